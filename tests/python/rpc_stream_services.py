"""A streaming service for the SlimeRPC stream tests (importable by
spawned processes).  Each stream has a tag; the service records how far
each tag's generator got and how it ended, so the caller can check what
ran at the server."""

import asyncio
import os
import threading
import time

import torch

from dlslime_torch import rpc


def item(i, nbytes):
    """Item i: its number and a tensor of nbytes bytes derived from it."""
    return {"i": i, "t": torch.arange(nbytes, dtype=torch.int64).to(torch.uint8) ^ (i & 0xFF)}


class Feed:
    rpc_name = "tests.Feed"

    def __init__(self):
        self._lock = threading.Lock()
        self._produced = {}
        self._ends = {}

    def _note(self, tag, end=None):
        with self._lock:
            if end is None:
                self._produced[tag] = self._produced.get(tag, 0) + 1
            else:
                self._ends[tag] = end

    @rpc.method
    def count(self, tag, n=None, *, fail_at=None, nbytes=0, sleep_at=None, sleep_s=0.0, base=None):
        """Items 0..n-1 (endless if n is None); raises ValueError instead
        of item fail_at; sleeps sleep_s before item sleep_at; adds base (a
        tensor argument) to each item's tensor."""
        try:
            i = 0
            while n is None or i < n:
                if i == sleep_at:
                    time.sleep(sleep_s)
                if i == fail_at:
                    raise ValueError(f"no item {i}")
                out = item(i, nbytes)
                if base is not None:
                    out["t"] = out["t"] + base
                self._note(tag)
                yield out
                i += 1
            self._note(tag, "done")
        except GeneratorExit:
            self._note(tag, "GeneratorExit")
            raise
        except ValueError:
            self._note(tag, "raised")
            raise

    @rpc.method
    async def acount(self, tag, n=None, *, fail_at=None, nbytes=0, sleep_s=0.0):
        """count's async twin, awaiting sleep_s before each item."""
        try:
            for i in range(n if n is not None else 1 << 62):
                await asyncio.sleep(sleep_s)
                if i == fail_at:
                    raise ValueError(f"no item {i}")
                self._note(tag)
                yield item(i, nbytes)
            self._note(tag, "done")
        except GeneratorExit:
            self._note(tag, "GeneratorExit")
            raise

    @rpc.method
    def unsendable(self, tag):
        yield 1
        yield lambda: None  # cannot be pickled: fails at the server, at this item
        yield 3

    @rpc.method
    def progress(self, tag):
        """(items produced, how it ended or None) for tag."""
        with self._lock:
            return self._produced.get(tag, 0), self._ends.get(tag)

    @rpc.method
    def pid(self):
        return os.getpid()


def serve_feed(name, store, *, threads=2, idle_timeout=120.0):
    """Serves Feed as name until 'stop' is set in store."""
    rpc.init(name, store=store)
    with rpc.Server(Feed(), threads=threads, stream_idle_timeout=idle_timeout).start():
        store.wait(["stop"])
    rpc.shutdown()
    return "served"


def wait_end(feed, tag, timeout_s=30.0):
    """How tag's generator ended, polled until it has (the close is
    asynchronous when the caller only dropped the stream)."""
    deadline = time.monotonic() + timeout_s
    while True:
        produced, end = feed.progress(tag).wait()
        if end is not None or time.monotonic() > deadline:
            return produced, end
        time.sleep(0.02)
