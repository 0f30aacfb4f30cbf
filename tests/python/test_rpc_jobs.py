"""SlimeRPC over many jobs in one process's life: rpc.init, shutdown and
init again in a new TCPStore, three times on both sides; two jobs at
once with their own tokens; a peer of one job refused by the other."""

import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist

from rpc_services import Calc
from dlslime_torch import rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(180)

ROUNDS = 3
STORE_TIMEOUT = datetime.timedelta(seconds=60)


def _round_store(store, i, host):
    """Round i's own TCPStore, hosted by the driver, found by the worker
    through the harness's store."""
    if host:
        own = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
        store.set(f"port{i}", str(own.port))
        return own
    port = int(store.get(f"port{i}"))
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=STORE_TIMEOUT)


def reinit_session(rank, size, store, transport):
    """Rank 0 drives, rank 1 serves; both join a new job every round."""
    tokens = []
    for i in range(ROUNDS):
        own = _round_store(store, i, host=rank == 0)
        job = rpc.init("driver" if rank == 0 else "worker", store=own)
        tokens.append(job.token)
        if rank == 1:
            with rpc.Server(Calc(), threads=1).start():
                own.wait(["stop"])
        else:
            with rpc.proxy("worker", Calc, timeout=30) as calc:
                t = torch.arange(1000.0) * i
                assert torch.equal(calc.add(t, i).wait(), t + i)
                assert bytes(calc.echo(b"round %d" % i).wait()) == b"round %d" % i
            own.set("stop", "1")
        rpc.shutdown()
        store.set(f"left{i}{rank}", "1")   # the driver's store lives until both have left
        if rank == 0:
            store.wait([f"left{i}1"])
    assert len(set(tokens)) == ROUNDS       # a token per job, not the first one kept
    return tokens


def test_reinit_with_new_stores(transport):
    tokens = run_job(2, reinit_session, transport, env={"DLSLIME_TRANSPORT": transport})
    assert tokens[0] == tokens[1]


def two_jobs_session(rank, size, store, transport):
    """Rank 0 is in jobs A and B at once; rank 1 serves in A, rank 2 in B."""
    store_a, store_b = dist.PrefixStore("jobA", store), dist.PrefixStore("jobB", store)
    if rank == 1:                                  # the default job's module-level API
        job = rpc.init("server1", store=store_a)
        with rpc.Server(Calc(), threads=1).start():
            store.wait(["stop"])
        rpc.shutdown()
        return job.token
    if rank == 2:                                  # a Job's own API, no default job
        with rpc.Job("server2", store_b) as job, job.Server(Calc(), threads=1).start():
            store.wait(["stop"])
        return job.token
    job_a = rpc.init("driver", store=store_a)
    with pytest.raises(rpc.RpcError, match="rpc.Job"):
        rpc.init("driver", store=store_b)     # the default job is taken
    with rpc.Job("driver", store_b) as job_b:
        assert job_a.token != job_b.token and job_a.ctx is not job_b.ctx
        with job_a.proxy("server1", Calc, timeout=30) as a, job_b.proxy("server2", Calc, timeout=30) as b:
            assert a.add(1, 2).wait() == 3 and b.add(3, 4).wait() == 7
            assert a.pack().wait()["pid"] != b.pack().wait()["pid"]
        # server2 of job B, published in job A under another name: its
        # context checks our job A token against B's and refuses us
        store_a.set("dlslime_rpc/addr/impostor", store_b.get("dlslime_rpc/addr/server2"))
        store_a.set(f"dlslime_rpc/svc/impostor/{rpc.service.spec_of(Calc).name}", b"1")
        with pytest.raises(rpc.RpcError, match="impostor.*job token mismatch"):
            job_a.proxy("impostor", Calc, timeout=10)
        # while job B still works
        with job_b.proxy("server2", Calc, timeout=30) as b:
            assert b.add(5, 5).wait() == 10
    with pytest.raises(rpc.RpcError, match="shut down"):
        job_b.proxy("server2", Calc, timeout=5)
    with rpc.proxy("server1", Calc, timeout=30) as a:   # the default job is job A
        assert a.add(2, 2).wait() == 4
    store.set("stop", "1")
    rpc.shutdown()
    return job_a.token, job_b.token


def test_two_jobs_at_once(transport):
    (a, b), token_a, token_b = run_job(3, two_jobs_session, transport, env={"DLSLIME_TRANSPORT": transport})
    assert (a, b) == (token_a, token_b)
