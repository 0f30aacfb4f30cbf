#!/usr/bin/env python3
"""torch.distributed latency and bandwidth: the "dlslime" backend next to
Gloo, measured side by side in one run.

For every world size it starts that many worker processes on this host
(multiprocessing spawn, meeting through a TCPStore on 127.0.0.1).  Each
worker makes one process group per backend under test in the same process
(the default group is a separate Gloo group that only carries the
benchmark's own bookkeeping), then, for every op and size, measures the
backends taking turns (a few timed slices each, ABBAAB...), so a load that
comes and goes on a small shared machine hits both alike.  It prints a table with the ratios, the issue's
targets and whether they are met (reported, never asserted), and writes a
CSV and a PNG plot.

    python bench/torch_dist_bench.py --quick
    python bench/torch_dist_bench.py --world-sizes 2,4
    python bench/torch_dist_bench.py --ops all_reduce,send_recv --max-size 64MiB

See bench/README.md for what each number means.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import multiprocessing
import sys
import time
import traceback
from multiprocessing import connection as mp_connection
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this checkout's dlslime_torch, not an installed one
    sys.path.insert(0, str(REPO))

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OPS = ("send_recv", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")
REFERENCE = "gloo"
# 8 B is there for the latency target
QUICK_SIZES = (4, 8, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
ELEM = 4  # float32
# Every backend's timed buffers, check buffers and a backend's own staging,
# per rank, in units of the point's size: what a point may need at most.
MEM_FACTOR = 8
# failure kinds, ordered: the worst on any rank wins
WRONG, RAISED = 1.0, 2.0
MEM_RESERVE = 1 * GiB
CSV_COLUMNS = ("world_size", "op", "bytes", "backend", "iters", "avg_us", "p50_us",
               "gbps", "bw_ratio_vs_gloo", "p50_ratio_vs_gloo", "status")


# ------------------------------------------------------------------ sizes

def parse_size(text: str) -> int:
    import re
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 256M)")
    value = int(m.group(1)) * {"": 1, "k": KiB, "m": MiB, "g": GiB}[m.group(2).lower()]
    if value < ELEM:
        raise argparse.ArgumentTypeError(f"a size must be at least {ELEM} bytes (one float32)")
    return value


def human(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def elements(op: str, size: int, world: int) -> tuple[int, int]:
    """(elements of the whole buffer, elements of one rank's chunk).

    For all_gather, reduce_scatter and all_to_all the size is the whole
    buffer of world chunks on one rank (all_gather's output,
    reduce_scatter's input, all_to_all's input = output), rounded down to
    whole chunks (at least one element each)."""
    n = max(1, size // ELEM)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        chunk = max(1, n // world)
        return chunk * world, chunk
    return n, n


# ------------------------------------------------------------------ worker side
# Everything below up to the parent side runs in the spawned ranks.

def pattern(n: int, offset: float):
    """Small integers, exact in float32 even summed over 4 ranks."""
    import torch
    return (torch.arange(n, dtype=torch.int32) % 1021).to(torch.float32) + offset


class Point:
    """One op at one size on one group: run() does one iteration on the
    timed buffers; check_once() one iteration on fresh patterned buffers,
    saying what is wrong (None if nothing)."""

    def __init__(self, op, n, chunk, group, rank, world):
        import torch
        self.torch = torch
        self.op, self.n, self.chunk = op, n, chunk
        self.g, self.rank, self.world = group, rank, world
        z = lambda k: torch.zeros(k)  # noqa: E731  (touched pages, finite sums)
        if op == "send_recv":
            self.peer = rank ^ 1 if (rank ^ 1) < world else None
            self.buf = z(n)
        elif op in ("all_reduce", "broadcast"):
            self.buf = z(n)
        elif op == "all_gather":
            self.inp, self.out = z(chunk), [z(chunk) for _ in range(world)]
        elif op == "reduce_scatter":
            self.inp, self.out = [z(chunk) for _ in range(world)], z(chunk)
        elif op == "all_to_all":
            self.inp = [z(chunk) for _ in range(world)]
            self.out = [z(chunk) for _ in range(world)]
        else:
            raise ValueError(op)

    def run(self):
        import torch.distributed as dist
        op, g = self.op, self.g
        if op == "send_recv":
            # one iteration = one round trip of the pair (rank, rank ^ 1)
            if self.peer is None:
                return
            if self.rank % 2 == 0:
                dist.send(self.buf, self.peer, group=g)
                dist.recv(self.buf, self.peer, group=g)
            else:
                dist.recv(self.buf, self.peer, group=g)
                dist.send(self.buf, self.peer, group=g)
        elif op == "all_reduce":
            dist.all_reduce(self.buf, group=g)
        elif op == "broadcast":
            dist.broadcast(self.buf, 0, group=g)
        elif op == "all_gather":
            dist.all_gather(self.out, self.inp, group=g)
        elif op == "reduce_scatter":
            dist.reduce_scatter(self.out, self.inp, group=g)
        elif op == "all_to_all":
            dist.all_to_all(self.out, self.inp, group=g)

    def free(self):
        for name in ("buf", "inp", "out"):
            self.__dict__.pop(name, None)

    @staticmethod
    def check_once(op, n, c, g, r, w):
        import torch
        import torch.distributed as dist
        R = 4096.0  # keeps every rank's values apart

        def differs(got, want, what):
            if torch.equal(got, want):
                return None
            bad = (got != want).nonzero()[0].item()
            return (f"{what}: element {bad} is {got.flatten()[bad].item()}, "
                    f"expected {want.flatten()[bad].item()}")

        if op == "send_recv":
            peer = r ^ 1
            if peer >= w:
                return None
            mine, theirs = pattern(n, R * r), pattern(n, R * peer)
            got = torch.full((n,), -1.0)
            if r % 2 == 0:
                dist.send(mine, peer, group=g)
                dist.recv(got, peer, group=g)
            else:
                dist.recv(got, peer, group=g)
                dist.send(mine, peer, group=g)
            return differs(got, theirs, f"received from rank {peer}")
        if op == "all_reduce":
            t = pattern(n, R * r)
            dist.all_reduce(t, group=g)
            return differs(t, pattern(n, 0) * w + R * (w * (w - 1) / 2), "sum")
        if op == "broadcast":
            t = pattern(n, 0) if r == 0 else torch.full((n,), -1.0)
            dist.broadcast(t, 0, group=g)
            return differs(t, pattern(n, 0), "broadcast from rank 0")
        if op == "all_gather":
            out = [torch.full((c,), -1.0) for _ in range(w)]
            dist.all_gather(out, pattern(c, R * r), group=g)
            for j in range(w):
                err = differs(out[j], pattern(c, R * j), f"chunk from rank {j}")
                if err:
                    return err
            return None
        if op == "reduce_scatter":
            # rank s puts base + R*s + 7*j into chunk j
            inp = [pattern(c, R * r + 7 * j) for j in range(w)]
            out = torch.full((c,), -1.0)
            dist.reduce_scatter(out, inp, group=g)
            return differs(out, pattern(c, 0) * w + R * (w * (w - 1) / 2) + 7 * w * r,
                           "reduced chunk")
        if op == "all_to_all":
            # rank s sends base + R*s + 16*j to rank j
            inp = [pattern(c, R * r + 16 * j) for j in range(w)]
            out = [torch.full((c,), -1.0) for _ in range(w)]
            dist.all_to_all(out, inp, group=g)
            for j in range(w):
                err = differs(out[j], pattern(c, R * j + 16 * r), f"chunk from rank {j}")
                if err:
                    return err
            return None
        raise ValueError(op)


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


class Worker:
    def __init__(self, rank, world, store, cfg):
        import torch
        import torch.distributed as dist
        import dlslime_torch  # noqa: F401  (registers "dlslime")
        self.torch, self.dist = torch, dist
        self.rank, self.world, self.cfg = rank, world, cfg
        op_timeout = datetime.timedelta(seconds=cfg["op_timeout"])
        # Bookkeeping only, and patient: a rank that waits here for one
        # whose op is timing out must outlast that timeout.
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=op_timeout + datetime.timedelta(seconds=120))
        self.groups = {b: dist.new_group(backend=b, timeout=op_timeout)
                       for b in cfg["backends"]}
        self.broken = {}

    def agree_max(self, values):
        """Element-wise max over ranks (on the bookkeeping group)."""
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def first_error(self, local):
        """Every rank's error text, agreed: (rank, text) of the first one."""
        texts = [None] * self.world
        self.dist.all_gather_object(texts, local)
        for r, t in enumerate(texts):
            if t:
                return r, t
        return None

    def log(self, text):
        if self.rank == 0:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def fail(self, backend, op, size, err, kind):
        """Marks a backend failed at this point, on every rank alike (kind:
        the worst failure of any rank); returns the status text."""
        r, text = self.first_error(err)
        last = text.strip().splitlines()[-1]
        if self.rank == 0:
            sys.stderr.write(f"{backend} {op} {human(size)} on {self.world} ranks failed "
                             f"on rank {r}:\n{text}\n")
        if kind == RAISED:
            # an op that raised may leave the group broken (as with Gloo or
            # NCCL): no more numbers from this backend in this job
            self.broken[backend] = f"{backend} failed earlier ({op} {human(size)})"
        return f"FAILED on rank {r}: {last}"

    def measure(self, op, size, order):
        """One point for every backend; returns {backend: row}, the same on
        every rank.  The backends take turns: `rounds` timed slices each,
        in the order ABBAAB..., so a load that comes and goes during the
        point weighs on both alike."""
        cfg, world, perf = self.cfg, self.world, time.perf_counter
        n, chunk = elements(op, size, world)
        rows = {b: {"world_size": world, "op": op, "bytes": n * ELEM, "backend": b,
                    "iters": 0, "avg_us": None, "p50_us": None, "gbps": None,
                    "status": "ok"} for b in order}
        live = []
        for b in order:
            if b in self.broken:
                rows[b]["status"] = f"not run: {self.broken[b]}"
            else:
                live.append(b)
        if not live:
            return rows
        need = MEM_FACTOR * n * ELEM * world + MEM_RESERVE
        (short,) = self.agree_max([1.0 if need > mem_available() else 0.0])
        if short:
            for b in live:
                rows[b]["status"] = (f"skipped: needs about {need / GiB:.1f} GiB, more "
                                     f"than the memory available")
            self.log(f"  {op} {human(size)} on {world} ranks: {rows[live[0]]['status']}")
            return rows

        points, errs, calib = {}, {b: None for b in live}, {b: 0.0 for b in live}
        warm = 1 if size >= 4 * MiB else 3 if size >= 64 * KiB else 10

        def settle():
            """Agrees on which backends failed so far; drops them."""
            flags = self.agree_max([(RAISED if errs[b] and not errs[b].startswith("WRONG")
                                     else WRONG if errs[b] else 0.0) for b in live])
            for b, f in zip(list(live), flags):
                if f:
                    rows[b]["status"] = self.fail(b, op, size, errs[b], f)
                    live.remove(b)
                    if b in points:
                        points.pop(b).free()

        for b in live:
            try:
                points[b] = Point(op, n, chunk, self.groups[b], self.rank, world)
                points[b].run()  # first touch of the pages, connections, staging
                t0 = perf()
                for _ in range(warm):
                    points[b].run()
                calib[b] = (perf() - t0) / warm
            except Exception:
                errs[b] = traceback.format_exc()
        settle()
        # the same iteration counts on every rank: from the slowest rank's calibration
        slowest = self.agree_max([calib[b] for b in live]) if live else []
        iters = {b: int(min(cfg["max_iters"],
                            max(cfg["min_iters"], math.ceil(cfg["time"] / max(t, 1e-7)))))
                 for b, t in zip(live, slowest)}
        rounds = min([cfg["rounds"], *iters.values()])
        steps, total = {b: [] for b in live}, {b: 0.0 for b in live}
        for k in range(rounds):
            for b in (live if k % 2 == 0 else live[::-1]):
                # this slice's even share of the point's iterations
                count = iters[b] * (k + 1) // rounds - iters[b] * k // rounds
                try:
                    self.dist.barrier(group=self.groups[b])
                    stamps = [0.0] * (count + 1)
                    run = points[b].run
                    stamps[0] = perf()
                    for i in range(1, count + 1):
                        run()
                        stamps[i] = perf()
                    total[b] += stamps[-1] - stamps[0]
                    steps[b] += [y - x for x, y in zip(stamps, stamps[1:])]
                except Exception:
                    errs[b] = traceback.format_exc()
            settle()
        for b in list(live):
            points.pop(b).free()
            try:
                wrong = Point.check_once(op, n, chunk, self.groups[b], self.rank, world)
                if wrong:
                    errs[b] = f"WRONG RESULT: {wrong}"
            except Exception:
                errs[b] = traceback.format_exc()
        settle()
        if not live:
            return rows
        # the one-way time of send_recv is half a round trip
        share = 0.5 if op == "send_recv" else 1.0
        local = []
        for b in live:
            st = sorted(steps[b])
            m = len(st)
            p50 = st[m // 2] if m % 2 else (st[m // 2 - 1] + st[m // 2]) / 2
            local += [total[b] / m * share, p50 * share]
        agreed = self.agree_max(local)
        for i, b in enumerate(live):
            avg, p50 = agreed[2 * i], agreed[2 * i + 1]
            rows[b].update(iters=iters[b], avg_us=avg * 1e6, p50_us=p50 * 1e6,
                           gbps=n * ELEM / avg / 1e9 if avg > 0 else None)
        return rows

    def run(self):
        cfg, rows, k = self.cfg, [], 0
        for op in cfg["ops"]:
            seen = set()
            for size in cfg["sizes"]:
                # sizes under one float32 per rank round up to the same buffer
                n = elements(op, size, self.world)[0]
                if n in seen:
                    continue
                seen.add(n)
                # alternate who goes first, so order does not favour either
                order = list(cfg["backends"])
                if k % 2:
                    order.reverse()
                k += 1
                got = self.measure(op, size, order)
                rows += [got[b] for b in cfg["backends"]]
                self.log("  " + progress_line(self.world, op, size, [got[b] for b in cfg["backends"]]))
        self.dist.barrier()
        for g in self.groups.values():
            self.dist.destroy_process_group(g)
        self.dist.destroy_process_group()
        return rows


def progress_line(world, op, size, rows):
    parts = [f"[{world} ranks] {op} {human(size)}:"]
    for r in rows:
        if r["avg_us"] is None:
            parts.append(f"{r['backend']} {r['status']}")
        else:
            parts.append(f"{r['backend']} {r['avg_us']:.1f} us {fmt_gbps(r['gbps'])} GB/s")
    return "  ".join(parts)


def worker_main(rank, port, world, cfg, conn):
    try:
        import torch
        import torch.distributed as dist
        # two cores for every rank: one intra-op thread each
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=120))
        rows = Worker(rank, world, store, cfg).run()
        conn.send(("done", rows if rank == 0 else None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# ------------------------------------------------------------------ parent side

def spawn_ranks(world, target, args, deadline_s):
    """Starts `world` spawned processes meeting through a TCPStore on
    127.0.0.1, each running target(rank, store_port, *args, conn), where
    conn takes one ("done", value) or ("error", traceback).  Returns rank
    0's value (or [] if it sent none) and the errors of the ranks that
    failed, died or outlived the deadline (killed).  Shared by the
    benchmarks that run ranks of their own (rdma_bench.py too)."""
    import torch.distributed as dist
    mp = multiprocessing.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    procs, conns = [], []
    for rank in range(world):
        parent_end, child_end = mp.Pipe(duplex=False)
        p = mp.Process(target=target, name=f"bench-rank{rank}",
                       args=(rank, store.port, *args, child_end))
        p.start()
        child_end.close()
        procs.append(p)
        conns.append(parent_end)
    rows, errors = [], []
    pending = {c: r for r, c in enumerate(conns)}
    end = time.monotonic() + deadline_s
    while pending and time.monotonic() < end:
        for c in mp_connection.wait(list(pending), timeout=max(0, end - time.monotonic())):
            rank = pending.pop(c)
            try:
                kind, value = c.recv()
            except EOFError:
                procs[rank].join(5)
                errors.append(f"rank {rank} exited with code {procs[rank].exitcode}")
                continue
            if kind == "error":
                errors.append(f"rank {rank} raised:\n{value}")
            elif rank == 0:
                rows = value
        if errors:  # the others get a little while to finish or fail too
            end = min(end, time.monotonic() + 30)
    for rank in sorted(pending.values()):
        errors.append(f"rank {rank}: still running after the deadline; killed")
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    return rows, errors


def run_job(world, cfg, deadline_s):
    """Runs every point on `world` ranks; returns rank 0's rows (and the
    errors of ranks that failed as a whole)."""
    return spawn_ranks(world, worker_main, (world, cfg), deadline_s)


def add_ratios(rows):
    """bw_ratio = backend GB/s / Gloo GB/s at the same point (= Gloo
    avg_us / backend avg_us: same bytes); p50_ratio = Gloo p50 / backend p50."""
    ref = {(r["world_size"], r["op"], r["bytes"]): r for r in rows if r["backend"] == REFERENCE}
    for r in rows:
        g = ref.get((r["world_size"], r["op"], r["bytes"]))
        ok = g is not None and r["avg_us"] and g["avg_us"]
        r["bw_ratio_vs_gloo"] = g["avg_us"] / r["avg_us"] if ok else None
        r["p50_ratio_vs_gloo"] = g["p50_us"] / r["p50_us"] if ok and r["p50_us"] and g["p50_us"] else None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_gbps(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v >= 0.1 else f"{v:.3g}"


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def print_table(rows, backends):
    others = [b for b in backends if b != REFERENCE] if REFERENCE in backends else []
    heads = ["op", "size"]
    for b in backends:
        heads += [f"{b} us", f"{b} p50", f"{b} GB/s"]
    for b in others:
        heads += [f"bw {b}/{REFERENCE}", f"p50 {REFERENCE}/{b}"]
    for world in sorted({r["world_size"] for r in rows}):
        by_point = {}
        for r in rows:
            if r["world_size"] == world:
                by_point.setdefault((r["op"], r["bytes"]), {})[r["backend"]] = r
        lines, notes, ops = [], [], []
        for (op, nbytes), got in by_point.items():
            cells = [op, human(nbytes)]
            for b in backends:
                r = got.get(b)
                if r is None or r["avg_us"] is None:
                    cells += ["-", "-", "-"]
                    if r is not None:
                        notes.append(f"{b} {op} {human(nbytes)}: {r['status']}")
                else:
                    cells += [fmt(r["avg_us"]), fmt(r["p50_us"]), fmt_gbps(r["gbps"])]
            for b in others:
                r = got.get(b)
                cells += [fmt_ratio(r and r["bw_ratio_vs_gloo"]),
                          fmt_ratio(r and r["p50_ratio_vs_gloo"])]
            lines.append(cells)
            ops.append(op)
        widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(heads)]
        show = lambda cells: print("  ".join(  # noqa: E731
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
        print(f"\n== world size {world} ==")
        show(heads)
        print("  ".join("-" * w for w in widths))
        for i, cells in enumerate(lines):
            if i and ops[i] != ops[i - 1]:
                print()
            show(cells)
        for n in notes:
            print(f"  note: {n}")


def print_targets(rows, backends):
    """The issue's targets, reported (never asserted: this is a benchmark)."""
    print("\ntargets (reported, not asserted; ratios of avg times measured side by side):")
    if REFERENCE not in backends or "dlslime" not in backends:
        print(f"  none: they compare dlslime with {REFERENCE}; run both")
        return
    ours = [r for r in rows if r["backend"] == "dlslime"]

    def verdict(ok):
        return "meets" if ok else "MISSES"

    def point(r):
        return f"{r['op']} {human(r['bytes'])} on {r['world_size']} ranks"

    big = [r for r in ours if r["world_size"] == 2 and r["op"] in ("send_recv", "all_reduce")
           and r["bytes"] >= MiB]
    for op in ("send_recv", "all_reduce"):
        rs = [r for r in big if r["op"] == op]
        if not rs:
            print(f"  {op} bandwidth >= 3x gloo from 1 MiB, 2 ranks: not measured")
            continue
        missing = [r for r in rs if r["bw_ratio_vs_gloo"] is None]
        worst = min((r for r in rs if r["bw_ratio_vs_gloo"] is not None),
                    key=lambda r: r["bw_ratio_vs_gloo"], default=None)
        if worst is None:
            print(f"  {op} bandwidth >= 3x gloo from 1 MiB, 2 ranks: no valid point -> MISSES")
            continue
        ok = worst["bw_ratio_vs_gloo"] >= 3 and not missing
        print(f"  {op} bandwidth >= 3x gloo from 1 MiB, 2 ranks: worst "
              f"{worst['bw_ratio_vs_gloo']:.2f}x at {human(worst['bytes'])}"
              f"{f', {len(missing)} point(s) without a number' if missing else ''} -> {verdict(ok)}")
    for op in ("send_recv", "all_reduce"):
        rs = [r for r in ours if r["world_size"] == 2 and r["op"] == op and r["bytes"] == 8]
        if not rs:
            print(f"  {op} 8-byte latency >= 3x lower than gloo, 2 ranks: not measured")
            continue
        r = rs[0]
        if r["bw_ratio_vs_gloo"] is None:
            print(f"  {op} 8-byte latency >= 3x lower than gloo, 2 ranks: no number -> MISSES")
            continue
        g = next(x for x in rows if x["backend"] == REFERENCE and x["world_size"] == 2
                 and x["op"] == op and x["bytes"] == 8)
        print(f"  {op} 8-byte latency >= 3x lower than gloo, 2 ranks: {r['avg_us']:.1f} us vs "
              f"{g['avg_us']:.1f} us = {r['bw_ratio_vs_gloo']:.2f}x (p50 "
              f"{r['p50_ratio_vs_gloo']:.2f}x) -> {verdict(r['bw_ratio_vs_gloo'] >= 3)}")
    valid = [r for r in ours if r["bw_ratio_vs_gloo"] is not None]
    failed = [r for r in ours if r["avg_us"] is None and not r["status"].startswith("skipped")]
    if valid:
        worst = min(valid, key=lambda r: r["bw_ratio_vs_gloo"])
        slower = sorted((r for r in valid if r["bw_ratio_vs_gloo"] < 1),
                        key=lambda r: r["bw_ratio_vs_gloo"])
        print(f"  never slower than gloo (every op, size and world size run): worst "
              f"{worst['bw_ratio_vs_gloo']:.2f}x at {point(worst)}; "
              f"{len(slower)} of {len(valid)} points slower"
              f"{f', {len(failed)} without a number' if failed else ''} -> "
              f"{verdict(not slower and not failed)}")
        for r in slower[:12]:
            print(f"    slower: {point(r)}: {r['bw_ratio_vs_gloo']:.2f}x "
                  f"(p50 {fmt_ratio(r['p50_ratio_vs_gloo'])})")
        if len(slower) > 12:
            print(f"    ... and {len(slower) - 12} more")
        # the verdict is on averages; a slower median is worth seeing too
        slow50 = sorted((r for r in valid if r["p50_ratio_vs_gloo"] is not None
                         and r["p50_ratio_vs_gloo"] < 1), key=lambda r: r["p50_ratio_vs_gloo"])
        if slow50:
            print(f"    (medians: dlslime's p50 is above gloo's at {len(slow50)} points: "
                  + ", ".join(f"{point(r)} {r['p50_ratio_vs_gloo']:.2f}x" for r in slow50[:8])
                  + (", ..." if len(slow50) > 8 else "") + ")")
    else:
        print("  never slower than gloo: no point with both numbers -> MISSES")


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else f"{r[k]:.6g}" if isinstance(r[k], float)
                            else r[k]) for k in CSV_COLUMNS})


def plot(path, rows, backends, ops):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)")
        return False
    worlds = sorted({r["world_size"] for r in rows})
    lo, hi = min(r["bytes"] for r in rows), max(r["bytes"] for r in rows)
    # per world size a block of panels, up to 3 a row
    cols = min(3, len(ops))
    block = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(block * len(worlds), cols, squeeze=False,
                             figsize=(4.6 * cols, 3.4 * block * len(worlds)))
    for ax in axes.flat:
        ax.set_visible(False)
    for i, world in enumerate(worlds):
        for j, op in enumerate(ops):
            ax = axes[i * block + j // cols][j % cols]
            ax.set_visible(True)
            for b in backends:
                pts = sorted((r["bytes"], r["gbps"]) for r in rows
                             if r["world_size"] == world and r["op"] == op
                             and r["backend"] == b and r["gbps"])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            markersize=3, label=b)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {world} ranks", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ticks = [t for t in (4, 64, 1 * KiB, 16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB)
                     if lo <= t <= hi]
            if ticks:
                ax.set_xticks(ticks)
                ax.set_xticklabels([human(t).replace(" ", "") for t in ticks], fontsize=8)
            if j % cols == 0:
                ax.set_ylabel("GB/s (bytes / time)")
            ax.set_xlabel("message size", fontsize=8)
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("torch.distributed on one host: bytes / time per op (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {', '.join(human(s) for s in QUICK_SIZES)}, short timings, "
                         f"2 ranks unless --world-sizes: well under 2 minutes")
    ap.add_argument("--world-sizes", help="comma list of world sizes (default 2,4; quick: 2)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list of {','.join(OPS)}")
    ap.add_argument("--backends", default="dlslime,gloo", help="comma list (default dlslime,gloo)")
    ap.add_argument("--max-size", type=parse_size, default=256 * MiB,
                    help="largest size (default 256MiB)")
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                    help="explicit comma list of sizes instead of the sweep")
    ap.add_argument("--time", type=float, default=None,
                    help="timed seconds per point and backend (default 0.15, quick 0.05)")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed slices per point and backend, the backends taking turns "
                         "(default 3)")
    ap.add_argument("--csv", metavar="PATH",
                    help="CSV output (default bench/results/torch_dist_<date-time>.csv)")
    ap.add_argument("--plot", metavar="PATH", help="PNG output (default: the CSV path, .png)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--op-timeout", type=float, default=120,
                    help="seconds one op may take before the backend gives up (default 120)")
    args = ap.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops or any(o not in OPS for o in ops):
        ap.error(f"--ops takes a comma list of {','.join(OPS)}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or len(set(backends)) != len(backends):
        ap.error("--backends takes a comma list of distinct backend names")
    try:
        worlds = ([int(w) for w in args.world_sizes.split(",")] if args.world_sizes
                  else [2] if args.quick else [2, 4])
    except ValueError:
        ap.error("--world-sizes takes a comma list of integers")
    if any(w < 2 for w in worlds):
        ap.error("every world size must be at least 2")
    if args.min_iters < 1 or args.rounds < 1:
        ap.error("--min-iters and --rounds must be at least 1")
    if args.sizes:
        sizes = sorted(set(args.sizes))
    elif args.quick:
        sizes = list(QUICK_SIZES)
    else:
        sizes = [4 << i for i in range(27)]  # 4 B .. 256 MiB
    sizes = [s for s in sizes if s <= args.max_size]
    if not sizes:
        ap.error("no size left under --max-size")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    csv_path = Path(args.csv) if args.csv else REPO / "bench" / "results" / f"torch_dist_{stamp}.csv"
    png_path = Path(args.plot) if args.plot else csv_path.with_suffix(".png")

    cfg = {"ops": ops, "sizes": sizes, "backends": backends,
           "time": args.time if args.time is not None else (0.05 if args.quick else 0.15),
           "min_iters": args.min_iters, "max_iters": 200000, "rounds": args.rounds,
           "op_timeout": args.op_timeout}
    # a generous bound on the whole job, so a hang cannot last forever
    deadline = 120 + len(ops) * len(sizes) * len(backends) * (cfg["time"] + 2) * 4 + \
        sum(s for s in sizes if s >= 16 * MiB) / MiB * 1.0 * len(ops) * len(backends)

    started = time.monotonic()
    rows, errors = [], []
    for world in worlds:
        print(f"# {world} ranks: {len(ops)} ops x {len(sizes)} sizes x {', '.join(backends)}",
              file=sys.stderr, flush=True)
        got, errs = run_job(world, cfg, deadline)
        rows += got
        errors += [f"{world} ranks: {e}" for e in errs]
    add_ratios(rows)

    print_table(rows, backends)
    print("\nus = avg time of one op (max over ranks of each rank's average), p50 = median op "
          "time (max over ranks);\nsend_recv: pairs (0,1), (2,3) ping-pong at once, one op = "
          "half a round trip. GB/s = 10^9 bytes / avg time, bytes = the size column:\n"
          "the tensor for send_recv, all_reduce, broadcast; the whole list of world chunks on one "
          "rank for all_gather (output),\nreduce_scatter (input) and all_to_all (input). "
          "bw b/gloo = b's GB/s / gloo's (= gloo avg / b avg); p50 gloo/b = gloo p50 / b p50.")
    print_targets(rows, backends)
    if rows:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(csv_path, rows)
        print(f"\nwrote {csv_path}")
        if not args.no_plot:
            png_path.parent.mkdir(parents=True, exist_ok=True)
            if plot(png_path, rows, backends, ops):
                print(f"wrote {png_path}")
    print(f"took {time.monotonic() - started:.0f} s")
    failed = [r for r in rows if r["status"].startswith("FAILED")]
    for e in errors:
        print(f"torch_dist_bench.py: FAILED: {e}", file=sys.stderr)
    for r in failed:
        print(f"torch_dist_bench.py: FAILED: {r['backend']} {r['op']} {human(r['bytes'])} on "
              f"{r['world_size']} ranks: {r['status']}", file=sys.stderr)
    return 1 if errors or failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
