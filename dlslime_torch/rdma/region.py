"""Registered tensors (Region), their picklable remote views (RemoteTensor)
and the processes that own them (Peer).

A Region keeps its tensor's memory alive while registered: the core's
memory region holds a byte view of the tensor, so neither dropping the
tensor nor dropping the Region under an operation in flight can free
memory the core still touches.  Regions of this process are remembered
(weakly) so that an operation on any tensor lying inside one uses it
without registering anything.
"""

import dataclasses
import functools
import hashlib
import threading
import weakref

import torch

from .. import _C, runtime
from .checks import check_tensor
from .errors import RdmaAccessError, RdmaError, RdmaInvalidError, from_core

_ACCESS = {"": 0, "r": _C.ACCESS_REMOTE_READ, "w": _C.ACCESS_REMOTE_WRITE,
           "rw": _C.ACCESS_ALL, "wr": _C.ACCESS_ALL}


@functools.lru_cache(maxsize=8)
def job_id(token):
    """A digest of the job token: equal in every process of one job,
    revealing nothing of the token (which is the job's secret)."""
    return hashlib.blake2b(bytes(token), digest_size=16,
                           person=b"dlslime-rdma-job").digest()


def context():
    """The process-wide context; a clear error if there is none yet."""
    ctx = runtime.current()
    if ctx is None:
        raise RdmaError(
            "dlslime rdma: this process has no dlslime context yet; make a "
            "'dlslime' process group first (dist.init_process_group"
            "('dlslime')), or use dlslime_torch.rdma.register_window, which "
            "sets one up over any process group")
    return ctx


def this_job():
    return job_id(runtime.token())


@dataclasses.dataclass(frozen=True)
class Peer:
    """A process that owns regions: how to reach it (address, the core's
    address blob), who it is (context_id) and which job it belongs to
    (job, a digest of the job token).  rank: its rank in the group that
    handed it out, for messages only."""

    address: bytes
    context_id: int
    job: bytes
    rank: object = None

    def __str__(self):
        who = f"rank {self.rank}" if self.rank is not None else "process"
        return f"{who} (context {self.context_id:016x})"


def local_peer(rank=None):
    """This process as a Peer, to hand to others (e.g. for recv_imm)."""
    ctx = context()
    return Peer(bytes(ctx.address()), ctx.id, this_job(), rank)


@dataclasses.dataclass(frozen=True)
class RemoteTensor:
    """What a peer needs to read or write a registered tensor: the core's
    64-byte descriptor, the owner, and the tensor's dtype and shape (the
    remote side is always a contiguous tensor, addressed in elements of
    its dtype).  Small and picklable."""

    desc: bytes
    owner: Peer
    dtype: torch.dtype
    shape: tuple

    @functools.cached_property   # in __dict__, which a frozen class allows
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def element_size(self):
        return _element_size(self.dtype)

    @property
    def nbytes(self):
        return self.numel * self.element_size

    def with_rank(self, rank):
        """The same descriptor, its owner labelled with a rank."""
        return dataclasses.replace(self, owner=dataclasses.replace(self.owner, rank=rank))

    def __str__(self):
        dtype = str(self.dtype).replace("torch.", "")
        return f"{dtype}{list(self.shape)} of {self.owner}"


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def byte_view(tensor):
    """A writable uint8 numpy view of a contiguous CPU tensor's bytes; it
    keeps the tensor's storage alive."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


class Region:
    """A tensor registered with this process's context (see register)."""

    def __init__(self, tensor, access="rw"):
        check_tensor(tensor, "the tensor to register")
        if access not in _ACCESS:
            raise RdmaInvalidError(f"dlslime rdma: access must be one of "
                                   f"'rw', 'r', 'w' or '', got {access!r}")
        if tensor.numel() == 0:
            raise RdmaInvalidError("dlslime rdma: cannot register an empty tensor")
        ctx = context()
        self.tensor = tensor
        self.access = access
        try:
            self.mr = ctx.reg_mr(byte_view(tensor), access=_ACCESS[access])
            desc = self.mr.desc()
        except _C.SlimeError as exc:
            raise from_core(exc, f"registering a {tensor.nbytes}-byte tensor") from None
        self.addr = self.mr.addr
        self.nbytes = self.mr.length
        self.remote = RemoteTensor(bytes(desc), local_peer(), tensor.dtype,
                                   tuple(tensor.shape))
        _registry.add(self)

    @property
    def registered(self):
        return self.mr.registered and not self.mr.context.closed

    def descriptor(self, rank=None):
        """The RemoteTensor to give to peers (optionally labelled with
        this process's rank)."""
        self.check_registered()
        return self.remote if rank is None else self.remote.with_rank(rank)

    def check_registered(self):
        if not self.registered:
            raise RdmaAccessError(f"dlslime rdma: the region of {self.remote} "
                                  f"was deregistered")

    def deregister(self):
        """Deregisters (idempotent).  Peers' later reads and writes of it
        fail with RdmaAccessError.  Refused (RdmaError, SLIME_ERR_BUSY)
        while this process's own operations on it are in flight."""
        _registry.discard(self)
        try:
            self.mr.dereg()
        except _C.SlimeError as exc:
            _registry.add(self)
            raise from_core(exc, f"deregistering {self.remote}") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.deregister()

    def __repr__(self):
        state = "" if self.registered else " deregistered"
        return f"<dlslime Region {self.remote}{state}>"


def register(tensor, access="rw"):
    """Registers a contiguous CPU tensor for one-sided access by peers
    ('rw': read and write, 'r', 'w', or '' for local use only) and
    returns its Region; region.descriptor() is what peers need."""
    return Region(tensor, access)


class _Registry:
    """This process's live regions, weakly: by descriptor (to serve
    operations on our own regions) and by address range (to find the
    region a local tensor lies in)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_desc = weakref.WeakValueDictionary()
        self._all = weakref.WeakSet()
        self._ranges = ()   # (addr, end, weakref) of each live region, for lookups

    def _refresh(self):
        self._ranges = tuple((r.addr, r.addr + r.nbytes, weakref.ref(r)) for r in self._all)

    def add(self, region):
        with self._lock:
            self._by_desc[region.remote.desc] = region
            self._all.add(region)
            self._refresh()

    def discard(self, region):
        with self._lock:
            self._by_desc.pop(region.remote.desc, None)
            self._all.discard(region)
            self._refresh()

    def by_desc(self, desc):
        region = self._by_desc.get(desc)
        return region if region is not None and region.registered else None

    def containing(self, ctx, ptr, nbytes):
        """A live region of ctx holding [ptr, ptr + nbytes), or None."""
        end = ptr + nbytes
        for start, stop, ref in self._ranges:   # a snapshot: no lock needed
            if start <= ptr and end <= stop:
                region = ref()
                if (region is not None and region.mr.context is ctx
                        and region.mr.registered):
                    return region
        return None


_registry = _Registry()
by_desc = _registry.by_desc
containing = _registry.containing


def ranges():
    """The registry's snapshot of (start, end, weakref to Region), for the
    C fast path of ops.py (which looks up local tensors in it as
    containing() does)."""
    return _registry._ranges
