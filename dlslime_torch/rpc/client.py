"""Calling a service: proxies, futures, wait_all."""

import asyncio
import time

from .. import _C
from . import codec, peers, stream
from .errors import ReplyTooLargeError, RpcError, RpcTimeoutError, decode_remote
from .service import KIND_DEFAULT, KIND_STREAM, spec_of

DEFAULT_TIMEOUT = 30.0
AWAIT_SPIN_S = 0.0005   # how long `await future` polls before it waits in a thread


def _ms(timeout):
    return max(0, int(timeout * 1000))


class Future:
    """One call in flight.  wait(timeout) returns the result or raises
    (RemoteRpcError, RpcTimeoutError, RpcError); `await future` works in
    asyncio (the wait runs in the loop's default executor)."""

    __slots__ = ("_req", "_kind", "_timeout", "_done", "_result", "_error", "_out", "__weakref__")

    def __init__(self, req, kind, timeout, out=None):
        self._req = req
        self._kind = kind
        self._timeout = timeout
        self._done = False
        self._result = None
        self._error = None
        self._out = out           # the caller's buffer for the reply

    def _finish(self, remote_error):
        req = self._req
        if remote_error:
            self._error = decode_remote(memoryview(req))
        elif self._out is not None:
            self._finish_out(req)
        elif self._kind == KIND_DEFAULT:
            try:
                self._result = _C.codec_decode(req, codec.unpickle_body)
            except Exception as exc:
                self._error = RpcError(f"rpc: cannot decode the reply: {exc}")
        else:
            self._result = memoryview(req)
        self._done = True

    def _finish_out(self, req):
        reply = memoryview(req)
        if req.in_out:
            n = len(reply)
            reply.release()
            self._result = memoryview(self._out).cast("B")[:n]
        else:   # kept, not lost: the error carries it
            self._error = ReplyTooLargeError(len(reply), memoryview(self._out).nbytes, reply)
        self._out = None

    def wait(self, timeout=None):
        if not self._done:
            timeout = self._timeout if timeout is None else timeout
            try:
                remote_error = self._req.wait(_ms(timeout))
            except _C.SlimeTimeoutError:
                # given up: the C client drops the late reply when it comes
                self._req.abandon()
                self._error = RpcTimeoutError(f"rpc call got no reply within {timeout} s")
                self._done = True
            except _C.SlimePeerLostError as exc:
                self._error = RpcError(f"rpc: the server is gone: {exc}")
                self._done = True
            except _C.SlimeError as exc:
                self._error = RpcError(f"rpc call failed: {exc}")
                self._done = True
            else:
                self._finish(remote_error)
        if self._error is not None:
            raise self._error
        return self._result

    result = wait

    def done(self):
        return self._done or self._req.test()

    def __await__(self):
        return self._wait_async().__await__()

    async def _wait_async(self):
        # a short call completes while the loop polls it, with no hand-off
        # to a thread; a longer one is waited for in the loop's executor
        spin_until = time.perf_counter() + AWAIT_SPIN_S
        while not self._done and not self._req.test():
            if time.perf_counter() > spin_until:
                return await asyncio.get_running_loop().run_in_executor(None, self.wait)
            await asyncio.sleep(0)
        return self.wait()


def wait_all(futures, timeout=None):
    """Waits for every future (timeout in seconds for all of them
    together); returns their results in order, or raises the first
    failure in list order."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results = []
    for f in futures:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        results.append(f.wait(left))
    return results


class _Method:
    __slots__ = ("_proxy", "_id", "_kind", "__name__")

    def __init__(self, proxy, name, mid, kind):
        self._proxy = proxy
        self._id = mid
        self._kind = kind
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        p = self._proxy
        out = None
        if self._kind != KIND_DEFAULT:
            out = kwargs.pop("out", None)
            if len(args) != 1 or kwargs:
                raise TypeError(f"{self.__name__} is a raw method: call it with one bytes-like argument "
                                "(and out=, a writable buffer for the reply)")
        client = p._client
        if client is None:
            raise RpcError("rpc: the proxy is closed")
        try:
            if self._kind == KIND_DEFAULT:
                req = client.call_obj(self._id, args, kwargs, codec.pickle_body)
            else:
                req = client.call(self._id, args[0], None, out)
        except _C.SlimePeerLostError as exc:
            raise RpcError(f"rpc: the server is gone: {exc}") from exc
        except _C.SlimeError as exc:
            raise RpcError(f"rpc call failed: {exc}") from exc
        return Future(req, self._kind, p.timeout, out)


class Proxy:
    """The client side of a service at one peer (in job, else the default
    job): each method returns a Future, a generator method a Stream."""

    def __init__(self, peer, service_cls, timeout=DEFAULT_TIMEOUT, credits=None, slot_size=None, job=None):
        self.spec = spec_of(service_cls)
        self.peer = peer
        self.timeout = timeout
        self.job = peers.job(job)
        self.job.wait_service(peer, self.spec.name, timeout)
        ep = self.job.connect(peer, timeout)
        ctx = self.job.ctx
        try:
            self._client = _C.RpcClient(ctx, ep, self.spec.port, self.spec.digest, timeout_ms=_ms(timeout),
                                        credits=credits, slot_size=slot_size)
        except _C.SlimeRefusedError as exc:
            raise RpcError(f"rpc: {self.spec.name} at peer '{peer}' refused the channel: {exc}") from exc
        except _C.SlimeError as exc:
            raise RpcError(f"rpc: cannot open a channel to {self.spec.name} at peer '{peer}': {exc}") from exc
        for name, (mid, kind, _) in self.spec.methods.items():
            make = stream.StreamMethod if kind == KIND_STREAM else _Method
            setattr(self, name, make(self, name, mid, kind))
        codec.warm_up()
        self.job.track(self)

    def lend_stats(self):
        """What lending did on this channel: on (the server is on this host
        and maps what we lend), lent (raw calls whose payload, 1 MiB or
        more, went in shared memory), in_place (replies read from their
        request's block), kept (blocks a handler kept a view of), blocks
        (blocks made)."""
        if self._client is None:
            raise RpcError("rpc: the proxy is closed")
        return self._client.lend_stats()

    def close(self):
        client, self._client = self._client, None
        if client is not None:
            client.close()
        self.job.untrack(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def proxy(peer, service_cls, timeout=DEFAULT_TIMEOUT, **kwargs):
    """A Proxy to service_cls served by peer (a rank inside torchrun, or
    the name a process gave rpc.init)."""
    return Proxy(peer, service_cls, timeout=timeout, **kwargs)
