"""Watched memory (_C.mem_watch) and the send/recv registrations kept in it.

On verbs a large message from or into a watched buffer registers it once
and reuses the registration (Context.counter); an unwatched buffer is
registered per message.  Other transports register nothing.
"""

import numpy as np
import pytest

from c_peer import (Peer, accept_from_test, assert_bytes_equal,
                    connect_to_peer, pattern)
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000
MSG = 1 << 20  # above the verbs rendezvous minimum
SENDS = 4


def _counters(ctx):
    return (ctx.counter(_C.COUNTER_BUF_REGISTRATIONS),
            ctx.counter(_C.COUNTER_BUF_REG_REUSED))


def test_watch_bad_input_is_refused_and_changes_nothing():
    buf = np.zeros(4096, dtype=np.uint8)
    addr = buf.ctypes.data
    with pytest.raises(_C.SlimeInvalidError, match="bad range"):
        _C.mem_watch(addr, 0)
    with pytest.raises(_C.SlimeInvalidError, match="no watched range"):
        _C.mem_unwatch(addr)
    _C.mem_watch(addr + 64, 128)
    try:
        with pytest.raises(_C.SlimeInvalidError, match="overlaps"):
            _C.mem_watch(addr, 65)
        assert _C.mem_watched(addr + 64, 128)
        assert _C.mem_watched(addr + 100, 1)
        assert not _C.mem_watched(addr + 63, 2)
        assert not _C.mem_watched(addr + 64, 129)
    finally:
        _C.mem_unwatch(addr + 64)
    assert not _C.mem_watched(addr + 64, 1)
    with pytest.raises(TypeError):
        _C.mem_watch("x", 1)


def receive_peer(link, transport, watched):
    ctx, ep = accept_from_test(link, transport)
    buf = np.zeros(MSG, dtype=np.uint8)
    if watched:
        _C.mem_watch(buf.ctypes.data, MSG)
    before = _counters(ctx)
    for tag in range(SENDS):
        ep.recv(buf, tag=tag).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(buf, pattern(MSG, tag), f"message {tag} at the peer")
    after = _counters(ctx)
    if watched:
        _C.mem_unwatch(buf.ctypes.data)
    return ep.transport, after[0] - before[0], after[1] - before[1]


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwatched"])
def test_large_messages_keep_registrations_only_in_watched_memory(transport, watched):
    with Peer(receive_peer, transport, watched) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        buf = np.zeros(MSG, dtype=np.uint8)
        if watched:
            _C.mem_watch(buf.ctypes.data, MSG)
        before = _counters(ctx)
        for tag in range(SENDS):
            buf[:] = pattern(MSG, tag)
            ep.send(buf, tag=tag).wait(timeout_ms=WAIT_MS)
        after = _counters(ctx)
        if watched:
            _C.mem_unwatch(buf.ctypes.data)
        peer_transport, peer_made, peer_reused = peer.finish()
        made, reused = after[0] - before[0], after[1] - before[1]
        if transport != "verbs":
            expect = (0, 0)
        elif watched:
            expect = (1, SENDS - 1)
        else:
            expect = (SENDS, 0)
        assert peer_transport == transport
        assert (made, reused) == expect, "sender"
        assert (peer_made, peer_reused) == expect, "receiver"
        ctx.close()
