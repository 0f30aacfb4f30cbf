"""Lifetimes across the binding: endpoints are cached, requests keep their
memory, dropped and orphaned objects neither crash nor corrupt memory."""

import gc
import threading

import numpy as np
import pytest

from c_peer import assert_bytes_equal, local_pair, pattern
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000


def test_one_endpoint_object_per_connection(transport):
    a, b, ab, ba = local_pair(transport)
    assert a.connect(b.address(), timeout_ms=WAIT_MS) is ab
    assert ab.peer_id == b.id and ba.peer_id == a.id
    assert ab.transport == transport and ba.transport == transport
    assert ab.status == _C.OK and ab.context is a
    assert ab == ab and hash(ab) == hash(ab) and ab != ba
    buf = bytearray(4)
    r = b.recv_any(buf, tag=3)
    ab.send(b"ping", tag=3).wait(timeout_ms=WAIT_MS)
    assert r.wait(timeout_ms=WAIT_MS).ep is ba
    a.close()
    b.close()


def test_request_keeps_its_buffer_until_complete(transport):
    a, b, ab, ba = local_pair(transport)
    buf = bytearray(16)
    r = ba.recv(buf, tag=1)
    with pytest.raises(BufferError):
        buf.extend(b"x")                         # acquired while pending
    ab.send(b"0123456789abcdef", tag=1).wait(timeout_ms=WAIT_MS)
    r.wait(timeout_ms=WAIT_MS)
    buf.extend(b"x")                             # let go once complete
    assert bytes(buf) == b"0123456789abcdefx"
    a.close()
    b.close()


def test_dropped_pending_recv_is_canceled(transport):
    a, b, ab, ba = local_pair(transport)
    r = ba.recv(bytearray(8), tag=1)
    del r
    gc.collect()
    # The message goes to the next receive, not to the dropped one.
    buf = bytearray(8)
    r2 = ba.recv(buf, tag=1)
    ab.send(b"survivor", tag=1).wait(timeout_ms=WAIT_MS)
    r2.wait(timeout_ms=WAIT_MS)
    assert bytes(buf) == b"survivor"
    a.close()
    b.close()


def test_dropped_pending_send_keeps_its_memory(transport):
    """A send dropped before anyone received it, with its array dropped
    too: the receive that comes later must still get the right bytes."""
    a, b, ab, ba = local_pair(transport)
    n = 16 << 20
    data = pattern(n, 42)
    ab.send(data, tag=5)                          # Request dropped at once
    del data
    gc.collect()
    filler = [np.full(n, 0xEE, dtype=np.uint8) for _ in range(2)]  # reuse freed memory
    got = np.zeros(n, dtype=np.uint8)
    ba.recv(got, tag=5).wait(timeout_ms=WAIT_MS)
    assert_bytes_equal(got, pattern(n, 42), "send whose Request was dropped")
    del filler
    a.close()
    b.close()


def test_close_fails_pending_and_later_calls(transport):
    a, b, ab, ba = local_pair(transport)
    mr = a.reg_mr(np.zeros(4096, dtype=np.uint8))
    r = ab.recv(bytearray(8), tag=1)
    a.close()
    with pytest.raises(_C.SlimeClosedError) as e:
        r.wait(timeout_ms=WAIT_MS)
    assert e.value.status == _C.ERR_CLOSED
    with pytest.raises(_C.SlimeClosedError):
        ab.send(b"x")
    with pytest.raises(_C.SlimeClosedError):
        a.connect(b.address())
    assert ab.status == _C.ERR_CLOSED
    ab.close()                                    # harmless after the context
    mr.dereg()                                    # MRs stay valid to deregister
    # The other side sees its peer go.
    r2 = ba.recv(bytearray(8), tag=1)
    with pytest.raises((_C.SlimePeerLostError, _C.SlimeClosedError)):
        r2.wait(timeout_ms=WAIT_MS)
    b.close()


