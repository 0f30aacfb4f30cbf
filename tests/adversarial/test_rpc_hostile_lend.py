"""A client that lends hostile blocks (csrc/rpc/lend.h).

A lent request names a memfd in the client's process, which the server
fetches (pidfd_getfd) and maps.  A client may name anything: a memfd not
sealed against shrinking (a shrink would fault the server's reads), one
smaller than it claims, another file's inode, an fd it does not have, a
size past the server's budget.  Each must get an error reply naming the
problem, with nothing mapped, and the server must go on serving genuine
lent calls.
"""

import os
import struct

import pytest

import rogue
from c_peer import CONNECT_TIMEOUT_MS, Peer, assert_bytes_equal, pattern
from dlslime_torch import _C
from target import serve_echo

pytestmark = pytest.mark.timeout(120)

PORT, DIGEST, ECHO, CID = 93, 0x1E4D, 1, 77
RPC_ERROR, RPC_F_LENT = 5, 0x2
MIB = 1 << 20
_LEND = struct.Struct("<iIQQ")   # rpc_lend_t: fd, zero, ino, size


def lend_target(link):
    ctx = _C.Context(transport="shm", token=rogue.TOKEN)
    srv = _C.RpcServer(ctx, PORT, DIGEST, [ECHO])
    thread = serve_echo(srv)
    link.put(ctx.address())
    assert link.get() == "bye"
    srv.close()
    thread.join()


def lent_request(req_id, fd, ino, size, length):
    hdr = struct.pack("<IHBBIIQQQQ", rogue.RPC_MAGIC, _C.RPC_VERSION, rogue.RPC_REQUEST, RPC_F_LENT, CID, 0, ECHO,
                      req_id, length, 64 << 10)
    return hdr + _LEND.pack(fd, 0, ino, size)


def answer(ep, req_id):
    """The error text of the reply to req_id (the server's own wording)."""
    buf = bytearray(4096)
    r = ep.recv(buf, tag=rogue.RPC_TAG_SPACE | 1 << 46 | CID)
    r.wait(timeout_ms=10000)
    magic, _, kind, flags, cid, _, _, got_id, length, _ = struct.unpack_from("<IHBBIIQQQQ", buf)
    assert magic == rogue.RPC_MAGIC and cid == CID and got_id == req_id
    assert kind == RPC_ERROR, f"a hostile lend was answered with kind {kind}"
    return bytes(buf[48:48 + length]).split(b"\0")[1].decode()


def hostile_blocks():
    """(what, fd, ino, size, payload length, words the error must say)."""
    unsealed = rogue.memfd("unsealed", 2 * MIB, sealed=False)
    small = rogue.memfd("small", MIB, sealed=True)
    good = rogue.memfd("good", 2 * MIB, sealed=True)
    ino = os.fstat(good).st_ino
    return [
        ("unsealed", unsealed, os.fstat(unsealed).st_ino, 2 * MIB, MIB, "sealed"),
        ("smaller than claimed", small, os.fstat(small).st_ino, 2 * MIB, MIB, "not the memfd"),
        ("another inode", good, ino + 1, 2 * MIB, MIB, "not the memfd"),
        ("no such fd", 1000, ino, 2 * MIB, MIB, "fetching"),
        ("past the budget", good, ino, 1 << 40, MIB, "at most"),
        ("payload past the block", good, ino, 2 * MIB, 3 * MIB, "at most"),
    ]


def test_hostile_lends_are_refused_and_serving_goes_on():
    with Peer(lend_target) as peer:
        address = peer.get()
        ctx = _C.Context(transport="shm", token=rogue.TOKEN)
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        for i, (what, fd, ino, size, length, words) in enumerate(hostile_blocks()):
            ep.send(lent_request(i + 1, fd, ino, size, length), tag=rogue.rpc_request_tag(PORT)).wait(timeout_ms=5000)
            text = answer(ep, i + 1)
            assert "lent payload" in text and words in text, f"{what}: {text}"
        cli = _C.RpcClient(ctx, ep, PORT, DIGEST)
        data = pattern(2 * MIB, 5)
        r = cli.call(ECHO, data)
        assert r.wait(timeout_ms=30000) is False
        assert_bytes_equal(memoryview(r), data, "a genuine lent echo after the hostile ones")
        assert cli.lend_stats()["in_place"] == 1, cli.lend_stats()
        cli.close()
        ctx.close()
        peer.put("bye")
        peer.finish()
