"""Failures are worded as torch words them, next to Gloo's words for the
same failure in the same job: torch's own tests match time-outs and lost
peers with " (Timed out|closed|timeout) ", and monitored_barrier's
messages by rank ("Rank 1 failed to pass monitoredBarrier", "Rank 0
timed out in monitoredBarrier", "Rank 2 successfully reached
monitoredBarrier, but received errors ...")."""

import datetime
import os
import re
import signal

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

LONG = datetime.timedelta(seconds=60)
TORCH_TIMEOUT_WORDS = re.compile(" (Timed out|closed|timeout) ")


def _error_of(call):
    try:
        call()
    except RuntimeError as exc:
        return str(exc)
    return None


def _barrier_timeout(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    one_s = datetime.timedelta(seconds=1)
    groups = {"dlslime": dist.new_group(timeout=one_s),
              "gloo": dist.new_group(backend="gloo", timeout=one_s)}
    out = {}
    for name, group in groups.items():
        if rank == 0:   # alone in the barrier
            out[name] = _error_of(lambda: dist.barrier(group=group))
            store.set(f"barrier-done/{name}", "1")
        else:
            store.wait([f"barrier-done/{name}"])
    # An aborted group fails what it still runs: rank 0's all_reduce,
    # which rank 1 never joins.
    group = dist.new_group()
    if rank == 0:
        work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
        dist.distributed_c10d._abort_process_group(group)
        out["aborted"] = _error_of(work.wait)
        store.set("abort-done", "1")
    else:
        store.wait(["abort-done"])
    return out


def test_barrier_timeout_and_abort_in_torch_words():
    out = run_job(2, _barrier_timeout)[0]
    assert out["gloo"] and TORCH_TIMEOUT_WORDS.search(out["gloo"]), out
    assert out["dlslime"] and TORCH_TIMEOUT_WORDS.search(out["dlslime"]), out
    # our detail stays after torch's words
    assert "dlslime: barrier failed: Timed out (SLIME_ERR_TIMEOUT" in out["dlslime"], out
    assert out["aborted"] and TORCH_TIMEOUT_WORDS.search(out["aborted"]), out
    assert "aborted or shut down: communicator closed (SLIME_ERR_CLOSED" in out["aborted"], out


def _peer_killed(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _error_of(lambda: dist.all_reduce(torch.ones(1000)))


def test_lost_peer_in_torch_words():
    message = run_job(2, _peer_killed, timeout=40, may_exit={1})[0]
    assert message and TORCH_TIMEOUT_WORDS.search(message), message
    assert "Connection closed by peer (SLIME_ERR_PEER_LOST" in message, message


def _monitored(rank, size, store):
    import dlslime_torch
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    short = datetime.timedelta(seconds=2)
    calls = {
        "dlslime": lambda group, timeout: dlslime_torch.monitored_barrier(group, timeout),
        "gloo": lambda group, timeout: dist.monitored_barrier(group, timeout),
    }
    out = {}
    # (scenario, the ranks that call, the barrier's timeout); a new pair of
    # groups each, as a rank that skips a call falls out of step.
    for scenario, callers, timeout in [("rank 0 alone, no time", {0}, datetime.timedelta(0)),
                                       ("rank 1 missing", {0, 2}, short),
                                       ("rank 2 missing", {0, 1}, short)]:
        groups = {"dlslime": dist.new_group(),
                  "gloo": dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=5))}
        for name, group in groups.items():
            if name == "gloo" and scenario == "rank 2 missing":
                continue   # the first two cover Gloo's words
            if rank in callers:
                out[(scenario, name)] = _error_of(lambda: calls[name](group, timeout))
            key = f"mb/{scenario}/{name}/"
            store.set(key + str(rank), "1")
            store.wait([key + str(r) for r in range(size)])
    return out


def test_monitored_barrier_in_gloos_words():
    results = run_job(3, _monitored, timeout=100)
    for name in ("gloo", "dlslime"):
        text = results[0][("rank 0 alone, no time", name)]
        assert text and "Rank 0 timed out in monitoredBarrier" in text, (name, text)
        text = results[0][("rank 1 missing", name)]
        assert text and "Rank 1 failed to pass monitoredBarrier" in text, (name, text)
        text = results[2][("rank 1 missing", name)]
        assert text and ("Rank 2 successfully reached monitoredBarrier, but received errors "
                         "while waiting for send/recv from rank 0") in text, (name, text)
    # The first missing rank in order is the one named.
    assert "Rank 2 failed to pass monitoredBarrier" in results[0][("rank 2 missing", "dlslime")]
    assert "Rank 1 successfully reached monitoredBarrier" in results[1][("rank 2 missing", "dlslime")]
