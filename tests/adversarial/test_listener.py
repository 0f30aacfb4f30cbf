"""Connections that never say hello (issue 13, item 3).

An unauthenticated connection costs the target an fd until its handshake
deadline.  The target must cap how many it holds (the oldest goes first:
a genuine dialer's hello follows its connect at once, so only a silent
connection grows old), and when fds run out it must neither spin on a
listener that stays readable nor stop serving genuine peers.
"""

import time

import pytest

import rogue
from c_peer import Peer
from target import assert_serves, target

pytestmark = pytest.mark.timeout(120)

SILENT = 200
# DLSLIME_PENDING_MAX's default
PENDING_MAX = 64


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_silent_connections_are_capped(transport):
    with Peer(target, transport) as peer:
        address = peer.get()
        pid = peer.proc.pid
        time.sleep(0.2)
        before = rogue.proc_fds(pid)
        socks = rogue.silent_connections(address, transport, SILENT)
        try:
            time.sleep(0.5)  # for the target to accept what it will
            held = rogue.proc_fds(pid) - before
            print(f"{SILENT} silent connections ({transport}): the target holds {held} fds")  # with -s
            assert held <= PENDING_MAX, f"the target holds {held} fds for {SILENT} silent connections"
            assert_serves(peer, address, transport)
        finally:
            for s in socks:
                s.close()
        peer.put("bye")
        peer.finish()


def assert_resting(pid):
    """The target, its fds exhausted, does not spin."""
    cpu, start = rogue.proc_cpu_seconds(pid), time.monotonic()
    time.sleep(2.0)
    used = rogue.proc_cpu_seconds(pid) - cpu
    wall = time.monotonic() - start
    print(f"fds exhausted: the target used {used:.2f} s of CPU in {wall:.2f} s")  # with -s
    # a spinning listener takes a whole core; a resting one, next to nothing
    assert used < 0.25 * wall, f"the target used {used:.2f} s of CPU in {wall:.2f} s, fds exhausted"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_no_spin_when_fds_run_out(transport):
    """With only 16 fds to spare, 200 silent connections exhaust them:
    accept fails with EMFILE while the listener stays readable.  The
    target drops the oldest silent ones for room."""
    with Peer(target, transport, 16) as peer:
        address = peer.get()
        pid = peer.proc.pid
        socks = rogue.silent_connections(address, transport, SILENT)
        try:
            time.sleep(0.3)
            assert_resting(pid)
            # genuine peers still get in while the silent ones stay
            assert_serves(peer, address, transport)
        finally:
            for s in socks:
                s.close()
        peer.put("bye")
        peer.finish()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_listener_rests_while_no_fd_is_free(transport):
    """No fd to spare at all, and no silent connection to drop for room:
    the listener rests instead of spinning, and listens again once fds
    are free."""
    with Peer(target, transport, 0) as peer:
        address = peer.get()
        socks = rogue.silent_connections(address, transport, 8)
        try:
            time.sleep(0.3)
            assert_resting(peer.proc.pid)
        finally:
            for s in socks:
                s.close()
        peer.put(("fds", 64))
        assert_serves(peer, address, transport)
        peer.put("bye")
        peer.finish()
