"""The checks of dlslime_torch.rdma that run inside one multi-rank job.

run_rdma_cases(rank, size, store) joins a "dlslime" group (and a Gloo
group for the checks' own bookkeeping), then runs every case in CASES in
order on every rank and returns {case name: None or the failure text}.
A case keeps the ranks in step with env.sync() (a Gloo barrier), so a
failing case costs that case only.  Contents are compared byte for byte
against what was sent (torch.equal on uint8 views); error cases check the
exception class and text, and that the target's memory did not change.
"""

import asyncio
import dataclasses
import datetime
import pickle
import threading
import traceback
import zlib

import torch
import torch.distributed as dist

CASES = {}
TIMEOUT = 30          # seconds, for every wait in the cases
SYNC_TIMEOUT = 20
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool,
          torch.float16, torch.float64, torch.int8]


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Env:
    def __init__(self, rank, size, store, gloo):
        self.rank, self.size, self.store, self.gloo = rank, size, store, gloo
        self.next, self.prev = (rank + 1) % size, (rank - 1) % size
        self.case, self.step = "", 0

    def sync(self, timeout=SYNC_TIMEOUT):
        """A barrier through the store, named by case and step: a rank
        that left a case early (it failed) makes the others' later steps
        of that case time out, and every rank meets again at the next."""
        self.step += 1
        key = f"rdma-cases/{self.case}/{self.step}"
        if self.store.add(key, 1) == self.size:
            self.store.set(key + "/all", b"1")
        self.store.wait([key + "/all"], datetime.timedelta(seconds=timeout))

    def others(self):
        return [r for r in range(self.size) if r != self.rank]


