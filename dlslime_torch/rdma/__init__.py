"""One-sided read / write / write_with_imm between torch tensors of
different processes: the target's code takes no part.

    import torch.distributed as dist
    from dlslime_torch import rdma

    dist.init_process_group("dlslime")             # the connections it uses
    win = rdma.register_window(cache)              # collective: every rank's descriptor
    rdma.write(pages, win[1], offset=4096).wait()  # into rank 1's cache
    rdma.read(buf, win[1]).result()                # out of it
    rdma.write_with_imm(flag, win[1], imm=7).wait(); ... rank 1: win.recv_imm(0).result() == 7

Pieces:
- register(tensor) -> Region; region.descriptor() -> RemoteTensor, a small
  picklable view for peers (the core's 64-byte descriptor, the owner's
  address and context id, a digest of the job token, dtype and shape).
  Pass descriptors any way you like (the window helper uses the group's
  all_gather_object).
- read, write, write_with_imm, recv_imm, batch_read, batch_write return a
  dlslime_torch.futures.Future: wait(timeout), done(), result(timeout),
  and `await fut` in asyncio.  The *_sync forms wait and return the
  result (timeout in seconds, None: futures.DEFAULT_TIMEOUT_S).
- They share the torch backend's process-wide context and its one
  connection per pair of processes (dlslime_torch.runtime); a connection
  to the owner of a descriptor is made on first use.

Offsets and lengths: in ELEMENTS, always.  `offset` counts elements of
the remote tensor's dtype, from its start, the tensor taken as flat
(row-major); the number of elements moved is the local tensor's numel().
The local and the remote dtype must be the same (RdmaInvalidError
otherwise).  The same holds for read, write, write_with_imm and each
batch item; the long batch item (local, remote, local_offset,
remote_offset, length) counts all three in elements too, local_offset in
the local tensor taken as flat.  A zero-element read or write completes
at once.

Fast memory: rdma.zeros(shape, dtype=...) allocates a tensor in a block
shm peers map, so reads and writes of it from the same host are memcpy,
with no system call per op (dlslime_torch.rdma.memory).
Ordinary tensors are copied by the kernel (cross-memory attach), which
pins the target's pages for every op; registering one therefore moves
its whole 2 MiB pages onto huge pages, once (DLSLIME_MR_HUGEPAGES=0: not),
and while the "dlslime" backend is up, tensors of 2 MiB or more start on
a 2 MiB boundary, so that this covers all of them but their tail.  Ops
larger than 32 MiB on them go through the shm ring instead, served by the
owner's progress thread (DLSLIME_SHM_CMA_MAX).

Tensors: CPU, contiguous (a slice along the first dimension of a
contiguous tensor is contiguous).  A local tensor lying inside a Region
of this process uses it; any other is registered for the one call (cheap
on shm and tcp; register big buffers you use often).  Descriptors of this
process's own regions work too, by a local copy.

Errors (dlslime_torch.rdma.errors, each also the core's class of the same
condition): before anything moves, RdmaInvalidError (a ValueError) for
dtype or shape mismatch, non-contiguous or non-CPU tensors, bad
immediates; RdmaAccessError for out-of-bounds ranges, deregistered
regions and descriptors from another job (err.check names the check that
refused, the same on every path: dlslime_torch.rdma.checks).  From the
target or the wire:
RdmaAccessError when the owner has deregistered the region,
RdmaPeerLostError when it died; RdmaTimeoutError (a TimeoutError) when a
wait runs out, the operation still pending.
"""

from ..futures import DEFAULT_TIMEOUT_S, Future, wait_all
from .errors import (RdmaAccessError, RdmaCanceledError, RdmaError,
                     RdmaInvalidError, RdmaPeerLostError, RdmaTimeoutError)
from .memory import zeros
from .ops import batch_read, batch_write, read, recv_imm, write, write_with_imm
from .region import Peer, Region, RemoteTensor, local_peer, register
from .window import Window, ensure_context, register_window

__all__ = [
    "DEFAULT_TIMEOUT_S", "Future", "Peer", "RdmaAccessError",
    "RdmaCanceledError", "RdmaError",
    "RdmaInvalidError", "RdmaPeerLostError", "RdmaTimeoutError", "Region",
    "RemoteTensor", "Window", "batch_read", "batch_read_sync", "batch_write",
    "batch_write_sync", "ensure_context", "local_peer", "read", "read_sync",
    "recv_imm", "recv_imm_sync", "register", "register_window", "wait_all",
    "write", "write_sync", "write_with_imm", "write_with_imm_sync", "zeros",
]


def read_sync(dst, remote, offset=0, timeout=None):
    """read() and wait; returns dst."""
    return read(dst, remote, offset).result(timeout)


def write_sync(src, remote, offset=0, timeout=None):
    """write() and wait."""
    write(src, remote, offset).wait(timeout)


def write_with_imm_sync(src, remote, imm, offset=0, timeout=None):
    """write_with_imm() and wait."""
    write_with_imm(src, remote, imm, offset).wait(timeout)


def recv_imm_sync(peer, timeout=None):
    """recv_imm() and wait; returns the immediate (an int).  On a timeout
    the receive is canceled, so a later immediate is not lost to it."""
    fut = recv_imm(peer)
    try:
        return fut.result(timeout)
    except RdmaTimeoutError:
        if fut.cancel():
            raise
        return fut.result(0)    # it matched while we were canceling


def batch_read_sync(items, timeout=None):
    """batch_read() and wait; returns the local tensors."""
    return batch_read(items).result(timeout)


def batch_write_sync(items, timeout=None):
    """batch_write() and wait."""
    batch_write(items).wait(timeout)
