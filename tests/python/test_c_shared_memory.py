"""_C.SharedMemory: blocks from slime_mem_alloc, which shm peers map and
copy with memcpy.  Contents must be exactly those of ordinary memory,
whatever the transport; lifetime follows the last reference."""

import gc

import numpy as np
import pytest

from c_peer import Peer, accept_from_test, assert_bytes_equal, connect_to_peer, pattern
from dlslime_torch import _C

pytestmark = pytest.mark.timeout(120)

WAIT_MS = 30000
N = (6 << 20) + 123


def shared_peer(link, transport, n):
    """Exposes a SharedMemory block holding pattern 5; checks what the
    test wrote into its second half."""
    ctx, ep = accept_from_test(link, transport)
    block = _C.SharedMemory(2 * n)
    view = np.frombuffer(block, dtype=np.uint8)
    view[:n] = pattern(n, 5)
    mr = ctx.reg_mr(block)
    link.put(mr.desc())
    assert link.get() == "written"
    assert_bytes_equal(view[n:], pattern(n, 6), "second half after the write")
    assert_bytes_equal(view[:n], pattern(n, 5), "first half, untouched")
    mr.dereg()
    link.put("ok")
    assert link.get() == "bye"


def test_read_write_shared_block(transport):
    with Peer(shared_peer, transport, N) as peer:
        ctx, ep = connect_to_peer(peer, transport)
        desc = peer.get()
        assert _C.desc_length(desc) == 2 * N
        local = np.zeros(N, dtype=np.uint8)
        mr = ctx.reg_mr(local)
        ep.read(mr, 0, desc, 0, N).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(local, pattern(N, 5), "read of the shared block")
        # small and odd reads go the same way
        local[:] = 0
        ep.read(mr, 3, desc, 1001, 8).wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(local[3:11], pattern(N, 5)[1001:1009], "8-byte read")
        local[:] = pattern(N, 6)
        ep.write(mr, 0, desc, N, N).wait(timeout_ms=WAIT_MS)
        peer.put("written")
        assert peer.get() == "ok"
        # the peer deregistered: refused, as for any region
        with pytest.raises(_C.SlimeAccessError):
            ep.read(mr, 0, desc, 0, 16).wait(timeout_ms=WAIT_MS)
        peer.put("bye")
        peer.finish()
        mr.dereg()
        ctx.close()


def test_block_lives_while_referenced():
    import torch
    block = _C.SharedMemory(1 << 16)
    assert block.nbytes == 1 << 16 and block.address != 0
    assert not np.frombuffer(block, dtype=np.uint8).any()   # zeroed
    tensor = torch.frombuffer(block, dtype=torch.int32)
    del block
    gc.collect()
    tensor += 7                                              # still mapped
    assert int(tensor.sum()) == 7 * (1 << 14)
    with pytest.raises(ValueError):
        _C.SharedMemory(0)
