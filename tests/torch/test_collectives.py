"""Every op of the "dlslime" backend against Gloo, at world sizes 1 to 4.

One job per world size runs the whole catalog (cases.py) and reports
each case; the tests below look up their case, so a failure names the
op, dtype and reduce op.  The job for a size starts when its first test
asks for it.
"""

import pytest

from cases import load_cases, run_cases
from harness import run_job

pytestmark = pytest.mark.timeout(240)

SIZES = (1, 2, 3, 4)
CASES = load_cases()
_jobs = {}


def outcomes(size, transport=None):
    key = (size, transport)
    if key not in _jobs:
        try:
            env = {"DLSLIME_TRANSPORT": transport} if transport else None
            _jobs[key] = run_job(size, run_cases, timeout=200, env=env)
        except Exception as exc:  # every case of this size fails with it
            _jobs[key] = exc
    if isinstance(_jobs[key], Exception):
        raise _jobs[key]
    return _jobs[key]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("size", SIZES)
def test_matches_gloo(size, name):
    failures = [f"rank {r}:\n{per_rank[name]}"
                for r, per_rank in enumerate(outcomes(size)) if per_rank[name]]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", (2, 3))
def test_all_cases_over_tcp(size):
    """The same catalog with every connection forced onto TCP."""
    failures = [f"rank {r}, {name}:\n{text}"
                for r, per_rank in enumerate(outcomes(size, "tcp"))
                for name, text in per_rank.items() if text]
    assert not failures, "\n".join(failures)
