"""Catalog cases: all_reduce over every dtype and op, coalesced,
reduce and reduce_scatter (see cases.py)."""

import warnings

import torch
import torch.distributed as dist

from cases import (DTYPES, OPS, R, case, close_sum, data, dname, exact_for,
                   gloo_all_reduce, reduction_applies, same)


# ---------------------------------------------------------------- all_reduce

def _all_reduce_case(dtype, opname, n):
    name = f"all_reduce-{dname(dtype)}-{opname}-{n}"

    @case(name)
    def run(env):
        x = data(name, env.rank, (n,), dtype, small=opname == "PRODUCT")
        ref = gloo_all_reduce(x, OPS[opname], env.gloo)
        got = x.clone()
        dist.all_reduce(got, op=OPS[opname])
        if (dtype in (torch.float16, torch.bfloat16) and opname in ("SUM", "AVG")
                and not exact_for(dtype, opname, env.size)):
            close_sum(got, ref, x, env.gloo, env.size, opname == "AVG", name)
        else:
            same(got, ref, exact_for(dtype, opname, env.size), name)


for _dt in DTYPES:
    for _op in OPS:
        if reduction_applies(_dt, _op):
            _all_reduce_case(_dt, _op, 37)
# Sizes past the eager limit and the core's chunking.
for _dt, _op, _n in [(torch.float32, "SUM", 300_007), (torch.bfloat16, "SUM", 200_003),
                     (torch.int64, "MAX", 100_000), (torch.float64, "AVG", 70_001),
                     (torch.float32, "SUM", 0)]:
    _all_reduce_case(_dt, _op, _n)


@case("all_reduce-noncontiguous")
def _(env):
    base = data("nc", env.rank, (6, 9), torch.float32)
    got = base.clone().t()           # strides (1, 9)
    assert not got.is_contiguous()
    ref = gloo_all_reduce(base.t().contiguous(), R.MAX, env.gloo)
    dist.all_reduce(got, op=R.MAX)
    same(got.contiguous(), ref)


@case("all_reduce-unsupported-combinations-raise")
def _(env):
    for dtype, op, words in [(torch.float32, R.BXOR, ("BXOR", "Float")),
                             (torch.int32, R.AVG, ("AVG", "Int")),
                             (torch.uint16, R.SUM, ("dtype", "UInt16"))]:
        try:
            dist.all_reduce(torch.ones(3, dtype=dtype), op=op)
        except RuntimeError as exc:
            text = str(exc)
            assert "dlslime: all_reduce" in text and all(w in text for w in words), text
        else:
            raise AssertionError(f"all_reduce {op} on {dtype} did not raise")
    # Refused before posting: the group still works.
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(env.size)))


@case("all_reduce-async-future")
def _(env):
    x = data("fut", env.rank, (5,), torch.float64)
    ref = gloo_all_reduce(x, R.SUM, env.gloo)
    work = dist.all_reduce(x, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2)
    work.wait()
    assert work.is_completed()
    same(x, ref, env.size <= 2)
    same(doubled.wait(), ref * 2, env.size <= 2)


@case("all_reduce-async-runs-unwaited")
def _(env):
    # A synchronous op's post leaves the collective to its wait; an async
    # one must start with no wait: rank 0 waits on it only after a message
    # rank 1 sends once its own all_reduce has returned.
    x = data("unwaited", env.rank, (6,), torch.float32)
    ref = gloo_all_reduce(x, R.SUM, env.gloo)
    if env.rank == 0:
        work = dist.all_reduce(x, async_op=True)
        if env.size > 1:
            dist.recv(torch.zeros(1), 1)
        work.wait()
    else:
        dist.all_reduce(x)
        if env.rank == 1:
            dist.send(torch.ones(1), 0)
    same(x, ref, env.size <= 2)


@case("all_reduce_coalesced")
def _(env):
    xs = [data("coal", env.rank * 3 + i, shape, torch.float32)
          for i, shape in enumerate([(4,), (2, 3), (7,)])]
    refs = [gloo_all_reduce(x, R.SUM, env.gloo) for x in xs]
    got = [x.clone() for x in xs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(got)
    for g, r in zip(got, refs):
        same(g, r, env.size <= 2)


# ---------------------------------------------------------------- reduce

@case("reduce")
def _(env):
    root = env.size - 1
    for dtype, op in [(torch.float32, R.SUM), (torch.int32, R.MAX), (torch.int8, R.PRODUCT)]:
        x = data(f"reduce{dtype}", env.rank, (33,), dtype, small=op == R.PRODUCT)
        ref = x.clone()
        dist.reduce(ref, dst=root, op=op, group=env.gloo)
        got = x.clone()
        dist.reduce(got, dst=root, op=op)
        if env.rank == root:
            same(got, ref, exact_for(dtype, "SUM" if op == R.SUM else "MAX", env.size))
        else:  # dlslime leaves a non-root rank's tensor as it was
            same(got, x, what="non-root tensor after reduce")


@case("reduce_scatter")
def _(env):
    for dtype, op in [(torch.float32, R.SUM), (torch.int32, R.MAX)]:
        xs = [data(f"rs{dtype}", env.rank * 8 + i, (2, 5), dtype) for i in range(env.size)]
        ref = torch.empty(2, 5, dtype=dtype)
        dist.reduce_scatter(ref, [x.clone() for x in xs], op=op, group=env.gloo)
        got = torch.empty(2, 5, dtype=dtype)
        dist.reduce_scatter(got, xs, op=op)
        same(got, ref, exact_for(dtype, "MAX" if op == R.MAX else "SUM", env.size))
        # Inputs are read in place: a non-contiguous one goes through a
        # copy, and the output may be one of the inputs.
        ins = [x.clone() for x in xs]
        ins[0] = xs[0].t().contiguous().t()
        dist.reduce_scatter(ins[env.rank], ins, op=op)
        same(ins[env.rank], ref, exact_for(dtype, "MAX" if op == R.MAX else "SUM", env.size))


@case("reduce_scatter_tensor")
def _(env):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for dtype, op in [(torch.float64, R.SUM), (torch.uint8, R.BXOR)]:
            x = data(f"rst{dtype}", env.rank, (env.size * 6,), dtype)
            ref = torch.empty(6, dtype=dtype)
            dist.reduce_scatter_tensor(ref, x.clone(), op=op, group=env.gloo)
            got = torch.empty(6, dtype=dtype)
            dist.reduce_scatter_tensor(got, x, op=op)
            same(got, ref, exact_for(dtype, "SUM", env.size))
