"""SlimeRPC through dlslime_torch._C: two contexts in this process (one
serves in threads, one calls), over both transports.  Replies are
checked against the request they answer, byte for byte."""

import threading
import time

import numpy as np
import pytest

from c_peer import assert_bytes_equal, pattern
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

PORT, DIGEST = 77, 0xD16E57
ECHO, INPLACE, FAIL, SLOW = 1, 2, 3, 4
SIZES = [0, 1, 1000, 65536 - 48, 65536 - 47, 65536, 300_000, 1 << 20, 16 << 20]


class Served:
    """A server on its own context with `threads` threads answering:
    ECHO: the payload; INPLACE: the payload reversed, built in the reply
    buffer; FAIL: an error whose payload is the request; SLOW: sleeps the
    first byte's tenths of a second, then echoes.  A subclass serves
    other METHODS by overriding answer()."""

    METHODS = [ECHO, INPLACE, FAIL, SLOW]

    def __init__(self, transport, threads=2, **opts):
        self.ctx = _C.Context(transport=transport)
        self.srv = _C.RpcServer(self.ctx, PORT, DIGEST, self.METHODS, **opts)
        self.threads = [threading.Thread(target=self._loop) for _ in range(threads)]
        self.errors = []
        for t in self.threads:
            t.start()

    def _loop(self):
        while True:
            try:
                call = self.srv.next(timeout_ms=200)
            except _C.SlimeClosedError:
                return
            if call is None:
                continue
            try:
                self.answer(call, memoryview(call))
            except Exception as exc:  # reported by close()
                self.errors.append(repr(exc))

    def answer(self, call, data):
        if call.method == ECHO:
            call.reply(data)
        elif call.method == INPLACE:
            out = memoryview(call.reply_buffer(len(data)))
            out[:] = bytes(data)[::-1]
            out.release()
            call.commit(len(data))
        elif call.method == FAIL:
            call.fail(data)
        elif call.method == SLOW:
            time.sleep(data[0] / 10)
            try:
                call.reply(data)
            except _C.SlimeTruncatedError:
                pass  # the client gave up on a bulk reply: dropped
            except _C.SlimePeerLostError:
                pass  # the test ended first and closed the client

    def close(self):
        self.srv.close()
        for t in self.threads:
            t.join()
        self.ctx.close()
        assert not self.errors, self.errors


@pytest.fixture
def channel(transport):
    served = Served(transport)
    ctx = _C.Context(transport=transport)
    ep = ctx.connect(served.ctx.address(), timeout_ms=10000)
    cli = _C.RpcClient(ctx, ep, PORT, DIGEST, credits=4)
    yield ctx, ep, cli
    cli.close()
    ctx.close()
    served.close()


def call(cli, method, data):
    r = cli.call(method, data)
    remote_error = r.wait(timeout_ms=30000)
    return r, remote_error


def test_every_size_and_kind(channel):
    _, _, cli = channel
    assert cli.credits == 4
    for seed, n in enumerate(SIZES):
        data = pattern(n, seed)
        r, err = call(cli, ECHO, data)
        assert not err
        assert_bytes_equal(memoryview(r), data, f"{n}-byte echo")
        r, err = call(cli, INPLACE, data)
        assert not err
        assert_bytes_equal(memoryview(r), data[::-1].copy(), f"{n}-byte in-place reply")
        r, err = call(cli, FAIL, data)
        assert err and r.remote_error
        assert_bytes_equal(memoryview(r), data, f"{n}-byte error payload")


def test_many_in_flight_fewer_credits(channel):
    _, _, cli = channel
    datas = [pattern(50 + 7919 * (i % 20), 100 + i) for i in range(64)]
    reqs = [cli.call(ECHO if i % 2 else INPLACE, d) for i, d in enumerate(datas)]
    for i in reversed(range(64)):
        assert reqs[i].wait(timeout_ms=30000) is False
        want = datas[i] if i % 2 else datas[i][::-1].copy()
        assert_bytes_equal(memoryview(reqs[i]), want, f"call {i}")


def test_concurrent_callers(channel):
    _, _, cli = channel
    failures = []

    def caller(k):
        try:
            for j in range(30):
                d = pattern(10 + 997 * j, 1000 * k + j)
                r, _ = call(cli, ECHO, d)
                assert_bytes_equal(memoryview(r), d, f"caller {k} call {j}")
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_unknown_method_is_an_error_reply(channel):
    _, _, cli = channel
    r, err = call(cli, 12345, b"x")
    assert err
    kind, text, _ = bytes(r).split(b"\0")
    assert kind == b"RpcError" and b"unknown method" in text


def test_mismatched_definition_is_refused(channel):
    ctx, ep, _ = channel
    with pytest.raises(_C.SlimeRefusedError, match="service definition mismatch"):
        _C.RpcClient(ctx, ep, PORT, DIGEST + 1, timeout_ms=10000)
    with pytest.raises(_C.SlimeTimeoutError, match="is a server for this service running"):
        _C.RpcClient(ctx, ep, PORT + 1, DIGEST, timeout_ms=300)


def test_late_replies_are_dropped(channel):
    _, _, cli = channel
    slow_small = np.full(10, 5, dtype=np.uint8)        # 0.5 s, inline reply
    slow_big = np.full(300_000, 5, dtype=np.uint8)     # 0.5 s, bulk reply
    late = [cli.call(SLOW, slow_small), cli.call(SLOW, slow_big)]
    for r in late:
        with pytest.raises(_C.SlimeTimeoutError):
            r.wait(timeout_ms=50)
        r.abandon()
    with pytest.raises(_C.SlimeCanceledError):
        late[0].wait(timeout_ms=10)
    # later calls get their own replies, never a late one
    for i in range(8):
        d = pattern(5000 + i, 300 + i)
        r, err = call(cli, ECHO, d)
        assert not err
        assert_bytes_equal(memoryview(r), d, f"call {i} after the abandoned ones")


def test_payload_view_outlives_the_call(transport):
    """A view of a request kept past the reply stays valid (detached)."""
    ctx_s = _C.Context(transport=transport)
    srv = _C.RpcServer(ctx_s, PORT, DIGEST, [ECHO])
    ctx_c = _C.Context(transport=transport)
    ep = ctx_c.connect(ctx_s.address(), timeout_ms=10000)
    kept = []

    def serve_one():
        call = srv.next(timeout_ms=20000)
        view = memoryview(call)
        call.reply(b"ok")
        kept.append(view)

    t = threading.Thread(target=serve_one)
    t.start()
    cli = _C.RpcClient(ctx_c, ep, PORT, DIGEST)
    data = pattern(4000, 9)
    r, _ = call(cli, ECHO, data)
    t.join()
    assert bytes(r) == b"ok"
    # later requests land in the same slots: the kept view must not change
    for i in range(20):
        r2 = cli.call(ECHO, pattern(4000, 50 + i))
        with pytest.raises(_C.SlimeTimeoutError):
            r2.wait(timeout_ms=1)  # nobody serves: it stays queued
        r2.abandon()
    assert_bytes_equal(kept[0], data, "kept view")
    cli.close()
    srv.close()
    ctx_c.close()
    ctx_s.close()
