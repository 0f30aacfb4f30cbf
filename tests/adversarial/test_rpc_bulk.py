"""An RPC client that announces bulk payloads it never sends (issue 13,
item 4).

The server used to reserve every announced size at once: 16 requests
announcing 8 GiB each held 128 GiB of its address space until the client
left.  Now a peer's announced-but-unreceived bulk bytes stay within a
budget (DLSLIME_RPC_BULK_BUDGET): an announcement larger than the budget
disconnects the peer with an error naming it; others wait, unallocated,
until the peer's earlier payloads have arrived.
"""

import os
import time

import numpy as np
import pytest

import rogue
from c_peer import CONNECT_TIMEOUT_MS, Peer, assert_bytes_equal, pattern
from dlslime_torch import _C
from target import serve_echo

pytestmark = pytest.mark.timeout(120)

PORT, DIGEST, ECHO = 91, 0xB0B, 1
BUDGET = 4 << 30  # DLSLIME_RPC_BULK_BUDGET's default
GIB = 1 << 30


def rpc_target(link, transport, budget=None):
    """An echo server (with a bulk budget of budget bytes if set);
    ("peer_error", id) answers the error of a send on the endpoint to
    peer id, or None."""
    if budget is not None:
        os.environ["DLSLIME_RPC_BULK_BUDGET"] = str(budget)
    ctx = _C.Context(transport=transport, token=rogue.TOKEN)
    srv = _C.RpcServer(ctx, PORT, DIGEST, [ECHO])

    thread = serve_echo(srv)
    link.put(ctx.address())
    eps = {}
    while True:
        cmd = link.get()
        if cmd == "bye":
            srv.close()
            thread.join()
            return None
        while cmd[1] not in eps:
            ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
            eps[ep.peer_id] = ep
        try:
            eps[cmd[1]].send(b"?", tag=5).wait(timeout_ms=5000)
            link.put(None)
        except _C.SlimeError as exc:
            link.put(str(exc))


def genuine_echo(address, transport):
    """A genuine client's call with a payload that goes by bulk."""
    ctx = _C.Context(transport=transport, token=rogue.TOKEN)
    try:
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        cli = _C.RpcClient(ctx, ep, PORT, DIGEST)
        data = pattern(1 << 20, 3)
        r = cli.call(ECHO, data)
        assert r.wait(timeout_ms=30000) is False
        assert_bytes_equal(memoryview(r), data, "bulk echo")
        cli.close()
    finally:
        ctx.close()


def announce(ep, n, length):
    for i in range(n):
        hdr = rogue.rpc_bulk_announcement(cid=1, method=ECHO, req_id=i + 1, length=length)
        ep.send(hdr, tag=rogue.rpc_request_tag(PORT)).wait(timeout_ms=5000)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_announcement_over_budget_disconnects(transport):
    with Peer(rpc_target, transport) as peer:
        address = peer.get()
        pid = peer.proc.pid
        ctx = _C.Context(transport=transport, token=rogue.TOKEN)
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        vm_before = rogue.proc_vm_kib(pid)
        try:
            announce(ep, 16, 8 * GIB)
        except _C.SlimeError:
            pass  # disconnected part way: what we want
        time.sleep(1.0)
        grown = (rogue.proc_vm_kib(pid) - vm_before) << 10
        print(f"16 x 8 GiB announced ({transport}): server address space +{grown >> 20} MiB")  # with -s
        assert grown < GIB, f"16 announcements of 8 GiB grew the server by {grown / GIB:.1f} GiB"
        peer.put(("peer_error", ctx.id))
        error = peer.get()
        assert error and "%016x" % ctx.id in error and "budget" in error, error
        genuine_echo(address, transport)
        ctx.close()
        peer.put("bye")
        peer.finish()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_announcements_within_budget_wait(transport):
    """Each fits the budget, their sum does not: the server reserves no
    more than the budget, and goes on serving."""
    with Peer(rpc_target, transport) as peer:
        address = peer.get()
        pid = peer.proc.pid
        ctx = _C.Context(transport=transport, token=rogue.TOKEN)
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        vm_before = rogue.proc_vm_kib(pid)
        announce(ep, 64, GIB // 2)
        time.sleep(1.0)
        grown = (rogue.proc_vm_kib(pid) - vm_before) << 10
        print(f"64 x 512 MiB announced ({transport}): server address space +{grown >> 20} MiB")  # with -s
        assert grown <= BUDGET + GIB // 2, f"64 announcements of 512 MiB grew the server by {grown / GIB:.1f} GiB"
        genuine_echo(address, transport)
        ctx.close()
        peer.put("bye")
        peer.finish()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_genuine_calls_beyond_budget_wait_their_turn(transport):
    """16 calls of 1 MiB in flight against a budget of 2 MiB: each payload
    waits for the one before it to arrive, and every echo is right."""
    with Peer(rpc_target, transport, 2 << 20) as peer:
        address = peer.get()
        ctx = _C.Context(transport=transport, token=rogue.TOKEN)
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        cli = _C.RpcClient(ctx, ep, PORT, DIGEST, credits=16)
        datas = [pattern((1 << 20) + 13 * i, 50 + i) for i in range(16)]
        reqs = [cli.call(ECHO, d) for d in datas]
        for i, r in enumerate(reqs):
            assert r.wait(timeout_ms=30000) is False
            assert_bytes_equal(memoryview(r), datas[i], f"call {i}")
        peer.put(("peer_error", ctx.id))
        assert peer.get() is None  # still connected: waiting is no offence
        cli.close()
        ctx.close()
        peer.put("bye")
        peer.finish()
