"""Tensor-parallel training on the "dlslime" backend.

    torchrun --standalone --nproc-per-node 2 examples/tensor_parallel.py [--steps 30]

A 2-layer MLP is sharded over a CPU DeviceMesh of every rank with
parallelize_module: the first Linear column-wise (each rank holds some
of its output features), the second row-wise (each rank sums its part of
the product; an all_reduce completes it).  It learns a fixed random
linear map from data every rank sees alike.  The same loop then runs on
a Gloo mesh, and once more unsharded on each rank alone.  Checks: the
loss fell, each rank's shards equal Gloo's (bit for bit on 2 ranks,
where a sum of two floats has one possible rounding; within float
rounding beyond) and, within float rounding, the matching slices of the
unsharded model.  Exits non-zero if a check fails.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from _common import HIDDEN, IN, OUT, check, fit, main, parse_steps, say


def train(model, steps):
    return fit(model, steps, data_seed=100)[0]      # the same batches on every rank


def mlp():
    torch.manual_seed(0)                             # same initial model everywhere
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, OUT))


def sharded(mesh):
    return parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def shards_of(model, rank, size):
    """This rank's slices of an unsharded model, as ColwiseParallel and
    RowwiseParallel cut them."""
    w1, b1, w2, b2 = (p.detach() for p in model.parameters())
    return [w1.chunk(size, 0)[rank], b1.chunk(size, 0)[rank], w2.chunk(size, 1)[rank], b2]


def body(rank, size, gloo):
    steps = parse_steps()
    # torch's row-wise Linear needs its input features split evenly.
    check(HIDDEN % size == 0, f"{HIDDEN} hidden features split over {size} ranks "
                              f"(run 1, 2, 4, ... ranks)")
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",))
    model = sharded(mesh)
    losses = train(model, steps)
    check(losses[-1] < 0.5 * losses[0], f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
    mine = [p.to_local() for p in model.parameters()]

    gloo_mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",),
                                 backend_override={"tp": "gloo"})
    gloo_model = sharded(gloo_mesh)
    train(gloo_model, steps)
    theirs = [p.to_local() for p in gloo_model.parameters()]
    if size <= 2:
        same = all(torch.equal(a, b) for a, b in zip(mine, theirs))
    else:
        same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(mine, theirs))
    check(same, "shards equal Gloo's")

    alone = mlp()
    train(alone, steps)
    check(all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
              for a, b in zip(mine, shards_of(alone, rank, size))),
          "shards equal the unsharded model's slices")
    say(f"{steps} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}; shards equal Gloo's "
        f"and the unsharded model's")


if __name__ == "__main__":
    main(body)
