"""DistributedDataParallel training on the "dlslime" backend.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py [--steps 30]

A small MLP learns a fixed random linear map from synthetic data, each
rank on its own shard.  The same loop then runs again on a Gloo group
with the same seeds.  Checks: the loss fell, every rank holds the same
parameters, and they equal Gloo's (bit for bit on 2 ranks, where a sum
of two floats has one possible rounding; within float rounding beyond).
Exits non-zero if a check fails.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import check, fit, main, mlp, parse_steps, same_as_gloo, say


def train(group, rank, steps):
    model = mlp()
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01)   # several buckets
    losses, seconds = fit(ddp, steps, data_seed=100 + rank)      # this rank's shard
    return [p.detach().clone() for p in model.parameters()], losses, seconds


def body(rank, size, gloo):
    steps = parse_steps()
    params, losses, seconds = train(dist.group.WORLD, rank, steps)
    check(losses[-1] < 0.5 * losses[0], f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
    # Every rank holds the same model.
    flat = torch.cat([p.flatten() for p in params])
    copies = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(copies, flat)
    check(all(torch.equal(c, flat) for c in copies), "ranks hold the same parameters")
    # The same loop on Gloo.
    gloo_params, gloo_losses, gloo_seconds = train(gloo, rank, steps)
    check(same_as_gloo(params, gloo_params, size), "parameters equal Gloo's")
    say(f"{steps} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
        f"{seconds / steps * 1e3:.2f} ms/step on dlslime, "
        f"{gloo_seconds / steps * 1e3:.2f} ms/step on gloo; parameters equal Gloo's")


if __name__ == "__main__":
    main(body)