def test_endpoint_close_fails_its_pending_requests(transport):
    a, b, ab, ba = local_pair(transport)
    r = ab.recv(bytearray(8), tag=1)
    ab.close()
    with pytest.raises(_C.SlimeClosedError):
        r.wait(timeout_ms=WAIT_MS)
    a.close()
    b.close()


def test_objects_outlive_their_context_reference(transport):
    """Dropping the Context first is safe: its children keep it alive."""
    a, b, ab, ba = local_pair(transport)
    region = np.zeros(4096, dtype=np.uint8)
    mr = b.reg_mr(region)
    desc = mr.desc()
    del a, b
    gc.collect()
    local = pattern(4096, 9).copy()
    local_mr = ab.context.reg_mr(local)
    ab.write(local_mr, 0, desc, 0, 4096).wait(timeout_ms=WAIT_MS)
    r = ba.recv(bytearray(1), tag=1)
    ab.send(b"!", tag=1).wait(timeout_ms=WAIT_MS)
    r.wait(timeout_ms=WAIT_MS)
    assert_bytes_equal(region, pattern(4096, 9), "write through orphaned objects")
    del ab, ba, mr, local_mr, r
    gc.collect()


def test_wait_all_and_many_threads(transport):
    a, b, ab, ba = local_pair(transport)
    count = 32
    bufs = [np.zeros(1000 + i, dtype=np.uint8) for i in range(count)]
    recvs = [ba.recv(bufs[i], tag=i) for i in range(count)]
    errors = []

    def sender(lo, hi):
        try:
            for i in range(lo, hi):
                ab.send(pattern(1000 + i, i), tag=i).wait(timeout_ms=WAIT_MS)
        except BaseException as exc:    # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(k, k + 8)) for k in range(0, count, 8)]
    for t in threads:
        t.start()
    _C.wait_all(recvs, timeout_ms=WAIT_MS)
    for t in threads:
        t.join(WAIT_MS / 1000)
    assert not errors, errors
    for i in range(count):
        assert recvs[i].bytes == 1000 + i
        assert_bytes_equal(bufs[i], pattern(1000 + i, i), f"message {i}")
    _C.wait_all([], timeout_ms=0)
    with pytest.raises(TypeError):
        _C.wait_all([object()])
    pending = ba.recv(bytearray(1), tag=999)
    with pytest.raises(_C.SlimeTimeoutError):
        _C.wait_all([recvs[0], pending], timeout_ms=100)
    assert pending.cancel()
    with pytest.raises(_C.SlimeCanceledError):
        _C.wait_all([recvs[0], pending])
    a.close()
    b.close()


class _Interrupted(Exception):
    pass


def test_a_signal_interrupts_a_long_wait(transport):
    """wait() waits in slices and runs signal handlers between them, so
    Ctrl-C (or any handler that raises) ends a long wait."""
    import signal

    a, b, ab, ba = local_pair(transport)
    r = ab.recv(bytearray(8), tag=1)

    def handler(signum, frame):
        raise _Interrupted()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            r.wait(timeout_ms=60000)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert r.status == _C.INPROGRESS             # interrupted, not failed
    assert r.cancel()
    with pytest.raises(_C.SlimeCanceledError):
        r.wait(timeout_ms=WAIT_MS)
    a.close()
    b.close()


def test_close_while_other_threads_wait(transport):
    """close() from one thread while others are inside wait() on requests
    of that context: the waits end with SlimeClosedError, nothing crashes."""
    import time

    for round_ in range(10):
        a, b, ab, ba = local_pair(transport)
        reqs = [ab.recv(bytearray(8), tag=k) for k in range(4)]
        outcomes = []

        def waiter(r):
            try:
                r.wait(timeout_ms=WAIT_MS)
                outcomes.append("completed")
            except _C.SlimeError as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=waiter, args=(r,)) for r in reqs]
        for t in threads:
            t.start()
        time.sleep(0.005 * (round_ % 4))        # vary where the waiters are
        a.close()
        for t in threads:
            t.join(WAIT_MS / 1000)
        assert outcomes == ["SlimeClosedError"] * 4
        b.close()
