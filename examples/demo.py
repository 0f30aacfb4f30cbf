"""The main job: two ranks move tensors over the "dlslime" backend.

    torchrun --standalone --nproc-per-node 2 examples/demo.py [--size-mib 64] [--iters 5]

On the default transport (shared memory between two processes of one
host), rank 0 and rank 1:

  1. ping-pong a tensor with send/recv (rank 0 sends, rank 1 sends it
     back), --iters times;
  2. all_reduce (SUM) a float32 tensor, --iters times.

Every transfer is checked element for element outside the timed part.
The same steps then run on a Gloo group of the same two processes, for
comparison.  Rank 0 prints what moved and how fast; the job exits
non-zero if any check failed.
"""

import argparse
import time

import torch
import torch.distributed as dist

from _common import check, main, say


def ping_pong(rank, group, size_bytes, iters):
    n = size_bytes // 4
    mine = torch.empty(n, dtype=torch.float32)
    got = torch.empty(n, dtype=torch.float32)
    seconds = 0.0
    for i in range(iters):
        mine.copy_(torch.arange(n, dtype=torch.float32)).add_(i * 3 + rank)
        dist.barrier(group=group)
        start = time.perf_counter()
        if rank == 0:
            dist.send(mine, dst=1, group=group)
            dist.recv(got, src=1, group=group)
        else:
            dist.recv(got, src=0, group=group)
            dist.send(got, dst=0, group=group)
        seconds += time.perf_counter() - start
        if rank == 0:   # came back unchanged
            check(torch.equal(got, mine), f"ping-pong {i}: the tensor came back different")
        else:
            check(torch.equal(got, torch.arange(n, dtype=torch.float32) + i * 3),
                  f"ping-pong {i}: received the wrong tensor")
    return 2 * size_bytes * iters / seconds


def all_reduce(rank, group, size_bytes, iters):
    n = size_bytes // 4
    t = torch.empty(n, dtype=torch.float32)
    seconds = 0.0
    for i in range(iters):
        t.fill_(float(rank + 1 + i))
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        seconds += time.perf_counter() - start
        check(bool((t == float(3 + 2 * i)).all()), f"all_reduce {i}: wrong sum")
    return size_bytes * iters / seconds


def transport_in_use(rank):
    from dlslime_torch import runtime
    addrs = [None, None]
    dist.all_gather_object(addrs, runtime.current().address())
    return runtime.connect(addrs[1 - rank], 10_000).transport


def body(rank, size, gloo):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    check(size == 2, f"the demo runs on 2 ranks, not {size}")
    nbytes = args.size_mib << 20
    transport = transport_in_use(rank)
    rates = {}
    for name, group in (("dlslime", dist.group.WORLD), ("gloo", gloo)):
        rates[name] = (ping_pong(rank, group, nbytes, args.iters),
                       all_reduce(rank, group, nbytes, args.iters))
    if rank == 0:
        moved = 2 * nbytes * args.iters + nbytes * args.iters
        say(f"dlslime over {transport}, 2 ranks; moved {moved >> 20} MiB per rank, "
            f"every element checked")
        say(f"{'':28s}{'dlslime':>12s}{'gloo':>12s}")
        say(f"{f'send/recv ping-pong {args.size_mib} MiB':28s}"
            f"{rates['dlslime'][0] / 1e9:8.2f} GB/s{rates['gloo'][0] / 1e9:8.2f} GB/s")
        say(f"{f'all_reduce SUM {args.size_mib} MiB':28s}"
            f"{rates['dlslime'][1] / 1e9:8.2f} GB/s{rates['gloo'][1] / 1e9:8.2f} GB/s")
        say(f"(bytes moved per second over {args.iters} iterations; ping-pong "
            f"counts both directions, all_reduce the buffer once)")


if __name__ == "__main__":
    main(body)
