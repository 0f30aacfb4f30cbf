"""The exceptions of the one-sided API.

Each class derives from the _C class of the same condition, so code that
already catches the core's errors (SlimeAccessError, SlimeTimeoutError,
which is also TimeoutError, ...) catches these too.  Python-side checks
raise them before anything is posted; failures the core reports (at the
target, or a lost peer) are re-raised as the same classes with the
operation named in front of the core's text.
"""

from .. import _C


class RdmaError(_C.SlimeError):
    """A one-sided operation failed.  status, status_name and detail as
    on the core's errors (status is _C.ERR_* of the cause); check: the
    name of the check that refused the operation before anything moved
    (dlslime_torch.rdma.checks), else None."""

    check = None

    def __init__(self, message, status=None, detail=None):
        super().__init__(message)
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "")
        self.detail = message if detail is None else detail


class RdmaInvalidError(RdmaError, _C.SlimeInvalidError):
    """Bad arguments: dtype or size mismatch, non-contiguous or non-CPU
    tensor, a malformed descriptor, an immediate out of range.  Also a
    ValueError."""

    def __init__(self, message, status=_C.ERR_INVAL, detail=None):
        super().__init__(message, status, detail)


class RdmaAccessError(RdmaError, _C.SlimeAccessError):
    """Memory the operation may not touch: out of bounds, unregistered or
    deregistered, or a descriptor from another job."""

    def __init__(self, message, status=_C.ERR_ACCESS, detail=None):
        super().__init__(message, status, detail)


class RdmaTimeoutError(RdmaError, _C.SlimeTimeoutError):
    """A wait ran out; the operation is still pending (wait again).  Also
    a TimeoutError."""

    def __init__(self, message, status=_C.ERR_TIMEOUT, detail=None):
        super().__init__(message, status, detail)


class RdmaPeerLostError(RdmaError, _C.SlimePeerLostError):
    """The owner of the remote region died or the connection broke.  Also
    a ConnectionError."""

    def __init__(self, message, status=_C.ERR_PEER_LOST, detail=None):
        super().__init__(message, status, detail)


class RdmaCanceledError(RdmaError, _C.SlimeCanceledError):
    """A receive of an immediate was canceled before one arrived."""

    def __init__(self, message, status=_C.ERR_CANCELED, detail=None):
        super().__init__(message, status, detail)


_STATUS_NAMES = {getattr(_C, n): n.replace("ERR_", "SLIME_ERR_")
                 for n in dir(_C) if n.startswith("ERR_")}
_BY_STATUS = {_C.ERR_INVAL: RdmaInvalidError, _C.ERR_ACCESS: RdmaAccessError,
              _C.ERR_TIMEOUT: RdmaTimeoutError, _C.ERR_PEER_LOST: RdmaPeerLostError,
              _C.ERR_CANCELED: RdmaCanceledError}


def from_core(exc, what):
    """The RdmaError for a core error exc raised by the operation `what`
    (a phrase such as "write of 4096 bytes to rank 1"): the same kind,
    with `what` in front of the core's text.  An RdmaError already says
    what failed: it is returned as it is."""
    if isinstance(exc, RdmaError):
        return exc
    status = getattr(exc, "status", None)
    cls = _BY_STATUS.get(status, RdmaError)
    err = cls(f"dlslime rdma: {what} failed: {exc}", status=status,
              detail=getattr(exc, "detail", str(exc)))
    err.__cause__ = exc
    return err
