"""The torch.distributed backend "dlslime".

torch calls _create_backend for every process group that uses
"dlslime".  It meets the group's other ranks through the c10d Store that
torch hands it (keys under "dlslime/<size>/<meeting>/", inside the
group's own store prefix; see _incarnation):

1. token: rank 0 publishes the job's secret (its context's token, else
   $DLSLIME_TOKEN, else random bytes); every rank makes the process-wide
   context with it (dlslime_torch.runtime), or checks that its existing
   context has it;
2. addresses: each rank publishes its context's address blob, together
   with whether the group's comm id is free in that process, so every
   rank sees a comm id collision and refuses the group with one message,
   and the epoch of the last group that used the comm id in that process,
   from which every rank picks the same new epoch (_epoch_after);
3. endpoints: Context.connect to every other rank (symmetric; an existing
   connection is reused);
4. the C++ backend (dlslime_torch._shim) makes the group's communicator
   over those endpoints;
5. a last meeting in the store: no rank starts using the group (or
   leaves) before every rank has its communicator.
"""

import hashlib
import os
import secrets
import threading
import warnings

import torch.distributed as dist

from . import runtime

BACKEND_NAME = "dlslime"

try:
    from . import _shim
    _SHIM_ERROR = None
except ImportError as exc:  # reported when a group is made, see _shim_or_raise
    _shim = None
    _SHIM_ERROR = exc

_lock = threading.Lock()
_registered = False


def available():
    """Whether the C++ backend loaded (else why not, as an exception)."""
    return _SHIM_ERROR is None


def _shim_or_raise():
    if _shim is None:
        raise RuntimeError(
            f"dlslime: the torch backend extension dlslime_torch._shim could "
            f"not be loaded ({_SHIM_ERROR}); rebuild with "
            f"`pip install --no-build-isolation -e .`") from _SHIM_ERROR
    return _shim


def comm_id_of(group_name):
    """The communicator id (16 bits, never 0) of a group name.

    torch names groups "0", "1", ... in creation order unless asked to
    hash; those numbers map to themselves + 1, so no two such groups
    collide.  Other names hash into the upper half.
    """
    if group_name.isdigit() and int(group_name) < 0x7FFF:
        return int(group_name) + 1
    digest = hashlib.blake2b(group_name.encode(), digest_size=2).digest()
    comm_id = 0x8000 | (int.from_bytes(digest, "little") & 0x7FFF)
    # 0xFFFF's tag space belongs to RPC (SLIME_RPC_TAG_SPACE in rpc.h)
    return 0xFFFE if comm_id == 0xFFFF else comm_id


def _epoch_after(lasts):
    """The new group's epoch, from each member's last epoch of the comm id.

    The core tells communicators with one comm id apart by the low 8 bits
    of the epoch: a message an old group left in flight never matches the
    new group's receives if those bits differ from the old group's on the
    receiving rank.  So: the first count above every member's last one
    whose low byte is none of theirs.
    """
    epoch = max(lasts) + 1
    used = {last & 0xFF for last in lasts}
    while (epoch & 0xFF) in used and len(used) < 256:
        epoch += 1
    return epoch


def _job_token():
    existing = runtime.token()
    if existing is not None:
        return existing
    env = os.environ.get("DLSLIME_TOKEN")
    if env:
        return env.encode()
    return secrets.token_bytes(32)


def _timeout_ms(timeout):
    ms = int(timeout.total_seconds() * 1000)
    if ms <= 0:
        raise ValueError(f"dlslime: the process group timeout must be positive, got {timeout}")
    return ms


def _incarnation(store, rank, size):
    """Which meeting of this group name this is, the same on every rank.

    torch reuses group names ("0" again after destroy_process_group and a
    new init, "1" for a subgroup of other ranks) on a store that may keep
    the old keys, so each meeting needs keys of its own.  Every meeting of
    a name with `size` ranks has each group rank 0..size-1 join exactly
    once, so per-(size, group rank) counters advance in step: each rank's
    own counter tells the meeting's number.
    """
    return store.add(f"dlslime/joins/{size}/{rank}", 1)


def _create_backend(dist_opts, backend_options):
    shim = _shim_or_raise()
    if backend_options is not None:
        raise ValueError(
            f"dlslime: the backend takes no backend options, got {backend_options!r}")
    store = dist_opts.store
    rank, size = dist_opts.group_rank, dist_opts.group_size
    group = str(dist_opts.group_id)
    timeout_ms = _timeout_ms(dist_opts.timeout)
    prefix = f"dlslime/{size}/{_incarnation(store, rank, size)}/"

    # 1. the job's token
    if rank == 0:
        token = _job_token()
        store.set(prefix + "token", token)
    else:
        token = store.get(prefix + "token")
    ctx = runtime.context(token)
    runtime.add_close_hook(shim.shutdown_all)

    # 2. addresses, and whether the comm id is free everywhere
    comm_id = comm_id_of(group)
    owner = shim.comm_id_owner(comm_id)
    if owner:
        record = b"C" + owner.encode()
    else:
        last = shim.comm_id_last_epoch(comm_id)
        record = b"A" + last.to_bytes(8, "little") + ctx.address()
    store.set(prefix + f"rank/{rank}", record)
    records = [record if r == rank else store.get(prefix + f"rank/{r}")
               for r in range(size)]
    taken = [(r, rec[1:].decode()) for r, rec in enumerate(records) if rec[:1] == b"C"]
    if taken:
        where = ", ".join(f"rank {r} (live group '{name}')" for r, name in taken)
        raise RuntimeError(
            f"dlslime: process group '{group}' maps to comm id {comm_id}, "
            f"which is already in use on {where}; destroy that group first "
            f"or give this one another name")

    epoch = _epoch_after([int.from_bytes(rec[1:9], "little") for rec in records])

    # 3. one endpoint per peer
    peers = [0] * size
    for r in range(size):
        if r != rank:
            peers[r] = runtime.connect(records[r][9:], timeout_ms).handle

    # 4. the communicator
    pg = shim.BackendDlslime(rank, size, ctx.handle, peers, comm_id, epoch,
                             timeout_ms, group)

    # 5. no rank returns before every rank has its communicator, so a
    # rank that is quick to finish (and close its context) never leaves
    # another one dialing a peer that is gone
    if store.add(prefix + "ready", 1) == size:
        store.set(prefix + "all-ready", b"1")
    store.wait([prefix + "all-ready"])
    return pg


def register_backend():
    """Registers "dlslime" with torch.distributed (once; later calls do
    nothing).  CPU tensors only: the core cannot move device memory yet."""
    global _registered
    with _lock:
        if _registered:
            return
        if _shim is None:
            warnings.warn(
                f"dlslime: registering the backend, but dlslime_torch._shim "
                f"did not load ({_SHIM_ERROR}); making a group will fail",
                RuntimeWarning, stacklevel=2)
        dist.Backend.register_backend(BACKEND_NAME, _create_backend,
                                      extended_api=True, devices=["cpu"])
        _registered = True


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for dlslime groups (torch's own
    accepts Gloo groups only), in Gloo's words: rank 0 waits up to timeout
    for every rank and raises naming the first that did not arrive (all of
    them with wait_all_ranks); the ranks that did arrive raise too, as soon
    as rank 0 tells them it failed."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if timeout is None:
        timeout = dist.distributed_c10d._get_default_timeout(BACKEND_NAME)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
