"""Windows: one tensor registered on every rank of a process group, each
rank holding every rank's descriptor (MPI's RMA window, torch's symmetric
memory, on CPU tensors).

    win = register_window(kv_cache, group)     # collective
    win.write(pages, rank=1, offset=4096)      # rank 1 takes no part
    win.read(buf, rank=2).wait()
    win.free()                                 # collective

The tensors may differ in shape (and dtype) between ranks: each
descriptor carries its own.  Works over any group (dlslime or Gloo): when
the process has no dlslime context yet, the group agrees on the job token
first (from its rank 0) and the context is made with it.
"""

import torch.distributed as dist

from .. import runtime
from . import ops
from .region import register


def ensure_context(group=None):
    """Every rank of group gets the process-wide context, all with group
    rank 0's job token (collective).  Ranks that already have one must
    have that token (they do when a dlslime group made it)."""
    from ..backend import _job_token   # the backend's rule for a fresh token
    mine = [_job_token() if dist.get_rank(group) == 0 else None]
    src = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast_object_list(mine, src=src, group=group)
    return runtime.context(mine[0])


class Window:
    """This rank's Region and every rank's RemoteTensor (window[r])."""

    def __init__(self, region, remotes, group):
        self.region = region
        self.remotes = remotes
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = len(remotes)

    @property
    def tensor(self):
        """This rank's tensor."""
        return self.region.tensor

    def __getitem__(self, rank):
        return self.remotes[rank]

    def __len__(self):
        return self.size

    def peer(self, rank):
        """The Peer of group rank `rank` (for recv_imm and the like)."""
        return self.remotes[rank].owner

    def read(self, dst, rank, offset=0):
        """ops.read from rank's tensor (offset in its elements)."""
        return ops.read(dst, self.remotes[rank], offset)

    def write(self, src, rank, offset=0):
        return ops.write(src, self.remotes[rank], offset)

    def write_with_imm(self, src, rank, imm, offset=0):
        return ops.write_with_imm(src, self.remotes[rank], imm, offset)

    def recv_imm(self, rank):
        """The next immediate that rank sends this one."""
        return ops.recv_imm(self.peer(rank))

    def free(self):
        """Collective: waits (barrier) until every rank is done with the
        window, then deregisters this rank's region."""
        if self.region.registered:
            dist.barrier(group=self.group)
            self.region.deregister()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.free()

    def __repr__(self):
        return f"<dlslime Window rank {self.rank} of {self.size}: {self.region.remote}>"


def register_window(tensor, group=None, access="rw"):
    """Collective over group (default: the default group): registers
    tensor on every rank and hands each rank all the descriptors."""
    ensure_context(group)
    rank = dist.get_rank(group)
    region = register(tensor, access)
    remotes = [None] * dist.get_world_size(group)
    dist.all_gather_object(remotes, region.descriptor(rank), group=group)
    return Window(region, remotes, group)
