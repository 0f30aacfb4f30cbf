"""One-sided read / write / write_imm and batches between two processes."""

import numpy as np
import pytest

from c_peer import (Peer, accept_from_test, assert_bytes_equal,
                    connect_to_peer, pattern)
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000
N = (4 << 20) + 17                          # odd on purpose


def regions_peer(link, transport, n):
    """Exposes SRC (pattern seed 1, read by the test) and DST (zeros,
    written by the test); checks DST after each write_imm."""
    ctx, ep = accept_from_test(link, transport)
    src = pattern(n, 1).copy()
    dst = np.zeros(n, dtype=np.uint8)
    src_mr = ctx.reg_mr(src, access=_C.ACCESS_REMOTE_READ)
    dst_mr = ctx.reg_mr(dst)
    assert src_mr.length == n and src_mr.addr == src.ctypes.data
    first_imm = ep.imm_recv()                # posted before the write arrives
    link.put((src_mr.desc(), dst_mr.desc()))

    first_imm.wait(timeout_ms=WAIT_MS)
    expected = np.zeros(n, dtype=np.uint8)
    half = n // 2
    expected[:half] = pattern(half, 2)        # plain write, completed before
    expected[half:] = pattern(n - half, 3)    # the write_imm
    assert_bytes_equal(dst, expected, "DST after write + write_imm")
    link.put(first_imm.imm)

    assert link.get() == "second imm sent"
    second_imm = ep.imm_recv().wait(timeout_ms=WAIT_MS)   # arrived earlier
    expected[:4096] = pattern(4096, 4)
    assert_bytes_equal(dst, expected, "DST after the second write_imm")
    link.put(second_imm.imm)

    assert link.get() == "bye"
    src_mr.dereg()
    dst_mr.dereg()
    assert not dst_mr.registered


def test_read_write_write_imm(transport):
    with Peer(regions_peer, transport, N) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        src_desc, dst_desc = peer.get()
        assert len(src_desc) == _C.DESC_SIZE == 64
        assert _C.desc_length(src_desc) == N
        assert _C.desc_length(dst_desc) == N

        local = np.zeros(N, dtype=np.uint8)
        mr = ctx.reg_mr(local)
        # Whole-region read.
        ep.read(mr, 0, src_desc, 0, N).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(local, pattern(N, 1), "read of SRC")
        # Read at offsets on both sides.
        local[:] = 0
        ep.read(mr, 100, src_desc, 4099, 70001).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(local[100:100 + 70001], pattern(N, 1)[4099:4099 + 70001],
                           "offset read")
        assert not local[:100].any() and not local[100 + 70001:].any()

        half = N // 2
        local[:half] = pattern(half, 2)
        local[half:] = pattern(N - half, 3)
        ep.write(mr, 0, dst_desc, 0, half).wait(timeout_ms=WAIT_MS)
        ep.write_imm(mr, half, dst_desc, half, N - half, 0xC0FFEE).wait(timeout_ms=WAIT_MS)
        assert peer.get() == 0xC0FFEE

        # An immediate that arrives before the peer asks for it is kept.
        local[:4096] = pattern(4096, 4)
        ep.write_imm(local_mr=mr, local_off=0, remote_desc=dst_desc, remote_off=0,
                     length=4096, imm=0xFFFFFFFF).wait(timeout_ms=WAIT_MS)
        peer.put("second imm sent")
        assert peer.get() == 0xFFFFFFFF

        # Reading back what was written checks it from this side too.
        back = np.zeros(N, dtype=np.uint8)
        back_mr = ctx.reg_mr((back.ctypes.data, back.nbytes))
        ep.read(back_mr, 0, dst_desc, 0, N).wait(timeout_ms=WAIT_MS)
        expected = local.copy()
        expected[:4096] = pattern(4096, 4)
        assert_bytes_equal(back, expected, "DST read back")
        peer.put("bye")
        peer.finish()
        back_mr.dereg()
        mr.dereg()


