"""Catalog cases: broadcast, all_gather, gather, scatter, all_to_all,
barrier and monitored_barrier (see cases.py)."""

import datetime
import warnings

import torch
import torch.distributed as dist

from cases import case, data, same


# ---------------------------------------------------------------- data movement

@case("broadcast")
def _(env):
    for root in sorted({0, env.size - 1}):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64):
            x = data(f"bc{dtype}", env.rank, (3, 11), dtype)
            ref = x.clone()
            dist.broadcast(ref, src=root, group=env.gloo)
            got = x.clone()
            dist.broadcast(got, src=root)
            same(got, ref, what=f"broadcast {dtype} from {root}")


@case("broadcast-noncontiguous-large")
def _(env):
    x = data("bcl", env.rank, (512, 300), torch.float32)
    ref = x.clone()
    dist.broadcast(ref, src=env.size - 1, group=env.gloo)
    got = x.clone().t()
    dist.broadcast(got, src=env.size - 1)
    same(got.t(), ref)


@case("all_gather")
def _(env):
    for dtype in (torch.float32, torch.int8):
        x = data(f"ag{dtype}", env.rank, (3, 4), dtype)
        ref = [torch.empty(3, 4, dtype=dtype) for _ in range(env.size)]
        dist.all_gather(ref, x, group=env.gloo)
        # Outputs of every layout: the shim copies them out of one buffer.
        got = [torch.empty(4, 3, dtype=dtype).t() for _ in range(env.size)]
        dist.all_gather(got, x)
        for g, r in zip(got, ref):
            same(g.contiguous(), r)
        # Contiguous outputs are written in place, here slices of one
        # tensor in reverse order, the input being this rank's own slice.
        flat = torch.zeros(env.size * 3, 4, dtype=dtype)
        got = list(reversed(flat.chunk(env.size)))
        got[env.rank].copy_(x)
        dist.all_gather(got, got[env.rank])
        for g, r in zip(got, ref):
            same(g, r)
        # An input that is another rank's slot goes from a copy.
        other = (env.rank + 1) % env.size
        if env.size > 1:
            got = [torch.zeros(3, 4, dtype=dtype) for _ in range(env.size)]
            got[other].copy_(x)
            dist.all_gather(got, got[other])
            for g, r in zip(got, ref):
                same(g, r)


