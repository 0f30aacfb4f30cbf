"""read, write, write_with_imm, recv_imm and their batch forms.

Every operation is checked in full before anything moves (for a batch:
every op of it), so a bad argument raises at the call and neither side's
memory is touched.  The checks name the tensor, the offset and the sizes;
the core checks again at the target, which is what catches a region its
owner has deregistered since handing out the descriptor.

Local memory: a tensor inside a Region of this process uses that region;
any other tensor has its whole storage registered for the operation (or
the batch) only, and deregistered once the future has seen it finish.

Descriptors of this process's own regions are served by a local copy
(a process has no connection to itself), checked the same way.
"""

import functools

import torch

from .. import _C, runtime
from ..futures import Future
from . import region as regions
from .checks import Refusal, check_count, check_tensor
from .checks import error as refusal_error
from .errors import RdmaAccessError, RdmaInvalidError, from_core
from .region import Peer, Region, RemoteTensor

CONNECT_TIMEOUT_S = 60
_OPCODES = {"read": _C.OP_READ, "write": _C.OP_WRITE, "write_with_imm": _C.OP_WRITE_IMM}
_endpoints = {}   # our context id -> {peer context id -> Endpoint}


def _endpoint(ctx, peer):
    mine = _endpoints.setdefault(ctx.id, {})
    ep = mine.get(peer.context_id)
    if ep is not None and ep.status == _C.OK:
        return ep
    try:
        ep = runtime.connect(peer.address, int(CONNECT_TIMEOUT_S * 1000))
    except _C.SlimeError as exc:
        raise from_core(exc, f"connecting to {peer}") from None
    if ep.peer_id != peer.context_id:
        raise RdmaAccessError(
            f"dlslime rdma: the address of {peer} leads to context "
            f"{ep.peer_id:016x}; the descriptor is stale (its owner is gone)")
    mine[peer.context_id] = ep
    return ep


class _Call:
    """What every op of one call is checked against: this process's
    context and job, looked up again only when the context changes.
    env: the same as the checks (_C.rdma_check, Context.rdma_post,
    rdma_batch) take it (csrc/python/rdma_check.h)."""

    __slots__ = ("ctx", "env")

    def __init__(self):
        self.ctx = ctx = regions.context()
        self.env = (regions.this_job(), ctx.id, RemoteTensor, torch.Tensor,
                    _endpoints.setdefault(ctx.id, {}), functools.partial(_endpoint, ctx))


_last_call = None


def _current_call():
    global _last_call
    call = _last_call
    if call is None or call.ctx is not runtime.current():
        call = _last_call = _Call()
    return call


