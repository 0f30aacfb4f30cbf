"""Two-sided send/recv between two processes, over both transports."""

import threading

import numpy as np
import pytest

from c_peer import (Peer, accept_from_test, assert_bytes_equal,
                    connect_to_peer, pattern)
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000
SIZES = [0, 1, 7, 4096, 4097, 65537, 1 << 20, (1 << 20) + 3, 64 << 20]


def echo_peer(link, transport, sizes):
    """Receives each size (tag = index), checks it, sends it back."""
    ctx, ep = accept_from_test(link, transport)
    for tag, n in enumerate(sizes):
        # Room to spare for half of them: bytes must report the message.
        buf = np.zeros(n + (tag % 2) * 13, dtype=np.uint8)
        r = ep.recv(buf, tag=tag).wait(timeout_ms=WAIT_MS)
        assert r.bytes == n, (n, r.bytes)
        assert_bytes_equal(buf[:n], pattern(n, tag), f"{n}-byte message at the peer")
        ep.send(buf[:n], tag=tag).wait(timeout_ms=WAIT_MS)
    return ep.transport


def test_send_recv_sizes_round_trip(transport):
    with Peer(echo_peer, transport, SIZES) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        assert ep.transport == transport
        for tag, n in enumerate(SIZES):
            data = pattern(n, tag)
            back = np.zeros(n, dtype=np.uint8)
            # The receive is posted before the echo can arrive.
            r = ep.recv(back, tag=tag)
            s = ep.send(data, tag=tag)
            _C.wait_all([s, r], timeout_ms=WAIT_MS)
            assert r.bytes == n
            assert r.status == _C.OK
            assert_bytes_equal(back, data, f"{n}-byte echo")
        assert peer.finish() == transport
        ctx.close()


def send_on_request_peer(link, transport, n):
    """Sends one message of n bytes when told, then says it has posted."""
    ctx, ep = accept_from_test(link, transport)
    for tag in (1, 2):
        assert link.get() == "send"
        s = ep.send(pattern(n, tag), tag=tag)
        link.put("posted")
        s.wait(timeout_ms=WAIT_MS)
    assert link.get() == "bye"


@pytest.mark.parametrize("n", [64, 1 << 20])
def test_recv_posted_before_and_after_send(transport, n):
    with Peer(send_on_request_peer, transport, n) as peer:
        ctx, ep = connect_to_peer(peer, transport)

        before = np.zeros(n, dtype=np.uint8)
        r = ep.recv(before, tag=1)          # posted before the send exists
        peer.put("send")
        assert peer.get() == "posted"
        r.wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(before, pattern(n, 1), "recv posted first")

        peer.put("send")
        assert peer.get() == "posted"      # the send exists before this recv
        after = bytearray(n)
        r = ep.recv(after, tag=2).wait(timeout_ms=WAIT_MS)
        assert r.bytes == n
        assert_bytes_equal(after, pattern(n, 2), "recv posted after")
        peer.put("bye")
        peer.finish()


def tagged_sender_peer(link, transport):
    ctx, ep = accept_from_test(link, transport)
    sends = [ep.send(pattern(100 + seed, seed), tag=tag)
             for tag, seed in ((1, 1), (2, 2), (3, 3), (2, 20))]
    link.put("sent")
    _C.wait_all(sends, timeout_ms=WAIT_MS)
    assert link.get() == "bye"


def test_tags_match_out_of_order_and_in_order_per_tag(transport):
    with Peer(tagged_sender_peer, transport) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        assert peer.get() == "sent"
        # Receive in a different tag order than sent; messages with one tag
        # arrive in the order they were sent (seed 2, then seed 20).
        for tag, seed in ((3, 3), (2, 2), (2, 20), (1, 1)):
            buf = np.zeros(200, dtype=np.uint8)
            r = ep.recv(buf, tag=tag).wait(timeout_ms=WAIT_MS)
            n = 100 + seed
            assert r.bytes == n, (tag, seed, r.bytes)
            assert_bytes_equal(buf[:n], pattern(n, seed), f"tag {tag}")
        peer.put("bye")
        peer.finish()


