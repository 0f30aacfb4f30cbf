"""SlimeRPC streams between processes, over both transports: items with
tensors of several sizes (sync and async generators, for and async
for), errors at each stage (opening, the first item, mid-stream, after
the last, an item that cannot be sent), cancellation by the caller
(close, leaving the loop), per-item timeouts, back-pressure (the
producer stays within the window while the consumer sleeps), a caller
that disappears mid-stream and a server killed mid-stream."""

import asyncio
import os
import signal
import sys
import time

import pytest
import torch

from rpc_stream_services import Feed, item, serve_feed, wait_end
from dlslime_torch import rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from harness import run_job  # noqa: E402  (the torch tests' process harness)

pytestmark = pytest.mark.timeout(180)


def _same(got, i, nbytes, base=0):
    want = item(i, nbytes)
    return got["i"] == i and got["t"].dtype == want["t"].dtype and torch.equal(got["t"], want["t"] + base)


def stream_session(rank, size, store, transport):
    if rank == 1:
        return serve_feed("server", store, threads=3)
    rpc.init("client", store=store)
    try:
        with rpc.proxy("server", Feed, timeout=60) as feed:
            _check_items(feed)
            _check_async(feed)
            _check_errors(feed)
            _check_cancel(feed)
            _check_backpressure(feed)
            _check_timeout(feed)
            _check_bad_pulls(feed)
        with rpc.proxy("server", Feed, timeout=60, credits=2) as feed:
            _check_cancel_few_credits(feed)
    finally:
        store.set("stop", "1")
        rpc.shutdown()
    return "ok"


def _check_items(feed):
    for nbytes in (0, 1000, 1 << 20):
        got = list(feed.count(f"n{nbytes}", 5, nbytes=nbytes))
        assert len(got) == 5 and all(_same(g, i, nbytes) for i, g in enumerate(got))
        assert feed.progress(f"n{nbytes}").wait() == (5, "done")
    assert list(feed.count("empty", 0)) == []
    base = torch.full((4096,), 3, dtype=torch.uint8)        # a tensor argument
    got = list(feed.count("base", 3, nbytes=4096, base=base))
    assert all(_same(g, i, 4096, base=3) for i, g in enumerate(got))
    for window in (1, 2, 64):                                # the window does not change the items
        got = list(feed.count.with_options(window=window)(f"w{window}", 20, nbytes=16))
        assert [g["i"] for g in got] == list(range(20))
    with pytest.raises(ValueError, match="window"):
        feed.count.with_options(window=0)
    assert isinstance(feed.count("lazy", 1), rpc.Stream)


def _check_async(feed):
    async def main():
        sync_gen = [x["i"] async for x in feed.count("as", 4, nbytes=64)]
        async_gen = [x async for x in feed.acount("aa", 4, nbytes=64)]
        async with feed.acount("ab", None, sleep_s=0.001) as s:   # left early: aclose
            async for x in s:
                if x["i"] == 2:
                    break
        return sync_gen, async_gen

    sync_gen, async_gen = asyncio.run(main())
    assert sync_gen == [0, 1, 2, 3]
    assert all(_same(g, i, 64) for i, g in enumerate(async_gen)) and len(async_gen) == 4
    assert feed.progress("aa").wait() == (4, "done")
    assert feed.progress("ab").wait()[1] == "GeneratorExit"


def _expect_error_after(stream, k, remote_type, text):
    got = []
    with pytest.raises(rpc.RemoteRpcError) as info:
        for x in stream:
            got.append(x)
    assert len(got) == k, got
    assert info.value.remote_type == remote_type and text in info.value.remote_message
    assert list(stream) == []          # ended for good


def _check_errors(feed):
    _expect_error_after(feed.count("bad", 3, no_such_argument=1), 0, "TypeError", "no_such_argument")
    _expect_error_after(feed.count("e0", 5, fail_at=0), 0, "ValueError", "no item 0")
    _expect_error_after(feed.count("e3", 5, fail_at=3, nbytes=100), 3, "ValueError", "no item 3")
    _expect_error_after(feed.count("e5", 6, fail_at=5), 5, "ValueError", "no item 5")
    _expect_error_after(feed.acount("ae", 5, fail_at=2), 2, "ValueError", "no item 2")
    assert feed.progress("e3").wait() == (3, "raised")
    stream = feed.unsendable("u")
    assert next(stream) == 1
    with pytest.raises(rpc.RemoteRpcError):
        next(stream)
    # the channel and further streams go on
    assert [x["i"] for x in feed.count("after", 2)] == [0, 1]


def _check_cancel(feed):
    with feed.count("c1", None, nbytes=32) as s:               # close() waits for the server
        assert [next(s)["i"] for _ in range(3)] == [0, 1, 2]
    produced, end = feed.progress("c1").wait()
    assert end == "GeneratorExit" and produced <= 3 + 8

    for x in feed.count("c2", None):                           # dropped by leaving the loop
        if x["i"] == 2:
            break
    assert wait_end(feed, "c2")[1] == "GeneratorExit"

    s = feed.acount("c3", None, sleep_s=0.001)
    next(s)
    s.close()
    assert feed.progress("c3").wait()[1] == "GeneratorExit"
    s.close()                                                  # twice: nothing more


def _check_cancel_few_credits(feed):
    """A window beyond the client's credits: the pulls queue behind each
    other, and the close sent on leaving the loop still gets out."""
    for window in (8, 1):
        for x in feed.count.with_options(window=window)(f"cc{window}", None, nbytes=100):
            if x["i"] == 4:
                break
        assert wait_end(feed, f"cc{window}")[1] == "GeneratorExit"
    assert [x["i"] for x in feed.count.with_options(window=8)("cc", 20)] == list(range(20))


