"""A tcp peer that names another process as its own (transport/tcp_cma.c).

Over tcp a rendezvous may be copied by the receiver out of the sender's
memory (process_vm_readv) when the sender is on this host.  The pid the
sender names is its word: a rogue naming a local process it is not, with
an address in that process, would have the target read that process's
memory and echo it back.  The target must believe a pid only where the
kernel shows that process owns the other end of the connection: the liar
gets a plain CTS and its own bytes back; a peer telling the truth gets
its rendezvous fetched (the control that shows the test can tell).
"""

import socket
import subprocess

import numpy as np
import pytest

import rogue
from c_peer import Peer, assert_bytes_equal, pattern
from target import ECHO_BYTES, assert_serves, target

pytestmark = pytest.mark.timeout(120)

F_CTS, F_DATA, F_RNDV_DONE, FF_RDMA = 3, 4, 10, 0x2
TAG_IN, TAG_ECHO = 1, 2


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the target hung up"
        data += chunk
    return data


def next_frame(sock, types):
    """The next frame of one of types (others skipped): (header, payload)."""
    while True:
        head = rogue.read_frame(lambda n: recv_exact(sock, n))
        payload = recv_exact(sock, head.len) if head.len else b""
        if head.type in types:
            return head, payload


def readable_address(pid):
    """The start of the first readable mapping of process pid."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            if perms.startswith("r"):
                return int(span.split("-")[0], 16)
    raise AssertionError(f"process {pid} maps nothing readable")


def announce(sock, addr):
    """A rendezvous of ECHO_BYTES for the target's receive, offered for
    fetching from addr."""
    sock.sendall(rogue.frame(rogue.F_RTS, a=TAG_IN, b=1, c=ECHO_BYTES, d=addr, flags=FF_RDMA))


def echo_of(sock):
    head, payload = next_frame(sock, {rogue.F_EAGER})
    assert head.a == TAG_ECHO
    return np.frombuffer(payload, dtype=np.uint8)


@pytest.fixture
def cma_peer(monkeypatch):
    monkeypatch.setenv("DLSLIME_TCP_CMA", "1")  # the target's peers are all on this host
    with Peer(target, "tcp") as peer:
        address = peer.get()
        assert_serves(peer, address, "tcp")
        yield peer, address


def test_a_named_pid_that_is_not_the_peer_is_not_read(cma_peer):
    peer, address = cma_peer
    victim = subprocess.Popen(["sleep", "60"])
    try:
        ours = pattern(ECHO_BYTES, 9)
        rogue_id = rogue.rogue_id()
        peer.put(("serve", rogue_id))
        with rogue.tcp_session(address, rogue_id, pid=victim.pid) as sock:
            sock.settimeout(10)
            announce(sock, readable_address(victim.pid))
            head, _ = next_frame(sock, {F_CTS, F_RNDV_DONE})
            assert head.type == F_CTS, "the target read the memory of a process the peer only named"
            sock.sendall(rogue.frame(F_DATA, a=head.b, length=ECHO_BYTES) + ours.tobytes())
            assert_bytes_equal(echo_of(sock), ours, "echo of the liar's bytes")
        assert peer.get() == "served"
    finally:
        victim.kill()
        victim.wait()
    assert_serves(peer, address, "tcp")


def test_the_peers_own_pid_is_read(cma_peer):
    peer, address = cma_peer
    ours = pattern(ECHO_BYTES, 11)
    rogue_id = rogue.rogue_id()
    peer.put(("serve", rogue_id))
    with rogue.tcp_session(address, rogue_id) as sock:
        sock.settimeout(10)
        announce(sock, ours.ctypes.data)
        head, _ = next_frame(sock, {F_CTS, F_RNDV_DONE})
        assert head.type == F_RNDV_DONE and head.u32 == 0, "the target did not fetch from its proven peer"
        assert_bytes_equal(echo_of(sock), ours, "echo of the fetched bytes")
    assert peer.get() == "served"
