"""dlslime_torch.rdma across processes: shm and tcp, world sizes 2 and 3.

One job per (transport, world size) runs every case of cases_rdma.py
(contents byte for byte, batches of hundreds of ops, concurrent access to
disjoint slices, every error case); each test below reports one case, so
a failure names it and the rank.
"""

import pytest

from cases_rdma import CASES, run_rdma_cases
from harness import run_job

pytestmark = pytest.mark.timeout(200)

_jobs = {}


def outcomes(transport, size):
    key = (transport, size)
    if key not in _jobs:
        try:
            _jobs[key] = run_job(size, run_rdma_cases, transport, timeout=150,
                                 env={"DLSLIME_TRANSPORT": transport})
        except Exception as exc:  # every case of this job fails with it
            _jobs[key] = exc
    if isinstance(_jobs[key], Exception):
        raise _jobs[key]
    return _jobs[key]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("size", (2, 3))
@pytest.mark.parametrize("transport", ("shm", "tcp"))
def test_rdma(transport, size, name):
    failures = [f"rank {r}:\n{per_rank[name]}"
                for r, per_rank in enumerate(outcomes(transport, size)) if per_rank[name]]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("transport", ("shm", "tcp"))
def test_dead_peer_fails_operations(transport):
    from cases_rdma import run_peer_dies
    result = run_job(2, run_peer_dies, transport, timeout=120, may_exit=(1,),
                     env={"DLSLIME_TRANSPORT": transport})[0]
    pending, later, text = result
    assert pending in ("RdmaPeerLostError", "RdmaError"), result
    assert later in ("RdmaPeerLostError", "RdmaError"), result
    assert "rank 1" in text, text
