"""Context ids cannot be squatted, and a connect that timed out can be
tried again (issue 13, item 5).

Ids are public: every address blob carries one.  A token holder used to
say hello with a genuine peer's id first; the target took it for that
peer, refused the genuine one as "already connected", and the genuine
peer's endpoint stayed connecting for ever, even after the squatter left.
Now an id is the digest of its context's secret and a hello carries the
secret, so a claim to an id that is not one's own is refused; and a
connect that waited for a peer's dial that never came leaves no endpoint
behind that would make the next connect wait as well.
"""

import os
import socket
import struct
import threading

import pytest

import rogue
from c_peer import Peer
from dlslime_torch import _C
from target import assert_serves, target

pytestmark = pytest.mark.timeout(120)

# long enough for a genuine connect on a loaded machine, short enough
# that the old behaviour (a connect that never comes up) fails quickly
GENUINE_MS = 8000


def squat(address, transport, ctx_id):
    """Says hello to the target as ctx_id; returns the connection (held
    open, as a squatter would) and the welcome."""
    if transport == "tcp":
        sock = socket.create_connection(("127.0.0.1", rogue.address_tcp_port(address)), timeout=10)
        sock.sendall(rogue.hello(address, rogue.TRANSPORT_TCP, ctx_id))
        data = b""
        while len(data) < rogue._WELCOME.size:
            chunk = sock.recv(rogue._WELCOME.size - len(data))
            if not chunk:
                return sock, (None, "")
            data += chunk
        return sock, rogue.parse_welcome(data)
    seg, table = rogue.segment(64 << 10), rogue.mr_table()
    try:
        return rogue.shm_dial(address, ctx_id, seg, table)
    finally:
        os.close(seg)
        os.close(table)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_squatter_cannot_take_a_genuine_peers_id(transport):
    with Peer(target, transport) as peer:
        address = peer.get()
        genuine = _C.Context(transport=transport, token=rogue.TOKEN)
        sock, (verdict, reason) = squat(address, transport, genuine.id)
        try:
            assert verdict == rogue.WELCOME_REFUSED, f"the target took a squatter for {genuine.id:016x}"
            assert f"{genuine.id:016x}" in reason, reason
            # the genuine peer, while the squatter still holds its socket
            assert_serves(peer, address, transport, ctx=genuine, timeout_ms=GENUINE_MS)
        finally:
            sock.close()
        # a rogue's own id, proven by its own secret, is still welcome
        sock, (verdict, reason) = squat(address, transport, rogue.rogue_id())
        sock.close()
        assert verdict == rogue.WELCOME_OK, reason
        peer.put("bye")
        peer.finish()


def duplicate_listener(address):
    """A tcp listener that answers every hello as a peer would whose own
    dial to us wins ("duplicate"), and then never dials.  Returns its port
    and the thread, which ends after one connection."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("0.0.0.0", 0))
    lsock.listen(1)
    welcome = rogue._WELCOME.pack(rogue.WELCOME_MAGIC, rogue.address_version(address), rogue.WELCOME_DUPLICATE,
                                  rogue.address_ctx_id(address), os.getpid(), 0, b"our dial wins")

    def serve():
        with lsock:
            lsock.settimeout(30)
            conn, _ = lsock.accept()
            with conn:
                conn.recv(4096)  # its hello
                conn.sendall(welcome)
                conn.settimeout(30)
                conn.recv(1)  # until the dialer hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return lsock.getsockname()[1], thread


def with_port(address, port):
    """The address blob with another tcp port (wire_addr_t.port)."""
    return address[:56] + struct.pack("<H", port) + address[58:]


def test_a_timed_out_connect_can_connect_again():
    """A peer said its dial would come, and it never came: the connect
    times out, and the next one to the same context id dials afresh."""
    with Peer(target, "tcp") as peer:
        address = peer.get()
        ctx = _C.Context(transport="tcp", token=rogue.TOKEN)
        port, thread = duplicate_listener(address)
        with pytest.raises(_C.SlimeTimeoutError) as e:
            ctx.connect(with_port(address, port), timeout_ms=1000)
        assert f"{rogue.address_ctx_id(address):016x}" in str(e.value)
        thread.join(30)
        assert_serves(peer, address, "tcp", ctx=ctx, timeout_ms=GENUINE_MS)
        peer.put("bye")
        peer.finish()
