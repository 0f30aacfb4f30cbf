"""The two-part payloads and the caller's reply buffer of SlimeRPC,
through dlslime_torch._C (two contexts in this process, both transports):
RpcClient.call(..., tail=) and RpcCall.reply(..., tail=) send the
concatenation of two buffers (the tail from its own memory when the
message goes by bulk), and call(..., out=) lands the reply in the
caller's buffer, or, when it does not fit, in memory of the request's
own with nothing lost.  Every reply is checked byte for byte."""

import numpy as np
import pytest

from c_peer import assert_bytes_equal, pattern
from test_rpc_c import DIGEST, ECHO, FAIL, PORT, Served
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

PARTS = 9  # replies with the request split in two parts: head, then tail
SLOT = 65536
# (head bytes, tail bytes): inline whole; a small head inline with a bulk
# tail; a head too large for a slot (head and tail joined into one bulk)
SPLITS = [(0, 0), (10, 20), (100, SLOT - 48 - 100), (100, SLOT), (0, 1 << 20), (3000, 300_000),
          (SLOT, 1000), (70_000, 1 << 20), (5, 16 << 20)]


class PartsServed(Served):
    """Served, plus PARTS: the request's bytes as the reply, given to
    reply() as a head of a third of them and the rest as its tail."""

    METHODS = [ECHO, FAIL, PARTS]

    def answer(self, call, data):
        if call.method == PARTS:
            k = len(data) // 3
            call.reply(data[:k], tail=data[k:])
        else:
            super().answer(call, data)


@pytest.fixture
def channel(transport):
    served = PartsServed(transport)
    ctx = _C.Context(transport=transport)
    ep = ctx.connect(served.ctx.address(), timeout_ms=10000)
    cli = _C.RpcClient(ctx, ep, PORT, DIGEST, credits=4)
    yield cli
    cli.close()
    ctx.close()
    served.close()


def wait_ok(r):
    assert r.wait(timeout_ms=30000) is False
    return r


def test_request_in_two_parts(channel):
    for seed, (h, t) in enumerate(SPLITS):
        data = pattern(h + t, seed)
        head, tail = data[:h].copy(), data[h:].copy()
        r = wait_ok(channel.call(ECHO, head, tail))
        assert_bytes_equal(memoryview(r), data, f"echo of a {h} + {t}-byte request")


def test_reply_in_two_parts(channel):
    for seed, (h, t) in enumerate(SPLITS):
        data = pattern(h + t, seed + 100)
        r = wait_ok(channel.call(PARTS, data))
        assert_bytes_equal(memoryview(r), data, f"a {h + t}-byte reply in two parts")


def test_reply_into_the_callers_buffer(channel):
    out = np.zeros(17 << 20, dtype=np.uint8)
    for seed, n in enumerate([0, 1, 1000, SLOT - 48, SLOT, 300_000, 16 << 20]):
        data = pattern(n, seed + 200)
        for method in (ECHO, PARTS):
            r = wait_ok(channel.call(method, data, out=out))
            assert r.in_out
            view = memoryview(r)
            assert view.nbytes == n
            if n:   # the reply's memory is the caller's buffer itself
                assert np.frombuffer(view, dtype=np.uint8).ctypes.data == out.ctypes.data
            view.release()
            assert_bytes_equal(out[:n], data, f"a {n}-byte reply landed in out")


def test_out_buffer_too_small_loses_nothing(channel):
    for seed, n in enumerate([100, 5000, 300_000, 4 << 20]):
        data = pattern(n, seed + 300)
        out = np.full(n - 1, 0xAB, dtype=np.uint8)
        r = wait_ok(channel.call(ECHO, data, out=out))
        assert not r.in_out
        assert_bytes_equal(memoryview(r), data, f"a {n}-byte reply too large for out")
        assert (out == 0xAB).all(), "a reply that does not fit must not touch out"
    # an error reply never lands in out, and the channel goes on
    out = np.zeros(1 << 20, dtype=np.uint8)
    data = pattern(1000, 7)
    r = channel.call(FAIL, data, out=out)
    assert r.wait(timeout_ms=30000) is True and not r.in_out
    assert_bytes_equal(memoryview(r), data, "error payload")
    assert not out.any()
    r = wait_ok(channel.call(ECHO, data, out=out))
    assert r.in_out and bytes(out[:1000]) == data.tobytes()


def test_bad_arguments_are_refused(channel):
    with pytest.raises(TypeError, match="writable"):
        channel.call(ECHO, b"abc", out=b"read-only")
    with pytest.raises(TypeError):
        channel.call(ECHO, b"abc", tail=12)
