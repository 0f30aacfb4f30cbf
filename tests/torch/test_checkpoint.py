"""torch.distributed.checkpoint (DCP) over "dlslime": the state dict of
a tensor-parallel MLP (DTensor parameters, sharded over two ranks) saved
with dcp.save and loaded back with dcp.load into a freshly initialised
copy, the planning done by object collectives (gather_object,
scatter_object_list, broadcast_object_list, all_gather_object) and
barriers on the mesh's dlslime group.  Each rank gets back exactly its
shards of the saved model, as the same save and load over Gloo does.
"""

import pytest
import torch
import torch.distributed as dist

from frameworks import check, init, meshes, run_scenarios
from harness import run_job

pytestmark = pytest.mark.timeout(150)

SIZE = 2


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 8))


def _sharded(mesh, seed):
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    return parallelize_module(mlp(seed), mesh, {"0": ColwiseParallel(),
                                                "2": RowwiseParallel()})


def _save_and_load(context):
    import torch.distributed.checkpoint as dcp
    mesh, path = context
    group = mesh.get_group()
    dcp.save(_sharded(mesh, 0).state_dict(), checkpoint_id=path, process_group=group)
    fresh = _sharded(mesh, 1)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=path, process_group=group)
    fresh.load_state_dict(state)
    return {k: v.to_local().clone() for k, v in fresh.state_dict().items()}


def _job(rank, size, store, root):
    init(rank, size, store)
    by_backend = meshes((size,), ("tp",))
    out = run_scenarios({"save_load": _save_and_load},
                        lambda backend: (by_backend[backend], f"{root}/{backend}"))
    dist.destroy_process_group()
    return out


def reference(rank):
    """The seed-0 model's shards: rows of the column-wise Linear,
    columns of the row-wise one."""
    w1, b1, w2, b2 = mlp(0).state_dict().values()
    return {"0.weight": w1.chunk(SIZE, 0)[rank], "0.bias": b1.chunk(SIZE, 0)[rank],
            "2.weight": w2.chunk(SIZE, 1)[rank], "2.bias": b2}


def test_checkpoint_round_trip_matches_gloo(tmp_path):
    check(run_job(SIZE, _job, str(tmp_path), timeout=120), "save_load", reference)
