"""Catalog cases: the object collectives and subgroups (see cases.py)."""

import torch
import torch.distributed as dist

from cases import R, case, data, gloo_all_reduce, same


# ---------------------------------------------------------------- objects

@case("object-collectives")
def _(env):
    mine = {"rank": env.rank, "payload": list(range(env.rank * 3)), "s": "x" * env.rank}
    got, ref = [None] * env.size, [None] * env.size
    dist.all_gather_object(got, mine)
    dist.all_gather_object(ref, mine, group=env.gloo)
    assert got == ref and got[env.rank] == mine, got

    root = env.size - 1
    objs = [f"from {env.rank}", {"k": env.rank}]
    ref_objs = list(objs)
    dist.broadcast_object_list(objs, src=root)
    dist.broadcast_object_list(ref_objs, src=root, group=env.gloo)
    assert objs == ref_objs == [f"from {root}", {"k": root}], objs

    out = [None] * env.size if env.rank == 0 else None
    ref_out = [None] * env.size if env.rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    dist.gather_object(mine, ref_out, dst=0, group=env.gloo)
    if env.rank == 0:
        assert out == ref_out and len(out) == env.size, out

    scatter_in = [("item", r, "y" * r) for r in range(env.size)] if env.rank == root else None
    got_one, ref_one = [None], [None]
    dist.scatter_object_list(got_one, scatter_in, src=root)
    dist.scatter_object_list(ref_one, scatter_in, src=root, group=env.gloo)
    assert got_one == ref_one == [("item", env.rank, "y" * env.rank)], got_one


# ---------------------------------------------------------------- subgroups

@case("subgroups")
def _(env):
    # Two overlapping subgroups alive at once, each beside its Gloo twin.
    # new_group is collective over the default group: every rank makes
    # every group, members or not.
    evens = list(range(0, env.size, 2))
    tail = list(range(1, env.size)) or [0]
    groups = [(ranks, dist.new_group(ranks), dist.new_group(ranks, backend="gloo"))
              for ranks in (evens, tail)]
    for ranks, slime, gloo in groups:
        if env.rank not in ranks:
            continue
        x = data(f"sub{ranks}", env.rank, (9,), torch.int64)
        ref = gloo_all_reduce(x, R.SUM, gloo)
        got = x.clone()
        dist.all_reduce(got, group=slime)
        same(got, ref, what=f"all_reduce on group {ranks}")
        outs = [torch.empty(9, dtype=torch.int64) for _ in ranks]
        refs = [torch.empty(9, dtype=torch.int64) for _ in ranks]
        dist.all_gather(outs, x, group=slime)
        dist.all_gather(refs, x, group=gloo)
        for o, r in zip(outs, refs):
            same(o, r, what=f"all_gather on group {ranks}")
        if len(ranks) > 1:
            first, last = ranks[0], ranks[-1]
            if env.rank == first:
                dist.send(torch.tensor([first * 1.5]), dst=last, group=slime, tag=12)
            elif env.rank == last:
                t = torch.empty(1)
                dist.recv(t, src=first, group=slime, tag=12)
                same(t, torch.tensor([first * 1.5]), what="subgroup recv")
    for _, slime, gloo in groups:
        dist.destroy_process_group(slime)
        dist.destroy_process_group(gloo)
    dist.barrier()
