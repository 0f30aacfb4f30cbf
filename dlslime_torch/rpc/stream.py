"""Streams: a generator method whose items the caller iterates.

A stream is three kinds of default call on the method's id, so each
item (and its tensors, out of band) travels as any call's result does:
("open", args, kwargs) starts the generator and returns its stream id;
("next", sid, seq) returns (True, item number seq) or (False, None) at
the end; ("close", sid) stops it, or lets an ended one go (the caller
sends it however its stream ends).  The caller keeps `window` pulls in
flight: the producer runs at most that many items ahead of the consumer,
so a slow consumer pauses it and memory stays bounded on both sides.
The generator is advanced only by pulls, in order of seq whichever
worker thread takes them.  An exception in the generator fails the pull
of that item, so the caller gets the items before it, then the
RemoteRpcError.  Leaving the iteration early, a per-item timeout, or
close() sends "close": the generator sees GeneratorExit.  A caller that
disappears stops pulling: its streams are closed once idle for
stream_idle_timeout seconds.
"""

import asyncio
import collections
import secrets
import threading
import time

from . import client
from .errors import RpcError
from .service import KIND_DEFAULT, KIND_STREAM

DEFAULT_WINDOW = 8
MAX_WINDOW = 1024
IDLE_TIMEOUT = 120.0
MAX_OPEN = 1024          # streams open at one server
CLOSE_TIMEOUT_S = 10.0   # for an item in progress, and an async generator's cleanup
_END = (False, None)


# ---------------------------------------------------------------- caller

class StreamMethod:
    """A generator method at a proxy: calling it returns a Stream (items
    at most DEFAULT_WINDOW ahead, the proxy's timeout per item);
    with_options(window=, timeout=) gives a caller with other ones."""

    __slots__ = ("_call", "_proxy", "_closing", "__name__")

    def __init__(self, proxy, name, mid, kind):
        assert kind == KIND_STREAM
        self._call = client._Method(proxy, name, mid, KIND_DEFAULT)
        self._proxy = proxy
        self._closing = collections.deque()
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return Stream(self, args, kwargs, DEFAULT_WINDOW, self._proxy.timeout)

    def linger(self, future):
        """Keeps a close nobody waits for until it is done: a request
        dropped while it waits for a credit is never sent.  No lock: it
        runs from __del__, wherever the collector runs; each deque
        operation is atomic, and a close popped not done goes back."""
        self._closing.append(future)
        for _ in range(len(self._closing)):
            try:
                f = self._closing.popleft()
            except IndexError:
                break
            if not f.done():
                self._closing.append(f)

    def with_options(self, *, window=DEFAULT_WINDOW, timeout=None):
        if not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"a stream's window is 1..{MAX_WINDOW} items, not {window!r}")
        timeout = self._proxy.timeout if timeout is None else timeout
        return lambda *args, **kwargs: Stream(self, args, kwargs, window, timeout)