def data(seed, shape, dtype):
    """Deterministic contents per seed: every byte pattern of the dtype."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    elif dtype.is_floating_point:   # no NaN payloads: equal() must hold
        return torch.randn(shape, generator=g).to(dtype)
    return raw.view(dtype).reshape(shape)


def same_bytes(got, want, what):
    a, b = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{list(got.shape)}, "
                             f"expected {want.dtype}{list(want.shape)}")
    if not torch.equal(a, b):
        bad = (a != b).nonzero()[0].item()
        raise AssertionError(f"{what}: byte {bad} is {a.reshape(-1)[bad].item()}, "
                             f"expected {b.reshape(-1)[bad].item()}")


def raises(cls, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except cls as exc:
        if text not in str(exc):
            raise AssertionError(f"expected {text!r} in the error, got: {exc}") from exc
        return exc
    raise AssertionError(f"expected {cls.__name__} ({text!r}); nothing was raised")


# ------------------------------------------------------------------ cases

@case
def transport_in_use(env, rdma, expect):
    """The forced transport really carries the one-sided ops."""
    from dlslime_torch.rdma import ops
    win = rdma.register_window(torch.zeros(8))          # over the dlslime group
    for r in env.others():
        rdma.read(torch.empty(8), win[r]).wait(TIMEOUT)
        ep = ops._endpoint(rdma.region.context(), win[r].owner)
        assert ep.transport == expect, f"rank {r} over {ep.transport}, expected {expect}"
    win.free()


@case
def read_write_every_dtype(env, rdma, expect):
    for dtype in DTYPES:
        shape = (37, 129)                      # odd sizes on purpose
        mine = data((env.rank, str(dtype)), shape, dtype)
        win = rdma.register_window(mine.clone(), group=env.gloo)
        for r in env.others():
            theirs = data((r, str(dtype)), shape, dtype)
            got = torch.empty(shape, dtype=dtype)
            assert rdma.read(got, win[r]).result(TIMEOUT) is got
            same_bytes(got, theirs, f"whole read of rank {r}'s {dtype}")
            part = torch.empty(1000, dtype=dtype)          # crosses rows
            rdma.read_sync(part, win[r], offset=129 * 3 + 5, timeout=TIMEOUT)
            same_bytes(part, theirs.reshape(-1)[392:1392], f"offset read of {dtype}")
        env.sync()
        # Every rank writes its own disjoint 100-element slice of every other.
        for r in env.others():
            rdma.write_sync(data(("w", env.rank, r), (100,), dtype), win[r],
                            offset=1000 + 100 * env.rank, timeout=TIMEOUT)
        env.sync()
        want = mine.clone().reshape(-1)
        for w in env.others():
            want[1000 + 100 * w:1100 + 100 * w] = data(("w", w, env.rank), (100,), dtype)
        same_bytes(win.tensor.reshape(-1), want, f"{dtype} tensor after the peers' writes")
        win.free()


@case
def large_transfers(env, rdma, expect):
    """Several MiB (rendezvous and single-copy paths), odd length."""
    n = (6 << 20) + 13
    win = rdma.register_window(data(("big", env.rank), (n,), torch.uint8), group=env.gloo)
    got = torch.empty(n - 7, dtype=torch.uint8)
    rdma.read(got, win[env.next], offset=7).wait(TIMEOUT)
    same_bytes(got, data(("big", env.next), (n,), torch.uint8)[7:], "large read")
    env.sync()
    rdma.write(data(("bigw", env.rank), (n - 3,), torch.uint8), win[env.next], 3).wait(TIMEOUT)
    env.sync()
    want = data(("big", env.rank), (n,), torch.uint8)
    want[3:] = data(("bigw", env.prev), (n - 3,), torch.uint8)
    same_bytes(win.tensor, want, "tensor after a large write")
    win.free()


@case
def shared_memory_tensors(env, rdma, expect):
    """A window over rdma.zeros tensors (blocks peers map; memcpy on shm):
    the same bytes as ordinary memory, large and small, both directions,
    and the process really maps its shm peer's block."""
    n = (5 << 20) + 3
    mine = rdma.zeros(n, dtype=torch.float16)
    assert not mine.any()
    mine.copy_(data(("shared", env.rank), (n,), torch.float16))
    win = rdma.register_window(mine, group=env.gloo)
    got = torch.empty(n - 11, dtype=torch.float16)
    rdma.read(got, win[env.next], offset=11).wait(TIMEOUT)
    same_bytes(got, data(("shared", env.next), (n,), torch.float16)[11:], "read of a shared tensor")
    small = torch.empty(3, dtype=torch.float16)
    rdma.read(small, win[env.next], offset=n - 3).wait(TIMEOUT)
    same_bytes(small, data(("shared", env.next), (n,), torch.float16)[-3:], "small read")
    env.sync()
    rdma.write(data(("sharedw", env.rank), (n - 5,), torch.float16), win[env.next], 5).wait(TIMEOUT)
    env.sync()
    want = data(("shared", env.rank), (n,), torch.float16)
    want[5:] = data(("sharedw", env.prev), (n - 5,), torch.float16)
    same_bytes(win.tensor, want, "shared tensor after a write")
    if expect == "shm":
        with open("/proc/self/maps") as maps:
            mapped = sum("memfd:dlslime-mem" in line for line in maps)
        assert mapped >= 2, f"own block plus the peer's mapped, found {mapped}"
    env.sync()
    win.free()


@case
def write_with_imm_says_done(env, rdma, expect):
    win = rdma.register_window(torch.zeros(4096, dtype=torch.int32), group=env.gloo)
    first = win.recv_imm(env.prev)                   # posted before the write
    env.sync()
    payload = torch.arange(4096, dtype=torch.int32) * (env.rank + 1)
    rdma.write_with_imm(payload, win[env.next], imm=0xFFFFFFF0 + env.rank).wait(TIMEOUT)
    assert first.result(TIMEOUT) == 0xFFFFFFF0 + env.prev
    # The immediate says the data is in place: no barrier needed.
    same_bytes(win.tensor, torch.arange(4096, dtype=torch.int32) * (env.prev + 1),
               "data when its immediate arrived")
    env.sync()
    # Immediates that arrive before anyone asks are kept, in order.
    for k in range(3):
        win.write_with_imm(payload[:1], env.next, imm=k, offset=k).wait(TIMEOUT)
    env.sync()
    assert [win.recv_imm(env.prev).result(TIMEOUT) for _ in range(3)] == [0, 1, 2]
    env.sync()
    win.free()


