"""A context made without a token (issue 13: the empty default token).

Such a context used to take the empty token, so any local process that
found its listener (abstract unix sockets and tcp ports are easy to list)
was a peer.  Now it makes a random token of its own, whose digests its
address blob carries: a peer given the blob gets in, a process that
presents the empty token does not.
"""

import os

import pytest

import rogue
from c_peer import Peer
from dlslime_torch import _C
from target import assert_serves, target

pytestmark = pytest.mark.timeout(120)


def hello_verdict(address, transport, token):
    if transport == "tcp":
        return rogue.tcp_dial(address, rogue.rogue_id(), token=token)
    seg, table = rogue.segment(64 << 10), rogue.mr_table()
    try:
        sock, welcome = rogue.shm_dial(address, rogue.rogue_id(), seg, table, token=token)
        sock.close()
        return welcome
    finally:
        os.close(seg)
        os.close(table)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_no_token_is_not_the_empty_token(transport):
    with Peer(target, transport, None, None) as peer:
        address = peer.get()
        verdict, reason = hello_verdict(address, transport, b"")
        assert verdict == rogue.WELCOME_REFUSED, "a context made without a token let in the empty token"
        assert "token" in reason, reason
        # the blob is the capability: a peer that was given it gets in
        assert_serves(peer, address, transport, token=None)
        peer.put("bye")
        peer.finish()


@pytest.mark.parametrize("token", [b"", ""])
def test_an_empty_token_is_refused(token):
    """Given explicitly, the empty token would let in any local process
    that finds the listener: creating the context fails instead."""
    with pytest.raises(_C.SlimeInvalidError, match="empty token"):
        _C.Context(transport="tcp", token=token)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_jobs_token_is_not_in_the_address(transport):
    """A context with a job's token (torch publishes it in its store) keeps
    it out of its blob: a peer without the token is refused."""
    with Peer(target, transport) as peer:
        address = peer.get()
        digest = rogue.token_digest("dlslime-hello-1", rogue.TOKEN).to_bytes(8, "little")
        assert digest not in address
        verdict, _ = hello_verdict(address, transport, b"some other token")
        assert verdict == rogue.WELCOME_REFUSED
        assert_serves(peer, address, transport)
        peer.put("bye")
        peer.finish()
