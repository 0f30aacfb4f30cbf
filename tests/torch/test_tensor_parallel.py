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


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 8))


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
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    model = parallelize_module(mlp(), mesh, {"0": ColwiseParallel(),
                                             "2": RowwiseParallel()})
    model(data()).pow(2).sum().backward()
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    model.zero_grad()
    return _train(model) | {"grads": grads}


def _job(rank, size, store):
    init(rank, size, store)
    by_backend = meshes((size,), ("tp",))
    out = run_scenarios({"mlp": _tensor_parallel}, by_backend.__getitem__)
    dist.destroy_process_group()
    return out


def reference(rank):
    model = mlp()
    model(data()).pow(2).sum().backward()
    w1, b1, w2, b2 = (p.grad for p in model.parameters())
    # Colwise shards the first Linear's rows, Rowwise the second's columns.
    grads = [w1.chunk(SIZE, 0)[rank], b1.chunk(SIZE, 0)[rank],
             w2.chunk(SIZE, 1)[rank], b2]
    model.zero_grad()
    return _train(model) | {"grads": grads}


def test_tensor_parallel_mlp_matches_gloo_and_local():
    check(run_job(SIZE, _job, timeout=120), "mlp", reference, exact_reference=False)
