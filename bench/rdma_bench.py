#!/usr/bin/env python3
"""One-sided read / write between torch tensors (dlslime_torch.rdma), next
to send/recv on the "dlslime" backend and memcpy, in one run.

It starts two ranks on this host (multiprocessing spawn, meeting through
a TCPStore on 127.0.0.1).  Rank 1 registers a buffer and stays idle; rank 0
registers its own and, for every size:

  read, write     one rdma.read / rdma.write of the size, then wait: the
                  latency of one operation as the API user sees it;
  read_batch,     one batch_read / batch_write of --batch items (64; fewer
  write_batch     when the size has under that many x 8 bytes) that
                  together move the size (also shown per item);
  send_recv       half a ping-pong round trip of dist.send / dist.recv on a
                  "dlslime" group (both ranks take part), as in
                  torch_dist_bench.py;
  memcpy          dst.copy_(src) of the size inside rank 0 (one thread).

The methods take turns in a few timed slices each (ABC.. CBA.. ABC..), so
a load that comes and goes on a shared machine weighs on all alike.  Each
(method, size) ends with one untimed transfer of patterned bytes checked
end to end on the receiving rank; a wrong byte marks the point FAILED.
Times are medians of single iterations (p50) and averages; GB/s and the
ratios come from the medians (x send/recv: bandwidth over send/recv's,
x memcpy: over memcpy's).  The issue's targets are reported, not asserted.

    python bench/rdma_bench.py --quick
    python bench/rdma_bench.py                          # 8 B .. 256 MiB, shm
    python bench/rdma_bench.py --transport tcp --max-size 64MiB

--memory both (the default on shm) runs everything twice: with ordinary
tensors (CMA) and with rdma.zeros tensors, which the peer maps (memcpy);
the table labels the second "shm+shared".
"""
from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:   # this checkout's dlslime_torch, not an installed one
        sys.path.insert(0, str(path))

from torch_dist_bench import MiB, fmt_gbps, human, parse_size, spawn_ranks  # noqa: E402

METHODS = ("read", "write", "read_batch", "write_batch", "send_recv", "memcpy")
ONE_SIDED = ("read", "write", "read_batch", "write_batch")
QUICK_SIZES = (8, 4096, 65536, 1 * MiB, 16 * MiB, 64 * MiB)
CSV_COLUMNS = ("transport", "memory", "method", "bytes", "items", "iters", "avg_us", "p50_us", "gbps",
               "x_send_recv", "x_memcpy", "status")
WAIT_S = 120


def all_sizes(max_size):
    sizes, s = [], 8
    while s <= max_size:
        sizes.append(s)
        s *= 2
    return sizes


# ------------------------------------------------------------------ ranks

def pattern(nbytes, seed):
    import torch
    return ((torch.arange(nbytes, dtype=torch.int64) * 131 + seed * 7) % 251).to(torch.uint8)


