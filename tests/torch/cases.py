"""The checks that run inside a multi-rank job: every torch.distributed
op on the "dlslime" group next to the same op on a Gloo group of the same
ranks, with the same inputs.  Results must match exactly for integers,
bool, MIN/MAX, data movement and up to 2 ranks; float sums and products
over 3+ ranks may differ in rounding (the reduction order differs), so
those compare with torch.testing.assert_close's defaults, except 16-bit
float sums: where values cancel, two summation orders legitimately
differ by more than those defaults allow, so they are held to the
rounding-error bound of summation instead (see close_sum).

Where Gloo has no implementation the reference still comes from Gloo by
a detour that gives the same bits: int16 reductions run on int32 copies
(Gloo has no int16; wrapping arithmetic agrees modulo 2**16).

CASES maps a case name to fn(env); env.slime and env.gloo are the two
groups (None for the default dlslime group).  Every rank runs every case
in the same order; a case fails by raising.  The cases themselves live in
cases_reduce.py, cases_movement.py, cases_p2p.py and cases_groups.py,
which register into CASES when load_cases() imports them.
"""

import datetime
import warnings
import zlib

import torch
import torch.distributed as dist
from torch.testing import assert_close

R = dist.ReduceOp
CASES = {}

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool]
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX,
       "AVG": R.AVG, "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}
BITWISE = ("BAND", "BOR", "BXOR")


class Env:
    def __init__(self, rank, size, store, gloo):
        self.rank, self.size, self.store = rank, size, store
        self.slime = None  # the default group
        self.gloo = gloo


def case(name):
    def register(fn):
        assert name not in CASES, name
        CASES[name] = fn
        return fn
    return register


def dname(dtype):
    return str(dtype).replace("torch.", "")


def gen(name, rank):
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) * 8 + rank)


def data(name, rank, shape, dtype, small=False):
    """Deterministic per (case, rank) values of dtype.  small: values
    near 1 (floats) or in [-3, 3] (ints), so products stay in range."""
    g = gen(name, rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        x = torch.rand(shape, generator=g) + 0.5 if small else torch.randn(shape, generator=g) * 4
        return x.to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    info = torch.iinfo(dtype)
    lo, hi = (max(info.min, -3), 4) if small else (max(info.min, -2**40), min(info.max, 2**40) + 1)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def same(got, want, exact=True, what="result"):
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    if exact:
        assert torch.equal(got, want), f"{what} differs from Gloo's:\n{got}\n{want}"
    else:
        assert_close(got, want, msg=lambda m: f"{what} not close to Gloo's: {m}")


def close_sum(got, ref, x, group, size, avg, what):
    """got and ref are two sums (averages with avg) over size ranks of x
    in a 16-bit float dtype, each rounded once per step: both lie within
    (size - 1) * u * sum(|x|) of the exact sum (u: unit roundoff), so they
    differ by at most size * eps * sum(|x|) (plus one rounding of the
    division for an average)."""
    abs_sum = x.abs().double()
    dist.all_reduce(abs_sum, group=group)
    eps = torch.finfo(x.dtype).eps
    bound = size * eps * abs_sum
    if avg:
        bound = bound / size + eps * ref.double().abs()
    diff = (got.double() - ref.double()).abs()
    worst = int(torch.argmax(diff - bound))
    assert bool((diff <= bound).all()), (
        f"{what}: differs from Gloo's by {diff[worst].item()} at {worst}, more than "
        f"rounding allows ({bound[worst].item()}): {got[worst].item()} vs {ref[worst].item()}")


def gloo_all_reduce(x, op, group):
    """Gloo's all_reduce of x (int16 through int32, see the module doc)."""
    if x.dtype == torch.int16:
        wide = x.to(torch.int32)
        dist.all_reduce(wide, op=op, group=group)
        return wide.to(torch.int16)
    ref = x.clone()
    dist.all_reduce(ref, op=op, group=group)
    return ref


def reduction_applies(dtype, opname):
    if opname in BITWISE:
        return not dtype.is_floating_point
    if opname == "AVG":
        return dtype.is_floating_point
    return True


def exact_for(dtype, opname, size):
    return not dtype.is_floating_point or opname in ("MIN", "MAX") or size <= 2


# test_collectives.py's catalog; test_gloo_parity.py runs other modules.
CATALOG = ("cases_reduce", "cases_movement", "cases_p2p", "cases_groups")


def load_cases(modules=CATALOG):
    """Imports the case modules (in a fixed order: every rank must run
    the cases in the same order); returns the cases they hold, and only
    those, whatever other modules a test process imported before."""
    import importlib
    for module in modules:
        importlib.import_module(module)
    return {name: fn for name, fn in CASES.items() if fn.__module__ in modules}


def run_cases(rank, size, store, modules=CATALOG):
    """The rank function of a catalog job: returns {case: None or the
    error text} for the cases of modules."""
    import traceback

    import dlslime_torch  # noqa: F401  (registers "dlslime")
    cases = load_cases(modules)
    warnings.simplefilter("ignore", FutureWarning)
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    gloo = dist.new_group(backend="gloo")
    env = Env(rank, size, store, gloo)
    outcomes = {}
    for name, fn in cases.items():
        try:
            fn(env)
            outcomes[name] = None
        except Exception:
            outcomes[name] = traceback.format_exc()
    dist.destroy_process_group()
    return outcomes