@case("all_gather_into_tensor")
def _(env):
    x = data("agt", env.rank, (5,), torch.float16)
    ref = torch.empty(env.size * 5, dtype=torch.float16)
    got = torch.empty(env.size * 5, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(ref, x, group=env.gloo)
        dist.all_gather_into_tensor(got, x)
    same(got, ref)


@case("gather")
def _(env):
    root = env.size - 1
    here = env.rank == root
    x = data("ga", env.rank, (7,), torch.int32)
    ref = [torch.empty(7, dtype=torch.int32) for _ in range(env.size)] if here else None
    got = [torch.empty(7, dtype=torch.int32) for _ in range(env.size)] if here else None
    dist.gather(x, ref, dst=root, group=env.gloo)
    dist.gather(x, got, dst=root)
    if here:
        for g, r in zip(got, ref):
            same(g, r)
    # Outputs written where they are: slices of one tensor in reverse
    # order, the root's input being its own slice; non-contiguous outputs
    # through a copy; an input that is another rank's slot from a copy.
    for layout in ("slices", "transposed", "other-slot"):
        got = None
        src = x
        if here:
            if layout == "slices":
                got = list(reversed(torch.zeros(env.size * 7, dtype=torch.int32).chunk(env.size)))
                got[env.rank].copy_(x)
                src = got[env.rank]
            elif layout == "transposed":
                got = [torch.zeros(1, 7, dtype=torch.int32).t() for _ in range(env.size)]
            else:
                got = [torch.zeros(7, dtype=torch.int32) for _ in range(env.size)]
                src = got[(env.rank + 1) % env.size]
                src.copy_(x)
        dist.gather(src, got, dst=root)
        if here:
            for g, r in zip(got, ref):
                same(g.reshape(-1), r, what=f"gather, {layout} outputs")


@case("scatter")
def _(env):
    root = env.size - 1
    here = env.rank == root
    xs = [data("sc", i, (2, 3), torch.float64) for i in range(env.size)] if here else None
    ref = torch.empty(2, 3, dtype=torch.float64)
    got = torch.empty(2, 3, dtype=torch.float64)
    dist.scatter(ref, xs, src=root, group=env.gloo)
    dist.scatter(got, xs, src=root)
    same(got, ref)
    # Inputs sent from where they are: slices of one tensor in reverse
    # order with the root's output its own slice (in place); transposed
    # inputs through a copy; an output that is another rank's input slot,
    # written while that slot is still being sent (so sent from a copy).
    for layout in ("slices", "transposed", "other-slot"):
        ins = None
        out = torch.zeros(2, 3, dtype=torch.float64)
        if here:
            if layout == "slices":
                ins = list(reversed(torch.zeros(env.size * 2, 3, dtype=torch.float64).chunk(env.size)))
                for i, t in enumerate(ins):
                    t.copy_(xs[i])
                out = ins[env.rank]
            elif layout == "transposed":
                ins = [x.t().contiguous().t() for x in xs]
            else:
                ins = [x.clone() for x in xs]
                out = ins[(env.rank + 1) % env.size] if env.size > 1 else out
        dist.scatter(out, ins, src=root)
        same(out, ref, what=f"scatter, {layout} inputs")
        if here and layout == "other-slot" and env.size > 1:
            for i, t in enumerate(ins):
                if t is not out:
                    same(t, xs[i], what="scatter's untouched inputs")


@case("all_to_all")
def _(env):
    ins = [data("a2a", env.rank * 16 + p, (2, 3), torch.int64) for p in range(env.size)]
    ref = [torch.empty(2, 3, dtype=torch.int64) for _ in range(env.size)]
    got = [torch.empty(2, 3, dtype=torch.int64) for _ in range(env.size)]
    dist.all_to_all(ref, ins, group=env.gloo)
    dist.all_to_all(got, ins)
    for g, r in zip(got, ref):
        same(g, r)


@case("all_to_all-uneven")
def _(env):
    # Rank r sends r + p + 1 elements to rank p.  Gloo's all_to_all wants
    # equal sizes; its all_to_all_single with those splits moves the same
    # bytes.
    ins = [data("a2au", env.rank * 16 + p, (env.rank + p + 1,), torch.int64) for p in range(env.size)]
    got = [torch.empty(p + env.rank + 1, dtype=torch.int64) for p in range(env.size)]
    dist.all_to_all(got, ins)
    out_splits = [p + env.rank + 1 for p in range(env.size)]
    ref = torch.empty(sum(out_splits), dtype=torch.int64)
    dist.all_to_all_single(ref, torch.cat(ins), out_splits, [t.numel() for t in ins],
                           group=env.gloo)
    same(torch.cat(got), ref)


@case("all_to_all_single-even")
def _(env):
    x = data("a2as", env.rank, (env.size * 3, 2), torch.float32)
    ref = torch.empty_like(x)
    got = torch.empty_like(x)
    dist.all_to_all_single(ref, x, group=env.gloo)
    dist.all_to_all_single(got, x)
    same(got, ref)


@case("all_to_all_single-uneven")
def _(env):
    # Rank r sends (r + p) % 3 rows to rank p (some of them empty).
    rows = lambda src, dst: (src + dst) % 3  # noqa: E731
    in_splits = [rows(env.rank, p) for p in range(env.size)]
    out_splits = [rows(p, env.rank) for p in range(env.size)]
    x = data("a2au", env.rank, (sum(in_splits), 4), torch.bfloat16)
    ref = torch.empty(sum(out_splits), 4, dtype=torch.bfloat16)
    got = torch.empty(sum(out_splits), 4, dtype=torch.bfloat16)
    dist.all_to_all_single(ref, x, out_splits, in_splits, group=env.gloo)
    dist.all_to_all_single(got, x, out_splits, in_splits)
    same(got, ref)


@case("barrier")
def _(env):
    # Every rank marks its arrival in the store before the barrier; after
    # it, every mark must be there.  add, not set: TCPStore's set does not
    # wait for the server, add returns only once the server counted it.
    env.store.add(f"barrier-arrived/{env.rank}", 1)
    dist.barrier()
    assert env.store.check([f"barrier-arrived/{r}" for r in range(env.size)]), \
        "barrier returned before every rank arrived"


@case("monitored_barrier")
def _(env):
    import dlslime_torch
    dlslime_torch.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    dist.monitored_barrier(group=env.gloo, timeout=datetime.timedelta(seconds=30))
