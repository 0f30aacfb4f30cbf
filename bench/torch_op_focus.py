#!/usr/bin/env python3
"""One op at a few sizes, "dlslime" beside Gloo, for before/after checks.

Two (or --world) ranks on this host; every rank makes one group per
backend, then for each size the backends take turns (--reps slices each,
ABBA order) and the median per-iteration time of each backend's slices
is reported with the ratio gloo/dlslime (above 1: dlslime is faster).
send_recv times one round trip and reports half of it (one way).

    PYTHONPATH=. python bench/torch_op_focus.py --op send_recv --sizes 8
    PYTHONPATH=. python bench/torch_op_focus.py --op all_to_all --sizes 8MiB,16MiB,32MiB
    PYTHONPATH=. python bench/torch_op_focus.py --op all_reduce --sizes 8,64KiB --async-op

torch_dist_bench.py is the full benchmark; this one is for iterating.
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.torch_dist_bench import parse_size, human  # noqa: E402

BACKENDS = ("dlslime", "gloo")


def make_op(op, nbytes, rank, world, group, async_op=False):
    """One iteration of op; with async_op, each call is posted with
    async_op=True (send_recv: isend / irecv) and its Work waited on at once,
    the asynchronous path that DDP and torch's own backend calls take."""
    import torch
    import torch.distributed as dist
    n = max(1, nbytes // 4)

    def call(fn, *args, **kw):
        if async_op:
            fn(*args, async_op=True, **kw).wait()
        else:
            fn(*args, **kw)

    if op == "send_recv":
        buf, peer = torch.zeros(n), rank ^ 1
        send, recv = (dist.isend, dist.irecv) if async_op else (dist.send, dist.recv)

        def one(fn):
            w = fn(buf, peer, group=group)
            if async_op:
                w.wait()

        def run():
            if rank % 2 == 0:
                one(send)
                one(recv)
            else:
                one(recv)
                one(send)
        return run
    if op == "all_reduce":
        buf = torch.zeros(n)
        return lambda: call(dist.all_reduce, buf, group=group)
    if op == "broadcast":
        buf = torch.zeros(n)
        return lambda: call(dist.broadcast, buf, 0, group=group)
    c = max(1, n // world)
    if op == "all_gather":
        inp, out = torch.zeros(c), [torch.zeros(c) for _ in range(world)]
        return lambda: call(dist.all_gather, out, inp, group=group)
    if op == "reduce_scatter":
        inp, out = [torch.zeros(c) for _ in range(world)], torch.zeros(c)
        return lambda: call(dist.reduce_scatter, out, inp, group=group)
    if op == "gather":
        inp = torch.zeros(c)
        out = [torch.zeros(c) for _ in range(world)] if rank == 0 else None
        return lambda: call(dist.gather, inp, out, dst=0, group=group)
    if op == "scatter":
        out = torch.zeros(c)
        inp = [torch.zeros(c) for _ in range(world)] if rank == 0 else None
        return lambda: call(dist.scatter, out, inp, src=0, group=group)
    if op == "all_to_all":
        inp, out = [torch.zeros(c) for _ in range(world)], [torch.zeros(c) for _ in range(world)]
        return lambda: call(dist.all_to_all, out, inp, group=group)
    if op == "all_to_all_single":
        inp, out = torch.zeros(c * world), torch.zeros(c * world)
        return lambda: call(dist.all_to_all_single, out, inp, group=group)
    raise ValueError(op)


def worker(rank, world, port, args, q):
    import torch
    import torch.distributed as dist
    import dlslime_torch  # noqa: F401
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = {b: dist.new_group(backend=b) for b in BACKENDS}
    out = []
    for size in args.sizes:
        runs = {b: make_op(args.op, size, rank, world, groups[b], args.async_op) for b in BACKENDS}
        iters = {}
        for b in BACKENDS:
            runs[b]()
            # a fixed count: every rank must post the same collectives
            k = 3
            t0 = time.perf_counter()
            for _ in range(k):
                runs[b]()
            per = (time.perf_counter() - t0) / k
            iters[b] = max(2, min(20000, int(args.slice / per)))
        t = torch.tensor([float(iters[b]) for b in BACKENDS])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        iters = {b: int(v) for b, v in zip(BACKENDS, t.tolist())}
        times = {b: [] for b in BACKENDS}
        for r in range(args.reps):
            for b in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
                dist.barrier(group=groups[b])
                t0 = time.perf_counter()
                for _ in range(iters[b]):
                    runs[b]()
                times[b].append((time.perf_counter() - t0) / iters[b])
        share = 0.5 if args.op == "send_recv" else 1.0
        med = {b: statistics.median(times[b]) * share for b in BACKENDS}
        t = torch.tensor([med[b] for b in BACKENDS], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append((size, dict(zip(BACKENDS, t.tolist()))))
    dist.barrier()
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()
    if rank == 0:
        q.put(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="send_recv")
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default=[8])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7, help="timed slices per backend")
    ap.add_argument("--slice", type=float, default=0.2, help="seconds per slice")
    ap.add_argument("--async-op", action="store_true",
                    help="post each call with async_op=True and wait on its Work at once")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.distributed as dist
    master = dist.TCPStore("127.0.0.1", port, is_master=True, world_size=args.world + 1,
                           timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args, q)) for r in range(args.world)]
    for p in procs:
        p.start()
    res = q.get(timeout=600)
    for p in procs:
        p.join(60)
    del master
    print(f"{args.op}{' (async_op=True, waited at once)' if args.async_op else ''}, {args.world} ranks, "
          f"median of {args.reps} slices (us per op{', one way' if args.op == 'send_recv' else ''}):")
    for size, m in res:
        print(f"  {human(size):>8}  dlslime {m['dlslime'] * 1e6:10.1f}  gloo {m['gloo'] * 1e6:10.1f}"
              f"  gloo/dlslime {m['gloo'] / m['dlslime']:5.2f}x")


if __name__ == "__main__":
    main()
