"""Failures surface as exceptions, never as hangs: a receive nobody
answers raises at the group's timeout, a killed rank makes the others
raise, and monitored_barrier names the ranks that did not arrive."""

import datetime
import os
import signal

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

LONG = datetime.timedelta(seconds=60)
SHORT = datetime.timedelta(seconds=2)


def _recv_timeout(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    short = dist.new_group([0, 1], timeout=SHORT)
    out = {}
    if rank == 0:
        try:
            dist.recv(torch.empty(4), src=1, group=short)      # nobody sends
        except dist.DistBackendError as exc:
            out["recv"] = str(exc)
        work = dist.irecv(torch.empty(4), src=1, tag=2, group=short)
        try:
            work.wait(datetime.timedelta(milliseconds=300))    # a wait's own timeout
        except dist.DistBackendError as exc:
            out["wait"] = str(exc)
        store.set("timed-out", "1")
        # The timed-out receives were canceled: the next message is this one's.
        later = torch.empty(4)
        dist.recv(later, src=1, group=short)
        out["later"] = later.tolist()
    else:
        store.wait(["timed-out"])
        dist.send(torch.arange(4.0), dst=0, group=short)
    dist.destroy_process_group()
    return out


def test_recv_without_sender_raises_at_the_timeout():
    out, _ = run_job(2, _recv_timeout)
    assert "recv from rank 1" in out["recv"] and "Timed out after 2000 ms" in out["recv"], out
    assert "recv from rank 1 (tag 2)" in out["wait"] and "300 ms" in out["wait"], out
    assert out["later"] == [0.0, 1.0, 2.0, 3.0]


def _killed_rank(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    dist.barrier()
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    errors = {}
    try:
        dist.all_reduce(torch.ones(1000))          # needs the dead rank
    except dist.DistBackendError as exc:
        errors["all_reduce"] = str(exc)
    try:
        dist.recv(torch.empty(2), src=size - 1)    # from the dead rank
    except dist.DistBackendError as exc:
        errors["recv"] = str(exc)
    # The group's timeout is 60 s and the job allows 40: these errors come
    # from seeing the peer die, not from a timeout.
    return errors


def test_killed_rank_makes_the_others_raise():
    results = run_job(3, _killed_rank, timeout=40, may_exit={2})
    for errors in results[:2]:
        assert set(errors) == {"all_reduce", "recv"}, errors
        assert "dlslime: all_reduce failed" in errors["all_reduce"], errors
        assert "SLIME_ERR_PEER_LOST" in errors["recv"], errors


def _monitored(rank, size, store):
    import dlslime_torch
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    gloo = dist.new_group(backend="gloo")
    messages = []
    if rank != size - 1:        # the last rank never arrives
        for call in (lambda: dlslime_torch.monitored_barrier(timeout=SHORT, wait_all_ranks=True),
                     lambda: dist.monitored_barrier(group=gloo, timeout=SHORT, wait_all_ranks=True)):
            try:
                call()
                messages.append(None)
            except RuntimeError as exc:
                messages.append(str(exc))
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(size)])
    return messages


def test_monitored_barrier_names_the_missing_rank_like_gloo():
    results = run_job(3, _monitored)
    slime, gloo = results[0]
    # Gloo's words, which tools may grep for.
    assert "Ranks 2 failed to pass monitoredBarrier in 2000 ms" in gloo, gloo
    assert "Ranks 2 failed to pass monitoredBarrier in 2000 ms" in slime, slime
    slime1, _ = results[1]           # rank 0 told rank 1 that it failed
    assert slime1 and "Rank 1 successfully reached monitoredBarrier" in slime1, slime1


def _short_message(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    out = {}
    for how in ("from", "any"):
        if rank == 0:
            dist.send(torch.arange(2.0), dst=1, tag=5)
            continue
        try:
            dist.recv(torch.empty(4), src=0 if how == "from" else None, tag=5)  # 16 bytes, 8 sent
            out[how] = None
        except RuntimeError as exc:
            out[how] = str(exc)
    # the group still works: nothing was left behind
    t = torch.ones(3)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


def test_a_message_that_does_not_fill_the_tensor_fails_the_recv():
    out = run_job(2, _short_message)[1]
    assert "recv from rank 0 (tag 5): expected a message of 16 bytes, got 8 bytes" in out["from"], out
    assert "recv from any source (tag 5): expected a message of 16 bytes, got 8 bytes" in out["any"], out
    assert out["after"] == [2.0, 2.0, 2.0]
