"""A hostile peer's default-method messages (issue 18: the C codec).

The decoder must refuse, with a ValueError naming what is wrong, every
message whose lengths, counts, nesting, segments or tensor shapes do not
hold, without allocating more than the message's size; a server that
gets one answers the caller with an error and goes on serving.
"""

import os
import random
import struct
import sys
import tracemalloc

import pytest
import torch

from dlslime_torch import rpc
from dlslime_torch.rpc import codec
from dlslime_torch.rpc.errors import decode_remote
from rpc_services import Calc, serve_calc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(120)

HEAD = struct.Struct("<4sIIIQ")
SEG = struct.Struct("<QQ")


def message(body, segments=(), data=b"", flags=0, nseg=None):
    """A message from parts: segments are (offset, nbytes) pairs into the
    whole message; data is appended after the body."""
    n = len(segments) if nseg is None else nseg
    head = HEAD.pack(b"SRP2", flags, n, 0, len(body)) + b"".join(SEG.pack(*s) for s in segments)
    return bytearray(head + body + data)


def u32(n):
    return struct.pack("<I", n)


def tensor_tag(code, dims, seg=0):
    return b"X" + bytes([code, len(dims)]) + u32(seg) + b"".join(struct.pack("<q", d) for d in dims)


def refused(msg, match):
    with pytest.raises(ValueError, match=match):
        codec.decode(msg)


def test_heads_that_do_not_fit():
    refused(bytearray(b"SRP2"), "shorter than its head")
    refused(bytearray(b"SRP1" + bytes(20)), "not a SlimeRPC message")
    refused(message(b"N", flags=2), "head does not fit")
    refused(message(b"N", nseg=1 << 31), "head does not fit")
    m = message(b"N")
    m[16:24] = struct.pack("<Q", 1 << 62)   # body longer than the message
    refused(m, "head does not fit")
    refused(message(b"N", segments=[(1 << 63, 1 << 63)]), "segment lies outside")
    refused(message(b"N", segments=[(8, 1 << 40)]), "segment lies outside")


def test_counts_larger_than_the_body():
    # 4 G items announced in a few bytes: refused before any allocation
    tracemalloc.start()
    try:
        for tag in (b"(", b"[", b"{"):
            refused(message(tag + u32(0xFFFFFFFF) + b"N"), "counts more items")
        refused(message(b"s" + u32(0xFFFFFFFF) + b"abc"), "runs past the end")
        refused(message(b"b" + u32(100)), "runs past the end")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_nesting_is_bounded():
    depth = codec.DEPTH_MAX + 1
    refused(message((b"[" + u32(1)) * depth + b"N"), "nest too deep")
    ok = (b"[" + u32(1)) * codec.DEPTH_MAX + b"N"
    got = codec.decode(message(ok))
    for _ in range(codec.DEPTH_MAX):
        got = got[0]
    assert got is None


def test_bodies_that_lie():
    refused(message(b"N" + b"N"), "left over")
    refused(message(b"?"), "unknown tag")
    refused(message(b"i" + b"\0" * 7), "runs past the end")
    refused(message(b""), "runs past the end")
    with pytest.raises(UnicodeDecodeError):   # a ValueError too
        codec.decode(message(b"s" + u32(2) + b"\xff\xfe"))
    with pytest.raises(TypeError, match="unhashable"):
        codec.decode(message(b"{" + u32(1) + b"[" + u32(0) + b"N"))


