"""Catalog cases: all_reduce of sparse COO tensors, as Gloo does it (SUM
of every rank's nonzeros, whose counts differ from rank to rank, then
coalesced), against Gloo (see cases.py)."""

import torch
import torch.distributed as dist

from cases import R, case, gen, same


def _sparse(name, rank, shape, sparse_dims, dtype):
    """A sparse tensor with a rank-dependent number of nonzeros (none on
    rank 1), repeated indices included, and small integer values, so
    that every order of summation gives the same bits."""
    g = gen(name, rank)
    nnz = (6, 0, 11, 3)[rank % 4]
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g)
                       for d in range(sparse_dims)])
    vals = torch.randint(-5, 6, (nnz, *shape[sparse_dims:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape, check_invariants=False)


@case("all_reduce-sparse")
def _(env):
    for shape, sparse_dims, dtype in [((10,), 1, torch.int64),
                                      ((6, 5), 2, torch.float32),
                                      ((7, 4, 3), 1, torch.float64)]:   # hybrid
        x = _sparse(f"sp{len(shape)}", env.rank, shape, sparse_dims, dtype)
        ref = x.clone()
        dist.all_reduce(ref, group=env.gloo)
        got = x.clone()
        dist.all_reduce(got)
        what = f"sparse all_reduce {dtype} {shape}"
        assert got.is_sparse and got.is_coalesced(), what
        same(got._indices(), ref.coalesce()._indices(), what=what + " indices")
        same(got._values(), ref.coalesce()._values(), what=what + " values")


@case("all_reduce-sparse-refuses-other-ops")
def _(env):
    x = _sparse("spmax", env.rank, (4,), 1, torch.float32)
    try:
        dist.all_reduce(x, op=R.MAX)
    except RuntimeError as exc:
        assert "only works with ReduceOp.SUM" in str(exc), exc
    else:
        raise AssertionError("sparse all_reduce with MAX did not raise")
    t = torch.ones(2)   # refused before posting: the group still works
    dist.all_reduce(t)
    same(t, torch.full((2,), float(env.size)))
