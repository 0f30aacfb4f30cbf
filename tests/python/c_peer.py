"""Two-process harness for the dlslime_torch._C tests.

`Peer(fn, *args)` runs fn(link, *args) in a fresh process (spawn: no state
inherited from pytest).  The parent talks to it over a pipe: put()/get()
on both sides.  If the peer raises, its traceback fails the parent's next
get() or finish(), so a check made in the peer fails the test.

Also the helpers every test uses: deterministic data patterns and the
address exchange that connects the two contexts.
"""

import multiprocessing
import os
import signal
import traceback

import numpy as np

from dlslime_torch import _C

CONNECT_TIMEOUT_MS = 20000
PIPE_TIMEOUT_S = 60


class PeerFailed(AssertionError):
    pass


# A prime period: a chunk landing at a wrong power-of-two offset shows.
_PATTERN_PERIOD = 65521


def pattern(nbytes, seed):
    """nbytes of pseudo-random data, fixed by seed (cheap for 64 MiB)."""
    block = np.random.default_rng(seed).integers(0, 256, _PATTERN_PERIOD, dtype=np.uint8)
    return np.resize(block, nbytes)


def assert_bytes_equal(got, expected, what="data"):
    got = np.frombuffer(got, dtype=np.uint8) if not isinstance(got, np.ndarray) else got
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: {got.size} bytes, expected {expected.size}")
    if not np.array_equal(got, expected):
        first = int(np.argmax(got != expected))
        raise AssertionError(f"{what}: first difference at byte {first} of {expected.size} "
                             f"(got {got[first]}, expected {expected[first]})")


class Link:
    """The peer's end of the pipe."""

    def __init__(self, conn):
        self._conn = conn

    def put(self, obj):
        self._conn.send(("msg", obj))

    def get(self, timeout=PIPE_TIMEOUT_S):
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the test sent nothing for {timeout} s")
        return self._conn.recv()


def _peer_main(conn, fn, args):
    try:
        result = fn(Link(conn), *args)
        conn.send(("done", result))
    except BaseException:  # report everything, including SystemExit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Peer:
    """The test's handle on a peer process; use as a context manager."""

    def __init__(self, fn, *args):
        mp = multiprocessing.get_context("spawn")
        self._conn, child_conn = mp.Pipe()
        self._name = fn.__name__
        self.proc = mp.Process(target=_peer_main, args=(child_conn, fn, args),
                               daemon=True)
        self.proc.start()
        child_conn.close()

    def put(self, obj):
        self._conn.send(obj)

    def _next(self, timeout):
        if not self._conn.poll(timeout):
            raise PeerFailed(f"peer {self._name} sent nothing for {timeout} s")
        try:
            return self._conn.recv()
        except EOFError:
            self.proc.join(5)
            raise PeerFailed(f"peer {self._name} died (exit code "
                             f"{self.proc.exitcode})") from None

    def get(self, timeout=PIPE_TIMEOUT_S):
        kind, obj = self._next(timeout)
        if kind == "error":
            raise PeerFailed(f"peer {self._name} failed:\n{obj}")
        if kind == "done":
            raise PeerFailed(f"peer {self._name} finished early, returning {obj!r}")
        return obj

    def finish(self, timeout=PIPE_TIMEOUT_S):
        """Waits for the peer to return; gives back its result."""
        kind, obj = self._next(timeout)
        if kind == "error":
            raise PeerFailed(f"peer {self._name} failed:\n{obj}")
        if kind != "done":
            raise PeerFailed(f"peer {self._name} sent {obj!r} instead of finishing")
        self.proc.join(timeout)
        return obj

    def kill(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            # A failure here often follows from one in the peer (it raised
            # and exited): show the peer's traceback, the real cause.
            if exc_type is not None and not isinstance(exc, PeerFailed):
                peer_error = self._pending_error()
                if peer_error:
                    raise PeerFailed(f"peer {self._name} failed:\n{peer_error}") from exc
        finally:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
            self._conn.close()

    def _pending_error(self):
        try:
            while self._conn.poll(1.0):
                kind, obj = self._conn.recv()
                if kind == "error":
                    return obj
        except (EOFError, OSError):
            pass
        return None


def accept_from_test(link, transport, **ctx_kwargs):
    """Peer side: make a context, publish its address, accept the test."""
    ctx = _C.Context(transport=transport, **ctx_kwargs)
    link.put(ctx.address())
    ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
    return ctx, ep


def connect_to_peer(peer, transport, **ctx_kwargs):
    """Test side: make a context and connect to the peer's address."""
    ctx = _C.Context(transport=transport, **ctx_kwargs)
    ep = ctx.connect(peer.get(), timeout_ms=CONNECT_TIMEOUT_MS)
    return ctx, ep


def local_pair(transport, **ctx_kwargs):
    """Two contexts in this process, connected: (a, b, ep_a_to_b, ep_b_to_a)."""
    a = _C.Context(transport=transport, **ctx_kwargs)
    b = _C.Context(transport=transport, **ctx_kwargs)
    ab = a.connect(b.address(), timeout_ms=CONNECT_TIMEOUT_MS)
    ba = b.accept(timeout_ms=CONNECT_TIMEOUT_MS)
    return a, b, ab, ba


def finish_request(result):
    """Waits on result if an operation returned a Request (errors found
    when posting raise before this; errors found later raise here)."""
    if isinstance(result, _C.Request):
        result.wait(timeout_ms=CONNECT_TIMEOUT_MS)
    return result
