"""The process-wide dlslime context.

One libdlslime context per process, shared by every dlslime process
group (and by the one-sided API and RPC that build on the same core), so
that one connection per pair of processes carries all of it.  It is made
on first use with the job's token, which the first process group agrees
on through torch's store (see dlslime_torch.backend).

Endpoints come from Context.connect, which returns the existing endpoint
to a peer: connecting again for another group costs nothing.

At exit the live process groups are shut down first (hooks added with
add_close_hook), then the context is closed.
"""

import atexit
import threading

from . import _C

_lock = threading.RLock()
_context = None
_token = None
_close_hooks = []
_atexit_registered = False


def current():
    """The context, or None before first use (or after close())."""
    return _context


def token():
    """The token the context was made with (bytes), or None."""
    return _token


def context(job_token):
    """The process-wide context, made with job_token on first use.

    A process belongs to one job: asking for another token once the
    context exists is an error, since its peers would refuse it.
    """
    global _context, _token, _atexit_registered
    job_token = bytes(job_token)
    with _lock:
        if _context is not None:
            if job_token != _token:
                raise RuntimeError(
                    "dlslime: this process already has a context for another "
                    "job (its token differs from the one this process group "
                    "agreed on); a process can take part in one job only")
            return _context
        _context = _C.Context(token=job_token)
        _token = job_token
        if not _atexit_registered:
            atexit.register(close)
            _atexit_registered = True
        return _context


def connect(address, timeout_ms):
    """The endpoint to the peer at address (the existing one if any)."""
    with _lock:
        if _context is None:
            raise RuntimeError("dlslime: connect() before the context exists")
        ctx = _context
    return ctx.connect(bytes(address), timeout_ms=int(timeout_ms))


def add_close_hook(hook):
    """Runs hook() before the context closes (once per registration)."""
    with _lock:
        if hook not in _close_hooks:
            _close_hooks.append(hook)


def close():
    """Runs the close hooks, then closes the context; a later context()
    makes a new one."""
    global _context, _token
    with _lock:
        ctx, _context, _token = _context, None, None
        hooks = list(_close_hooks)
    if ctx is None:
        return
    for hook in hooks:
        hook()
    ctx.close()
