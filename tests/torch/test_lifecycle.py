"""The backend's life cycle: registration, rendezvous (token, one
context and one connection per process pair), destroy and init again,
comm id collisions, and shutdown failing what is pending."""

import datetime
import importlib

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

TIMEOUT = datetime.timedelta(seconds=30)


def test_import_registers_once():
    import dlslime_torch
    from dlslime_torch import backend
    assert dlslime_torch.backend_available()
    dlslime_torch.register_backend()
    dlslime_torch.register_backend()
    importlib.reload(backend)          # a second registration from scratch
    backend.register_backend()
    assert dist.Backend("dlslime") == "dlslime"
    assert dist.Backend.backend_list.count("dlslime") == 1
    assert dist.Backend.backend_capability["dlslime"] == ["cpu"]
    # It does not take the CPU default from Gloo.
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert dist.is_backend_available("dlslime")


def _reinit(rank, size, store):
    import dlslime_torch
    from dlslime_torch import runtime
    seen = []
    for round_ in range(3):
        dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                                timeout=TIMEOUT)
        t = torch.full((4,), float(rank + round_))
        dist.all_reduce(t)
        assert t.tolist() == [float(sum(range(size)) + size * round_)] * 4, t
        # The subgroup gets the same name every round but other members
        # (with 3 ranks): the rendezvous must not mix up the rounds.
        members = sorted({round_ % size, (round_ + 1) % size})
        sub = dist.new_group(members)
        if rank in members:
            u = torch.ones(2, dtype=torch.int32)
            dist.all_reduce(u, group=sub)
            assert u.tolist() == [2, 2]
        tokens = [None] * size
        dist.all_gather_object(tokens, runtime.token())
        assert len(set(tokens)) == 1 and len(tokens[0]) >= 16, tokens
        seen.append((runtime.current().handle, runtime.current().id))
        dist.destroy_process_group()
        assert not dist.is_initialized()
    # One context for the whole process, whatever the groups did.
    assert len(set(seen)) == 1, seen
    del dlslime_torch
    return seen[0][1]


@pytest.mark.parametrize("size", (2, 3))
def test_destroy_and_init_again(size):
    ids = run_job(size, _reinit)
    assert len(set(ids)) == size   # a context per process, not shared


def _token_from_env(rank, size, store):
    import dlslime_torch  # noqa: F401
    from dlslime_torch import runtime
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    token = runtime.token()
    dist.destroy_process_group()
    return token


def test_token_comes_from_dlslime_token_when_set():
    assert run_job(2, _token_from_env, env={"DLSLIME_TOKEN": "job-secret"}) == [b"job-secret"] * 2


def _one_connection_per_pair(rank, size, store):
    import dlslime_torch  # noqa: F401
    from dlslime_torch import runtime
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    groups = [dist.new_group([0, 1]) for _ in range(3)]
    for g in groups:
        t = torch.ones(1)
        dist.all_reduce(t, group=g)
        assert t.item() == 2.0
    addrs = [None] * size
    dist.all_gather_object(addrs, runtime.current().address())
    peer = 1 - rank
    # Every group used the endpoint that connect() returns now: the
    # context has one per peer.
    handle = runtime.connect(addrs[peer], 5000).handle
    again = runtime.connect(addrs[peer], 5000).handle
    dist.barrier()   # before either side closes its context
    dist.destroy_process_group()
    return handle == again


def test_groups_share_one_endpoint_per_peer():
    assert run_job(2, _one_connection_per_pair) == [True, True]


def _collision(rank, size, store):
    import dlslime_torch  # noqa: F401
    from dlslime_torch import backend
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    backend.comm_id_of = lambda name: 77      # force every new group onto one id
    first = dist.new_group([0, 1])
    try:
        dist.new_group([0, 1])
    except RuntimeError as exc:
        message = str(exc)
    else:
        message = None
    t = torch.ones(1)
    dist.all_reduce(t, group=first)           # the live group is unharmed
    assert t.item() == 2.0
    dist.destroy_process_group()
    return message


def test_comm_id_collision_is_refused_on_every_rank():
    for message in run_job(2, _collision):
        assert message and "comm id 77" in message and "already in use" in message, message


def _shutdown_fails_pending(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    dist.barrier()
    if rank == 0:
        work = dist.irecv(torch.empty(3), src=1, tag=5)   # nobody sends
        dist.destroy_process_group()
        try:
            work.wait()
        except RuntimeError as exc:
            return str(exc)
        return None
    dist.destroy_process_group()
    return "ok"


def test_destroy_fails_pending_work():
    message, _ = run_job(2, _shutdown_fails_pending)
    assert message and "dlslime: recv from rank 1" in message, message


def _stale_messages(rank, size, store):
    """Rank 0 sends on a group that rank 1 never receives on (a small
    message and a large one), then both make the group again under the
    same name: its receives must get the new messages, never the old."""
    import dlslime_torch  # noqa: F401
    small, big = 4, 1 << 18            # eager, and rendezvous (1 MiB)
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    old_big = None
    if rank == 0:
        dist.send(torch.full((small,), -1.0), 1, tag=3)
        old_big = dist.isend(torch.full((big,), -1.0), 1, tag=4)
    dist.barrier()
    dist.destroy_process_group()
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size, timeout=TIMEOUT)
    if rank == 0:
        dist.send(torch.full((small,), 2.0), 1, tag=3)
        dist.send(torch.full((big,), 2.0), 1, tag=4)
        got = None
    else:
        a, b = torch.zeros(small), torch.zeros(big)
        dist.recv(a, 0, tag=3)
        dist.recv(b, 0, tag=4)
        got = (a.unique().tolist(), b.unique().tolist())
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        # the old large send is refused by the receiver, not left hanging
        try:
            old_big.wait()
        except RuntimeError as exc:
            return str(exc)
        return "completed"
    return got


def test_remade_group_never_gets_the_old_groups_messages():
    refused, got = run_job(2, _stale_messages)
    assert got == ([2.0], [2.0]), got
    assert "dropped" in refused, refused


def test_handles_name_the_c_objects():
    """Context.handle / Endpoint.handle: the C pointers the shim is given
    (so torch ops and _C users share one core), valid while open."""
    from dlslime_torch import _C
    a, b = _C.Context(transport="shm"), _C.Context(transport="shm")
    try:
        assert isinstance(a.handle, int) and a.handle and a.handle != b.handle
        ep = a.connect(b.address(), timeout_ms=10_000)
        assert ep.handle and a.connect(b.address(), timeout_ms=10_000).handle == ep.handle
    finally:
        b.close()
        a.close()
    with pytest.raises(_C.SlimeClosedError):
        a.handle
    with pytest.raises(_C.SlimeClosedError):
        ep.handle
