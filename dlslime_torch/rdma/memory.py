"""Tensors in memory that shm peers map: one-sided ops on them are memcpy.

A read or write into an ordinary tensor of a process on the same host
goes by process_vm_readv/writev, which pins the target's pages on every
call.  zeros() allocates the tensor in a shared block of the core
(slime_mem_alloc); a peer maps the block once and from then on copies
with plain loads and stores, split across its copy threads.  Register it
(register, register_window) like any tensor; on tcp and verbs it is
ordinary memory.  The block is freed when the last tensor viewing it
goes.
"""

import math

import torch

from .. import _C


def zeros(*size, dtype=torch.float32):
    """A zeroed, contiguous CPU tensor of `size` (ints or one sequence)
    in a shared block; one-sided ops from shm peers on it run at memcpy
    speed."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if any(not isinstance(n, int) or n < 0 for n in size):
        raise ValueError(f"rdma.zeros: sizes must be non-negative ints, got {size}")
    if not isinstance(dtype, torch.dtype) or dtype.is_complex:
        raise ValueError(f"rdma.zeros: unsupported dtype {dtype!r}")
    numel = math.prod(size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # a zero-element tensor still gets a (one-page) block to point into
    block = _C.SharedMemory(max(numel * itemsize, 1))
    flat = torch.frombuffer(block, dtype=torch.uint8)[:numel * itemsize]
    return flat.view(dtype).view(size)
