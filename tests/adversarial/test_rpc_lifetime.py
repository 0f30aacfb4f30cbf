"""An RPC server that many short-lived clients call does not grow (issue
13, item 7, for SlimeRPC).

The server answered from the endpoint a request came on but never held
or accepted it, so every client's endpoint stayed in the context's accept
queue until the context was destroyed (about 1 KiB a client that came and
went).  Now the server keeps a reference on a client's endpoint while it
has calls from it, and lets it go (out of the accept queue too) once the
client is gone, so the core frees it.
"""


import os

import numpy as np
import pytest

from c_peer import CONNECT_TIMEOUT_MS, Peer
from dlslime_torch import _C
from rogue import TOKEN
from target import WAIT_MS, assert_flat, footprint, serve_echo

PORT, DIGEST, ECHO = 93, 0x11FE, 1
# DLSLIME_TEST_CLIENTS (as for tests/c/test_ep_release) runs the long soak
# by hand, e.g. 100000 clients; the warm-up stays a third of the run
CYCLES = int(os.environ.get("DLSLIME_TEST_CLIENTS", "1500"))
WARM = CYCLES // 3
# a client costs a few ms, more on a loaded machine
RUN_S = 600 + CYCLES // 20

pytestmark = pytest.mark.timeout(RUN_S)


def echo_server(link, transport):
    """Echoes every call until told "bye"; "rss" answers its private
    resident set and its number of mappings."""
    ctx = _C.Context(transport=transport, token=TOKEN)
    srv = _C.RpcServer(ctx, PORT, DIGEST, [ECHO])

    thread = serve_echo(srv)
    link.put(ctx.address())
    while link.get(timeout=RUN_S) == "rss":
        link.put(footprint())
    srv.close()
    thread.join()
    ctx.close()


def call_and_leave(address, transport, i):
    """A fresh client: connect, hello, one echo, leave."""
    ctx = _C.Context(transport=transport, token=TOKEN)
    try:
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        cli = _C.RpcClient(ctx, ep, PORT, DIGEST)
        data = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
        r = cli.call(ECHO, data)
        assert r.wait(timeout_ms=WAIT_MS) is False
        assert int.from_bytes(bytes(memoryview(r)), "little") == i
        cli.close()
    finally:
        ctx.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_rpc_server_memory_is_flat_over_clients_that_come_and_go(transport):
    with Peer(echo_server, transport) as server:
        address = server.get()
        for i in range(CYCLES):
            call_and_leave(address, transport, i)
            if i + 1 == WARM:
                server.put("rss")
                warm = server.get()
        server.put("rss")
        end = server.get()
        server.put("bye")
        server.finish()
    assert_flat(warm, end, f"the rpc server ({transport})", f"{CYCLES - WARM} clients")
