"""Failures surface as the right exception class, with the C library's
detail text, over both transports."""

import numpy as np
import pytest

from c_peer import (Peer, accept_from_test, connect_to_peer, finish_request,
                    local_pair, pattern)
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000


def check_error(excinfo, cls, status):
    err = excinfo.value
    assert isinstance(err, _C.SlimeError) and isinstance(err, RuntimeError)
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert err.status == status
    assert err.status_name == _C.status_name(status)
    # The C library said why, and the message carries it.
    assert err.detail, f"no detail text in {err!r}"
    assert err.detail in str(err)
    assert _C.strerror(status) in str(err)


def exposing_peer(link, transport):
    """Exposes a 64 KiB region, a read-only one and a deregistered one."""
    ctx, ep = accept_from_test(link, transport)
    data = pattern(65536, 1).copy()
    ro = pattern(4096, 2).copy()
    gone = np.zeros(4096, dtype=np.uint8)
    mr = ctx.reg_mr(data)
    ro_mr = ctx.reg_mr(ro, access=_C.ACCESS_REMOTE_READ)
    gone_mr = ctx.reg_mr(gone)
    gone_desc = gone_mr.desc()
    gone_mr.dereg()
    link.put((mr.desc(), ro_mr.desc(), gone_desc))
    assert link.get() == "bye"
    # Nothing the test tried may have changed the regions.
    assert np.array_equal(data, pattern(65536, 1))
    assert np.array_equal(ro, pattern(4096, 2))
    assert not gone.any()


def test_one_sided_errors(transport):
    with Peer(exposing_peer, transport) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        desc, ro_desc, gone_desc = peer.get()
        local = np.zeros(65536, dtype=np.uint8)
        mr = ctx.reg_mr(local)

        # Past the end of the remote region.
        with pytest.raises(_C.SlimeAccessError) as e:
            finish_request(ep.read(mr, 0, desc, 65536 - 10, 20))
        check_error(e, _C.SlimeAccessError, _C.ERR_ACCESS)
        # Past the end of the local region.
        with pytest.raises(_C.SlimeAccessError) as e:
            finish_request(ep.read(mr, 65536 - 10, desc, 0, 20))
        check_error(e, _C.SlimeAccessError, _C.ERR_ACCESS)
        # A region the peer deregistered (so no longer registered at all).
        with pytest.raises(_C.SlimeAccessError) as e:
            finish_request(ep.read(mr, 0, gone_desc, 0, 16))
        check_error(e, _C.SlimeAccessError, _C.ERR_ACCESS)
        # A region the peer exposed for reading only.
        with pytest.raises(_C.SlimeAccessError) as e:
            finish_request(ep.write(mr, 0, ro_desc, 0, 16))
        check_error(e, _C.SlimeAccessError, _C.ERR_ACCESS)
        # Zero length is an invalid argument, also a ValueError.
        with pytest.raises(ValueError) as e:
            finish_request(ep.read(mr, 0, desc, 0, 0))
        check_error(e, _C.SlimeInvalidError, _C.ERR_INVAL)

        # The endpoint still works after all that.
        ep.read(mr, 0, desc, 0, 65536).wait(timeout_ms=WAIT_MS)
        assert np.array_equal(local, pattern(65536, 1))

        # A local region deregistered on this side.
        mr.dereg()
        with pytest.raises(_C.SlimeAccessError, match="deregistered"):
            ep.read(mr, 0, desc, 0, 16)
        peer.put("bye")
        peer.finish()


def oversize_sender_peer(link, transport):
    ctx, ep = accept_from_test(link, transport)
    # A message that needs a rendezvous fails the sender too.
    with pytest.raises(_C.SlimeTruncatedError) as e:
        ep.send(pattern(1 << 20, 3), tag=7).wait(timeout_ms=WAIT_MS)
    check_error(e, _C.SlimeTruncatedError, _C.ERR_TRUNCATED)
    # A small one may have completed at the sender before it was matched
    # (it was copied out eagerly); if it fails, it fails as truncated.
    try:
        ep.send(pattern(100, 4), tag=9).wait(timeout_ms=WAIT_MS)
    except _C.SlimeTruncatedError:
        pass
    # The pair is still usable.
    ep.send(b"after", tag=8).wait(timeout_ms=WAIT_MS)
    assert link.get() == "bye"


def test_truncation_fails_the_receive(transport):
    with Peer(oversize_sender_peer, transport) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        for tag in (7, 9):
            small = bytearray(10)
            with pytest.raises(_C.SlimeTruncatedError) as e:
                ep.recv(small, tag=tag).wait(timeout_ms=WAIT_MS)
            check_error(e, _C.SlimeTruncatedError, _C.ERR_TRUNCATED)
        buf = bytearray(16)
        r = ep.recv(buf, tag=8).wait(timeout_ms=WAIT_MS)
        assert bytes(buf[:r.bytes]) == b"after"
        peer.put("bye")
        peer.finish()


def wrong_token_dialer_peer(link, transport, token, server_addr):
    ctx = _C.Context(transport=transport, token=token)
    with pytest.raises(_C.SlimeRefusedError) as e:
        ctx.connect(server_addr, timeout_ms=WAIT_MS)
    check_error(e, _C.SlimeRefusedError, _C.ERR_REFUSED)
    # The right token (as str: the same bytes) gets in.
    good = _C.Context(transport=transport, token="secret-job-1")
    ep = good.connect(server_addr, timeout_ms=WAIT_MS)
    ep.send(b"in", tag=1).wait(timeout_ms=WAIT_MS)


