"""DTensor on a 1-D CPU DeviceMesh whose group is "dlslime": placements,
redistribution and a few ops (scatter, broadcast, all_gather,
all_reduce and reduce_scatter under the hood; on CPU torch turns Shard
into Shard by all_gather and chunk), each equal bit for bit to the same
run on a Gloo mesh of the same ranks and to the plain local result.

The data are small integers held as floats, so every sum and product
below is exact and the local result can be compared exactly too.  The
tensors have 5 rows: Shard(0) splits them unevenly over the 3 ranks.
"""

import pytest
import torch

from frameworks import check, init, meshes, run_scenarios
from harness import run_job

pytestmark = pytest.mark.timeout(150)

SIZE = 3


def ints(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).float()


X = ints((5, 6), 1)          # the same on every rank
A, B = ints((5, 4), 2), ints((4, 6), 3)


def part(rank):
    """Each rank's own addend of a Partial tensor."""
    return ints((5, 6), 100 + rank)


def chunk(t, dim, rank):
    return torch.chunk(t, SIZE, dim)[rank]


def source(rank):
    """Different on every rank: distribute_tensor must take rank 0's."""
    return ints((5, 6), 10 + rank)


def _distribute(placement):
    def scenario(mesh):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(source(mesh.get_rank()), mesh, [placement]).to_local()
    return scenario


def _from_local_checked(mesh):
    """run_check=True compares the ranks' metadata and broadcasts a
    Replicate tensor from rank 0."""
    from torch.distributed.tensor import DTensor, Replicate
    return DTensor.from_local(source(mesh.get_rank()), mesh, [Replicate()],
                              run_check=True).to_local()


def _views(d):
    return [d.to_local().clone(), d.full_tensor()]


def _redistribute(src, dst):
    def scenario(mesh):
        from torch.distributed.tensor import distribute_tensor
        d = distribute_tensor(X, mesh, [src])
        return _views(d.redistribute(mesh, [dst]))
    return scenario


def _partial_to(reduce_op, dst):
    def scenario(mesh):
        from torch.distributed.tensor import DTensor, Partial
        d = DTensor.from_local(part(mesh.get_rank()), mesh, [Partial(reduce_op)],
                               run_check=False)
        return _views(d.redistribute(mesh, [dst]))
    return scenario


def _matmul(a_place, b_place):
    def scenario(mesh):
        from torch.distributed.tensor import distribute_tensor
        c = distribute_tensor(A, mesh, [a_place]) @ distribute_tensor(B, mesh, [b_place])
        return c.full_tensor()
    return scenario


def _sums(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor
    d = distribute_tensor(X, mesh, [Shard(0)])
    return [d.sum().full_tensor(), d.sum(dim=0).full_tensor(),
            d.sum(dim=1).full_tensor()]


def _backward(mesh):
    """Autograd through a row-sharded matmul: B's gradient is a Partial
    summed over the ranks."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    a = distribute_tensor(A, mesh, [Shard(0)]).requires_grad_()
    b = distribute_tensor(B, mesh, [Replicate()]).requires_grad_()
    ((a @ b) * 2).sum().backward()
    return [a.grad.full_tensor(), b.grad.full_tensor()]


def scenarios():
    from torch.distributed.tensor import Replicate, Shard
    return {
        "distribute_shard0": _distribute(Shard(0)),
        "distribute_replicate": _distribute(Replicate()),
        "from_local_checked": _from_local_checked,
        "shard0_to_replicate": _redistribute(Shard(0), Replicate()),
        "shard1_to_replicate": _redistribute(Shard(1), Replicate()),
        "shard0_to_shard1": _redistribute(Shard(0), Shard(1)),
        "shard1_to_shard0": _redistribute(Shard(1), Shard(0)),
        "replicate_to_shard1": _redistribute(Replicate(), Shard(1)),
        "partial_sum_to_replicate": _partial_to("sum", Replicate()),
        "partial_sum_to_shard0": _partial_to("sum", Shard(0)),
        "partial_avg_to_replicate": _partial_to("avg", Replicate()),
        "matmul_row_sharded": _matmul(Shard(0), Replicate()),
        "matmul_column_sharded": _matmul(Replicate(), Shard(1)),
        "matmul_inner_sharded": _matmul(Shard(1), Shard(0)),
        "sums": _sums,
        "backward": _backward,
    }


def _job(rank, size, store):
    import torch.distributed as dist
    init(rank, size, store)
    by_backend = meshes((size,), ("x",))
    out = run_scenarios(scenarios(), by_backend.__getitem__)
    dist.destroy_process_group()
    return out


_results = []


def results():
    if not _results:
        _results.append(run_job(SIZE, _job, timeout=120))
    return _results[0]


def _total():
    return sum(part(r) for r in range(SIZE))


REFERENCES = {
    "distribute_shard0": lambda r: chunk(source(0), 0, r),
    "distribute_replicate": lambda r: source(0),
    "from_local_checked": lambda r: source(0),
    "shard0_to_replicate": lambda r: [X, X],
    "shard1_to_replicate": lambda r: [X, X],
    "shard0_to_shard1": lambda r: [chunk(X, 1, r), X],
    "shard1_to_shard0": lambda r: [chunk(X, 0, r), X],
    "replicate_to_shard1": lambda r: [chunk(X, 1, r), X],
    "partial_sum_to_replicate": lambda r: [_total(), _total()],
    "partial_sum_to_shard0": lambda r: [chunk(_total(), 0, r), _total()],
    "partial_avg_to_replicate": lambda r: [_total() / SIZE, _total() / SIZE],
    "matmul_row_sharded": lambda r: A @ B,
    "matmul_column_sharded": lambda r: A @ B,
    "matmul_inner_sharded": lambda r: A @ B,
    "sums": lambda r: [X.sum(), X.sum(dim=0), X.sum(dim=1)],
    "backward": lambda r: [2 * torch.ones(5, 6) @ B.T, 2 * A.T @ torch.ones(5, 6)],
}



@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_dtensor_matches_gloo_and_local(name):
    check(results(), name, REFERENCES[name])