def test_tensors_that_lie():
    data = bytes(64)
    body_len = len(tensor_tag(0, [4]))
    at = HEAD.size + SEG.size + body_len
    good = message(tensor_tag(0, [4]), [(at, 16)], data[:16])
    assert torch.equal(codec.decode(good), torch.zeros(4))
    refused(message(tensor_tag(0, [5]), [(at, 16)], data[:16]), "does not match its segment")
    refused(message(tensor_tag(0, [-4]), [(at, 16)], data[:16]), "negative tensor dimension")
    refused(message(tensor_tag(0, [1 << 62, 1 << 62]), [(at, 16)], data[:16]), "does not match")
    refused(message(tensor_tag(0, [1 << 61]), [(at, 16)], data[:16]), "does not match")   # bytes overflow
    refused(message(tensor_tag(200, [4]), [(at, 16)], data[:16]), "unknown dtype")
    refused(message(tensor_tag(0, [1] * 33), [(at, 16)], data[:16]), "too many dimensions")
    refused(message(tensor_tag(0, [4], seg=1), [(at, 16)], data[:16]), "names no segment")
    refused(message(tensor_tag(0, [4]), [], data[:16]), "names no segment")
    # a zero-sized tensor with a huge other dimension allocates nothing
    at = HEAD.size + SEG.size + len(tensor_tag(0, [0, 1 << 62]))
    t = codec.decode(message(tensor_tag(0, [0, 1 << 62]), [(at, 0)]))
    assert t.shape == (0, 1 << 62) and t.numel() == 0


def test_pickled_bodies_name_only_their_segments():
    import pickle

    class Ids(pickle.Pickler):
        def persistent_id(self, obj):
            return ("T", 3, "float32", (4,)) if obj == "tensor" else None

    f = __import__("io").BytesIO()
    Ids(f).dump(["tensor"])
    refused(message(f.getvalue(), flags=1), "unknown out-of-band object")
    refused(message(pickle.dumps([1])[:-1], flags=1), "its pickle")   # a cut pickle
    assert codec.decode(message(pickle.dumps([1]), flags=1)) == [1]


def mutations(msg, rng, n):
    for _ in range(n):
        m = bytearray(msg)
        for _ in range(rng.randint(1, 4)):
            if not m:
                break
            kind = rng.random()
            i = rng.randrange(len(m))
            if kind < 0.5:
                m[i] = rng.randrange(256)
            elif kind < 0.7:
                m[i:i + 4] = struct.pack("<I", rng.choice([0, 1, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
            elif kind < 0.85:
                del m[i:]
            else:
                m[i:i] = bytes(rng.randrange(1, 16))
        yield m


def test_mutated_messages_raise_or_decode():
    """Random corruptions of real messages (a fixed seed): each decodes
    to something or raises a clear error; none crashes the process."""
    rng = random.Random(18)
    objs = [
        ((torch.arange(12).view(3, 4), 1.5, "x"), {"k": [None, True, b"z"], "t": torch.ones(2, dtype=torch.bool)}),
        {"a": 1, "b": [1, 2, {"c": (3.0, "d")}]},
    ]
    outcomes = {"ok": 0, "refused": 0}
    for obj in objs:
        head, tail = codec.encode(obj)
        assert tail is None
        for m in mutations(head, rng, 4000):
            try:
                codec.decode(m)
                outcomes["ok"] += 1
            except (ValueError, TypeError):   # TypeError: an unhashable key
                outcomes["refused"] += 1
    assert outcomes["refused"] > 1000 and outcomes["ok"] > 10, outcomes


def hostile_caller(rank, size, store, transport):
    """Sends malformed messages to a default method of a real server,
    then a good call over the same channel."""
    if rank == 1:
        return serve_calc(rank, size, store, "server", threads=1)
    rpc.init("client", store=store)
    try:
        with rpc.proxy("server", Calc, timeout=30) as calc:
            add = calc.spec.methods["add"][0]
            for bad in (b"", b"SRP1" + bytes(20), message((b"[" + u32(1)) * 200 + b"N"),
                        message(b"[" + u32(0xFFFFFFFF)), message(tensor_tag(0, [1 << 40]), [(0, 64)]),
                        codec.encode(5)[0], codec.encode(([1], 7))[0]):   # well formed, not (args, kwargs)
                req = calc._client.call(add, bytes(bad))
                assert req.wait(timeout_ms=30_000) is True, "a malformed call must fail at the server"
                err = decode_remote(memoryview(req))
                assert err.remote_type == "ValueError", err
                assert "message" in err.remote_message, err
            assert calc.add(2, 3, scale=2).wait() == 10
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    return "ok"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_server_refuses_malformed_calls_and_goes_on(transport):
    assert run_job(2, hostile_caller, transport, env={"DLSLIME_TRANSPORT": transport})[0] == "ok"