def raw_pair_echo_peer(link, transport, n):
    """Like echo_peer, but every buffer is passed as (ptr, length)."""
    ctx, ep = accept_from_test(link, transport)
    buf = np.zeros(n, dtype=np.uint8)
    r = ep.recv((buf.ctypes.data, n), tag=5).wait(timeout_ms=WAIT_MS)
    assert r.bytes == n
    assert_bytes_equal(buf, pattern(n, 5), "raw-pair recv")
    ep.send((buf.ctypes.data, n), tag=6).wait(timeout_ms=WAIT_MS)


def test_raw_pointer_length_pairs(transport):
    n = 300001
    with Peer(raw_pair_echo_peer, transport, n) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        data = pattern(n, 5)
        back = np.zeros(n, dtype=np.uint8)
        r = ep.recv((back.ctypes.data, back.nbytes), tag=6)
        ep.send((data.ctypes.data, data.nbytes), tag=5).wait(timeout_ms=WAIT_MS)
        r.wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(back, data, "raw-pair echo")
        peer.finish()


def plain_sender_peer(link, transport, n, tag):
    ctx, ep = accept_from_test(link, transport)
    assert link.get() == "send"
    ep.send(pattern(n, tag), tag=tag).wait(timeout_ms=WAIT_MS)
    assert link.get() == "bye"


def test_recv_any_reports_the_endpoint(transport):
    with Peer(plain_sender_peer, transport, 5000, 9) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        buf = np.zeros(8192, dtype=np.uint8)
        r = ctx.recv_any(buf, tag=9)
        assert r.ep is None                 # not known while pending
        peer.put("send")
        r.wait(timeout_ms=WAIT_MS)
        assert r.bytes == 5000
        assert_bytes_equal(buf[:5000], pattern(5000, 9), "recv_any")
        assert r.ep is ep
        assert r.ep.peer_id == ep.peer_id
        peer.put("bye")
        peer.finish()


def ping_pong_then_send_peer(link, transport, rounds, n, tag):
    ctx, ep = accept_from_test(link, transport)
    for _ in range(rounds):
        link.put(link.get() + 1)
    ep.send(pattern(n, tag), tag=tag).wait(timeout_ms=WAIT_MS)
    assert link.get() == "bye"


def test_wait_releases_the_gil(transport):
    """The peer sends only after a Python thread of this process has
    played many rounds of ping-pong with it while the main thread waits.
    Each round needs the GIL, so the rounds finish only if wait() runs
    with the GIL released, not merely lets go of it now and then."""
    rounds = 400
    with Peer(ping_pong_then_send_peer, transport, rounds, 1000, 4) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        buf = np.zeros(1000, dtype=np.uint8)
        r = ep.recv(buf, tag=4)
        played = []

        def ping_pong():
            for i in range(rounds):
                peer.put(i)
                played.append(peer.get() == i + 1)

        worker = threading.Thread(target=ping_pong)
        worker.start()
        try:
            r.wait(timeout_ms=20000)
        finally:
            worker.join(WAIT_MS / 1000)
        assert len(played) == rounds and all(played)
        assert_bytes_equal(buf, pattern(1000, 4), "message sent after the rounds")
        peer.put("bye")
        peer.finish()


def test_accept_and_connect_release_the_gil(transport):
    """A thread connects to this process's context while the main thread
    blocks in accept()."""
    server = _C.Context(transport=transport)
    client = _C.Context(transport=transport)
    result = {}

    def dial():
        result["ep"] = client.connect(server.address(), timeout_ms=WAIT_MS)

    worker = threading.Thread(target=dial)
    worker.start()
    try:
        accepted = server.accept(timeout_ms=WAIT_MS)
    finally:
        worker.join(WAIT_MS / 1000)
    assert accepted.peer_id == client.id
    assert result["ep"].peer_id == server.id
    server.close()
    client.close()
