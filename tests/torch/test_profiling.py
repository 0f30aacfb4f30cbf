"""Under torch.profiler every op leaves a record named "dlslime:<op>"
with its tensors' shapes, as Gloo's do ("gloo:send"); without a profiler
the backend makes no record at all (a record per op costs an allocation
that nobody would read)."""

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)


def _records(prof):
    seen = {}
    for e in prof.events():
        if e.name.startswith(("dlslime:", "gloo:")):
            seen.setdefault(e.name, []).append((e.is_async, e.input_shapes))
    return seen


def _profiled_ops(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size)
    gloo = dist.new_group(backend="gloo")
    t = torch.ones(3)
    out = {}
    for name, group in (("dlslime", None), ("gloo", gloo)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            if rank == 0:
                dist.send(t, 1, group=group)
            else:
                dist.recv(t, 0, group=group)
            dist.all_reduce(t, group=group)
        out[name] = _records(prof)
    # profiling over, ops go on as before
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


def test_each_op_leaves_one_record_with_its_shapes_like_gloo():
    for rank, out in enumerate(run_job(2, _profiled_ops)):
        p2p = "send" if rank == 0 else "recv"
        assert out["dlslime"] == {f"dlslime:{p2p}": [(True, [[3]])],
                                  "dlslime:all_reduce": [(True, [[3]])]}, out
        assert set(out["gloo"]) == {f"gloo:{p2p}", "gloo:all_reduce"}, out  # the same ops, named alike
        assert out["after"] == [8.0, 8.0, 8.0], out
