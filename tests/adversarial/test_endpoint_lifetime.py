"""Endpoints of peers that came and went are freed (issue 13, item 7).

A long-lived server that many short-lived clients call used to keep every
endpoint until its context was destroyed (1-7 KB per peer).  Now an
endpoint whose holds the application gave back (a Python Endpoint holds
one while it lives) is freed once its peer has left, so the server's
memory is flat over many connect-call-leave cycles.
"""

import numpy as np
import pytest

from c_peer import CONNECT_TIMEOUT_MS, Peer
from dlslime_torch import _C
from rogue import TOKEN
from target import WAIT_MS, assert_flat, footprint

pytestmark = pytest.mark.timeout(600)

CYCLES = 2500
WARM = 500


def echo_server(link, transport, cycles, warm):
    """Serves cycles peers, one at a time: one 8-byte echo each, then the
    endpoint is dropped.  Answers its private resident set and number of
    mappings after warm peers and after the last."""
    ctx = _C.Context(transport=transport, token=TOKEN)
    link.put(ctx.address())
    buf = np.zeros(8, dtype=np.uint8)
    for i in range(cycles):
        ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
        ep.recv(buf, tag=1).wait(timeout_ms=WAIT_MS)
        ep.send(buf, tag=2).wait(timeout_ms=WAIT_MS)
        del ep
        if i + 1 in (warm, cycles):
            link.put(footprint())
    link.get()  # until the test has read it all
    ctx.close()


def call_and_leave(address, transport, i):
    ctx = _C.Context(transport=transport, token=TOKEN)
    try:
        ep = ctx.connect(address, timeout_ms=CONNECT_TIMEOUT_MS)
        data = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
        back = np.zeros(8, dtype=np.uint8)
        r = ep.recv(back, tag=2)
        ep.send(data, tag=1).wait(timeout_ms=WAIT_MS)
        r.wait(timeout_ms=WAIT_MS)
        assert int.from_bytes(back.tobytes(), "little") == i
    finally:
        ctx.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_memory_is_flat_over_peers_that_come_and_go(transport):
    with Peer(echo_server, transport, CYCLES, WARM) as server:
        address = server.get()
        for i in range(CYCLES):
            call_and_leave(address, transport, i)
            if i + 1 == WARM:
                warm = server.get()
        end = server.get()
        server.put("bye")
        server.finish()
    assert_flat(warm, end, f"the server ({transport})", f"{CYCLES - WARM} peers")
