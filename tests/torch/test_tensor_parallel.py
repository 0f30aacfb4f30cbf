"""Tensor parallel on "dlslime": a 2-layer MLP whose first Linear is
ColwiseParallel and second RowwiseParallel (parallelize_module) on a
1-D CPU mesh of two ranks.  The forward pass ends in an all_reduce of
the row-parallel partial sums, the backward pass in one of the input's
gradient.  Outputs, each rank's shard of every gradient, the input's
gradient and the output after a few SGD steps equal bit for bit the
same run on a Gloo mesh, and to rounding the unsharded model run
locally.
"""

import pytest
import torch
import torch.distributed as dist

from frameworks import check, init, meshes, run_scenarios
from harness import run_job

pytestmark = pytest.mark.timeout(150)

SIZE = 2
STEPS = 3


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 8))


def sharded_mlp(mesh, seed=0):
    """mlp(seed) with its first Linear column-wise, its second row-wise."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    return parallelize_module(mlp(seed), mesh, {"0": ColwiseParallel(),
                                            "2": RowwiseParallel()})


def shards(grads, index, count):
    """mlp()'s tensors as sharded_mlp cuts them: rows of the column-wise
    Linear, columns of the row-wise one (its bias is replicated)."""
    w1, b1, w2, b2 = grads
    return [w1.chunk(count, 0)[index], b1.chunk(count, 0)[index],
            w2.chunk(count, 1)[index], b2]


def data():
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(5))


def _train(model):
    """One forward/backward (kept), then STEPS of SGD; the final output."""
    x = data().requires_grad_()
    out = model(x)
    out.pow(2).sum().backward()
    first = {"out": out.detach(), "x_grad": x.grad}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(STEPS):
        opt.step()
        opt.zero_grad()
        model(data()).pow(2).sum().backward()
    first["after"] = model(data()).detach()
    return first


def _tensor_parallel(mesh):
    model = sharded_mlp(mesh)
    model(data()).pow(2).sum().backward()
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    model.zero_grad()
    return _train(model) | {"grads": grads}


def normed_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(8), *mlp())


def tokens():
    """(batch, sequence, features): sequence parallelism splits dim 1."""
    return torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(9))


def _sequence_parallel(mesh):
    """LayerNorm on each rank's part of the sequence, then the MLP: an
    all_gather of the sequence before it, a reduce_scatter after."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    model = parallelize_module(normed_mlp(), mesh, {
        "0": SequenceParallel(),
        "1": ColwiseParallel(input_layouts=Shard(1)),
        "3": RowwiseParallel(output_layouts=Shard(1))})
    out = model(tokens().chunk(SIZE, 1)[mesh.get_rank()])
    out.pow(2).sum().backward()
    return {"out": out.detach(), "grads": [p.grad.full_tensor() for p in model.parameters()]}


def _job(rank, size, store):
    init(rank, size, store)
    by_backend = meshes((size,), ("tp",))
    out = run_scenarios({"mlp": _tensor_parallel, "sequence_parallel": _sequence_parallel},
                        by_backend.__getitem__)
    dist.destroy_process_group()
    return out


def sequence_reference(rank):
    """The whole sequence locally: this rank's part of the output, and
    the full gradients (the ranks' losses add up to this one)."""
    model = normed_mlp()
    out = model(tokens())
    out.pow(2).sum().backward()
    return {"out": out.detach().chunk(SIZE, 1)[rank],
            "grads": [p.grad for p in model.parameters()]}


def mlp_reference(rank):
    model = mlp()
    model(data()).pow(2).sum().backward()
    grads = shards([p.grad for p in model.parameters()], rank, SIZE)
    model.zero_grad()
    return _train(model) | {"grads": grads}


_results = []
REFERENCES = {"mlp": mlp_reference, "sequence_parallel": sequence_reference}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_tensor_parallel_matches_gloo_and_local(name):
    if not _results:
        _results.append(run_job(SIZE, _job, timeout=120))
    check(_results[0], name, REFERENCES[name], exact_reference=False)