def batch_peer(link, transport):
    """Answers the test's batch with a batch of its own."""
    ctx, ep = accept_from_test(link, transport)
    src = pattern(1 << 20, 7).copy()
    src_mr = ctx.reg_mr(src)
    link.put(src_mr.desc())
    got_a = np.zeros(3000, dtype=np.uint8)
    got_b = bytearray(5)
    req = ctx.batch([
        (_C.OP_RECV, ep, got_a, 11),
        {"op": "recv", "ep": ep, "buf": got_b, "tag": 12},
        (_C.OP_SEND, ep, pattern(777, 13), 13),
        {"op": _C.OP_SEND, "ep": ep, "buf": b""},          # tag 0, empty
    ])
    req.wait(timeout_ms=WAIT_MS)
    assert_bytes_equal(got_a, pattern(3000, 11), "batch recv a")
    assert bytes(got_b) == b"hello"
    assert link.get() == "bye"
    src_mr.dereg()


def test_batches_of_two_sided_and_one_sided_ops(transport):
    with Peer(batch_peer, transport) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        src_desc = peer.get()
        got = np.zeros(777, dtype=np.uint8)
        empty = bytearray(0)
        req = ctx.batch([
            (_C.OP_SEND, ep, pattern(3000, 11), 11),
            (_C.OP_SEND, ep, b"hello", 12),
            (_C.OP_RECV, ep, got, 13),
            (_C.OP_RECV, ep, empty, 0),
        ])
        req.wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(got, pattern(777, 13), "batch recv")

        local = np.zeros(1 << 20, dtype=np.uint8)
        mr = ctx.reg_mr(local)
        # Four reads of disjoint pieces, in tuple and dict form, one request.
        pieces = [(0, 0, 1000), (1000, 5000, 3000), (4000, 100000, 65536)]
        ops = [(_C.OP_READ, ep, mr, lo, src_desc, ro, n) for lo, ro, n in pieces]
        ops.append({"op": "read", "ep": ep, "local": mr, "local_off": 200000,
                    "remote": src_desc, "remote_off": 300000, "length": 4097})
        ctx.batch(ops).wait(timeout_ms=WAIT_MS)
        src = pattern(1 << 20, 7)
        for lo, ro, n in pieces + [(200000, 300000, 4097)]:
            assert_bytes_equal(local[lo:lo + n], src[ro:ro + n], f"batch read at {lo}")
        # A write batch, checked by reading back.
        local[:8192] = pattern(8192, 8)
        ctx.batch([(_C.OP_WRITE, ep, mr, 0, src_desc, 500000, 4096),
                   (_C.OP_WRITE_IMM, ep, mr, 4096, src_desc, 504096, 4096, 77)]
                  ).wait(timeout_ms=WAIT_MS)
        back = np.zeros(8192, dtype=np.uint8)
        back_mr = ctx.reg_mr(back)
        ep.read(back_mr, 0, src_desc, 500000, 8192).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(back, pattern(8192, 8), "batch write read back")
        peer.put("bye")
        peer.finish()


def test_batch_rejects_bad_ops_before_posting(transport):
    a = _C.Context(transport=transport)
    b = _C.Context(transport=transport)
    ep = a.connect(b.address(), timeout_ms=WAIT_MS)
    b.accept(timeout_ms=WAIT_MS)
    with pytest.raises(ValueError, match="op 1"):
        a.batch([(_C.OP_SEND, ep, b"x", 1), (99, ep, b"x")])
    with pytest.raises(ValueError, match="op 0"):
        a.batch([{"op": "send", "ep": ep, "buf": b"x", "bogus": 1}])
    with pytest.raises(ValueError, match="op 0"):
        a.batch([(_C.OP_READ, ep)])
    with pytest.raises(TypeError):
        a.batch([(_C.OP_SEND, "not an endpoint", b"x")])
    with pytest.raises(ValueError, match="another Context"):
        b.batch([(_C.OP_SEND, ep, b"x")])
    # Nothing was posted: a receive on b sees only the next real message.
    buf = bytearray(8)
    r = b.recv_any(buf, tag=1)
    a.batch([(_C.OP_SEND, ep, b"real", 1)]).wait(timeout_ms=WAIT_MS)
    assert r.wait(timeout_ms=WAIT_MS).bytes == 4 and bytes(buf[:4]) == b"real"
    a.close()
    b.close()