def _check_backpressure(feed):
    window = 4
    s = feed.count.with_options(window=window)("bp", None, nbytes=1024)
    assert [next(s)["i"] for _ in range(3)] == [0, 1, 2]
    # the pulls in flight are answered: item 2 + window - 1 is the last
    bound = 3 + window - 1
    deadline = time.monotonic() + 30
    while feed.progress("bp").wait()[0] < bound and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)                                            # a slow consumer
    assert feed.progress("bp").wait() == (bound, None)
    assert [next(s)["i"] for _ in range(10)] == list(range(3, 13))
    assert feed.progress("bp").wait()[0] <= 13 + window - 1
    s.close()


def _check_timeout(feed):
    s = feed.count.with_options(timeout=0.3)("slow", None, sleep_at=2, sleep_s=1.5)
    assert [next(s)["i"] for _ in range(2)] == [0, 1]
    with pytest.raises(rpc.RpcTimeoutError):
        next(s)
    with pytest.raises(StopIteration):
        next(s)
    produced, end = wait_end(feed, "slow")
    assert end == "GeneratorExit" and produced <= 2 + 8


def _check_bad_pulls(feed):
    """A client that does not follow the protocol gets errors; the
    server's streams go on."""
    call = feed.count._call              # the stream's calls, made by hand
    sid = call("open", ("bad", 3), {}).wait()
    for op, text in [(("next", sid + 1, 0), "not open"), (("next", sid, 1 << 20), "ahead"),
                     (("next", sid, "x"), "TypeError"), (("seek", sid), "unknown operation"),
                     (("next",), "TypeError")]:
        with pytest.raises(rpc.RemoteRpcError, match=text):
            call(*op).wait()
    assert call("next", sid, 0).wait()[1]["i"] == 0
    assert call("close", sid).wait() is None
    assert call("close", sid).wait() is None          # closing again: nothing
    assert feed.progress("bad").wait() == (1, "GeneratorExit")


def test_generator_methods_are_streams():
    class Svc:
        @rpc.method
        def gen(self):
            yield 1

        @rpc.method
        async def agen(self):
            yield 1

        @rpc.method
        def plain(self):
            return 1

    kinds = {name: kind for name, (_, kind, _) in rpc.service.spec_of(Svc).methods.items()}
    assert kinds == {"gen": "stream", "agen": "stream", "plain": "default"}
    with pytest.raises(ValueError, match="generator"):
        rpc.method(raw=True)(Svc.gen)


def test_stream_cases(transport):
    env = {"DLSLIME_TRANSPORT": transport}
    assert run_job(2, stream_session, transport, env=env)[0] == "ok"


def caller_gone_session(rank, size, store, transport):
    """Rank 2 reads two items and dies without closing; the server closes
    its generator once idle, and serves on."""
    if rank == 1:
        return serve_feed("server", store, idle_timeout=1.0)
    rpc.init(f"client{rank}", store=store)
    feed = rpc.proxy("server", Feed, timeout=60)
    if rank == 2:
        s = feed.count("gone", None, nbytes=4096)
        next(s), next(s)
        store.set("read", "1")
        os._exit(0)
    store.wait(["read"])
    produced, end = wait_end(feed, "gone", 60)
    assert end == "GeneratorExit" and 2 <= produced <= 2 + 8
    assert [x["i"] for x in feed.count("next", 3)] == [0, 1, 2]
    store.set("stop", "1")
    rpc.shutdown()
    return "ok"


def test_caller_disconnects_mid_stream(transport):
    env = {"DLSLIME_TRANSPORT": transport}
    assert run_job(3, caller_gone_session, transport, env=env, may_exit=(2,))[0] == "ok"


def server_killed_session(rank, size, store, transport):
    if rank == 1:
        return serve_feed("server", store)
    rpc.init("client", store=store)
    feed = rpc.proxy("server", Feed, timeout=60)
    pid = feed.pid().wait()
    s = feed.count("k", None, nbytes=256, sleep_at=5, sleep_s=60)
    assert [next(s)["i"] for _ in range(3)] == [0, 1, 2]
    os.kill(pid, signal.SIGKILL)
    # the items already sent may still come; then the loss, long before any timeout
    with pytest.raises(rpc.RpcError, match="server is gone"):
        for _ in s:
            pass
    rpc.shutdown()
    return "ok"


def test_server_killed_mid_stream(transport):
    env = {"DLSLIME_TRANSPORT": transport}
    assert run_job(2, server_killed_session, transport, env=env, may_exit=(1,))[0] == "ok"


def test_made_items_are_taken_while_a_later_one_is_slow():
    """The pull of item 2 makes items 0 and 1 on its way; their own pulls
    take them while item 2 is still being made (they came later, in
    other server threads).  With the generator run under the stream's
    lock they waited for item 2, and a per-item timeout fired on them."""
    from dlslime_torch.rpc.stream import _Producer
    import threading
    making_2, both_taken = threading.Event(), threading.Event()
    waited_out = []

    def gen():
        yield 0
        yield 1
        making_2.set()
        waited_out.append(not both_taken.wait(10))
        yield 2

    p = _Producer(gen(), None)
    results = {}
    later = threading.Thread(target=lambda: results.setdefault(2, p.pull(2)))
    later.start()
    assert making_2.wait(10)
    results[0], results[1] = p.pull(0), p.pull(1)
    both_taken.set()
    later.join(10)
    assert waited_out == [False]
    assert results == {0: (True, 0), 1: (True, 1), 2: (True, 2)}