def test_wrong_token_is_refused(transport):
    server = _C.Context(transport=transport, token=b"secret-job-1")
    with Peer(wrong_token_dialer_peer, transport, b"secret-job-2",
              server.address()) as peer:
        ep = server.accept(timeout_ms=WAIT_MS)   # only the good dialer
        buf = bytearray(2)
        ep.recv(buf, tag=1).wait(timeout_ms=WAIT_MS)
        assert bytes(buf) == b"in"
        peer.finish()
        with pytest.raises(_C.SlimeTimeoutError):
            server.accept(timeout_ms=300)        # the refused one never shows
    server.close()


def test_recv_nobody_answers_times_out_and_stays_pending(transport):
    a, b, ab, ba = local_pair(transport)
    buf = bytearray(64)
    r = ab.recv(buf, tag=99)
    with pytest.raises(_C.SlimeTimeoutError) as e:
        r.wait(timeout_ms=200)
    assert isinstance(e.value, TimeoutError)
    assert e.value.status == _C.ERR_TIMEOUT
    assert r.status == _C.INPROGRESS
    assert r.test() is False
    # Still pending: a late message completes it.
    ba.send(b"late", tag=99).wait(timeout_ms=WAIT_MS)
    assert r.wait(timeout_ms=WAIT_MS).bytes == 4 and bytes(buf[:4]) == b"late"

    r2 = ab.recv(buf, tag=100)
    assert r2.cancel() is True
    with pytest.raises(_C.SlimeCanceledError) as e:
        r2.wait(timeout_ms=WAIT_MS)
    check_error(e, _C.SlimeCanceledError, _C.ERR_CANCELED)
    assert r2.status == _C.ERR_CANCELED
    assert r2.error == e.value.detail
    with pytest.raises(_C.SlimeCanceledError):
        r2.test()
    a.close()
    b.close()


def victim_peer(link, transport):
    ctx, ep = accept_from_test(link, transport)
    link.put("ready")
    link.get(timeout=120)                       # killed while waiting here


def test_peer_killed_fails_pending_ops_with_peer_lost(transport):
    with Peer(victim_peer, transport) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        assert peer.get() == "ready"
        buf = bytearray(16)
        r = ep.recv(buf, tag=1)
        imm = ep.imm_recv()
        peer.kill()
        # Well within the wait's budget, not by running it out.
        with pytest.raises(_C.SlimePeerLostError) as e:
            r.wait(timeout_ms=15000)
        assert isinstance(e.value, ConnectionError)
        check_error(e, _C.SlimePeerLostError, _C.ERR_PEER_LOST)
        with pytest.raises(_C.SlimePeerLostError):
            imm.wait(timeout_ms=15000)
        assert ep.status == _C.ERR_PEER_LOST
        # New operations to the lost peer fail too; the context lives on.
        with pytest.raises((_C.SlimePeerLostError, _C.SlimeClosedError)):
            finish_request(ep.send(b"x", tag=1))
        assert ctx.address()


def test_connect_errors(transport):
    ctx = _C.Context(transport=transport)
    with pytest.raises(_C.SlimeInvalidError) as e:
        ctx.connect(b"this is not an address blob", timeout_ms=2000)
    check_error(e, _C.SlimeInvalidError, _C.ERR_INVAL)
    gone = _C.Context(transport=transport)
    addr = gone.address()
    gone.close()
    with pytest.raises(_C.SlimePeerLostError) as e:
        ctx.connect(addr, timeout_ms=5000)
    check_error(e, _C.SlimePeerLostError, _C.ERR_PEER_LOST)
    ctx.close()


def test_python_argument_errors(transport):
    a, b, ab, ba = local_pair(transport)
    mr = a.reg_mr(bytearray(64))
    desc = mr.desc()
    with pytest.raises(ValueError):
        ab.send(b"x", tag=-1)
    with pytest.raises(ValueError):
        ab.send(b"x", tag=1 << 64)
    with pytest.raises(TypeError):
        ab.send("text is not bytes")
    with pytest.raises(TypeError):
        ab.recv(b"read-only")                    # a receive needs writable memory
    with pytest.raises(TypeError):
        a.reg_mr(b"read-only")
    with pytest.raises(ValueError):
        ab.read(mr, 0, desc[:10], 0, 8)          # a descriptor is 64 bytes
    with pytest.raises(ValueError):
        ab.read(mr, -1, desc, 0, 8)
    with pytest.raises(ValueError):
        ab.write_imm(mr, 0, desc, 0, 8, 1 << 32)
    with pytest.raises(ValueError):
        ab.recv((0, -5))
    with pytest.raises(TypeError):
        ab.recv((1, 2, 3))
    with pytest.raises(ValueError):
        ab.recv(bytearray(4)).wait(timeout_ms=-1)
    with pytest.raises(TypeError):
        ab.read(bytearray(8), 0, desc, 0, 8)     # local must be a MemoryRegion
    with pytest.raises(ValueError, match="another Context"):
        ba.read(mr, 0, desc, 0, 8)
    with pytest.raises(TypeError):
        _C.Context(transport=5)
    with pytest.raises(ValueError):
        _C.Context(tcp_port=70000)
    with pytest.raises(TypeError):
        _C.Endpoint()
    a.close()
    b.close()