class Stream:
    """The caller's end of one stream: iterate it (for, or async for),
    once, from one thread or task.  close() (or leaving a with block)
    stops the producer; so does dropping the stream before its end.
    Each item waits at most `timeout` seconds (RpcTimeoutError, and the
    stream is closed)."""

    def __init__(self, method, args, kwargs, window, timeout):
        self._method = method
        self._call = method._call
        self._request = (args, kwargs)
        self._window = window
        self._timeout = timeout
        self._sid = None
        self._pulls = collections.deque()
        self._seq = 0
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        item = self._next_or_end()
        if item is _END:
            raise StopIteration
        return item[1]

    def __aiter__(self):
        return self

    async def __anext__(self):
        # as Future.__await__: the wait runs in the loop's executor
        item = await asyncio.get_running_loop().run_in_executor(None, self._next_or_end)
        if item is _END:
            raise StopAsyncIteration
        return item[1]

    def _next_or_end(self):
        if self._done:
            return _END
        try:
            if self._sid is None:
                args, kwargs = self._request
                self._request = None
                self._sid = self._call("open", args, kwargs).wait(self._timeout)
            while len(self._pulls) < self._window:
                self._pulls.append(self._call("next", self._sid, self._seq))
                self._seq += 1
            item = self._pulls.popleft().wait(self._timeout)
        except BaseException:
            self._end(wait=False)
            raise
        if not item[0]:
            self._end(wait=False)
            return _END
        return item

    def _end(self, wait):
        """Finishes the stream: the pulls still in flight are abandoned
        (their late replies dropped), and the server is told to let the
        stream go, ended or not (after an error, a timeout, a reply
        that could not be encoded, it may still hold the generator)."""
        self._done = True
        self._pulls.clear()
        if self._sid is None:
            return
        try:
            closing = self._call("close", self._sid)
            if wait:
                closing.wait(self._timeout)
            else:
                self._method.linger(closing)
        except RpcError:
            pass  # the server or the proxy is gone: nothing runs there to stop

    def close(self):
        """Stops the producer and waits until the server has (at most the
        per-item timeout)."""
        if not self._done:
            self._end(wait=True)

    async def aclose(self):
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    def __del__(self):
        if not getattr(self, "_done", True):
            self._end(wait=False)


# ---------------------------------------------------------------- server

async def _anext(agen):
    return await agen.__anext__()


async def _aclose(agen):
    await agen.aclose()


class _Producer:
    """One open stream at the server: its generator, advanced by pulls one
    at a time, the items asked for ahead kept until their pull.  The
    generator runs with the lock released, so that the pull of an item
    made already takes it while a later pull waits for a slow one."""

    def __init__(self, gen, loop):
        self.gen = gen
        self.loop = loop          # the event loop of an async generator, else None
        self.lock = threading.Lock()
        self.turn = threading.Condition(self.lock)   # advancing became False
        self.advancing = False    # a pull is inside the generator
        self.next_seq = 0
        self.ready = {}
        self.finished = False
        self.cancelled = False
        self.touched = time.monotonic()

    def _advance(self):
        """(True, item), _END, or the generator's exception to raise."""
        try:
            if self.loop is None:
                return True, next(self.gen)
            return True, asyncio.run_coroutine_threadsafe(_anext(self.gen), self.loop).result()
        except (StopIteration, StopAsyncIteration):
            self.finished = True
            return _END
        except Exception as exc:  # goes to the caller at this item
            self.finished = True
            return False, exc

    def _make_next_locked(self):
        """Under the lock: the next item, made with the lock released."""
        self.advancing = True
        seq = self.next_seq
        self.lock.release()
        try:
            outcome = self._advance()
        finally:
            self.lock.acquire()
            self.advancing = False
            self.turn.notify_all()
        self.ready[seq] = outcome
        self.next_seq = seq + 1

    def pull(self, seq):
        if not 0 <= seq < self.next_seq + MAX_WINDOW:
            raise RpcError(f"stream: item {seq} asked for, more than {MAX_WINDOW} ahead of {self.next_seq}")
        self.touched = time.monotonic()
        try:
            with self.lock:
                while self.next_seq <= seq and not (self.finished or self.cancelled):
                    if self.advancing:
                        self.turn.wait()
                    else:
                        self._make_next_locked()
                outcome = self.ready.pop(seq, _END)
        finally:
            self.touched = time.monotonic()
            self.close_if_cancelled()
        if outcome[0] is False and outcome[1] is not None:
            raise outcome[1]
        return outcome

    def busy(self):
        return self.advancing

    def close_if_cancelled(self, wait_s=0.0):
        """Closes the generator once cancelled, waiting up to wait_s for a
        pull inside it to finish its item.  That pull calls this again
        when it is out, so a cancel that found the generator busy is never
        lost."""
        if not self.cancelled:
            return
        if not (self.lock.acquire(timeout=wait_s) if wait_s > 0 else self.lock.acquire(blocking=False)):
            return
        try:
            if wait_s > 0:
                self.turn.wait_for(lambda: not self.advancing, wait_s)
            if self.advancing or self.finished:
                return
            self.finished = True
            self.turn.notify_all()
            if self.loop is None:
                self.gen.close()
            else:
                asyncio.run_coroutine_threadsafe(_aclose(self.gen), self.loop).result(CLOSE_TIMEOUT_S)
        except Exception:
            pass  # the generator's own cleanup failed: nobody is left to tell
        finally:
            self.lock.release()

    def cancel(self, wait_s=0.0):
        self.cancelled = True
        self.close_if_cancelled(wait_s)


