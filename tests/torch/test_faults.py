"""A rank killed (SIGKILL) or stopped (SIGSTOP) in the middle of a large
transfer or a collective makes the others raise, naming it, long before
the group's timeout; nothing hangs.

A killed rank's connections close, which the survivors see at once.  A
stopped one keeps them open: the survivors find it by peer liveness (a
peer waited on and silent is pinged; no answer within
DLSLIME_PEER_SILENCE_MS fails it).  A rank merely busy in Python is not
dead: its progress thread answers for it.

The kill comes from outside the victim (a shell it starts, which notes
the time), at a moment when every rank is inside the op's loop."""

import datetime
import os
import signal
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

LONG = datetime.timedelta(seconds=60)   # the group's timeout: never reached
BOUND_S = 10        # survivors raise well within this (measured: about 1 s)
JOB_S = 45
KILL_AFTER_S = 0.3  # into the op's loop
LOOP_S = 30         # survivors keep at the op this long at most
BIG = 16 << 20      # floats: 64 MiB


def _arm_killer(sig, note):
    """Has a shell send sig to this process KILL_AFTER_S from now, after
    writing the time and our pid to note."""
    pid = os.getpid()
    script = f'sleep {KILL_AFTER_S}; echo "$(date +%s.%N) {pid}" > {note}.tmp; ' \
             f'mv {note}.tmp {note}; kill -{sig} {pid}'
    subprocess.Popen(["sh", "-c", script])


def _loop(fn):
    """Runs fn until it raises; the error, and the time it came."""
    end = time.monotonic() + LOOP_S
    while time.monotonic() < end:
        try:
            fn()
        except RuntimeError as exc:    # DistBackendError is one
            return exc, time.time()
    return None, time.time()


def _ops(op, rank):
    """The op each rank repeats, as a function."""
    if op == "send_recv":                   # each way in turn: the stop finds either
        buf, peer = torch.ones(BIG), 1 - rank
        if rank == 0:
            return lambda: (dist.send(buf, dst=peer), dist.recv(buf, src=peer))
        return lambda: (dist.recv(buf, src=peer), dist.send(buf, dst=peer))
    if op == "all_reduce":
        buf = torch.ones(BIG // 4)
        return lambda: dist.all_reduce(buf)
    buf = torch.ones(BIG // 4)
    return lambda: dist.broadcast(buf, src=0)


def _faulty(rank, size, store, op, sig, note):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    victim = size - 1
    step = _ops(op, rank)
    step()                                  # connected, warm
    dist.barrier()
    if rank == victim:
        _arm_killer(sig, note)
        _loop(step)
        return None                         # never reached
    exc, when = _loop(step)
    assert exc is not None, "the op kept succeeding with a dead peer"
    deadline = time.monotonic() + BOUND_S
    while not os.path.exists(note):         # the killer notes, then kills
        assert time.monotonic() < deadline, f"the op failed, but rank {victim} was not killed: {exc}"
        time.sleep(0.01)
    with open(note) as f:
        killed_at, pid = f.read().split()
    if sig == "STOP":                       # its sockets stay open: end it
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:          # another survivor did, and it was reaped
            pass
    return {"error": f"{type(exc).__name__}: {exc}", "after_s": when - float(killed_at)}


CASES = [(tp, sig, op) for tp in ("shm", "tcp") for sig in ("KILL", "STOP")
         for op in ("send_recv", "all_reduce", "broadcast")]


@pytest.mark.parametrize("transport,sig,op", CASES, ids=["-".join(c) for c in CASES])
def test_lost_rank_makes_the_others_raise(transport, sig, op, tmp_path):
    size = 2 if op == "send_recv" else 3
    victim = size - 1
    note = str(tmp_path / "killed")
    started = time.monotonic()
    results = run_job(size, _faulty, op, sig, note, timeout=JOB_S, may_exit={victim},
                      env={"DLSLIME_TRANSPORT": transport})
    for rank, out in enumerate(results[:victim]):
        print(f"{transport} {sig} {op} rank {rank}: {out['after_s'] * 1000:.0f} ms: {out['error'][:200]}")
        assert 0 < out["after_s"] < BOUND_S, out     # for the kill, not before it
        assert f"rank {victim}" in out["error"], out
    # the whole job, spawn to reaped victim, ends well before the timeout
    assert time.monotonic() - started < JOB_S


SILENCE_MS = 300


def _busy_sender(rank, size, store):
    from dlslime_torch import _C, runtime
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=LONG)
    dist.barrier()
    buf = torch.zeros(BIG)
    if rank == 0:
        dist.recv(buf, src=1)               # waits out rank 1's busy spell
        return buf[-1].item(), runtime.current().counter(_C.COUNTER_PEER_PINGS)
    time.sleep(3 * SILENCE_MS / 1000)       # Python sleeps: the GIL is free
    end = time.monotonic() + 3 * SILENCE_MS / 1000
    n = 0
    while time.monotonic() < end:           # Python computes: holds the GIL
        n += 1
    dist.send(buf + 7, dst=0)
    return n


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_rank_busy_in_python_is_not_declared_dead(transport):
    (got, pings), _ = run_job(2, _busy_sender, timeout=JOB_S,
                              env={"DLSLIME_TRANSPORT": transport, "DLSLIME_PEER_SILENCE_MS": str(SILENCE_MS)})
    assert got == 7.0
    # rank 1 was silent for 6 silence limits: it was pinged, and answered
    assert pings >= 3, pings
