"""A Python callback chained on a Work's Future never stalls the core.

The callback needs the GIL.  Were it run on the thread that completed the
request (the progress thread for send/recv, the collective worker for a
collective), a main thread holding the GIL for a while (C code: a long
regex, a numpy op; here a Python loop with the interpreter's switch
interval raised so it never hands the GIL over) would stop that thread:
no pongs, so the peers declare a live rank dead, and nothing it
transfers moves.  The shim runs such completions on a thread of its own.

Rank 1 arms callbacks on an all_reduce and two irecvs, then holds the GIL
for three silence limits while both complete and rank 0 waits on a
receive from it; rank 0 must get its data, and nobody is declared lost.
"""

import datetime
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

TIMEOUT = datetime.timedelta(seconds=20)  # the group's: a stall fails, not hangs
SILENCE_MS = 500
N = 1024
BIG = 16 << 20  # floats, 64 MiB: its send needs rank 1's progress thread


def _hold_gil(seconds):
    """Keeps the GIL for seconds: no other thread runs Python meanwhile."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(10 * seconds)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(saved)


def _rank0(store, gloo):
    store.wait(["armed"])
    dist.send(torch.arange(N, dtype=torch.float32) + 3, dst=1)
    dist.send(torch.full((N,), 9.0), dst=1)
    t = torch.full((N,), 1.0)
    dist.all_reduce(t)
    got = torch.zeros(BIG)
    # Waits while rank 1 holds its GIL: peer liveness pings rank 1, whose
    # progress thread must answer.
    dist.irecv(got, src=1).wait()
    ref = torch.full((N,), 1.0)
    dist.all_reduce(ref, group=gloo)
    return {"reduced": t.tolist(), "ref": ref.tolist(),
            "got_right": torch.equal(got, torch.arange(BIG, dtype=torch.float32) * 5)}


def _rank1(store, gloo):
    main = threading.get_ident()
    ran = []

    def note(name):
        def cb(fut):
            ran.append((name, threading.get_ident() != main))
            return fut.value()[0] * 2
        return cb

    t = torch.full((N,), 2.0)
    reduced = dist.all_reduce(t, async_op=True).get_future().then(note("all_reduce"))
    buf = torch.zeros(N)
    received = dist.irecv(buf, src=0).get_future().then(note("recv"))
    # Matched after the first: its callback runs after the first's.
    second = dist.irecv(torch.zeros(N), src=0).get_future().then(note("recv2"))
    store.set("armed", "1")
    _hold_gil(3 * SILENCE_MS / 1000)
    dist.send(torch.arange(BIG, dtype=torch.float32) * 5, dst=0)
    ref = torch.full((N,), 2.0)
    dist.all_reduce(ref, group=gloo)
    return {"reduced": reduced.wait().tolist(), "ref": (ref * 2).tolist(),
            "received": received.wait().tolist(), "second": second.wait().tolist(),
            "ran": ran}


def _job(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    gloo = dist.new_group(backend="gloo")
    dist.barrier()
    out = _rank0(store, gloo) if rank == 0 else _rank1(store, gloo)
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_callbacks_do_not_stall_a_rank_holding_the_gil(transport):
    r0, r1 = run_job(2, _job, timeout=60,
                     env={"DLSLIME_TRANSPORT": transport, "DLSLIME_PEER_SILENCE_MS": str(SILENCE_MS)})
    assert r0["got_right"]
    assert r0["reduced"] == r0["ref"] == [3.0] * N
    assert r1["reduced"] == r1["ref"] == [6.0] * N
    assert r1["received"] == [float((i + 3) * 2) for i in range(N)]
    assert r1["second"] == [18.0] * N
    # Every callback ran, off the main thread (which was holding the GIL
    # when the requests completed), the receives' in their completion order.
    assert sorted(r1["ran"]) == [("all_reduce", True), ("recv", True), ("recv2", True)], r1["ran"]
    assert [name for name, _ in r1["ran"] if name != "all_reduce"] == ["recv", "recv2"], r1["ran"]