class Rank:
    def __init__(self, rank, store, cfg):
        import torch
        import torch.distributed as dist
        from dlslime_torch import rdma
        self.torch, self.dist, self.rdma = torch, dist, rdma
        self.rank, self.peer, self.cfg = rank, 1 - rank, cfg
        timeout = datetime.timedelta(seconds=WAIT_S)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
        self.slime = dist.new_group(backend="dlslime", timeout=timeout)
        top = max(cfg["sizes"])
        # registered, both ranks; "shared": in blocks shm peers map (memcpy)
        alloc = rdma.zeros if cfg["memory"] == "shared" else torch.zeros
        self.buf = alloc(top, dtype=torch.uint8)
        self.win = rdma.register_window(self.buf)             # over the Gloo group
        self.remote = self.win[self.peer]
        if rank == 0:
            self.src = torch.zeros(top, dtype=torch.uint8)    # memcpy's source

    def bcast(self, values):
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.broadcast(t, 0)
        return t.tolist()

    def step(self, method, size):
        """One iteration (this rank's part)."""
        rdma, r0 = self.rdma, self.rank == 0
        if method == "send_recv":
            g, b = self.slime, self.view
            if r0:
                self.dist.send(b, 1, group=g)
                self.dist.recv(b, 1, group=g)
            else:
                self.dist.recv(b, 0, group=g)
                self.dist.send(b, 0, group=g)
        elif not r0:
            return
        elif method == "read":
            rdma.read(self.view, self.remote).wait(WAIT_S)
        elif method == "write":
            rdma.write(self.view, self.remote).wait(WAIT_S)
        elif method == "read_batch":
            rdma.batch_read(self.items).wait(WAIT_S)
        elif method == "write_batch":
            rdma.batch_write(self.items).wait(WAIT_S)
        elif method == "memcpy":
            self.view.copy_(self.src_view)

    def batch_count(self, size):
        return max(1, min(self.cfg["batch"], size // 8))

    def batch_items(self, size):
        """n equal pieces (n = --batch, fewer under 8 B a piece), each going to the
        slot of another piece on the far side (a fixed shuffle, like
        scattered cache pages), so no two items could be merged into one."""
        n = self.batch_count(size)
        piece = size // n
        order = self.torch.randperm(n, generator=self.torch.Generator().manual_seed(n)).tolist()
        return [(self.buf[i * piece:(i + 1) * piece], self.remote, order[i] * piece)
                for i in range(n)]

    def shuffled(self, sent, size, method):
        """Where a batch's pieces land: piece i of the near side is piece
        order[i] of the far side (the bytes past n whole pieces stay 0)."""
        n = self.batch_count(size)
        piece = size // n
        order = self.torch.randperm(n, generator=self.torch.Generator().manual_seed(n)).tolist()
        out = self.torch.zeros_like(sent)
        for i, j in enumerate(order):
            near, far = slice(i * piece, (i + 1) * piece), slice(j * piece, (j + 1) * piece)
            if method == "read_batch":
                out[near] = sent[far]
            else:
                out[far] = sent[near]
        return out

    def check(self, method, size):
        """One patterned transfer, checked where the bytes land; the error
        text or None, agreed by both ranks."""
        torch, seed, err = self.torch, size % 997 + METHODS.index(method), None
        want = pattern(size, seed)
        # rank 0 may still be timing one-sided writes into rank 1's buffer
        self.dist.barrier()
        self.buf[:size].zero_()
        if method in ("read", "read_batch") and self.rank == 1:
            self.buf[:size].copy_(want)
        elif method == "memcpy" and self.rank == 0:
            self.src[:size].copy_(want)
        elif method in ("write", "write_batch", "send_recv") and self.rank == 0:
            self.buf[:size].copy_(want)
        self.dist.barrier()
        try:
            if method == "send_recv":   # one way only: 0 -> 1
                if self.rank == 0:
                    self.dist.send(self.buf[:size], 1, group=self.slime)
                else:
                    self.dist.recv(self.buf[:size], 0, group=self.slime)
            else:
                self.step(method, size)
        except Exception:
            err = traceback.format_exc()
        self.dist.barrier()
        lands = 0 if method in ("read", "read_batch", "memcpy") else 1
        if method.endswith("_batch") and self.rank == lands:
            want = self.shuffled(want, size, method)
        if err is None and self.rank == lands and not torch.equal(self.buf[:size], want):
            bad = (self.buf[:size] != want).nonzero()[0].item()
            err = f"WRONG: byte {bad} is {self.buf[bad].item()}, expected {want[bad].item()}"
        errs = [None, None]
        self.dist.all_gather_object(errs, err)
        return next((e for e in errs if e), None)

    def point(self, size):
        """Every method at one size: rows keyed by method (rank 0's)."""
        cfg, perf = self.cfg, time.perf_counter
        # made once per size, as the batches' items are: slicing a tensor
        # costs about 1 us, which is torch's time, not the transfer's
        self.view = self.buf[:size]
        self.src_view = self.src[:size] if self.rank == 0 else None
        self.items = self.batch_items(size) if self.rank == 0 else None
        methods = list(cfg["methods"])
        # calibrate on rank 0 (the peer follows send_recv's count)
        iters = {}
        for m in methods:
            for _ in range(2):                        # touch pages, connect, warm up
                self.step(m, size)
            t0 = perf()
            k = 3
            for _ in range(k):
                self.step(m, size)
            per = (perf() - t0) / k
            iters[m] = int(min(cfg["max_iters"], max(3, cfg["time"] / cfg["rounds"] / max(per, 1e-7))))
        iters = dict(zip(methods, (int(v) for v in self.bcast([iters[m] for m in methods]))))
        steps = {m: [] for m in methods}
        for rnd in range(cfg["rounds"]):
            for m in (methods if rnd % 2 == 0 else methods[::-1]):
                self.dist.barrier()
                if self.rank == 1 and m != "send_recv":
                    continue
                stamps = [perf()]
                for _ in range(iters[m]):
                    self.step(m, size)
                    stamps.append(perf())
                steps[m] += [b - a for a, b in zip(stamps, stamps[1:])]
        rows = {}
        for m in methods:
            status = self.check(m, size) or "ok"
            if self.rank != 0:
                continue
            share = 0.5 if m == "send_recv" else 1.0     # one way of a round trip
            p50 = statistics.median(steps[m]) * share
            avg = statistics.fmean(steps[m]) * share
            rows[m] = {"transport": cfg["transport"], "method": m, "bytes": size,
                       "items": self.batch_count(size) if m.endswith("_batch") else 1,
                       "iters": len(steps[m]), "avg_us": avg * 1e6, "p50_us": p50 * 1e6,
                       "gbps": size / p50 / 1e9, "status": status}
        return rows

    def run(self):
        rows = []
        for size in self.cfg["sizes"]:
            got = self.point(size)
            if self.rank == 0:
                rows += [got[m] for m in self.cfg["methods"]]
                sys.stderr.write(progress(size, got) + "\n")
        self.dist.barrier()
        self.win.free()
        self.dist.destroy_process_group(self.slime)
        self.dist.destroy_process_group()
        return rows


def progress(size, got):
    return f"  {human(size)}: " + "  ".join(
        f"{m} {r['p50_us']:.1f} us" if r["status"] == "ok" else f"{m} {r['status'][:60]}"
        for m, r in got.items())


def rank_main(rank, port, cfg, env, conn):
    try:
        import os
        os.environ.update(env)
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=WAIT_S))
        conn.send(("done", Rank(rank, store, cfg).run()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# ------------------------------------------------------------------ parent

def run_pair(cfg, deadline_s):
    env = {"DLSLIME_TRANSPORT": cfg["transport"]} if cfg["transport"] != "auto" else {}
    return spawn_ranks(2, rank_main, (cfg, env), deadline_s)


def add_ratios(rows):
    ref = {(r["transport"], r["method"], r["bytes"]): r for r in rows}
    for r in rows:
        for col, m in (("x_send_recv", "send_recv"), ("x_memcpy", "memcpy")):
            other = ref.get((r["transport"], m, r["bytes"]))
            ok = other and other["status"] == "ok" and r["status"] == "ok"
            r[col] = other["p50_us"] / r["p50_us"] if ok and r["method"] != m else None


def print_table(rows, methods):
    shown = [m for m in methods]
    ratio = [m for m in methods if m in ONE_SIDED]
    heads = ["size"] + [f"{m} us" for m in shown] + [f"{m} GB/s" for m in shown]
    per_item = [m for m in methods if m.endswith("_batch")]
    heads += [f"{m} us/item" for m in per_item]
    heads += [f"{m} x s/r" for m in ratio] + [f"{m} x memcpy" for m in ratio]
    for transport in sorted({r["transport"] for r in rows}):
        by = {}
        for r in rows:
            if r["transport"] == transport:
                by.setdefault(r["bytes"], {})[r["method"]] = r
        lines = []
        for size, got in sorted(by.items()):
            cell = lambda m, f: "-" if m not in got or got[m]["status"] != "ok" else f(got[m])  # noqa: E731
            line = [human(size)]
            line += [cell(m, lambda r: f"{r['p50_us']:.1f}") for m in shown]
            line += [cell(m, lambda r: fmt_gbps(r["gbps"])) for m in shown]
            line += [cell(m, lambda r: f"{r['p50_us'] / r['items']:.2f}") for m in per_item]
            line += [cell(m, lambda r: "-" if r["x_send_recv"] is None else f"{r['x_send_recv']:.2f}")
                     for m in ratio]
            line += [cell(m, lambda r: "-" if r["x_memcpy"] is None else f"{r['x_memcpy']:.2f}")
                     for m in ratio]
            lines.append(line)
        widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(heads)]
        print(f"\ntransport {transport} (p50 of single iterations; x = bandwidth ratio)")
        print("  ".join(h.rjust(w) for h, w in zip(heads, widths)))
        for l in lines:
            print("  ".join(c.rjust(w) for c, w in zip(l, widths)))
        for r in rows:
            if r["transport"] == transport and r["status"] != "ok":
                print(f"  {r['method']} {human(r['bytes'])}: {r['status']}")


def report_targets(rows):
    """The issue's targets: one-sided at least as fast as send/recv at every
    size; on shm, within 60% of memcpy from 16 MiB up."""
    for transport in sorted({r["transport"] for r in rows}):
        mine = [r for r in rows if r["transport"] == transport and r["method"] in ("read", "write")]
        slow = [r for r in mine if r["x_send_recv"] is not None and r["x_send_recv"] < 1.0]
        print(f"\ntarget [{transport}] read/write >= send/recv at every size: "
              + ("met" if not slow and mine else "NOT met at " + ", ".join(
                  f"{r['method']} {human(r['bytes'])} ({r['x_send_recv']:.2f}x)" for r in slow)))
        if transport.split("+")[0] in ("shm", "auto"):
            big = [r for r in mine if r["bytes"] >= 16 * MiB and r["x_memcpy"] is not None]
            low = [r for r in big if r["x_memcpy"] < 0.6]
            print(f"target [{transport}] read/write >= 0.6 x memcpy from 16 MiB: "
                  + ("no size that large" if not big else "met" if not low else
                     "NOT met at " + ", ".join(f"{r['method']} {human(r['bytes'])} "
                                                f"({r['x_memcpy']:.2f}x)" for r in low)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="shm", help="shm, tcp, auto or all (shm and tcp)")
    ap.add_argument("--max-size", type=parse_size, default=256 * MiB)
    ap.add_argument("--sizes", help="comma list (overrides --max-size), e.g. 8,64KiB,16MiB")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--time", type=float, default=0.6, help="timed seconds per method and size")
    ap.add_argument("--rounds", type=int, default=3, help="timed slices per method and size")
    ap.add_argument("--max-iters", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64, help="items per batch_read / batch_write")
    ap.add_argument("--memory", default="both", choices=("heap", "shared", "both"),
                    help="the registered buffers: ordinary tensors (heap), rdma.zeros "
                         "tensors that shm peers map (shared), or one run of each")
    ap.add_argument("--quick", action="store_true", help="6 sizes, shorter slices")
    ap.add_argument("--csv", default=str(REPO / "bench" / "results" / "rdma_bench.csv"))
    args = ap.parse_args()
    if args.sizes:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    elif args.quick:
        sizes = [s for s in QUICK_SIZES if s <= args.max_size]
    else:
        sizes = all_sizes(args.max_size)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown methods {bad}; choose from {METHODS}")
    transports = ("shm", "tcp") if args.transport == "all" else (args.transport,)
    memories = ("heap", "shared") if args.memory == "both" else (args.memory,)
    rows, failed = [], False
    for transport in transports:
        for memory in memories:
            if memory == "shared" and transport == "tcp":
                continue    # ordinary memory there: nothing to compare
            cfg = {"transport": transport, "sizes": sizes, "methods": methods,
                   "time": args.time / (3 if args.quick else 1), "rounds": args.rounds,
                   "max_iters": args.max_iters, "memory": memory, "batch": args.batch}
            label = transport if memory == "heap" else f"{transport}+shared"
            print(f"[{label}] {len(sizes)} sizes x {len(methods)} methods ...", file=sys.stderr)
            got, errors = run_pair(cfg, deadline_s=3600)
            for e in errors:
                print(e, file=sys.stderr)
            failed |= bool(errors) or any(r["status"] != "ok" for r in got)
            for r in got:    # grouped by label in the table and the ratios
                r["transport"], r["memory"] = label, memory
            rows += got
    add_ratios(rows)
    print_table(rows, methods)
    report_targets(rows)
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"\nCSV: {args.csv}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
