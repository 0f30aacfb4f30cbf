"""The SlimeRPC Python API between processes found through a TCPStore
(standalone), over both transports: every method kind with bytes and
tensors of many sizes and dtypes, keyword arguments, remote exceptions,
concurrent callers against several server threads, asyncio, timeouts with
late replies, a mismatched service definition and a server killed
mid-call.  The torchrun flavour is in tests/torch/test_rpc_torchrun.py."""

import asyncio
import os
import sys
import threading
import time

import pytest
import torch

from rpc_services import Calc, CalcOtherDefinition, serve_calc, serve_calc_until_killed
from dlslime_torch import rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(180)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int64,
          torch.uint8, torch.bool]
BYTE_SIZES = [0, 1, 1024, 65536 - 48 - 1, 65536, 1 << 20, 16 << 20]


def client_session(rank, size, store, transport):
    """Rank 0: the client of every check; rank 1 serves (serve_calc)."""
    if rank == 1:
        return serve_calc(rank, size, store, "server", threads=3)
    rpc.init("client", store=store)
    try:
        with rpc.proxy("server", Calc, timeout=60) as calc:
            _check_default(calc)
            _check_raw(calc)
            _check_errors(calc)
            _check_concurrency(calc)
            _check_async(calc)
            _check_timeouts(calc)
        with pytest.raises(rpc.RpcError, match="service definition mismatch"):
            rpc.proxy("server", CalcOtherDefinition, timeout=20)
        with pytest.raises(rpc.RpcError, match="no server"):
            rpc.proxy("nobody", Calc, timeout=0.5)
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    return "ok"


def _check_default(calc):
    assert calc.add(2, 3).wait() == 5
    assert calc.add(2, b=3, scale=10).wait() == 50
    assert calc.add("ab", "cd").wait() == "abcd"
    g = torch.Generator().manual_seed(0)
    tensors = []
    for i, dt in enumerate(DTYPES):
        for n in (0, 1, 1000, 1 << 18):
            t = (torch.rand(n, generator=g) * 100).to(dt)
            tensors.append(t.reshape(-1, 2) if n % 2 == 0 and n else t)
    nested = {"x": torch.arange(12).reshape(3, 4), "bytes": b"\x00\x01" * 100, "list": [1, 2.5, None]}
    got = calc.pack(*tensors, extra=nested).wait()
    assert got["pid"] != os.getpid()
    assert len(got["tensors"]) == len(tensors)
    for a, b in zip(got["tensors"], tensors):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert torch.equal(got["named"]["extra"]["x"], nested["x"])
    assert got["named"]["extra"]["bytes"] == nested["bytes"]
    assert got["named"]["extra"]["list"] == nested["list"]
    big = torch.randn(64 << 20 // 4, generator=g)          # 64 MiB both ways
    assert torch.equal(calc.add(big, 0).wait(), big)
    view = torch.arange(100.0)[::2]                         # not contiguous
    assert torch.equal(calc.add(view, 1).wait(), view + 1)


def _check_raw(calc):
    for n in BYTE_SIZES:
        data = os.urandom(n)
        assert bytes(calc.echo(data).wait()) == data
        assert bytes(calc.reverse(data).wait()) == data[::-1]
    with pytest.raises(TypeError):
        calc.echo(b"a", b"b")


def _check_errors(calc):
    with pytest.raises(rpc.RemoteRpcError) as info:
        calc.boom("the reason").wait()
    err = info.value
    assert err.remote_type == "KeyError"
    assert "the reason" in err.remote_message
    assert "raise KeyError(text)" in err.remote_traceback
    assert calc.add(1, 1).wait() == 2  # the channel goes on


def _check_concurrency(calc):
    results, failures = {}, []

    def caller(k):
        try:
            futs = [calc.add(torch.full((100 + j,), float(k)), j) for j in range(20)]
            for j, f in enumerate(futs):
                assert torch.equal(f.wait(), torch.full((100 + j,), float(k + j)))
            results[k] = True
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(results) == 6
    # several server threads run handlers at the same time
    names = rpc.wait_all([calc.thread_name() for _ in range(12)], timeout=30)
    assert len(set(names)) > 1, names


def _check_async(calc):
    async def main():
        return await asyncio.gather(calc.add(1, 2), calc.add(3, 4))

    assert asyncio.run(main()) == [3, 7]


def _check_timeouts(calc):
    slow = calc.sleep(0.5)
    with pytest.raises(rpc.RpcTimeoutError):
        slow.wait(timeout=0.05)
    with pytest.raises(rpc.RpcTimeoutError):
        rpc.wait_all([calc.sleep(0.5), calc.add(1, 1)], timeout=0.05)
    # the late replies are dropped; later calls get their own
    for i in range(10):
        assert calc.add(i, 1).wait() == i + 1
    time.sleep(0.6)
    for i in range(10):
        assert bytes(calc.echo(bytes([i]) * 100).wait()) == bytes([i]) * 100


def test_standalone_round_trips(transport):
    assert run_job(2, client_session, transport, env={"DLSLIME_TRANSPORT": transport})[0] == "ok"


def dying_server_session(rank, size, store, transport):
    if rank == 1:
        return serve_calc_until_killed(rank, size, store, "server")
    import signal
    rpc.init("client", store=store)
    calc = rpc.proxy("server", Calc, timeout=30)
    assert calc.add(1, 2).wait() == 3
    pending = calc.sleep(60)
    time.sleep(0.2)  # the server is inside the handler
    os.kill(int(store.get("server_pid")), signal.SIGKILL)
    # fails as soon as the core sees the peer die, long before the timeout
    with pytest.raises(rpc.RpcError, match="server is gone"):
        pending.wait(timeout=60)
    with pytest.raises(rpc.RpcError, match="server is gone"):
        calc.add(1, 1).wait(timeout=5)
    rpc.shutdown()
    return "ok"


def test_server_killed_mid_call(transport):
    def env_job():
        return run_job(2, _dying_with_pid, transport, env={"DLSLIME_TRANSPORT": transport}, may_exit=(1,))

    assert env_job()[0] == "ok"


def _dying_with_pid(rank, size, store, transport):
    if rank == 1:
        store.set("server_pid", str(os.getpid()))
    return dying_server_session(rank, size, store, transport)
