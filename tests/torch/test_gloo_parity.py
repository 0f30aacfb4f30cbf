"""The c10d::Backend entry points Gloo implements for CPU tensors beyond
the catalog of test_collectives.py, against Gloo at 2 and 3 ranks: the
coalesced collectives (cases_coalesced.py), sparse all_reduce
(cases_sparse.py), all_to_all_single's split forms
(cases_alltoall_splits.py) and the choices c10d leaves to a backend
(cases_backend_hooks.py).  The same machinery as test_collectives.py: one
job per world size runs every case."""

import pytest

import cases
from harness import run_job

pytestmark = pytest.mark.timeout(240)

SIZES = (2, 3)
MODULES = ("cases_coalesced", "cases_sparse", "cases_alltoall_splits",
           "cases_backend_hooks")
_jobs = {}


NAMES = list(cases.load_cases(MODULES))


def _run(rank, size, store):
    return cases.run_cases(rank, size, store, modules=MODULES)


def outcomes(size):
    if size not in _jobs:
        try:
            _jobs[size] = run_job(size, _run, timeout=200)
        except Exception as exc:  # every case of this size fails with it
            _jobs[size] = exc
    if isinstance(_jobs[size], Exception):
        raise _jobs[size]
    return _jobs[size]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", SIZES)
def test_matches_gloo(size, name):
    failures = [f"rank {r}:\n{per_rank[name]}"
                for r, per_rank in enumerate(outcomes(size)) if per_rank[name]]
    assert not failures, "\n".join(failures)
