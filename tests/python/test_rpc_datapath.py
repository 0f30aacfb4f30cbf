"""The SlimeRPC call datapath between two processes, over both
transports: default methods whose large tensors travel as the message's
tail (sent from the tensor's memory, not copied into the message), and
raw calls whose reply lands in a buffer the caller gives (out=),
including one too small for it (an error that carries the reply)."""

import os
import sys

import numpy as np
import pytest
import torch

from rpc_services import Calc, serve_calc
from dlslime_torch import rpc
from dlslime_torch.rpc import codec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(180)


def _tensor_cases():
    g = torch.Generator().manual_seed(1)
    big = torch.randn(1 << 20, generator=g)                                   # 4 MiB: the tail
    return {
        "one tail": ((big,), {}),
        "at the threshold": ((torch.randint(0, 255, (codec.TAIL_MIN,), generator=g, dtype=torch.uint8),), {}),
        "tail among small": ((torch.arange(10), big.to(torch.bfloat16).reshape(1024, -1), torch.ones(3)),
                             {"k": torch.full((5000,), 2.0, dtype=torch.float64)}),
        "two large": ((torch.randn(300_000, generator=g), torch.randn(200_000, generator=g).to(torch.float16)), {}),
        "not contiguous": ((torch.randn(512, 1024, generator=g).t(),), {"scale": 2}),
        "16 MiB": ((torch.randn(4 << 20, generator=g),), {}),
    }


def _check_tensor_calls(calc):
    for name, (args, kwargs) in _tensor_cases().items():
        head, tail = codec.encode((args, kwargs))
        assert tail is not None, f"{name}: no tensor went as the message's tail"
        assert memoryview(tail).nbytes == max(t.nbytes for t in (*args, *kwargs.values()) if torch.is_tensor(t))
        got = calc.pack(*args, **kwargs).wait()
        assert got["pid"] != os.getpid()
        assert len(got["tensors"]) == len(args), name
        for a, b in zip(got["tensors"], args):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
        for k, v in kwargs.items():
            assert torch.equal(got["named"][k], v) if torch.is_tensor(v) else got["named"][k] == v, name
    # a tail in the reply that the server computed, not echoed
    x = torch.randn(1 << 18)
    assert torch.equal(calc.add(x, 1.5, scale=2).wait(), (x + 1.5) * 2)


def _check_out_buffers(calc):
    out = bytearray(5 << 20)
    for n in (0, 1, 1000, 65536 - 48, 65536, 1 << 20, 5 << 20):
        data = os.urandom(n)
        got = calc.echo(data, out=out).wait()
        assert isinstance(got, memoryview) and got.nbytes == n
        assert got.obj is out, "the reply must be a view of the caller's buffer"
        assert bytes(got) == data and out[:n] == data
        got.release()
    small = bytearray(b"\xab" * 999)
    data = os.urandom(1000)
    with pytest.raises(rpc.ReplyTooLargeError) as info:
        calc.echo(data, out=small).wait()
    assert info.value.size == 1000 and info.value.capacity == 999
    assert bytes(info.value.reply) == data, "the reply that did not fit is kept"
    assert small == b"\xab" * 999, "a reply that does not fit leaves out alone"
    big = os.urandom(2 << 20)
    with pytest.raises(rpc.ReplyTooLargeError) as info:
        calc.echo(big, out=np.zeros(1 << 20, dtype=np.uint8)).wait()
    assert bytes(info.value.reply) == big
    assert bytes(calc.echo(b"after", out=out).wait()) == b"after"   # the channel goes on
    with pytest.raises(TypeError, match="raw method"):
        calc.echo(b"x", out=bytearray(4), extra=1)


def client_session(rank, size, store, transport):
    if rank == 1:
        return serve_calc(rank, size, store, "server", threads=2)
    rpc.init("client", store=store)
    try:
        with rpc.proxy("server", Calc, timeout=60) as calc:
            _check_tensor_calls(calc)
            _check_out_buffers(calc)
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    return "ok"


def test_tensor_tails_and_out_buffers(transport):
    assert run_job(2, client_session, transport, env={"DLSLIME_TRANSPORT": transport})[0] == "ok"
