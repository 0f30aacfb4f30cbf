"""The default methods' codec (dlslime_torch.rpc.codec, C in
csrc/python/codec*.c) in one process: every kind it has a tag for comes
back equal and of the same type as a pickle round trip gives (the
reference), through the tagged path; everything else through the pickle
path, tensors out of band either way; the tail is the largest tensor,
sent from its own memory.  The codec reads and makes tensors through the
shim's ATen calls where the shim loads, else through torch's Python API:
this module runs once more in a process without the shim."""

import enum
import os
import pickle
import subprocess
import sys
from collections import OrderedDict, namedtuple

import pytest
import torch

from dlslime_torch.rpc import codec

F_PICKLE = 1
Point = namedtuple("Point", "x y")


class Color(enum.IntEnum):
    RED = 1


def _message(obj):
    """The whole message as the receiver gets it (head, then tail), and
    the head's flags."""
    head, tail = codec.encode(obj)
    assert head[:4] == b"SRP2"
    whole = bytearray(head) + (bytes(memoryview(tail)) if tail is not None else b"")
    return whole, int.from_bytes(head[4:8], "little")


def _same(a, b):
    """Equal, of the same types all the way down (tensors: dtype, shape,
    bytes)."""
    if isinstance(a, torch.Tensor):
        return (type(b) is type(a) and a.dtype == b.dtype and a.shape == b.shape
                and a.requires_grad == b.requires_grad and torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


TAGGED = {
    "none": None, "bools": (True, False), "ints": [0, -1, 2**63 - 1, -2**63],
    "floats": [0.0, -1.5, float("inf"), float("nan"), 1e-300], "str": "héllo ✓ \x00",
    "bytes": b"\x00\xff" * 100, "empty": ((), [], {}, "", b""),
    "nested": {"a": [1, (2.5, "x", {"b": None})], 3: b"k", (1, 2): [[]]},
    "call": ((torch.arange(10), 1.5), {"scale": 2, "t": torch.ones(3, 4, dtype=torch.bfloat16)}),
    "dtypes": [torch.zeros(3, dtype=d) for d in (torch.float32, torch.float64, torch.float16, torch.uint8,
                                                 torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
                                                 torch.complex64, torch.complex128)],
    "shapes": [torch.tensor(3.0), torch.zeros(0, 5), torch.randn(2, 3, 4, 5), torch.randn(1, 1, 1)],
    "not contiguous": torch.randn(40, 30).t(),
    "same tensor twice": [torch.ones(2)] * 3,
    "lazy conjugate and negation": [torch.tensor([1 + 2j, 3 - 1j]).conj(), torch.tensor([1j, 2])._neg_view()],
}

PICKLED = {
    "big int": 2**70, "set": {1, 2}, "namedtuple": Point(1, torch.ones(2)), "ordered": OrderedDict(a=1),
    "intenum": Color.RED, "class": OrderedDict, "surrogate": "\ud800", "bytearray": bytearray(b"ab"),
    "too deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    "tensor in a set-holding dict": {"s": frozenset([1]), "t": torch.randn(5, 5)},
    "parameters": [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.ones(4), requires_grad=False)],
}


@pytest.mark.parametrize("name", list(TAGGED))
def test_tagged_round_trip(name):
    obj = TAGGED[name]
    msg, flags = _message(obj)
    assert flags == 0, f"{name} went through the pickle fallback"
    got = codec.decode(msg)
    assert _same(pickle.loads(pickle.dumps(obj)), got)
    assert _same(obj if not isinstance(obj, torch.Tensor) else obj.contiguous(), got)


@pytest.mark.parametrize("name", list(PICKLED))
def test_pickle_fallback_round_trip(name):
    obj = PICKLED[name]
    msg, flags = _message(obj)
    assert flags == F_PICKLE, f"{name} should need the pickle fallback"
    assert _same(pickle.loads(pickle.dumps(obj)), codec.decode(msg))


