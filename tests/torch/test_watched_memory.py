"""The backend wraps torch's CPU allocator so that large tensors are
watched memory (slime_mem_watch) from allocation to free: transports that
register send/recv buffers (verbs) keep those registrations, and drop them
when the tensor's memory goes back."""

import datetime

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

TIMEOUT = datetime.timedelta(seconds=30)
BIG = 1 << 20


def _watched(t):
    from dlslime_torch import _C
    return _C.mem_watched(t.data_ptr(), t.numel() * t.element_size())


def _allocations(rank, size, store):
    import dlslime_torch  # noqa: F401
    before = torch.empty(BIG, dtype=torch.uint8)
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    big = torch.empty(BIG, dtype=torch.uint8)
    small = torch.empty(1024, dtype=torch.uint8)
    seen = {"before": _watched(before), "big": _watched(big), "small": _watched(small)}
    addr = big.data_ptr()
    del big
    from dlslime_torch import _C
    seen["freed"] = _C.mem_watched(addr, 1)
    # memory reused for a new tensor is watched for that one
    again = torch.zeros(BIG // 4, dtype=torch.float32)
    seen["again"] = _watched(again)
    # raw allocations (as ops' workspaces use) go through the same deleter
    t = torch.arange(BIG, dtype=torch.int64).flip(0).sort().values
    seen["op_result"] = _watched(t) and bool((t == torch.arange(BIG)).all())
    # from 2 MiB tensors start on a huge-page boundary; allocated and freed
    # in turns (so freed memory is reused), each keeps its bytes
    huge = 2 << 20
    starts, kept = set(), True
    for i in range(64):
        n = huge + 4096 * (i % 5) + (i % 3)
        a = torch.full((n,), i % 251, dtype=torch.uint8)
        b = torch.full((n // 8,), i, dtype=torch.int64)
        starts |= {a.data_ptr() % huge, b.data_ptr() % huge}
        kept &= bool((a == i % 251).all()) and bool((b == i).all()) and _watched(a) and _watched(b)
        del a, b
    seen["huge_aligned"] = starts == {0} and kept
    seen["1MiB_any_start"] = torch.empty(BIG, dtype=torch.uint8).data_ptr() % huge != 0
    # watched tensors below 2 MiB start on a page boundary (the wrapped
    # allocator's large blocks start 64 bytes into one), and keep their bytes
    starts, kept = set(), True
    for i, n in enumerate((256 << 10, (256 << 10) + 17, BIG, BIG + 4096 + 3, huge - 1)):
        a = torch.full((n,), i + 1, dtype=torch.uint8)
        starts.add(a.data_ptr() % 4096)
        kept &= bool((a == i + 1).all()) and _watched(a)
        del a
    seen["page_aligned"] = starts == {0} and kept
    # the data moves as before
    x = torch.full((BIG // 4,), float(rank + 1))
    dist.all_reduce(x)
    seen["all_reduce"] = bool((x == sum(range(1, size + 1))).all())
    dist.destroy_process_group()
    return seen


def test_large_tensors_are_watched_from_allocation_to_free():
    for seen in run_job(2, _allocations):
        assert seen == {"before": False, "big": True, "small": False, "freed": False,
                        "again": True, "op_result": True, "huge_aligned": True,
                        "1MiB_any_start": True, "page_aligned": True, "all_reduce": True}, seen


def _switched_off(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    watched = _watched(torch.empty(BIG, dtype=torch.uint8))
    dist.destroy_process_group()
    return watched


def test_dlslime_watch_cpu_allocator_0_leaves_the_allocator_alone():
    assert run_job(1, _switched_off, env={"DLSLIME_WATCH_CPU_ALLOCATOR": "0"}) == [False]
