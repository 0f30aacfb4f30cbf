"""The module's surface: constants, exception classes, Context basics,
memory regions.  One process, no peer."""

import gc

import numpy as np
import pytest

from dlslime_torch import _C

pytestmark = pytest.mark.timeout(60)


def test_constants_mirror_the_header():
    assert (_C.OK, _C.INPROGRESS, _C.ERR_INVAL, _C.ERR_TIMEOUT) == (0, 1, -1, -3)
    assert (_C.ERR_PEER_LOST, _C.ERR_REFUSED, _C.ERR_ACCESS) == (-4, -5, -6)
    assert (_C.ERR_TRUNCATED, _C.ERR_CANCELED, _C.ERR_CLOSED, _C.ERR_BUSY) == (-7, -8, -12, -13)
    assert _C.ACCESS_ALL == _C.ACCESS_REMOTE_READ | _C.ACCESS_REMOTE_WRITE == 3
    assert [_C.OP_SEND, _C.OP_RECV, _C.OP_READ, _C.OP_WRITE, _C.OP_WRITE_IMM] == [1, 2, 3, 4, 5]
    assert _C.DESC_SIZE == 64
    assert _C.status_name(_C.ERR_PEER_LOST) == "SLIME_ERR_PEER_LOST"
    assert _C.strerror(_C.ERR_PEER_LOST)


def test_exception_hierarchy():
    assert issubclass(_C.SlimeError, RuntimeError)
    for cls in (_C.SlimeTimeoutError, _C.SlimePeerLostError, _C.SlimeRefusedError,
                _C.SlimeAccessError, _C.SlimeTruncatedError, _C.SlimeCanceledError,
                _C.SlimeInvalidError, _C.SlimeClosedError):
        assert issubclass(cls, _C.SlimeError)
    assert issubclass(_C.SlimeTimeoutError, TimeoutError)
    assert issubclass(_C.SlimePeerLostError, ConnectionError)
    assert issubclass(_C.SlimeInvalidError, ValueError)


def test_context_basics(transport):
    with _C.Context(transport=transport) as ctx:
        addr = ctx.address()
        assert isinstance(addr, bytes) and 0 < len(addr) <= _C.ADDRESS_MAX
        assert ctx.address() == addr
        assert isinstance(ctx.id, int) and ctx.id == ctx.id
        assert not ctx.closed
        other = _C.Context(transport=transport, token="job")
        assert other.id != ctx.id
        other.close()
        other.close()                            # idempotent
    assert ctx.closed
    with pytest.raises(_C.SlimeClosedError):
        ctx.address()
    with pytest.raises(_C.SlimeClosedError):
        ctx.accept(timeout_ms=10)
    with pytest.raises(_C.SlimeClosedError):
        ctx.reg_mr(bytearray(8))


def test_accept_times_out(transport):
    ctx = _C.Context(transport=transport)
    with pytest.raises(_C.SlimeTimeoutError) as e:
        ctx.accept(timeout_ms=100)
    assert e.value.status == _C.ERR_TIMEOUT
    ctx.close()


def test_memory_region_views_its_buffer(transport):
    ctx = _C.Context(transport=transport)
    arr = np.arange(1000, dtype=np.float32)
    mr = ctx.reg_mr(arr)
    assert mr.addr == arr.ctypes.data and mr.length == arr.nbytes
    assert mr.registered and mr.context is ctx
    desc = mr.desc()
    assert isinstance(desc, bytes) and len(desc) == 64
    assert _C.desc_length(desc) == arr.nbytes
    assert _C.desc_length(bytearray(desc)) == arr.nbytes
    mr.dereg()
    mr.dereg()                                   # idempotent
    assert not mr.registered
    with pytest.raises(_C.SlimeAccessError):
        mr.desc()

    raw = np.zeros(4096, dtype=np.uint8)
    raw_mr = ctx.reg_mr((raw.ctypes.data, raw.nbytes), access=_C.ACCESS_REMOTE_READ)
    assert raw_mr.addr == raw.ctypes.data and raw_mr.length == 4096
    raw_mr.dereg()
    with pytest.raises(_C.SlimeInvalidError):
        ctx.reg_mr(bytearray(0))                 # the C library wants len > 0
    with pytest.raises((TypeError, ValueError)):  # the exporter picks which
        ctx.reg_mr(np.zeros((8, 8))[:, ::2])     # not contiguous
    ctx.close()


def test_region_keeps_its_buffer_acquired(transport):
    ctx = _C.Context(transport=transport)
    buf = bytearray(4096)
    mr = ctx.reg_mr(buf)
    with pytest.raises(BufferError):
        buf.extend(b"x")                         # cannot move under the library
    mr.dereg()
    buf.extend(b"x")                             # released by dereg
    held = bytearray(64)
    mr2 = ctx.reg_mr(held)
    del mr2
    gc.collect()
    held.extend(b"x")                            # released when freed
    ctx.close()