def test_depth_limit_is_the_tagged_paths():
    deep = 1
    for _ in range(codec.DEPTH_MAX):
        deep = [deep]
    assert _message(deep)[1] == 0
    assert _message([deep])[1] == F_PICKLE


@pytest.mark.parametrize("fallback", [False, True])
def test_tensors_out_of_band_and_the_tail(fallback):
    small, big, bigger = torch.randn(100), torch.randn(codec.TAIL_MIN // 4), torch.randn(codec.TAIL_MIN)
    obj = [small, bigger, big] + ([{1}] if fallback else [])
    head, tail = codec.encode(obj)
    assert int.from_bytes(head[4:8], "little") == (F_PICKLE if fallback else 0)
    assert memoryview(tail).nbytes == bigger.nbytes, "the largest tensor is the tail"
    assert bytes(memoryview(tail)) == bigger.numpy().tobytes()
    assert len(head) < small.nbytes + big.nbytes + 4096, "the tail's bytes are not in the head"
    msg = bytearray(head) + bytes(memoryview(tail))
    got = codec.decode(msg)
    assert all(_same(a, b) for a, b in zip(obj, got))
    # tensors of TAIL_MIN bytes or more alias the message (no copy of a
    # large tensor); the tagged path copies smaller ones, which then do
    # not keep it alive
    base = torch.frombuffer(msg, dtype=torch.uint8).data_ptr()
    assert got[1].data_ptr() == base + len(head)
    assert base < got[2].data_ptr() < base + len(head)
    assert (base <= got[0].data_ptr() < base + len(msg)) == fallback


def test_tail_keeps_its_tensor():
    t = torch.randn(codec.TAIL_MIN)
    expect = t.numpy().tobytes()
    _, tail = codec.encode([t])
    del t
    assert bytes(memoryview(tail)) == expect


def test_below_the_tail_threshold_all_in_the_head():
    t = torch.randn(codec.TAIL_MIN // 4 - 1)
    head, tail = codec.encode((t,))
    assert tail is None and len(head) > t.nbytes
    assert _same((t,), codec.decode(bytearray(head)))


def test_tensor_path_is_aten_with_the_shim():
    from dlslime_torch import _C
    try:
        import dlslime_torch._shim  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the shim does not load here: {exc}")
    assert _C.codec_tensor_path() == "aten"


def test_the_same_through_the_python_path():
    """Every case above in a process where the shim cannot load."""
    if os.environ.get("DLSLIME_CODEC_NO_SHIM"):
        from dlslime_torch import _C
        assert _C.codec_tensor_path() == "python"
        return
    block = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_shim")
    env = dict(os.environ, DLSLIME_CODEC_NO_SHIM="1",
               PYTHONPATH=block + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                        "-k", "not aten_with_the_shim"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_a_large_decoded_tensor_holds_the_message_while_it_lives():
    """A tensor of TAIL_MIN bytes or more is the message's memory: the
    message stays (a bytearray cannot be resized under it) while the
    tensor lives, and is let go when the tensor dies."""
    t = torch.randn(codec.TAIL_MIN // 4).view(4, -1)
    msg, _ = _message(((t,), {}))
    got = codec.decode(msg)[0][0]
    assert torch.equal(got, t)
    with pytest.raises(BufferError):
        msg.extend(b"x")
    del got
    msg.extend(b"x")   # no export left: the tensor's storage released it


def test_a_parameter_comes_back_a_parameter_its_data_out_of_band():
    p = torch.nn.Parameter(torch.randn(codec.TAIL_MIN // 4))
    head, tail = codec.encode(((p,), {}))
    assert int.from_bytes(head[4:8], "little") == F_PICKLE
    assert tail is not None and memoryview(tail).nbytes == p.nbytes   # its bytes, sent from its memory
    assert len(head) < 4096
    got = codec.decode(bytearray(head) + bytes(memoryview(tail)))[0][0]
    assert type(got) is torch.nn.Parameter and got.requires_grad and torch.equal(got, p)
