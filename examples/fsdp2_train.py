"""FSDP2 (fully_shard) training on the "dlslime" backend.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_train.py [--steps 30]

A small MLP, each Linear layer and the whole model sharded with
fully_shard over a 1-D CPU device mesh of every rank, learns a fixed
random linear map from synthetic data, each rank on its own shard of the
data.  The same loop then runs again with the mesh on a Gloo group and
the same seeds.  Checks: the loss fell, and the losses of every step and
the full parameters equal Gloo's (bit for bit on 2 ranks, where a sum of
two floats has one possible rounding; within float rounding beyond).
Exits non-zero if a check fails.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from _common import check, fit, main, mlp, parse_steps, same_as_gloo, say


def train(group, rank, steps):
    mesh = DeviceMesh.from_group(group, "cpu")
    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)     # one all-gather / reduce-scatter per layer
    fully_shard(model, mesh=mesh)
    losses, seconds = fit(model, steps, data_seed=100 + rank)   # this rank's shard
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return params, losses, seconds


def body(rank, size, gloo):
    steps = parse_steps()
    params, losses, seconds = train(dist.group.WORLD, rank, steps)
    check(losses[-1] < 0.5 * losses[0], f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
    gloo_params, gloo_losses, gloo_seconds = train(gloo, rank, steps)
    same_losses = (losses == gloo_losses if size <= 2 else
                   torch.allclose(torch.tensor(losses), torch.tensor(gloo_losses), rtol=1e-4))
    check(same_losses and same_as_gloo(params, gloo_params, size),
          "losses and parameters equal Gloo's")
    say(f"{steps} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
        f"{seconds / steps * 1e3:.2f} ms/step on dlslime, "
        f"{gloo_seconds / steps * 1e3:.2f} ms/step on gloo; losses and parameters equal Gloo's")


if __name__ == "__main__":
    main(body)
