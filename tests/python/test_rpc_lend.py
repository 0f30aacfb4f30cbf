"""Lent payloads between two processes: a large call's payload is copied
once into shared memory the server reads in place, and a reply that is
a range of it (an echo, a slice changed in place, a tensor argument
returned) comes back in place.  Over shm every such call is lent; a view the handler keeps past
its reply keeps the block (the client never writes into it again: the
server checks by hash); over tcp, or with DLSLIME_RPC_LEND=0, nothing is
lent.  Every reply is checked against the bytes sent."""

import hashlib
import os
import sys

import pytest
import torch

from rpc_services import Blobs, serve_blobs
from dlslime_torch import rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


def _calls(blobs):
    """The calls, and the lend counters each should move on a lending channel."""
    a, b = os.urandom(2 * MIB), os.urandom(3 * MIB)
    first = blobs.echo(a).wait()
    second = blobs.echo(b).wait()            # the first result is held: another block
    assert bytes(first) == a and bytes(second) == b, "an echo, or a result held meanwhile, changed"
    del first, second
    got = blobs.bump_tail(a).wait()
    want = bytes((x + 1) % 256 for x in a[:4]) + a[4:]
    assert bytes(got) == want[2:]
    assert bytes(blobs.copy(b).wait()) == b                  # a new buffer: lent, not in place
    assert bytes(blobs.as_array(a).wait()) == a              # a view the reply does not release: kept
    assert bytes(blobs.echo(a[:1000]).wait()) == a[:1000]    # too small to lend
    kept = [os.urandom(2 * MIB) for _ in range(2)]
    for k in kept:
        assert bytes(blobs.keep(k).wait()) == k[:8]
        assert bytes(blobs.echo(b).wait()) == b              # while the server keeps k's block
    t = torch.randn(MIB)                                     # 4 MiB of float32
    got = blobs.tensor_echo(t).wait()                        # default method: the tail comes back in place
    assert torch.equal(got, t)
    assert torch.equal(blobs.tensor_echo(t, scale=2.0).wait(), t * 2)   # computed: lent, not in place
    kt = torch.randn(MIB)
    assert torch.equal(blobs.tensor_keep(kt).wait(), kt[:4])          # the argument kept: its block too
    assert torch.equal(blobs.tensor_echo(t).wait(), t)
    digests = b"".join(hashlib.sha256(x).digest() for x in (kept[0][8:], kept[1][8:], kt.numpy().tobytes()))
    assert blobs.kept_intact(b"").wait() == digests, "a block the server kept was written again"
    return {"lent": 13, "in_place": 7, "kept": 4}


def session(rank, size, store, lending):
    if rank == 1:
        return serve_blobs(rank, size, store, "blobs")
    rpc.init("client", store=store)
    try:
        with rpc.proxy("blobs", Blobs, timeout=60) as blobs:
            want = _calls(blobs)
            stats = blobs.lend_stats()
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    assert stats["on"] == lending, stats
    for key, n in want.items():
        assert stats[key] == (n if lending else 0), (key, stats)
    return "ok"


def test_lent_calls(transport):
    env = {"DLSLIME_TRANSPORT": transport}
    assert run_job(2, session, transport == "shm", env=env)[0] == "ok"


def test_lending_turned_off():
    env = {"DLSLIME_TRANSPORT": "shm", "DLSLIME_RPC_LEND": "0"}
    assert run_job(2, session, False, env=env)[0] == "ok"


def first_call_faults(rank, size, store):
    if rank == 1:
        return serve_blobs(rank, size, store, "blobs")
    rpc.init("client", store=store)
    try:
        with rpc.proxy("blobs", Blobs, timeout=60) as blobs:
            faults = int(bytes(blobs.write_pages(bytes(4 * MIB)).wait()))
            stats = blobs.lend_stats()
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    assert stats["lent"] == 1, stats
    return faults


def test_first_call_finds_its_pages_mapped():
    """The process's first connect lends a primed block that the server
    maps at the hello with its pages faulted in: a handler writing every
    page of the first call's 4 MiB payload takes no fault per page (it
    took one for each of the 1024 before)."""
    faults = run_job(2, first_call_faults, env={"DLSLIME_TRANSPORT": "shm"})[0]
    assert faults < 64, f"{faults} page faults writing 1024 pages of the first lent payload"
