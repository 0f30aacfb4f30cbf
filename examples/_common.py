"""Shared by the torchrun examples: start-up, checks, and a clean exit
code.

Each example is run as
    torchrun --standalone --nproc-per-node 2 examples/<name>.py
and exits non-zero when a check fails on any rank.
"""

import datetime
import gc
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import dlslime_torch  # noqa: F401  (registers the "dlslime" backend)

TIMEOUT = datetime.timedelta(seconds=60)


def init():
    """Joins the torchrun job on "dlslime"; returns (rank, world_size,
    a Gloo group of every rank)."""
    if "RANK" not in os.environ:
        sys.exit(f"run me under torchrun, e.g.: torchrun --standalone "
                 f"--nproc-per-node 2 {sys.argv[0]}")
    torch.set_num_threads(1)
    dist.init_process_group("dlslime", timeout=TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo")


def say(text):
    # One write per line, so the ranks' lines do not interleave.
    sys.stdout.write(f"[rank {dist.get_rank()}] {text}\n")
    sys.stdout.flush()


def check(ok, what):
    if not ok:
        raise AssertionError(f"check failed: {what}")


# The training examples' model and task: an MLP fitting y = x @ target.
IN, HIDDEN, OUT, BATCH = 16, 64, 4, 32


def mlp():
    """The training examples' model, the same initial weights everywhere."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, OUT))


def fit(model, steps, data_seed):
    """SGD on the regression task, batches drawn from data_seed; returns
    (the losses, seconds taken)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    target = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(7))
    data = torch.Generator().manual_seed(data_seed)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(BATCH, IN, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def parse_steps(default=30):
    """The training examples' --steps."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=default)
    return parser.parse_args().steps


def same_as_gloo(ours, gloo, size):
    """Whether two runs' tensors are equal: bit for bit on 2 ranks (a sum
    of two floats has one rounding), to rounding on more."""
    if size <= 2:
        return all(torch.equal(a, b) for a, b in zip(ours, gloo))
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(ours, gloo))


def main(body):
    """Runs body(rank, size, gloo) and exits 0 only if it passed on every
    rank."""
    rank, size, gloo = init()
    failed = 0
    try:
        body(rank, size, gloo)
    except Exception:  # report, then make the other ranks fail too
        traceback.print_exc()
        failed = 1
    try:
        # Agree on the outcome over Gloo, which works even if dlslime broke.
        verdict = torch.tensor([failed])
        dist.all_reduce(verdict, group=gloo)
        failed = int(verdict.item())
        dist.destroy_process_group()
        # Modules that hold a group in reference cycles (fully_shard's)
        # would otherwise free it during interpreter shutdown, where
        # Gloo's worker threads have been seen to abort the process
        # ("terminate called without an active exception", once in CI).
        gc.collect()
    except Exception:
        traceback.print_exc()
        failed = 1
    if rank == 0:
        print("FAILED" if failed else "OK: every check passed", flush=True)
    sys.exit(1 if failed else 0)
