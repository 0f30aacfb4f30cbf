"""Catalog cases: the coalesced collectives (all_gather_coalesced,
all_gather_into_tensor_coalesced, reduce_scatter_tensor_coalesced,
all_reduce_coalesced with mixed dtypes), each against Gloo (see cases.py).

Each case also checks that the op ran as one collective of the core (one
per dtype for a reduction: the core reduces one dtype per collective):
the group's sequence number counts the collectives the backend posted.
"""

import warnings

import torch
import torch.distributed as dist

from cases import R, case, data, exact_for, gloo_all_reduce, same


def _seq():
    """The collectives the dlslime group's backend has posted (torch's
    ProcessGroup asks only its built-in backends for this count)."""
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return backend._get_sequence_number_for_group()


def _collectives(fn):
    """Runs fn(); returns how many collectives the dlslime group posted."""
    before = _seq()
    fn()
    return _seq() - before


def _mixed(name, rank):
    """Tensors of several dtypes and shapes, one of them empty."""
    return [data(f"{name}0", rank, (3, 2), torch.float32),
            data(f"{name}1", rank, (5,), torch.int64),
            data(f"{name}2", rank, (0,), torch.float32),
            data(f"{name}3", rank, (2, 2, 2), torch.bfloat16),
            data(f"{name}4", rank, (7,), torch.int8)]


@case("all_gather_coalesced")
def _(env):
    # torch's API (one dtype) against Gloo's: got[r][i] is rank r's ins[i].
    ins = [data("agc-api", env.rank, (4,), torch.float64),
           data("agc-api2", env.rank, (2, 3), torch.float64)]
    got = [[torch.empty_like(x) for x in ins] for _ in range(env.size)]
    ref = [[torch.empty_like(x) for x in ins] for _ in range(env.size)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced(ref, ins, group=env.gloo)
        n = _collectives(lambda: dist.all_gather_coalesced(got, ins))
    assert n == 1, f"all_gather_coalesced posted {n} collectives"
    for g, r in zip(sum(got, []), sum(ref, [])):
        same(g, r, what="all_gather_coalesced")
    # Mixed dtypes, which torch's dist.all_gather_coalesced refuses and the
    # group's own method takes (the backend moves bytes), against Gloo's
    # all_gather of each tensor; a transposed output is written through a
    # copy.
    ins = _mixed("agc", env.rank)
    got = [[torch.empty(2, 3).t() if i == 0 else torch.empty_like(x)
            for i, x in enumerate(ins)] for _ in range(env.size)]
    n = _collectives(lambda: dist.group.WORLD.allgather_coalesced(got, ins).wait())
    assert n == 1, f"all_gather_coalesced posted {n} collectives"
    for i, x in enumerate(ins):
        ref = [torch.empty_like(x) for _ in range(env.size)]
        if x.numel():
            dist.all_gather(ref, x, group=env.gloo)
        for r in range(env.size):
            same(got[r][i].contiguous(), ref[r], what=f"all_gather_coalesced {x.dtype}")


def _gather_single_coalesced(outs, ins, group):
    """torch's coalescing manager: one all_gather_into_tensor_coalesced."""
    with dist._coalescing_manager(group=group):
        for o, i in zip(outs, ins):
            dist.all_gather_single(o, i, group=group)


@case("all_gather_into_tensor_coalesced")
def _(env):
    ins = _mixed("agtc", env.rank)
    # Concatenated and stacked output forms, and a non-contiguous one.
    shapes = [(env.size * 3, 2), (env.size, 5), (0,), (env.size * 2, 2, 2), (env.size * 7,)]
    got = [torch.empty(s, dtype=x.dtype) for s, x in zip(shapes, ins)]
    got[1] = torch.empty(5, env.size, dtype=torch.int64).t()
    n = _collectives(lambda: _gather_single_coalesced(got, ins, None))
    assert n == 1, f"all_gather_into_tensor_coalesced posted {n} collectives"
    for g, x in zip(got, ins):   # Gloo, one tensor at a time, flat
        ref = torch.empty(env.size * x.numel(), dtype=x.dtype)
        if x.numel():
            dist.all_gather_single(ref, x.reshape(-1), group=env.gloo)
        same(g.contiguous().reshape(-1), ref, what=f"all_gather_into_tensor_coalesced {x.dtype}")


def _scatter_single_coalesced(outs, ins, op, group):
    """torch's coalescing manager: one reduce_scatter_tensor_coalesced."""
    with dist._coalescing_manager(group=group):
        for o, i in zip(outs, ins):
            dist.reduce_scatter_single(o, i, op=op, group=group)


@case("reduce_scatter_tensor_coalesced")
def _(env):
    for op, opname in ((R.SUM, "SUM"), (R.MAX, "MAX")):
        shapes = [(env.size * 4,), (env.size, 3), (env.size * 2, 5), (0,)]
        dtypes = [torch.float32, torch.int64, torch.float32, torch.float64]
        ins = [data(f"rstc{opname}{i}", env.rank, s, d)
               for i, (s, d) in enumerate(zip(shapes, dtypes))]
        outs = [torch.empty(s[0] // env.size, *s[1:], dtype=d) if s[0] else torch.empty(0, dtype=d)
                for s, d in zip(shapes, dtypes)]
        got = [torch.empty_like(o) for o in outs]
        n = _collectives(lambda: _scatter_single_coalesced(got, ins, op, None))
        # one collective per dtype: float32, int64, float64
        assert n == 3, f"reduce_scatter_tensor_coalesced posted {n} collectives"
        for g, o, x in zip(got, outs, ins):
            # Gloo's reduce_scatter of one tensor as the reference
            if x.numel():
                dist.reduce_scatter_single(o, x.clone(), op=op, group=env.gloo)
            same(g, o, exact_for(x.dtype, opname, env.size),
                 f"reduce_scatter_tensor_coalesced {x.dtype} {opname}")


def _all_reduce_coalesced(tensors, op):
    """torch's coalescing manager: one all_reduce_coalesced (torch's
    dist.all_reduce_coalesced itself refuses mixed dtypes)."""
    with dist._coalescing_manager():
        for t in tensors:
            dist.all_reduce(t, op=op)


@case("all_reduce_coalesced-mixed-dtypes")
def _(env):
    xs = _mixed("arc", env.rank)
    refs = [gloo_all_reduce(x, R.MAX, env.gloo) for x in xs]
    got = [x.clone() for x in xs]
    got[0] = xs[0].t().contiguous().t()        # non-contiguous, written back
    n = _collectives(lambda: _all_reduce_coalesced(got, R.MAX))
    assert n == 4, f"all_reduce_coalesced of 4 dtypes posted {n} collectives"
    for g, r in zip(got, refs):
        same(g, r, what=f"all_reduce_coalesced {r.dtype}")


@case("all_reduce_coalesced-refused-before-posting")
def _(env):
    # AVG does not apply to integers: refused, naming both, before any
    # collective is posted (the float32 group comes first).
    before = _seq()
    try:
        _all_reduce_coalesced([torch.ones(3), torch.ones(2, dtype=torch.int32)], R.AVG)
    except RuntimeError as exc:
        assert "all_reduce_coalesced" in str(exc) and "AVG" in str(exc) and "Int" in str(exc), exc
    else:
        raise AssertionError("AVG on int32 did not raise")
    assert _seq() == before, "a refused all_reduce_coalesced posted a collective"
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(env.size)))
