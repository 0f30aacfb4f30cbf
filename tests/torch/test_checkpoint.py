"""torch.distributed.checkpoint (DCP) over "dlslime": the state dict of
a tensor-parallel MLP (DTensor parameters, sharded over two ranks) saved
with dcp.save and loaded back with dcp.load into a freshly initialised
copy, the planning done by object collectives (gather_object,
scatter_object_list, broadcast_object_list, all_gather_object) and
barriers on the mesh's dlslime group.  Each rank gets back exactly its
shards of the saved model, as the same save and load over Gloo does.
"""

import pytest
import torch.distributed as dist

from frameworks import check, init, meshes, run_scenarios
from harness import run_job
from test_tensor_parallel import mlp, shards, sharded_mlp

pytestmark = pytest.mark.timeout(150)

SIZE = 2


def _save_and_load(context):
    import torch.distributed.checkpoint as dcp
    mesh, path = context
    group = mesh.get_group()
    dcp.save(sharded_mlp(mesh, 0).state_dict(), checkpoint_id=path, process_group=group)
    fresh = sharded_mlp(mesh, 1)
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
    """This rank's shards of the saved (seed 0) model."""
    state = mlp(0).state_dict()
    return dict(zip(state, shards(list(state.values()), rank, SIZE)))


def test_checkpoint_round_trip_matches_gloo(tmp_path):
    check(run_job(SIZE, _job, str(tmp_path), timeout=120), "save_load", reference)