def cache_of(rank, pages, page):
    """Rank's cache once the previous rank wrote its 300 pages into it."""
    size = dist.get_world_size()
    prev = (rank - 1) % size
    written = torch.randperm(pages, generator=torch.Generator().manual_seed(prev))[:300]
    want = torch.zeros(pages, page, dtype=torch.float16)
    want[written] = data(("pages", prev), (300, page), torch.float16)
    return want


@case
def batches_of_hundreds(env, rdma, expect):
    """A paged cache: 300 scattered pages written in one batch, then read
    back in one batch of the long item form."""
    pages, page = 512, 48
    cache = torch.zeros(pages, page, dtype=torch.float16)
    win = rdma.register_window(cache, group=env.gloo)
    src = data(("pages", env.rank), (300, page), torch.float16)
    g = torch.Generator().manual_seed(env.rank)
    dst_pages = torch.randperm(pages, generator=g)[:300].tolist()
    fut = rdma.batch_write([(src[i], win[env.next], p * page)
                            for i, p in enumerate(dst_pages)])
    fut.wait(TIMEOUT)
    env.sync()
    same_bytes(cache, cache_of(env.rank, pages, page), "cache after a batch of 300 page writes")
    # Read my pages back out of the next rank, into one unregistered flat
    # buffer, in reverse order, with (local, remote, loff, roff, length).
    back = torch.full((300 * page,), -1.0, dtype=torch.float16)
    items = [(back, win[env.next], (299 - i) * page, p * page, page)
             for i, p in enumerate(dst_pages)]
    got = rdma.batch_read_sync(items, timeout=TIMEOUT)
    assert len(got) == 300
    same_bytes(back.reshape(300, page), src.flip(0), "batch read of 300 pages")
    # A batch mixing every peer and this rank's own window (a local copy).
    mixed = [(torch.empty(page, dtype=torch.float16), win[r], k * page)
             for r in range(env.size) for k in range(40)]
    out = rdma.batch_read(mixed).result(TIMEOUT)
    for (t, remote, off), o in zip(mixed, out):
        assert o is t
        r = remote.owner.rank
        same_bytes(t, cache_of(r, pages, page)[off // page], f"page of rank {r}")
    env.sync()
    win.free()


@case
def registered_local_tensors(env, rdma, expect):
    """Local tensors inside a Region go through the C fast path (the
    checked Python path, ops._post_one / _post_many, is not called) and
    move the same bytes; an error case with them still raises the Python
    path's text and moves nothing; what the fast path leaves to Python
    (a deregistered local region, this rank's own window) still works."""
    from dlslime_torch.rdma import ops
    n = 4096
    win = rdma.register_window(data(("reg", env.rank), (n,), torch.float32), group=env.gloo)
    staging = rdma.register(torch.zeros(n))
    mine, theirs = staging.tensor, data(("reg", env.next), (n,), torch.float32)
    python_path = []
    post_one, post_many = ops._post_one, ops._post_many
    ops._post_one = lambda *a: python_path.append(a) or post_one(*a)
    ops._post_many = lambda *a: python_path.append(a) or post_many(*a)
    try:
        got = mine[100:300]
        assert rdma.read(got, win[env.next], 1000).result(TIMEOUT) is got
        same_bytes(got, theirs[1000:1200], "fast read")
        spots = [8 * ((i * 7) % 500) for i in range(300)]
        items = [(mine[8 * i:8 * i + 8], win[env.next], k) for i, k in enumerate(spots)]
        out = rdma.batch_read(items).result(TIMEOUT)
        assert len(out) == 300 and all(o is item[0] for o, item in zip(out, items))
        same_bytes(mine[:2400], torch.cat([theirs[k:k + 8] for k in spots]), "fast batch read")
        first = win.recv_imm(env.prev)
        env.sync()
        # Into the next rank's window: a write, a batch of 100, a write_with_imm.
        mine.copy_(data(("regw", env.rank), (n,), torch.float32))
        rdma.write(mine[:64], win[env.next]).wait(TIMEOUT)
        rdma.batch_write([(mine[64 + 4 * i:68 + 4 * i], win[env.next], 4000 - 4 * i)
                          for i in range(100)]).wait(TIMEOUT)
        rdma.write_with_imm(mine[500:516], win[env.next], imm=77, offset=2000).wait(TIMEOUT)
        assert first.result(TIMEOUT) == 77
        assert not python_path, f"{len(python_path)} calls took the Python path"
        want = data(("reg", env.rank), (n,), torch.float32)
        sent = data(("regw", env.prev), (n,), torch.float32)
        want[:64] = sent[:64]
        for i in range(100):
            want[4000 - 4 * i:4004 - 4 * i] = sent[64 + 4 * i:68 + 4 * i]
        want[2000:2016] = sent[500:516]
        same_bytes(win.tensor, want, "window after fast writes")
        env.sync()
        # Errors: the Python path's text, nothing moved.
        A, E = rdma.RdmaAccessError, rdma.RdmaInvalidError
        raises(E, "is torch.int32 but the remote one is torch.float32",
               rdma.write, mine.view(torch.int32)[:16], win[env.next])
        raises(A, "elements [4088, 4104) are outside the remote tensor of 4096",
               rdma.write, mine[:16], win[env.next], n - 8)
        raises(A, "offset is negative", rdma.read, mine[:16], win[env.next], -1)
        raises(E, "imm must be an int", rdma.write_with_imm, mine[:1], win[env.next], -5)
        bad = [(mine[i:i + 1], win[env.next], i) for i in range(10)]
        raises(A, "write item 10: ", rdma.batch_write, bad + [(mine[:8], win[env.next], n - 1)])
        raises(E, "write item 3: ", rdma.batch_write,
               bad[:3] + [(mine.view(torch.int32)[:1], win[env.next], 0)])
        env.sync()
        same_bytes(win.tensor, want, "window after refused fast-path operations")
        # Left to Python, and still right: this rank's own window, and a
        # local region deregistered (its tensor is registered per call).
        python_path.clear()
        rdma.read(mine[:8], win[env.rank], 2000).wait(TIMEOUT)
        same_bytes(mine[:8], want[2000:2008], "read of this rank's own window")
        staging.deregister()
        rdma.read(mine[:8], win[env.next], 8).wait(TIMEOUT)
        same_bytes(mine[:8], data(("regw", env.rank), (n,), torch.float32)[8:16],
                   "read into a deregistered region's tensor")   # what this rank wrote
        assert len(python_path) == 2
    finally:
        ops._post_one, ops._post_many = post_one, post_many
    env.sync()
    win.free()


@case
def checks_agree_on_both_paths(env, rdma, expect):
    """Each check the C fast path shares with the checked Python path
    (csrc/python/rdma_check.c) refuses an op with the same error whether
    the fast path met it first (a tensor inside a Region, a batch of short
    items) or only the checked path did (the Region itself as the local
    side, a batch led by a long item: both left to Python untouched).  The
    check's name on the error says the C checks judged it; nothing moves."""
    E, A = rdma.RdmaInvalidError, rdma.RdmaAccessError
    win = rdma.register_window(torch.zeros(64), group=env.gloo)
    theirs = win[env.next]
    staging = rdma.register(torch.ones(64))
    ints = rdma.register(torch.ones(64, dtype=torch.int32))
    other_job = dataclasses.replace(theirs, owner=dataclasses.replace(theirs.owner,
                                                                      job=b"another job"))
    short = dataclasses.replace(theirs, desc=theirs.desc[:10])
    ops = [   # (check, class, op, local Region, remote, offset)
        ("remote", E, rdma.write, staging, theirs.desc, 0),
        ("count", E, rdma.write, staging, theirs, 1.5),
        ("negative", A, rdma.read, staging, theirs, -1),
        ("job", A, rdma.write, staging, other_job, 0),
        ("desc", E, rdma.write, staging, short, 0),
        ("dtype", E, rdma.read, ints, theirs, 0),
        ("bounds", A, rdma.write, staging, theirs, 1),
    ]
    imm = [("imm", E, staging, theirs, -1), ("imm_self", E, staging, win[env.rank], 1)]

    def agree(check, cls, fast_args, slow_args, fn):
        fast, slow = raises(cls, "", fn, *fast_args), raises(cls, "", fn, *slow_args)
        assert str(fast) == str(slow), (check, str(fast), str(slow))
        assert fast.check == slow.check == check, (check, fast.check, slow.check)

    for check, cls, fn, region, remote, offset in ops:
        agree(check, cls, (region.tensor, remote, offset), (region, remote, offset), fn)
    for check, cls, region, remote, value in imm:
        agree(check, cls, (region.tensor, remote, value), (region, remote, value),
              rdma.write_with_imm)
    items = [(check, cls, (region.tensor, remote, offset))
             for check, cls, _, region, remote, offset in ops]
    items += [("tensor", E, ([1.0], theirs, 0)),
              ("device", E, (torch.ones(4, device="meta"), theirs, 0)),
              ("contiguous", E, (torch.ones(8, 8).t(), theirs, 0))]
    mine = staging.tensor
    for check, cls, item in items:   # item 1, after one the fast path takes or not
        agree(check, cls, ([(mine[:1], theirs, 0), item],),
              ([(mine, theirs, 0, 0, 1), item],), rdma.batch_write)
    exc = raises(A, "write item 0: local_offset is negative (-1)", rdma.batch_write,
                 [(mine, theirs, -1, 0, 1)])
    assert exc.check == "negative"
    env.sync()
    same_bytes(win.tensor, torch.zeros(64), "window after refused operations")
    env.sync()
    staging.deregister()
    ints.deregister()
    win.free()


@case
def concurrent_disjoint_slices(env, rdma, expect):
    """Every rank, from 4 threads, writes its own slices of rank 0's
    window and reads the slices of every other rank's, all at once."""
    chunk, threads, rounds = 4096, 4, 8
    n = env.size * threads * rounds * chunk
    win = rdma.register_window(data(("conc", env.rank), (n,), torch.int32), group=env.gloo)
    errors = []

    def worker(t):
        try:
            futs = []
            for k in range(rounds):
                slot = ((env.rank * threads + t) * rounds + k) * chunk
                futs.append(rdma.write(data(("cw", env.rank, t, k), (chunk,), torch.int32),
                                       win[0], slot))
                for r in env.others():
                    if r == 0:
                        continue     # rank 0's slices are being written
                    dst = torch.empty(chunk, dtype=torch.int32)
                    futs.append(rdma.read(dst, win[r], slot))
                    futs[-1].wait(TIMEOUT)
                    same_bytes(dst, data(("conc", r), (n,), torch.int32)[slot:slot + chunk],
                               f"thread {t} read of rank {r}")
            rdma.wait_all(futs, TIMEOUT)
        except BaseException:
            errors.append(traceback.format_exc())

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(TIMEOUT * 2)
    assert not errors, errors[0]
    env.sync()
    if env.rank == 0:
        want = data(("conc", 0), (n,), torch.int32)
        for w in range(env.size):
            if w == 0:
                continue
            for t in range(threads):
                for k in range(rounds):
                    slot = ((w * threads + t) * rounds + k) * chunk
                    want[slot:slot + chunk] = data(("cw", w, t, k), (chunk,), torch.int32)
        # rank 0's own writes went to its own window by local copies
        for t in range(threads):
            for k in range(rounds):
                slot = (t * rounds + k) * chunk
                want[slot:slot + chunk] = data(("cw", 0, t, k), (chunk,), torch.int32)
        same_bytes(win.tensor, want, "rank 0's window after concurrent writes")
    env.sync()
    win.free()


@case
def bad_arguments_touch_nothing(env, rdma, expect):
    E = rdma.RdmaInvalidError
    A = rdma.RdmaAccessError
    original = data(("bad", env.rank), (64, 16), torch.float32)
    win = rdma.register_window(original.clone(), group=env.gloo)
    r = env.next
    f32 = torch.ones(16)
    checks = [
        (E, "is torch.int32 but the remote one is torch.float32",
         rdma.write, torch.ones(16, dtype=torch.int32), win[r]),
        (E, "not contiguous", rdma.write, torch.ones(16, 4).t(), win[r]),
        (E, "on meta", rdma.write, torch.ones(4, device="meta"), win[r]),
        (E, "must be a torch.Tensor", rdma.write, [1.0, 2.0], win[r]),
        (E, "must be a RemoteTensor", rdma.write, f32, win[r].desc),
        (A, "elements [1017, 1033) are outside the remote tensor of 1024",
         rdma.write, f32, win[r], 1017),
        (A, "elements [0, 1025) are outside", rdma.read, torch.empty(1025), win[r]),
        (A, "offset is negative", rdma.write, f32, win[r], -1),
        (E, "offset must be an int", rdma.write, f32, win[r], 1.5),
        (E, "offset must be an int", rdma.write, f32, win[r], True),
        (E, "imm must be an int in [0, 2**32)", rdma.write_with_imm, f32, win[r], 1 << 32),
        (E, "imm must be an int", rdma.write_with_imm, f32, win[r], -1),
        (E, "at least one element", rdma.write_with_imm, torch.ones(0), win[r], 1),
        (E, "recv_imm takes a Peer", rdma.recv_imm, 3),
        (E, "that is this process", rdma.recv_imm, win[env.rank]),
    ]
    for cls, text, fn, *args in checks:
        raises(cls, text, fn, *args)
    assert isinstance(raises(E, "must match", rdma.read, torch.ones(2, dtype=torch.int64),
                             win[r]), ValueError)
    # A bad item anywhere in a batch: nothing of the batch moves.
    items = [(f32 * 9, win[r], 16 * i) for i in range(10)] + [(f32, win[r], 1020)]
    raises(A, "write item 10: ", rdma.batch_write, items)
    raises(E, "expected (local, remote, offset)", rdma.batch_write, [(f32, win[r])])
    raises(A, "local elements [10, 30) are outside the local tensor of 16",
           rdma.batch_read, [(f32, win[r], 10, 0, 20)])
    # Zero elements: done at once, nothing moves.
    assert rdma.write(torch.ones(0), win[r], 1024).done()
    env.sync()
    same_bytes(win.tensor, original, "target after refused operations")
    win.free()


@case
def foreign_descriptors(env, rdma, expect):
    """Descriptors of another job are refused before anything moves: by
    the Python check (job digest), and by the core when only the core's
    64 bytes are foreign."""
    from dlslime_torch import _C
    from dlslime_torch.rdma.region import Peer, RemoteTensor, byte_view, job_id
    win = rdma.register_window(torch.zeros(256), group=env.gloo)
    with _C.Context(token=b"another job entirely") as other:
        theirs = torch.arange(256, dtype=torch.float32)
        mr = other.reg_mr(byte_view(theirs))
        foreign = RemoteTensor(mr.desc(), Peer(other.address(), other.id,
                                               job_id(b"another job entirely")),
                               torch.float32, (256,))
        raises(rdma.RdmaAccessError, "comes from another job", rdma.write,
               torch.ones(8), foreign)
        raises(rdma.RdmaAccessError, "comes from another job", rdma.read,
               torch.ones(8), foreign)
        raises(rdma.RdmaAccessError, "another job", rdma.recv_imm, foreign.owner)
        # The core's descriptor of another job, dressed as a peer's.
        forged = RemoteTensor(mr.desc(), win[env.next].owner, torch.float32, (256,))
        exc = raises(rdma.RdmaAccessError, "another job", rdma.write, torch.ones(8), forged)
        assert exc.status == _C.ERR_ACCESS, exc.status
        # A stale descriptor of this job: its context is gone.
        stale = RemoteTensor(win[env.next].desc, Peer(other.address(), 12345,
                                                      win[env.next].owner.job),
                             torch.float32, (256,))
        raises(rdma.RdmaError, "connecting to process", rdma.write, torch.ones(8), stale)
        assert torch.equal(theirs, torch.arange(256, dtype=torch.float32))
        mr.dereg()
    env.sync()
    same_bytes(win.tensor, torch.zeros(256), "window after forged writes")
    win.free()


@case
def deregistered_regions(env, rdma, expect):
    A = rdma.RdmaAccessError
    tensor = data(("dereg", env.rank), (1000,), torch.int64)
    win = rdma.register_window(tensor, group=env.gloo)
    rdma.read(torch.empty(10, dtype=torch.int64), win[env.next]).wait(TIMEOUT)
    env.sync()
    win.region.deregister()
    win.region.deregister()                      # idempotent
    assert not win.region.registered
    env.sync()
    # The peer's region is gone: reads and writes fail cleanly, at the target.
    for fut in (rdma.read(torch.empty(10, dtype=torch.int64), win[env.next]),
                rdma.write(torch.zeros(10, dtype=torch.int64), win[env.next], 5)):
        exc = fut.exception(TIMEOUT)
        assert isinstance(exc, A), repr(exc)
        assert fut.done()
        raises(A, "failed", fut.result)
    exc = raises(A, "failed", rdma.batch_write_sync,
                 [(torch.zeros(4, dtype=torch.int64), win[env.next], 8 * i) for i in range(50)])
    # This process's own deregistered region, as local or as remote.
    raises(A, "was deregistered", rdma.read, torch.empty(1, dtype=torch.int64), win[env.rank])
    raises(A, "was deregistered", rdma.write, win.region, win[env.next])
    raises(A, "was deregistered", win.region.descriptor)
    env.sync()
    same_bytes(tensor, data(("dereg", env.rank), (1000,), torch.int64),
               "deregistered tensor after the peers' attempts")


@case
def futures_and_asyncio(env, rdma, expect):
    from dlslime_torch import _C
    win = rdma.register_window(data(("fut", env.rank), (4096,), torch.float32), group=env.gloo)
    fut = win.recv_imm(env.next)                     # nobody sends
    exc = raises(rdma.RdmaTimeoutError, "recv_imm from rank", fut.wait, 0.05)
    assert isinstance(exc, TimeoutError) and isinstance(exc, _C.SlimeTimeoutError)
    assert not fut.done()
    assert fut.cancel()
    assert isinstance(fut.exception(TIMEOUT), _C.SlimeCanceledError)
    raises(rdma.RdmaTimeoutError, "", rdma.recv_imm_sync, win[env.next], timeout=0.02)
    other = win.recv_imm(env.next)
    raises(ValueError, "finite number", other.wait, -1)
    raises(ValueError, "finite number", other.wait, float("inf"))
    assert other.cancel()

    async def many():
        outs = [torch.empty(100) for _ in range(20)]
        got = await asyncio.gather(*(rdma.read(o, win[env.next], 100 * i)
                                     for i, o in enumerate(outs)))
        imm = asyncio.ensure_future(win.recv_imm(env.prev).wait_async(TIMEOUT))
        await asyncio.sleep(0)
        return got, outs, imm

    async def main():
        got, outs, imm = await many()
        assert all(g is o for g, o in zip(got, outs))
        await asyncio.to_thread(env.sync)
        await rdma.write_with_imm(torch.ones(1), win[env.next], 99 + env.rank)
        return await imm, outs

    value, outs = asyncio.run(main())
    assert value == 99 + env.prev
    same_bytes(torch.cat(outs), data(("fut", env.next), (4096,), torch.float32)[:2000],
               "asyncio reads")
    futs = [rdma.read(torch.empty(64), win[r], 64) for r in range(env.size)]
    results = rdma.wait_all(futs, TIMEOUT)
    assert all(f.done() for f in futs) and len(results) == env.size
    env.sync()
    win.free()


@case
def descriptors_pickle(env, rdma, expect):
    region = rdma.register(torch.zeros(3, 5, dtype=torch.bfloat16), access="r")
    desc = region.descriptor(rank=env.rank)
    back = pickle.loads(pickle.dumps(desc))
    assert back == desc and back.numel == 15 and back.nbytes == 30, back
    assert f"bfloat16[3, 5] of rank {env.rank}" in str(desc)
    assert len(pickle.dumps(desc)) < 1024
    # access="r": peers may read, not write.
    descs = [None] * env.size
    dist.all_gather_object(descs, desc, group=env.gloo)
    rdma.read(torch.empty(15, dtype=torch.bfloat16), descs[env.next]).wait(TIMEOUT)
    raises(rdma.RdmaAccessError, "does not allow remote write", rdma.write,
           torch.ones(15, dtype=torch.bfloat16), descs[env.next])
    env.sync()
    same_bytes(region.tensor, torch.zeros(3, 5, dtype=torch.bfloat16), "read-only region")
    region.deregister()


# ------------------------------------------------------------------ job

def run_rdma_cases(rank, size, store, expect):
    import dlslime_torch  # noqa: F401  (registers "dlslime")
    from dlslime_torch import rdma
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                            timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    env = Env(rank, size, store, gloo)
    outcome = {}
    for name, fn in CASES.items():
        env.case, env.step = name, 0
        try:
            fn(env, rdma, expect)
            outcome[name] = None
        except BaseException:
            outcome[name] = traceback.format_exc()
        env.case, env.step = name + "/end", 0
        env.sync(timeout=TIMEOUT * 3)
    dist.destroy_process_group()
    return outcome


def run_peer_dies(rank, size, store, transport):
    """Rank 1 exits abruptly once rank 0 holds its descriptor and waits
    for an immediate from it: rank 0's pending and later operations on it
    fail (RdmaPeerLostError or the core's closed error), none hangs."""
    import os
    import time
    import dlslime_torch  # noqa: F401
    from dlslime_torch import rdma
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    win = rdma.register_window(torch.zeros(1 << 20, dtype=torch.uint8))
    pending = win.recv_imm(1) if rank == 0 else None
    rdma.read(torch.empty(16, dtype=torch.uint8), win[1 - rank]).wait(TIMEOUT)
    store.set(f"peer-dies/{transport}/ready/{rank}", b"1")
    if rank == 1:
        store.wait([f"peer-dies/{transport}/ready/0"])
        os._exit(0)
    store.wait([f"peer-dies/{transport}/ready/1"])
    exc = pending.exception(TIMEOUT)                 # fails, does not hang
    assert isinstance(exc, rdma.RdmaError), repr(exc)
    start = time.monotonic()
    for _ in range(3):
        try:
            rdma.read(torch.empty(1 << 20, dtype=torch.uint8), win[1]).wait(TIMEOUT)
        except rdma.RdmaError as err:
            later = err
        else:
            raise AssertionError("a read from a dead peer succeeded")
    assert time.monotonic() - start < TIMEOUT, "failing took as long as the timeout"
    return type(exc).__name__, type(later).__name__, str(later)
