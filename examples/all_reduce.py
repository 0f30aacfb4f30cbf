"""all_reduce on the "dlslime" backend, checked against closed forms.

    torchrun --standalone --nproc-per-node 2 examples/all_reduce.py

Rank r contributes a tensor whose every element is a known function of
r and of its index, so each rank can compute what the reduction must be:
SUM, PRODUCT, MIN, MAX, AVG and the bitwise ops, over float32, float64,
bfloat16, int32, int64, uint8 and bool; then an asynchronous all_reduce
whose Future feeds a callback, and a large float32 buffer whose rate is
printed.  Exits non-zero if any element is wrong.
"""

import time

import torch
import torch.distributed as dist

from _common import check, main, say

R = dist.ReduceOp
N = 1000


def contribution(rank, dtype):
    i = torch.arange(N)
    if dtype == torch.bool:
        return ((i + rank) % 3 != 0)
    if dtype.is_floating_point:
        return ((i % 7) + rank + 1).to(dtype)        # small integers: exact in every float
    return ((i * 31 + rank * 17) % 100).to(dtype)


def expected(size, dtype, op):
    xs = torch.stack([contribution(r, dtype) for r in range(size)])
    if dtype == torch.bool:
        return {R.SUM: xs.any(0), R.MAX: xs.any(0), R.PRODUCT: xs.all(0), R.MIN: xs.all(0),
                R.BAND: xs.all(0), R.BOR: xs.any(0), R.BXOR: xs.sum(0) % 2 == 1}[op]
    if op == R.SUM:
        return xs.sum(0, dtype=dtype)
    if op == R.PRODUCT:
        return xs.prod(0, dtype=dtype)
    if op == R.MIN:
        return xs.amin(0)
    if op == R.MAX:
        return xs.amax(0)
    if op == R.AVG:
        return xs.sum(0, dtype=dtype) / size
    out = xs[0].clone()
    for x in xs[1:]:
        out = {R.BAND: out & x, R.BOR: out | x, R.BXOR: out ^ x}[op]
    return out


def body(rank, size, gloo):
    floats = [torch.float32, torch.float64, torch.bfloat16]
    ints = [torch.int32, torch.int64, torch.uint8, torch.bool]
    checked = 0
    for dtype in floats + ints:
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
        ops += [R.AVG] if dtype in floats else [R.BAND, R.BOR, R.BXOR]
        for op in ops:
            t = contribution(rank, dtype)
            dist.all_reduce(t, op=op)
            want = expected(size, dtype, op)
            check(torch.equal(t, want), f"all_reduce {op} on {dtype}: {t[:5]} vs {want[:5]}")
            checked += 1
    # Asynchronous, with a callback chained on the Work's Future.
    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    halved = work.get_future().then(lambda fut: fut.value()[0] / 2)
    work.wait()
    total = size * (size + 1) / 2
    check(torch.equal(halved.wait(), torch.full((4,), total / 2)), "future callback")
    # A large buffer, timed.
    big = torch.full((16 << 20,), float(rank))          # 64 MiB of float32
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(big)
    seconds = time.perf_counter() - start
    check(bool((big == float(size * (size - 1) / 2)).all()), "64 MiB all_reduce")
    say(f"{checked} all_reduce checks passed; 64 MiB float32 SUM in {seconds * 1e3:.1f} ms "
        f"({big.nbytes / seconds / 1e9:.2f} GB/s of buffer)")


if __name__ == "__main__":
    main(body)
