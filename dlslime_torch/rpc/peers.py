"""RPC jobs: how peers find each other and which token they must hold.

A job is the processes that share one torch.distributed store.  Each
publishes its context's address blob under its name
("dlslime_rpc/addr/<name>"), and a server publishes each service it
serves ("dlslime_rpc/svc/<name>/<service>") once it is ready.  The first
process to join picks the job's token ("dlslime_rpc/token"); a peer
holding another token is refused at the handshake.

A process may be in several jobs at once and may leave one and join
another any number of times, so each Job holds its own token and the
context that checks its peers against it: the process-wide context of
dlslime_torch.runtime when that was made with the same token (inside a
torchrun job on the dlslime backend: RPC shares the backend's
connections), else a context of the job's own, closed with the job.
rpc.init makes the default job, the one the module-level functions use;
inside torchrun it is made on first use, named by the rank, in the
default group's store.
"""

import atexit
import os
import secrets
import threading
from datetime import timedelta

from .. import _C, runtime
from .errors import RpcError

TOKEN_KEY = "dlslime_rpc/token"

_lock = threading.RLock()
_default = None
_jobs = []  # live jobs, left at exit


def _default_group_store():
    try:
        import torch.distributed as dist
    except ImportError:
        return None, None
    if not dist.is_available() or not dist.is_initialized():
        return None, None
    return str(dist.get_rank()), dist.distributed_c10d._get_default_store()


def _job_token(store, group_store):
    env = os.environ.get("DLSLIME_TOKEN")
    if env:
        return env.encode()
    # The backend's token is offered only to the backend's own store: a
    # job in another store would learn the secret of the torchrun job.
    mine = runtime.token() if group_store else None
    mine = mine or secrets.token_hex(16).encode()
    return bytes(store.compare_set(TOKEN_KEY, "", mine))


def wait_key(store, key, timeout_s, what):
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except Exception as exc:  # the store raises its own kinds of timeout
        raise RpcError(f"{what}: nothing published under '{key}' within {timeout_s} s "
                       f"({type(exc).__name__}: {exc})") from exc
    return store.get(key)


class Job:
    """This process's part in one job: Job(name, store) joins it (both
    may be left out inside torchrun: the rank, the group's store).
    proxy(), Server(), serve() work as the module's functions do, in
    this job; shutdown() (or leaving a with block) closes its servers,
    proxies and own context."""

    def __init__(self, name=None, store=None):
        group_store = None
        if store is None or name is None:
            rank_name, group_store = _default_group_store()
            name = rank_name if name is None else name
            store = group_store if store is None else store
        if store is None or name is None:
            raise RpcError("rpc: outside a torchrun job, give a name and a store "
                           "(torch.distributed.TCPStore)")
        self.name = str(name)
        self.store = store
        self.token = _job_token(store, store is group_store)
        self._closables = []
        self._closed = False
        with _lock:
            shared = runtime.token() == self.token
            self.ctx = runtime.context(self.token) if shared else _C.Context(token=self.token)
            self._owns_ctx = not shared
            _jobs.append(self)
        if shared:
            runtime.add_close_hook(_leave_shared)
        try:
            store.set(f"dlslime_rpc/addr/{self.name}", bytes(self.ctx.address()))
        except BaseException:
            self.shutdown()
            raise

    # ---- finding peers ----
    def connect(self, peer, timeout_s):
        """The endpoint to the process named peer in this job."""
        self._check_open()
        key = f"dlslime_rpc/addr/{peer}"
        addr = wait_key(self.store, key, timeout_s, f"rpc: peer '{peer}'")
        try:
            return self.ctx.connect(bytes(addr), timeout_ms=max(0, int(timeout_s * 1000)))
        except _C.SlimeError as exc:
            raise RpcError(f"rpc: cannot connect to peer '{peer}' of job '{self.name}': {exc}") from exc

    def publish_service(self, service_name):
        self.store.set(f"dlslime_rpc/svc/{self.name}/{service_name}", b"1")

    def wait_service(self, peer, service_name, timeout_s):
        wait_key(self.store, f"dlslime_rpc/svc/{peer}/{service_name}", timeout_s,
                 f"rpc: no server for {service_name} at peer '{peer}'")

    # ---- what rides the job ----
    def proxy(self, peer, service_cls, **kwargs):
        from .client import Proxy
        return Proxy(peer, service_cls, job=self, **kwargs)

    def Server(self, service, **kwargs):  # noqa: N802  (named as the class it makes)
        from .server import Server
        return Server(service, job=self, **kwargs)

    def serve(self, service, **kwargs):
        from .server import serve
        return serve(service, job=self, **kwargs)

    def track(self, obj):
        with _lock:
            self._check_open()
            self._closables.append(obj)

    def untrack(self, obj):
        with _lock:
            if obj in self._closables:
                self._closables.remove(obj)

    def _check_open(self):
        if self._closed:
            raise RpcError(f"rpc: job '{self.name}' is shut down")

    def shutdown(self):
        """Closes this job's servers and proxies, then its own context
        (a shared one stays with dlslime_torch.runtime)."""
        global _default
        with _lock:
            if self._closed:
                return
            self._closed = True
            objs, self._closables = self._closables, []
            if self in _jobs:
                _jobs.remove(self)
            if _default is self:
                _default = None
        for obj in reversed(objs):
            obj.close()
        if self._owns_ctx:
            self.ctx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def init(name=None, store=None):
    """Joins the default job as `name`, publishing this process's address
    in store, and returns it (a Job).  Inside torchrun both may be left
    out.  Calling it again for the same name and store returns the same
    job; for another job, shutdown() first, or make a second Job."""
    global _default
    with _lock:
        job = _default
        if job is not None:
            if job.name == str(name if name is not None else job.name) and store in (None, job.store):
                return job
            raise RpcError(f"rpc.init: this process is '{job.name}' in a job already; "
                           f"rpc.shutdown() it first, or join another with rpc.Job(name, store)")
        _default = Job(name, store)
        return _default


def job(given=None):
    """given, else the default job (made on first use inside torchrun)."""
    if given is not None:
        return given
    with _lock:
        if _default is not None:
            return _default
    return init()


def shutdown():
    """Leaves the default job: closes its servers, proxies and own context.
    Other Jobs stay until their own shutdown()."""
    with _lock:
        current = _default
    if current is not None:
        current.shutdown()


def _leave_shared():
    """The process-wide context is closing: the jobs riding it end first."""
    with _lock:
        riding = [j for j in _jobs if not j._owns_ctx]
    for j in riding:
        j.shutdown()


@atexit.register
def _leave_all():
    with _lock:
        live = list(_jobs)
    for j in reversed(live):
        j.shutdown()
