"""Floods of what a connected peer can make us hold (issue 13, item 6).

A peer's rendezvous announcements, empty eager messages, read requests
whose replies it never reads, and immediates nobody asks for used to
queue without bound (300k announcements: +28 MiB).  Every such item now
counts against one per-peer budget (DLSLIME_PEER_ITEMS_MAX); a peer over
it is disconnected with an error naming it, the target's memory stays
where it was, and genuine peers are still served.
"""

import socket

import pytest

import rogue
from c_peer import Peer
from target import assert_serves, target

pytestmark = pytest.mark.timeout(180)

FLOOD = 300_000
# the budget's default holds 16384 items (about 1.5 MiB of them); the
# old code grew by 16-60 MiB under these floods
GROWTH_MAX_KIB = 4 << 10
# announced, never sent: no receive is posted for this tag
TAG = 0x5EED


def flood_frames(kind):
    if kind == "announcements":
        return b"".join(rogue.frame(rogue.F_RTS, a=TAG, b=i + 1, c=1 << 20) for i in range(FLOOD))
    if kind == "empty messages":
        return rogue.frame(rogue.F_EAGER, a=TAG) * FLOOD
    if kind == "unread read replies":
        return b"".join(rogue.read_request(handle=7, length=64, req_id=i + 1) for i in range(FLOOD))
    return rogue.frame(rogue.F_IMM, u32=42) * (FLOOD * 4)  # 4 bytes each: more of them


def flood(address, ctx_id, frames):
    """Sends the frames as peer ctx_id, never reading what comes back,
    until they are all sent or the target hangs up."""
    sock = rogue.tcp_session(address, ctx_id)
    try:
        sock.settimeout(20)
        sock.sendall(frames)
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass  # the target disconnected us, or stopped reading
    return sock


@pytest.mark.parametrize("kind", ["announcements", "empty messages", "unread read replies", "immediates"])
def test_a_flood_is_bounded_and_named(kind):
    with Peer(target, "tcp") as peer:
        address = peer.get()
        assert_serves(peer, address, "tcp")  # warm: its buffers and threads exist
        peer.put("rss")
        before = peer.get()
        rogue_id = rogue.rogue_id()
        sock = flood(address, rogue_id, flood_frames(kind))
        try:
            peer.put(("why", rogue_id))
            why = peer.get()
            peer.put("rss")
            after = peer.get()
        finally:
            sock.close()
        print(f"{kind}: target RSS {before} -> {after} KiB")  # the figures, with -s
        assert why is not None, f"a peer that sent {FLOOD} {kind} is still connected"
        assert f"{rogue_id:016x}" in why and "budget" in why, why
        assert after - before < GROWTH_MAX_KIB, f"{kind}: the target grew by {after - before} KiB"
        assert_serves(peer, address, "tcp")
        peer.put("bye")
        peer.finish()
