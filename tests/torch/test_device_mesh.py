"""A 2-D DeviceMesh on "dlslime": four ranks as 2x2, mesh_dim_names
("dp", "tp").  init_device_mesh makes one dlslime subgroup per row and
per column (new_group with the default backend); collectives along each
dim, sub-meshes and DTensors with 2-D placements must give on every rank
exactly what the same mesh built on Gloo gives, and the plain local
result.

Mesh [[0, 1], [2, 3]]: along "dp" rank r meets r % 2 and r % 2 + 2,
along "tp" it meets 2 * (r // 2) and 2 * (r // 2) + 1.  The data are
small integers held as floats: every sum is exact, but for the MLP's
(tensor parallel over "tp", data parallel over "dp"), whose float
weights make it equal the local run only to rounding.
"""

import pytest
import torch
import torch.distributed as dist

from frameworks import check, init, meshes, run_scenarios
from harness import run_job
from test_tensor_parallel import mlp, shards, sharded_mlp

pytestmark = pytest.mark.timeout(200)

SIZE = 4
NAMES = ("dp", "tp")


def ints(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).float()


X = ints((6, 4), 1)


def mine(rank):
    return ints((4,), 100 + rank)


def peers(rank, dim):
    """rank's group along dim, in group-rank order."""
    return [rank % 2, rank % 2 + 2] if dim == "dp" else [rank - rank % 2, rank - rank % 2 + 1]


def _layout(mesh):
    return {dim: torch.tensor(dist.get_process_group_ranks(mesh.get_group(dim)))
            for dim in NAMES} | {"coordinate": torch.tensor(mesh.get_coordinate())}


def _all_reduce(mesh):
    out = {}
    for dim in NAMES:
        t = mine(dist.get_rank())
        dist.all_reduce(t, group=mesh.get_group(dim))
        out[dim] = t
    return out


def _all_gather(mesh):
    out = {}
    for dim in NAMES:
        t = torch.empty(8)
        dist.all_gather_into_tensor(t, mine(dist.get_rank()), group=mesh.get_group(dim))
        out[dim] = t
    return out


def _reduce_scatter(mesh):
    out = {}
    for dim in NAMES:
        t = torch.empty(2)
        dist.reduce_scatter_tensor(t, mine(dist.get_rank()), group=mesh.get_group(dim))
        out[dim] = t
    return out


def _broadcast(mesh):
    """From group rank 1 along each dim."""
    out = {}
    for dim in NAMES:
        t = mine(dist.get_rank())
        dist.broadcast(t, group=mesh.get_group(dim), group_src=1)
        out[dim] = t
    return out


def _functional_all_reduce(mesh):
    """The functional collectives name a mesh dim instead of a group."""
    from torch.distributed import _functional_collectives as funcol
    return {dim: funcol.all_reduce(mine(dist.get_rank()), "sum", (mesh, i))
            for i, dim in enumerate(NAMES)}


def _partial_on_submesh(mesh):
    """A DTensor on the "dp" sub-mesh, Partial there: reduced over dp."""
    from torch.distributed.tensor import DTensor, Partial
    d = DTensor.from_local(mine(dist.get_rank()), mesh["dp"], [Partial()],
                           run_check=False)
    return d.full_tensor()


def _partial_shard(mesh):
    """Partial along dp, Shard(0) along tp; to Replicate along dp is an
    all_reduce over dp alone."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    d = DTensor.from_local(mine(dist.get_rank()), mesh, [Partial(), Shard(0)],
                           run_check=False)
    return d.redistribute(mesh, [Replicate(), Shard(0)]).to_local()


def _shard_2d(placements):
    def scenario(mesh):
        from torch.distributed.tensor import distribute_tensor
        d = distribute_tensor(X, mesh, placements)
        return [d.to_local().clone(), d.full_tensor()]
    return scenario


def _distribute(placements):
    """Each rank's source differs: the blocks must all be rank 0's (a
    scatter along dp from its row, then along tp from its column)."""
    def scenario(mesh):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(ints((6, 4), 10 + dist.get_rank()), mesh,
                                 placements).to_local()
    return scenario


def _shard_swap(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor
    d = distribute_tensor(X, mesh, [Shard(0), Shard(1)])
    return d.redistribute(mesh, [Shard(1), Shard(0)]).to_local()


def _sharded_matmul(mesh):
    """Rows over dp, inner dim over tp: a Partial along tp."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    a = distribute_tensor(X, mesh, [Shard(0), Shard(1)])
    b = distribute_tensor(X.T, mesh, [Replicate(), Shard(0)])
    return (a @ b).full_tensor()


