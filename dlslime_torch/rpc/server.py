"""Serving a service: worker threads take calls from the C server (GIL
released while they wait) and answer each by its method's kind."""

import threading
import traceback

from .. import _C
from . import codec, peers, stream
from .errors import RpcError, encode_remote
from .service import KIND_DEFAULT, KIND_INPLACE, spec_of

NEXT_SLICE_MS = 200
INLINE_ROOM = 64 * 1024 - 48  # a default slot less its header


class Server:
    """A service served in job (else the default job).  start() runs worker
    threads; serve_forever() blocks; stop() ends both.  A stream nobody
    pulls for stream_idle_timeout seconds is closed (its caller is gone)."""

    def __init__(self, service, *, threads=1, reply_timeout=30.0, slot_size=None, credits=None,
                 publish=True, job=None, stream_idle_timeout=stream.IDLE_TIMEOUT):
        self.service = service
        self.spec = spec_of(service)
        self.threads = max(1, int(threads))
        self.reply_timeout_ms = int(reply_timeout * 1000)
        self.job = peers.job(job)
        ctx = self.job.ctx
        ids = [mid for mid, _, _ in self.spec.methods.values()]
        self._srv = _C.RpcServer(ctx, self.spec.port, self.spec.digest, ids,
                                 slot_size=slot_size, credits=credits)
        self._streams = stream.Streams(stream_idle_timeout)
        self._handlers = {mid: self._streams.handler(getattr(service, name), kind, max_reply)
                          for name, (mid, kind, max_reply) in self.spec.methods.items()}
        self._workers = []
        self._stopped = threading.Event()
        self.served = 0
        codec.warm_up()
        self.job.track(self)
        if publish:
            self.job.publish_service(self.spec.name)
        self.name = self.job.name

    # ---- one call ----
    def _answer(self, call):
        handler, kind, max_reply = self._handlers[call.method]
        timeout = self.reply_timeout_ms
        try:
            if kind == KIND_DEFAULT:   # decode, call, encode, reply: one C call
                call.answer(handler, codec.pickle_body, codec.unpickle_body, timeout)
            elif kind == KIND_INPLACE:
                data = memoryview(call)
                cap = max_reply if max_reply is not None else max(len(data), INLINE_ROOM)
                buf = call.reply_buffer(cap)
                out = memoryview(buf)
                try:
                    n = handler(data, out)
                finally:
                    out.release()
                    data.release()
                if not isinstance(n, int) or not 0 <= n <= cap:
                    raise RpcError(f"an inplace handler must return the reply's length (0..{cap}), got {n!r}")
                call.commit(n, timeout_ms=timeout)
            else:
                data = memoryview(call)
                result = handler(data)
                if result is not data:
                    try:
                        data.release()
                    except BufferError:
                        pass   # a view made from it lives on (the result, say): the call keeps the payload
                call.reply(result if result is not None else b"", timeout_ms=timeout)
        except Exception as exc:  # the handler's failure goes to the caller
            payload = encode_remote(type(exc).__qualname__, str(exc), traceback.format_exc())
            try:
                call.fail(payload, timeout_ms=timeout)
            except RuntimeError:
                pass  # answered already (the reply itself failed: the client is gone)
        self.served += 1

    def serve_once(self, timeout=None):
        """Serves one call; returns False if none came within timeout."""
        ms = 2**62 if timeout is None else int(timeout * 1000)
        call = self._srv.next(ms)
        if call is None:
            return False
        self._answer(call)
        return True

    def _loop(self):
        while not self._stopped.is_set():
            try:
                call = self._srv.next(NEXT_SLICE_MS)
            except _C.SlimeClosedError:
                return
            if call is not None:
                self._answer(call)
                # dropped now, not when the next call comes: its payload
                # buffer goes back to the pool for the next request
                call = None

    def start(self):
        """Runs the worker threads in the background."""
        for i in range(self.threads):
            t = threading.Thread(target=self._loop, name=f"slime-rpc-{self.spec.name}-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def serve_forever(self, timeout=None):
        """Blocks until stop() (from a handler or another thread), or for
        timeout seconds if given."""
        if not self._workers:
            self.start()
        self._stopped.wait(timeout)
        self.close()

    def stop(self):
        self._stopped.set()

    def close(self):
        self._stopped.set()
        self._srv.close()
        for t in self._workers:
            if t is not threading.current_thread():
                t.join()
        self._workers = []
        self._streams.close()
        self.job.untrack(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(service, *, threads=1, timeout=None, **kwargs):
    """Serves service with `threads` worker threads until stop() is called
    on the returned server from a handler or another thread (or for
    timeout seconds); blocking."""
    server = Server(service, threads=threads, **kwargs)
    server.serve_forever(timeout)
    return server


def serve_once(service_or_server, timeout=None, **kwargs):
    """Serves exactly one call (or none within timeout); returns whether
    one was served.  Give a Server to keep serving the same one."""
    if isinstance(service_or_server, Server):
        return service_or_server.serve_once(timeout)
    with Server(service_or_server, **kwargs) as server:
        return server.serve_once(timeout)
