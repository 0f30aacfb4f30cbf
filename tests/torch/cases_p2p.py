"""Catalog cases: send/recv, isend/irecv, recv from any source and
batch_isend_irecv (see cases.py)."""

import torch
import torch.distributed as dist

from cases import case, data, same


# ---------------------------------------------------------------- point to point

@case("send-recv-ring")
def _(env):
    if env.size == 1:
        return
    nxt, prv = (env.rank + 1) % env.size, (env.rank - 1) % env.size
    for n, dtype in [(10, torch.float32), (600_000, torch.uint8)]:   # eager and rendezvous
        mine = data(f"ring{n}", env.rank, (n,), dtype)
        expected = data(f"ring{n}", prv, (n,), dtype)
        got = torch.empty(n, dtype=dtype)
        if env.rank % 2 == 0:
            dist.send(mine, dst=nxt, tag=3)
            dist.recv(got, src=prv, tag=3)
        else:
            dist.recv(got, src=prv, tag=3)
            dist.send(mine, dst=nxt, tag=3)
        same(got, expected, what="received tensor")
        via_gloo = torch.empty(n, dtype=dtype)
        reqs = [dist.isend(mine, dst=nxt, group=env.gloo), dist.irecv(via_gloo, src=prv, group=env.gloo)]
        for r in reqs:
            r.wait()
        same(got, via_gloo)


@case("isend-irecv-tags-out-of-order")
def _(env):
    if env.size == 1:
        return
    if env.rank == 0:
        works = [dist.isend(torch.full((4,), float(tag)), dst=1, tag=tag) for tag in (1, 2, 3)]
        for w in works:
            w.wait()
    elif env.rank == 1:
        bufs = {tag: torch.empty(4) for tag in (3, 1, 2)}
        works = [(tag, dist.irecv(buf, src=0, tag=tag)) for tag, buf in bufs.items()]
        for tag, w in works:
            w.wait()
            same(bufs[tag], torch.full((4,), float(tag)), what=f"message with tag {tag}")


@case("recv-any-source")
def _(env):
    if env.size == 1:
        return
    if env.rank == 0:
        seen = {}
        for _ in range(env.size - 1):
            buf = torch.empty(3, dtype=torch.int64)
            src = dist.recv(buf, tag=7)  # any source; a tag of its own,
            # or a message another case's rank already sent could match
            seen[src] = buf
        assert sorted(seen) == list(range(1, env.size)), seen
        for src, buf in seen.items():
            same(buf, torch.full((3,), src * 11, dtype=torch.int64), what=f"message from {src}")
    else:
        dist.send(torch.full((3,), env.rank * 11, dtype=torch.int64), dst=0, tag=7)


@case("batch_isend_irecv-sends-first")
def _(env):
    if env.size == 1:
        return
    nxt, prv = (env.rank + 1) % env.size, (env.rank - 1) % env.size
    n = 300_000  # past the eager limit: both sides post their sends first
    to_next = data("bi", env.rank, (n,), torch.float32)
    to_prev = data("bi", env.rank + 100, (n,), torch.float32)
    from_prev, from_next = torch.empty(n), torch.empty(n)
    ops = [dist.P2POp(dist.isend, to_next, nxt, tag=9), dist.P2POp(dist.isend, to_prev, prv, tag=10),
           dist.P2POp(dist.irecv, from_prev, prv, tag=9), dist.P2POp(dist.irecv, from_next, nxt, tag=10)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(from_prev, data("bi", prv, (n,), torch.float32), what="from the previous rank")
    same(from_next, data("bi", nxt + 100, (n,), torch.float32), what="from the next rank")


@case("recv-noncontiguous")
def _(env):
    if env.size == 1:
        return
    if env.rank == 0:
        dist.send(torch.arange(12.0).reshape(3, 4), dst=1, tag=11)
    elif env.rank == 1:
        got = torch.zeros(4, 3).t()
        dist.recv(got, src=0, tag=11)
        same(got, torch.arange(12.0).reshape(3, 4))