def _tensor_parallel_dp(mesh):
    """2-D parallelism: test_tensor_parallel's MLP sharded over the "tp"
    sub-mesh, each dp replica on a batch of its own, the shards'
    gradients then summed over "dp"."""
    model = sharded_mlp(mesh["tp"])
    model(ints((4, 8), 200 + mesh.get_local_rank("dp"))).pow(2).sum().backward()
    grads = [p.grad.to_local() for p in model.parameters()]
    for g in grads:
        dist.all_reduce(g, group=mesh.get_group("dp"))
    return grads


def scenarios():
    from torch.distributed.tensor import Replicate, Shard
    return {
        "layout": _layout,
        "all_reduce": _all_reduce,
        "all_gather": _all_gather,
        "reduce_scatter": _reduce_scatter,
        "broadcast": _broadcast,
        "functional_all_reduce": _functional_all_reduce,
        "partial_on_submesh": _partial_on_submesh,
        "partial_shard": _partial_shard,
        "distribute_shard_shard": _distribute([Shard(0), Shard(1)]),
        "distribute_replicate_shard": _distribute([Replicate(), Shard(1)]),
        "shard_shard": _shard_2d([Shard(0), Shard(1)]),
        "replicate_shard": _shard_2d([Replicate(), Shard(0)]),
        "shard_swap": _shard_swap,
        "sharded_matmul": _sharded_matmul,
        "tensor_parallel_dp": _tensor_parallel_dp,
    }


def _job(rank, size, store):
    init(rank, size, store)
    by_backend = meshes((2, 2), NAMES)
    out = run_scenarios(scenarios(), by_backend.__getitem__)
    dist.destroy_process_group()
    return out


def _sum(rank, dim):
    return sum(mine(p) for p in peers(rank, dim))


def _index(rank, dim):
    return peers(rank, dim).index(rank)


def _block(rank, dp_dim, tp_dim, t=X):
    """rank's block of t split along dp_dim by its dp coordinate, then
    along tp_dim by its tp coordinate (None: not split)."""
    for dim, index in ((dp_dim, rank // 2), (tp_dim, rank % 2)):
        if dim is not None:
            t = torch.chunk(t, 2, dim)[index]
    return t


def _tensor_parallel_dp_reference(rank):
    """Both replicas' batches through the whole MLP, gradients summed."""
    model = mlp()
    for replica in range(2):
        model(ints((4, 8), 200 + replica)).pow(2).sum().backward()
    return shards([p.grad for p in model.parameters()], rank % 2, 2)


REFERENCES = {
    "layout": lambda r: {"dp": torch.tensor(peers(r, "dp")),
                         "tp": torch.tensor(peers(r, "tp")),
                         "coordinate": torch.tensor([r // 2, r % 2])},
    "all_reduce": lambda r: {d: _sum(r, d) for d in NAMES},
    "all_gather": lambda r: {d: torch.cat([mine(p) for p in peers(r, d)]) for d in NAMES},
    "reduce_scatter": lambda r: {d: _sum(r, d).chunk(2)[_index(r, d)] for d in NAMES},
    "broadcast": lambda r: {d: mine(peers(r, d)[1]) for d in NAMES},
    "functional_all_reduce": lambda r: {d: _sum(r, d) for d in NAMES},
    "partial_on_submesh": lambda r: _sum(r, "dp"),
    "partial_shard": lambda r: _sum(r, "dp"),
    "distribute_shard_shard": lambda r: _block(r, 0, 1, ints((6, 4), 10)),
    "distribute_replicate_shard": lambda r: _block(r, None, 1, ints((6, 4), 10)),
    "shard_shard": lambda r: [_block(r, 0, 1), X],
    "replicate_shard": lambda r: [_block(r, None, 0), X],
    "shard_swap": lambda r: _block(r, 1, 0),
    "sharded_matmul": lambda r: X @ X.T,
    "tensor_parallel_dp": _tensor_parallel_dp_reference,
}
ROUNDED = {"tensor_parallel_dp"}     # float weights: local sums round otherwise


_results = []



@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_2d_mesh_matches_gloo_and_local(name):
    if not _results:
        _results.append(run_job(SIZE, _job, timeout=180))
    check(_results[0], name, REFERENCES[name], exact_reference=name not in ROUNDED)