class _Op:
    """One checked operation: local (a contiguous CPU tensor), remote,
    and the byte range in the remote region.  own: this process's Region
    behind the descriptor (None for a peer's).  The checks are
    _C.rdma_check's, the fast path's own; the text for errors is made
    only when needed (name, describe)."""

    __slots__ = ("kind", "local", "remote", "offset", "roff", "nbytes", "imm", "own", "label")

    def __init__(self, kind, local, remote, offset, call, imm=None, label=""):
        if isinstance(local, Region):
            local.check_registered()
            local = local.tensor
        self.kind, self.local, self.remote, self.offset = kind, local, remote, offset
        self.imm, self.label = imm, label
        try:
            own = _C.rdma_check(local, remote, offset, imm, call.env)
        except Refusal as refusal:
            raise refusal_error(refusal, self.name) from None
        size = local.element_size()
        self.roff, self.nbytes = offset * size, local.numel() * size
        self.own = None
        if own:
            self.own = regions.by_desc(remote.desc)
            if self.own is None:
                raise RdmaAccessError(f"dlslime rdma: {self.describe()}: that region "
                                      f"of this process was deregistered")

    def name(self, part):
        """The part of this op a refusal names (checks._WORDS)."""
        if part == "tensor":
            return f"{self.label}the local tensor of {self.kind}"
        if part == "remote":
            return f"{self.label}the remote side of {self.kind}"
        if part == "count":
            return f"{self.label}offset"
        return self.describe()

    def describe(self):
        return _describe(self.kind, self.local, self.remote, self.offset, self.label)

    def copy_locally(self):
        size = self.local.element_size()
        theirs = self.own.tensor.detach().reshape(-1)[
            self.roff // size:(self.roff + self.nbytes) // size]
        mine = self.local.detach().reshape(-1)
        if self.kind == "read":
            mine.copy_(theirs)
        else:
            theirs.copy_(mine)


def _describe(kind, local, remote, offset, label=""):
    """An operation in words, for errors."""
    dtype = str(local.dtype).replace("torch.", "")
    return (f"{label}{kind} of {local.numel()} {dtype} elements "
            f"{'from' if kind == 'read' else 'to'} {remote} at element {offset}")


def _describe_batch(kind, tensors):
    return f"{kind} of {len(tensors)} items ({sum(t.nbytes for t in tensors)} bytes)"


class _LocalRegions:
    """Finds (or registers for this call only) the memory region under
    local tensors; close() deregisters what it registered."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.last = None
        self.temporary = {}   # storage address -> MemoryRegion

    def find(self, tensor):
        """(MemoryRegion, byte offset of tensor in it)."""
        ptr, nbytes = tensor.data_ptr(), tensor.nbytes
        last = self.last   # batches tend to use one region over and over
        if (last is None or not (last.addr <= ptr and ptr + nbytes <= last.addr + last.nbytes)
                or not last.mr.registered):
            last = self.last = regions.containing(self.ctx, ptr, nbytes)
        if last is not None:
            return last.mr, ptr - last.addr
        storage = tensor.untyped_storage()
        base = storage.data_ptr()
        mr = self.temporary.get(base)
        if mr is None:
            whole = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage)
            try:
                mr = self.ctx.reg_mr(whole.numpy(), access=0)
            except _C.SlimeError as exc:
                raise from_core(exc, f"registering a local tensor of {nbytes} bytes") from None
            self.temporary[base] = mr
        return mr, ptr - base

    def close(self):
        for mr in self.temporary.values():
            try:
                mr.dereg()
            except _C.SlimeError:
                pass   # still in use: freeing the object deregisters it later
        self.temporary = {}


def _post_one(call, op):
    """Posts one checked op (the hot path of small transfers: no batch);
    returns the Future, whose result is the local tensor."""
    if op.own is not None or op.nbytes == 0:
        if op.nbytes:
            op.copy_locally()
        return Future(None, op.local)
    # the common case, a tensor inside a registered Region, needs no
    # _LocalRegions (which exists to register others for this call)
    tensor = op.local
    ptr = tensor.data_ptr()
    region = regions.containing(call.ctx, ptr, tensor.nbytes)
    local = None if region is not None else _LocalRegions(call.ctx)
    try:
        ep = _endpoint(call.ctx, op.remote.owner)
        mr, off = (region.mr, ptr - region.addr) if local is None else local.find(tensor)
        if op.kind == "read":
            request = ep.read(mr, off, op.remote.desc, op.roff, op.nbytes)
        elif op.kind == "write":
            request = ep.write(mr, off, op.remote.desc, op.roff, op.nbytes)
        else:
            request = ep.write_imm(mr, off, op.remote.desc, op.roff, op.nbytes, op.imm)
    except _C.SlimeError as exc:
        if local is not None:
            local.close()
        raise from_core(exc, op.describe()) from None
    except BaseException:
        if local is not None:
            local.close()
        raise
    if local is not None and local.temporary:
        return Future(request, op.local, what=op.describe, wrap_error=from_core,
                      keep=local, cleanup=local.close)
    return Future(request, op.local, what=op.describe, wrap_error=from_core)


def _post_many(call, kind, ops, what):
    """Posts checked ops as one batch and serves those on this process's
    own regions by copying; returns the Future, whose result is the list
    of local tensors."""
    local = _LocalRegions(call.ctx)
    c_ops, opcode = [], _OPCODES[kind]
    try:
        for op in ops:
            if op.own is not None or op.nbytes == 0:
                continue
            ep = _endpoint(call.ctx, op.remote.owner)
            mr, off = local.find(op.local)
            c_ops.append((opcode, ep, mr, off, op.remote.desc, op.roff, op.nbytes))
        request = call.ctx.batch(c_ops) if c_ops else None
    except _C.SlimeError as exc:
        local.close()
        raise from_core(exc, what) from None
    except BaseException:
        local.close()
        raise
    for op in ops:
        if op.own is not None and op.nbytes:
            op.copy_locally()
    # The request holds the memory regions; the local tensors are held
    # here so that the future's result is the very tensors given.
    return Future(request, [op.local for op in ops], what=what, wrap_error=from_core,
                  keep=local, cleanup=local.close if local.temporary else None)


def _post(kind, local, remote, offset, imm=None):
    """One op: the C fast path posts the common case; what it declines
    (nothing posted) takes the checked path, which raises any error."""
    call = _current_call()
    request = call.ctx.rdma_post(_OPCODES[kind], local, remote, offset, imm,
                                 call.env, regions.ranges())
    if request is None:
        return _post_one(call, _Op(kind, local, remote, offset, call, imm=imm))
    return Future(request, local, wrap_error=from_core,
                  what=lambda: _describe(kind, local, remote, offset))


def read(dst, remote, offset=0):
    """Reads remote elements [offset, offset + dst.numel()) into dst;
    returns a Future whose result is dst."""
    return _post("read", dst, remote, offset)


def write(src, remote, offset=0):
    """Writes src into remote elements [offset, offset + src.numel());
    returns a Future whose result is src."""
    return _post("write", src, remote, offset)


def write_with_imm(src, remote, imm, offset=0):
    """write(), then the 32-bit imm is delivered to the remote region's
    owner (recv_imm there) once the data is in place."""
    return _post("write_with_imm", src, remote, offset, imm)


def _peer_of(peer):
    if isinstance(peer, RemoteTensor):
        return peer.owner
    if isinstance(peer, Peer):
        return peer
    raise RdmaInvalidError(f"dlslime rdma: recv_imm takes a Peer or a RemoteTensor "
                           f"of that peer, got {type(peer).__name__}")


def recv_imm(peer):
    """A Future for the next immediate value (an int) that peer sends
    this process with write_with_imm, in the order sent; one that arrived
    before the call is kept for it.  peer: a Peer, or a RemoteTensor that
    peer owns."""
    peer = _peer_of(peer)
    ctx = regions.context()
    what = f"recv_imm from {peer}"
    if peer.job != regions.this_job():
        raise RdmaAccessError(f"dlslime rdma: {what}: that peer belongs to another job")
    if peer.context_id == ctx.id:
        raise RdmaInvalidError(f"dlslime rdma: {what}: that is this process")
    ep = _endpoint(ctx, peer)
    try:
        request = ep.imm_recv()
    except _C.SlimeError as exc:
        raise from_core(exc, what) from None
    return Future(request, lambda req: req.imm, what=what, wrap_error=from_core)


def _unpack(item, kind, index, call):
    """A batch item, (local, remote, offset) or (local, remote,
    local_offset, remote_offset, length), as a checked _Op."""
    label = f"{kind} item {index}: "
    if not isinstance(item, (tuple, list)) or len(item) not in (3, 5):
        raise RdmaInvalidError(
            f"dlslime rdma: {label}expected (local, remote, offset) or (local, "
            f"remote, local_offset, remote_offset, length), got {item!r:.200}")
    if len(item) == 3:
        local, remote, offset = item
    else:
        local, remote, loff, offset, length = item
        if isinstance(local, Region):
            local.check_registered()
            local = local.tensor
        check_tensor(local, f"{label}the local tensor")
        loff = check_count(loff, "local_offset", label)
        length = check_count(length, "length", label)
        if loff + length > local.numel():
            raise RdmaAccessError(
                f"dlslime rdma: {label}local elements [{loff}, {loff + length}) "
                f"are outside the local tensor of {local.numel()} elements")
        local = local.reshape(-1)[loff:loff + length]
    return _Op(kind, local, remote, offset, call, label=label)


def _batch(kind, items):
    """The C fast path posts a batch of common items; one it declines
    (nothing posted) takes the checked path, which raises any error."""
    call = _current_call()
    if type(items) is not list and type(items) is not tuple:
        items = list(items)   # an iterator: both paths must see the items
    request = call.ctx.rdma_batch(_OPCODES[kind], items, call.env, regions.ranges())
    if request is not None:
        tensors = [item[0] for item in items]
        return Future(request, tensors, wrap_error=from_core,
                      what=lambda: _describe_batch(kind, tensors))
    ops = [_unpack(item, kind, i, call) for i, item in enumerate(items)]
    return _post_many(call, kind, ops, _describe_batch(kind, [op.local for op in ops]))


def batch_read(items):
    """Many reads in one call, one Future for all (its result: the list of
    local tensors).  Each item is (local, remote, offset) or (local,
    remote, local_offset, remote_offset, length), all in elements.  Every
    item is checked before any is posted."""
    return _batch("read", items)


def batch_write(items):
    """Many writes in one call; items as for batch_read."""
    return _batch("write", items)