class Streams:
    """The open streams of one server, closed when idle for idle_timeout
    seconds (the caller is gone) and when the server closes."""

    def __init__(self, idle_timeout=IDLE_TIMEOUT):
        self.idle_timeout = float(idle_timeout)
        self._lock = threading.Lock()
        self._open = {}
        self._closed = threading.Event()
        self._reaper = None
        self._loop = None
        self._loop_thread = None

    def handler(self, fn, kind, max_reply):
        """The server's (handler, kind, max_reply) for a method: a stream's
        handler answers its three calls, as a default method."""
        if kind != KIND_STREAM:
            return fn, kind, max_reply

        def answer(op, *rest):
            if op == "open":
                return self._start(fn, *rest)
            if op == "next":
                return self._pull(*rest)
            if op == "close":  # answered once closed, so that close() returns after it
                return self._cancel(*rest, wait_s=CLOSE_TIMEOUT_S)
            raise RpcError(f"stream: unknown operation {op!r}")

        return answer, KIND_DEFAULT, max_reply

    def _start(self, fn, args, kwargs):
        gen = fn(*args, **kwargs)
        is_async = hasattr(gen, "__anext__")
        with self._lock:
            if self._closed.is_set():
                raise RpcError("stream: the server is closing")
            if len(self._open) >= MAX_OPEN:
                raise RpcError(f"stream: {MAX_OPEN} streams are open at this server already")
            loop = self._event_loop() if is_async else None
            sid = secrets.randbits(62)
            while sid in self._open:
                sid = secrets.randbits(62)
            self._open[sid] = _Producer(gen, loop)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="slime-rpc-stream-reaper", daemon=True)
                self._reaper.start()
        return sid

    def _pull(self, sid, seq):
        with self._lock:
            producer = self._open.get(sid)
        if producer is None:
            raise RpcError(f"stream {sid} is not open here (it ended, was closed, or was idle "
                           f"for more than {self.idle_timeout} s)")
        # an ended stream stays for the pulls past its end, in flight
        # still, until its caller closes it (or leaves it idle)
        return producer.pull(seq)

    def _cancel(self, sid, wait_s=0.0):
        with self._lock:
            producer = self._open.pop(sid, None)
        if producer is not None:
            producer.cancel(wait_s)

    def _event_loop(self):
        """The loop async generators run on (one thread per server)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                 name="slime-rpc-stream-loop", daemon=True)
            self._loop_thread.start()
        return self._loop

    def _reap(self):
        while not self._closed.wait(min(1.0, self.idle_timeout / 4)):
            now = time.monotonic()
            with self._lock:
                idle = [sid for sid, p in self._open.items()
                        if not p.busy() and now - p.touched > self.idle_timeout]
            for sid in idle:
                self._cancel(sid)

    def close(self):
        with self._lock:
            self._closed.set()
            producers = list(self._open.values())
            self._open.clear()
            reaper, self._reaper = self._reaper, None
        for p in producers:
            p.cancel()
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(CLOSE_TIMEOUT_S)
            if not self._loop_thread.is_alive():  # else a generator blocks it: left to exit
                self._loop.close()
            self._loop = None
