"""Point-to-point on the "dlslime" backend, checked byte for byte.

    torchrun --standalone --nproc-per-node 2 examples/send_recv.py

Ranks pair up (0 with 1, 2 with 3, ...; an odd last rank talks to rank
0 through recv from any source).  Each pair exchanges tensors of several
dtypes and sizes (small ones go eagerly, large ones by rendezvous) with
send/recv, then isend/irecv in both directions at once, then a
batch_isend_irecv where both sides post their sends first.  Exits
non-zero if anything differs from what was sent.
"""

import time

import torch
import torch.distributed as dist

from _common import check, main, say

CASES = [(torch.float32, (17,)), (torch.int64, (3, 5)), (torch.bfloat16, (1000,)),
         (torch.uint8, (8 << 20,)), (torch.float64, (512, 512))]


def payload(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g, dtype=torch.int64).to(dtype)


def exchange(rank, peer):
    moved = 0
    for i, (dtype, shape) in enumerate(CASES):
        mine, theirs = payload(dtype, shape, rank * 100 + i), payload(dtype, shape, peer * 100 + i)
        got = torch.empty(shape, dtype=dtype)
        # Blocking: the lower rank sends first.
        if rank < peer:
            dist.send(mine, dst=peer, tag=i)
            dist.recv(got, src=peer, tag=i)
        else:
            dist.recv(got, src=peer, tag=i)
            dist.send(mine, dst=peer, tag=i)
        check(torch.equal(got, theirs), f"send/recv of {dtype}{list(shape)}")
        # Non-blocking, both directions at once.
        got2 = torch.empty(shape, dtype=dtype)
        works = [dist.isend(mine, dst=peer, tag=100 + i), dist.irecv(got2, src=peer, tag=100 + i)]
        for w in works:
            w.wait()
        check(torch.equal(got2, theirs), f"isend/irecv of {dtype}{list(shape)}")
        moved += 2 * mine.nbytes
    # Sends first on both sides, in one batch.
    tensors = [payload(dtype, shape, rank * 7 + i) for i, (dtype, shape) in enumerate(CASES)]
    inbox = [torch.empty(shape, dtype=dtype) for dtype, shape in CASES]
    ops = ([dist.P2POp(dist.isend, t, peer, tag=200 + i) for i, t in enumerate(tensors)]
           + [dist.P2POp(dist.irecv, t, peer, tag=200 + i) for i, t in enumerate(inbox)])
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for i, (dtype, shape) in enumerate(CASES):
        check(torch.equal(inbox[i], payload(dtype, shape, peer * 7 + i)), f"batch item {i}")
    return moved + sum(t.nbytes for t in tensors)


def body(rank, size, gloo):
    check(size >= 2, "needs at least 2 processes")
    start = time.perf_counter()
    if size % 2 and rank == size - 1:
        dist.send(torch.tensor([rank]), dst=0, tag=999)
        say("odd one out: sent my rank to rank 0")
        moved = 4
    else:
        peer = rank ^ 1
        moved = exchange(rank, peer)
        if rank == 0 and size % 2:
            who = torch.empty(1, dtype=torch.int64)
            src = dist.recv(who, tag=999)           # from any source
            check(src == size - 1 and who.item() == size - 1, f"recv from any source got {src}")
    seconds = time.perf_counter() - start
    say(f"moved {moved / 2**20:.1f} MiB both ways in {seconds:.2f} s, every byte checked")


if __name__ == "__main__":
    main(body)
