"""TORCH_DISTRIBUTED_DEBUG=DETAIL on "dlslime" as on Gloo: torch wraps
the group in its collective checker (ProcessGroupWrapper), which compares
every collective's op, dtypes and shapes across the ranks before it runs.
Without it, neither backend checks what the bytes mean: ranks that pass
float32 and int32 tensors of the same size all-reduce them silently, and
a broadcast whose root sends more than a receiver expects fails on the
receiver only.  With it, every rank raises, the root too."""

import datetime

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _outcome(fn):
    try:
        fn()
        return None
    except Exception as exc:  # the text is what the test compares
        return str(exc)


def _mismatches(rank, size, store, backend, cases=("dtype", "shape")):
    import dlslime_torch  # noqa: F401  registers the backend
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=20))
    dtype = torch.float32 if rank == 0 else torch.int32
    ops = {
        # the same bytes on every rank, a different dtype on rank 1
        "dtype": lambda: dist.all_reduce(torch.ones(4, dtype=dtype)),
        # rank 0 (the root) sends 8 elements, the others expect 4
        "shape": lambda: dist.broadcast(torch.ones(8 if rank == 0 else 4), src=0),
    }
    out = {case: _outcome(ops[case]) for case in cases}
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("backend", ["dlslime", "gloo"])
def test_detail_mode_names_mismatched_collectives_on_every_rank(backend):
    results = run_job(2, _mismatches, backend, env=DETAIL)
    for rank, out in enumerate(results):
        for case, error in out.items():
            assert error is not None, f"{backend}, rank {rank}: the {case} mismatch passed"
            # torch's checker's words: proof that the wrapper ran
            assert "Detected mismatch between collectives" in error, \
                f"{backend}, rank {rank}, {case}: {error}"


def test_without_detail_a_dtype_mismatch_passes_as_on_gloo():
    """What DETAIL is for: without it the bytes are summed as each rank
    reads them, on both backends (no check, as in Gloo and NCCL)."""
    for backend in ("dlslime", "gloo"):
        results = run_job(2, _mismatches, backend, ("dtype",))
        assert results == [{"dtype": None}] * 2, (backend, results)
