"""How RPC peers find each other: names in a torch.distributed store.

Each process taking part publishes its context's address blob under its
name ("dlslime_rpc/addr/<name>"), and a server publishes each service it
serves ("dlslime_rpc/svc/<name>/<service>") once it is ready.  Inside a
torchrun job with a default process group, the group's store is used and
a rank's name is its number; outside one, rpc.init(name, store=TCPStore)
names the process.  The context is the process-wide one of
dlslime_torch.runtime, so RPC shares the backend's connections.
"""

import os
import secrets
import threading
from datetime import timedelta

from .. import runtime
from .errors import RpcError

_lock = threading.RLock()
_state = None  # (name, store)
_closables = []  # servers and clients to close before the context


class _State:
    def __init__(self, name, store):
        self.name = name
        self.store = store


def _default_group_store():
    try:
        import torch.distributed as dist
    except ImportError:
        return None, None
    if not dist.is_available() or not dist.is_initialized():
        return None, None
    return str(dist.get_rank()), dist.distributed_c10d._get_default_store()


def _job_token(store):
    existing = runtime.token()
    if existing is not None:
        return existing
    env = os.environ.get("DLSLIME_TOKEN")
    if env:
        return env.encode()
    # the first process to get here picks the job's secret
    mine = secrets.token_hex(16)
    return bytes(store.compare_set("dlslime_rpc/token", "", mine))


def init(name=None, store=None):
    """Joins RPC as `name`, publishing this process's address in store.

    Inside torchrun (a default process group exists) both may be left
    out: the name is the rank and the store the group's.  Calling it again
    with the same name does nothing."""
    global _state
    with _lock:
        if store is None or name is None:
            rank_name, group_store = _default_group_store()
            name = rank_name if name is None else name
            store = group_store if store is None else store
        if store is None or name is None:
            raise RpcError("rpc.init: outside a torchrun job, give a name and a store "
                           "(torch.distributed.TCPStore)")
        name = str(name)
        if _state is not None:
            if _state.name != name:
                raise RpcError(f"rpc.init: this process is '{_state.name}' already")
            return _state
        ctx = runtime.context(_job_token(store))
        runtime.add_close_hook(_close_all)
        store.set(f"dlslime_rpc/addr/{name}", bytes(ctx.address()))
        _state = _State(name, store)
        return _state


def state():
    """The RPC state, made by init() (implicitly inside torchrun)."""
    with _lock:
        if _state is not None:
            return _state
    return init()


def peer_name(peer):
    return str(peer)


def wait_key(store, key, timeout_s, what):
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except Exception as exc:  # the store raises its own kinds of timeout
        raise RpcError(f"{what}: nothing published under '{key}' within {timeout_s} s "
                       f"({type(exc).__name__}: {exc})") from exc
    return store.get(key)


def connect(peer, timeout_s):
    """The endpoint to the process named peer."""
    st = state()
    name = peer_name(peer)
    addr = wait_key(st.store, f"dlslime_rpc/addr/{name}", timeout_s, f"rpc: peer '{name}'")
    return runtime.connect(addr, int(timeout_s * 1000))


def publish_service(service_name):
    st = state()
    st.store.set(f"dlslime_rpc/svc/{st.name}/{service_name}", b"1")


def wait_service(peer, service_name, timeout_s):
    st = state()
    wait_key(st.store, f"dlslime_rpc/svc/{peer_name(peer)}/{service_name}", timeout_s,
             f"rpc: no server for {service_name} at peer '{peer}'")


def track(obj):
    with _lock:
        _closables.append(obj)


def untrack(obj):
    with _lock:
        if obj in _closables:
            _closables.remove(obj)


def _close_all():
    global _state
    with _lock:
        objs = list(_closables)
        _closables.clear()
        _state = None
    for obj in reversed(objs):
        obj.close()


def shutdown():
    """Closes every server and client of this process (the context stays
    with dlslime_torch.runtime)."""
    _close_all()
