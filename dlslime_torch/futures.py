"""Future: a Python handle on one _C.Request, for the APIs built on the core.

    fut.wait(timeout=None)   # seconds; raises, or returns the future
    fut.done()               # never blocks; True once finished (ok or not)
    fut.result(timeout=None) # wait, then the value (a tensor, an immediate)
    fut.exception(timeout=None)
    await fut                # in asyncio, without blocking the event loop

Timeouts are in seconds; None means DEFAULT_TIMEOUT_S, since nothing in
dlslime waits forever.  A wait that runs out raises the timeout error and
leaves the operation pending: wait again, or cancel() a receive.

Awaiting polls: _C.Request has no completion callback into Python (the
core's callback runs on its progress thread, which holds no GIL), so the
awaiting coroutine tests the request and sleeps between tests, starting
at zero and backing off to POLL_MAX_S.  That costs at most POLL_MAX_S of
extra latency and a wake-up per POLL_MAX_S while an operation is in
flight, and keeps no thread busy.

A future keeps what the operation uses (tensors, regions) referenced until
it has seen the request finish, and then runs its cleanup once (releasing
memory registered for that operation only).
"""

import asyncio
import threading
import time

from . import _C

DEFAULT_TIMEOUT_S = 300.0
POLL_MAX_S = 0.001

_PENDING, _OK, _FAILED = 0, 1, 2
_INF = float("inf")
# One lock for every future's first-settler-wins: settling is short and
# rare next to making futures, which a lock each would slow down.
_settle_lock = threading.Lock()


def timeout_ms(timeout):
    """Milliseconds for the core from a timeout in seconds (None: the
    default).  Negative, NaN and infinite timeouts are refused."""
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not 0 <= timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    return int(timeout * 1000)


def _as_is(exc, what):
    return exc


class Future:
    """The outcome of one operation (or of one batch of them).

    request: the _C.Request, or None for an operation that is complete
    already.  value: what result() returns on success; a callable is
    called with the request.  what: the operation in words, for errors
    (or a callable that makes them: most operations never fail).
    wrap_error(exc, what): turns a core error into the exception to raise.
    keep: objects to keep alive until the request finished.  cleanup: run
    once when the request is seen finished.
    """

    __slots__ = ("_req", "_value", "_what", "_wrap", "_keep", "_cleanup",
                 "_state", "_exc")

    def __init__(self, request, value=None, *, what="operation",
                 wrap_error=None, keep=(), cleanup=None):
        self._req = request
        self._value = value
        self._what = what
        self._wrap = wrap_error or _as_is
        self._keep = keep
        self._cleanup = cleanup
        self._exc = None
        self._state = _PENDING
        if request is None:
            self._settle(None)

    @classmethod
    def completed(cls, value=None, what="operation"):
        return cls(None, value, what=what)

    def _settle(self, exc):
        """Records the outcome (first caller wins) and cleans up."""
        if exc is None and self._cleanup is None and not callable(self._value):
            # Nothing to run once, and every thread that sees the request
            # sees the same final status (the binding records the first
            # one): success needs no lock, which is most of a small op's
            # settling.
            self._keep = ()
            if self._state == _PENDING:
                self._state = _OK
            return
        with _settle_lock:
            if self._state != _PENDING:
                return
            if exc is None and callable(self._value):
                try:
                    self._value = self._value(self._req)
                except BaseException as err:  # a value we cannot read is a failure
                    exc = err
            self._exc = exc
            self._state = _FAILED if exc is not None else _OK
            cleanup, self._cleanup, self._keep = self._cleanup, None, ()
        if cleanup is not None:
            cleanup()

    def _describe(self):
        return self._what() if callable(self._what) else self._what

    def _still_pending(self):
        # The core reports "ran out" and "ended with a timeout status"
        # with the same exception; the request's status tells them apart.
        return self._req.status == _C.INPROGRESS

    def wait(self, timeout=None):
        """Waits up to timeout seconds; returns self, or raises the
        operation's error (the timeout error if it is still pending)."""
        if self._state == _PENDING:
            # a plain number of seconds, the common case, without a call
            if (type(timeout) is float or type(timeout) is int) and 0 <= timeout < _INF:
                ms = int(timeout * 1000)
            else:
                ms = timeout_ms(timeout)
            try:
                self._req.wait(ms)
            except _C.SlimeTimeoutError as exc:
                if self._still_pending():
                    raise self._wrap(exc, self._describe()) from None
                self._settle(self._wrap(exc, self._describe()))
            except _C.SlimeError as exc:
                self._settle(self._wrap(exc, self._describe()))
            else:
                self._settle(None)
        if self._state == _FAILED:
            raise self._exc
        return self

    def done(self):
        """True once the operation finished, successfully or not.  Never
        blocks (drives the core's progress once)."""
        if self._state == _PENDING:
            try:
                finished = self._req.test()
            except _C.SlimeError as exc:
                self._settle(self._wrap(exc, self._describe()))
            else:
                if finished:
                    self._settle(None)
        return self._state != _PENDING

    def result(self, timeout=None):
        """Waits (see wait) and returns the operation's value."""
        self.wait(timeout)
        return self._value

    def exception(self, timeout=None):
        """Waits (see wait; a timeout still raises) and returns the
        operation's error, or None."""
        try:
            self.wait(timeout)
        except Exception as exc:  # noqa: BLE001  (handed back, not handled)
            if self._state == _PENDING:
                raise
            return exc
        return None

    def cancel(self):
        """Cancels a receive of an immediate that has not matched yet;
        True if it was canceled (it then fails with SlimeCanceledError).
        Transfers cannot be canceled: False."""
        if self._state != _PENDING:
            return False
        return bool(self._req.cancel())

    async def wait_async(self, timeout=None):
        """The awaitable form of result(): polls (see the module text)."""
        deadline = time.monotonic() + timeout_ms(timeout) / 1000
        delay = 0.0
        while not self.done():
            if time.monotonic() >= deadline:
                return self.result(timeout=0)   # raises the timeout error
            await asyncio.sleep(delay)
            delay = min(max(delay * 2, 20e-6), POLL_MAX_S)
        return self.result(timeout=0)

    def __await__(self):
        return self.wait_async().__await__()

    def __repr__(self):
        state = {_PENDING: "pending", _OK: "done", _FAILED: "failed"}[self._state]
        return f"<dlslime Future {self._describe()}: {state}>"


def wait_all(futures, timeout=None):
    """Waits for every future, all within one timeout (seconds); returns
    their results in order, or raises the first failure in list order
    once all of them have finished (or the timeout error)."""
    futures = list(futures)
    deadline = time.monotonic() + timeout_ms(timeout) / 1000
    first = None
    for fut in futures:
        try:
            fut.wait(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001
            if fut._state == _PENDING:
                raise
            first = first or exc
    if first is not None:
        raise first
    return [fut._value for fut in futures]
