"""A same-host peer that lies about, or later changes, the shared memory
it hands over at the shm handshake (issue 13, items 1 and 2).

The rogue dials the target's shm listener with its own ring segment and
MR table memfds.  The target must refuse what it cannot trust (a ring size
that does not fit the segment, memfds not sealed against resizing), name
the rogue in the refusal, stay up, and go on serving genuine peers.
"""

import os
import struct
import time

import pytest

import rogue
from c_peer import Peer
from target import assert_serves, target

pytestmark = pytest.mark.timeout(120)

RING = 64 << 10
F_READ_RESP = 8


def read_reply(seg_fd, timeout=10.0):
    """The first frame the target wrote into ring[1] (acceptor -> dialer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head = rogue.first_packet(seg_fd, rogue.RINGS + RING, 8)
        if head:
            return struct.unpack("<BBHI", head)
        time.sleep(0.01)
    raise AssertionError(f"the target wrote no reply in {timeout} s")


def test_well_formed_rogue_is_answered():
    """The control: the rogue's handshake and frames are what a genuine
    peer sends, so the refusals below are for the fault alone."""
    with Peer(target, "shm") as peer:
        address = peer.get()
        seg, table = rogue.segment(RING), rogue.mr_table()
        sock, (verdict, reason) = rogue.shm_dial(address, rogue.rogue_id(), seg, table)
        assert verdict == rogue.WELCOME_OK, reason
        rogue.post_frame(seg, sock, rogue.read_request(handle=5 << 32, length=8))
        ftype, _flags, _pad, status = read_reply(seg)
        assert ftype == F_READ_RESP and status != 0
        sock.close()
        peer.put("bye")
        peer.finish()


def test_ring_size_that_wraps_is_refused():
    """ring_size = R + 2^63: 2 * ring_size wraps to 2R, so a check of the
    segment's size in 64-bit arithmetic passes while the transmit ring
    lies 2^63 bytes past the segment."""
    with Peer(target, "shm") as peer:
        address = peer.get()
        me = rogue.rogue_id()
        seg, table = rogue.segment(RING, claimed_ring=RING + (1 << 63)), rogue.mr_table()
        sock, (verdict, reason) = rogue.shm_dial(address, me, seg, table)
        if verdict == rogue.WELCOME_OK:
            # what the rogue is after: the target's reply into its ring
            rogue.post_frame(seg, sock, rogue.read_request(handle=5 << 32, length=8))
            time.sleep(0.5)
        assert_serves(peer, address, "shm")
        assert verdict == rogue.WELCOME_REFUSED, f"welcomed a ring of 2^63 + {RING} bytes"
        assert "%016x" % me in reason and "ring" in reason, reason
        peer.put("bye")
        peer.finish()


@pytest.mark.parametrize("unsealed", ["ring segment", "MR table"])
def test_unsealed_memfd_is_refused(unsealed):
    """A memfd that its owner may shrink after the handshake: the target's
    next access to the mapping past the new end would fault (SIGBUS)."""
    with Peer(target, "shm") as peer:
        address = peer.get()
        me = rogue.rogue_id()
        seg = rogue.segment(RING, sealed=unsealed != "ring segment")
        table = rogue.mr_table(sealed=unsealed != "MR table")
        sock, (verdict, reason) = rogue.shm_dial(address, me, seg, table)
        if verdict == rogue.WELCOME_OK:
            # make the target reply (it reads our MR table to decide on a
            # doorbell), then pull the shrunk memory from under it
            if unsealed == "MR table":
                os.ftruncate(table, 0)
            rogue.post_frame(seg, sock, rogue.read_request(handle=5 << 32, length=8))
            if unsealed == "ring segment":
                os.ftruncate(seg, 0)
                sock.send(b"\1")
            time.sleep(0.5)
        assert_serves(peer, address, "shm")
        assert verdict == rogue.WELCOME_REFUSED, f"welcomed an unsealed {unsealed}"
        assert "%016x" % me in reason and "seal" in reason, reason
        peer.put("bye")
        peer.finish()


def test_sealed_memfd_cannot_shrink():
    """What the seals buy: the kernel refuses the shrink itself."""
    fd = rogue.segment(RING)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    os.close(fd)


def test_forged_entry_in_the_targets_mr_table_is_not_trusted():
    """Peers map the target's MR table writable (to pin its entries while
    they copy by CMA).  A rogue that writes a valid-looking entry for an
    address of its choosing, then asks the target to serve a read of it,
    must get a refusal: the target checks the accesses it serves against
    its own record of its regions, not the shared table."""
    with Peer(target, "shm") as peer:
        address = peer.get()
        seg, table = rogue.segment(RING), rogue.mr_table()
        theirs = []
        sock, (verdict, reason) = rogue.shm_dial(address, rogue.rogue_id(), seg, table,
                                                 fds_out=theirs)
        assert verdict == rogue.WELCOME_OK, reason
        # an address nothing is mapped at in the target
        rogue.forge_mr_entry(theirs[0], slot=7, rkey=0x55, addr=0x1000, length=1 << 20)
        rogue.post_frame(seg, sock, rogue.read_request(handle=7 << 32, length=4096, rkey=0x55))
        time.sleep(0.5)
        assert_serves(peer, address, "shm")
        ftype, _flags, _pad, status = read_reply(seg)
        assert ftype == F_READ_RESP and status != 0, "the target served a read of a forged region"
        sock.close()
        peer.put("bye")
        peer.finish()
