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
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing import connection as mp_connection
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this checkout's dlslime_torch, not an installed one
    sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))
import mpi_launch  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OPS = ("send_recv", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")
# the systems dlslime is compared with: Open MPI (through mpi4py), Gloo,
# and torch's do-nothing test backend ("fake": torch's own cost, the floor)
REFERENCES = ("mpi", "gloo", "fake")
DEFAULT_BACKENDS = ("dlslime", "mpi", "gloo", "fake")
# 8 B is there for the latency target
QUICK_SIZES = (4, 8, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
ELEM = 4  # float32
# Every backend's timed buffers, check buffers and a backend's own staging,
# per rank, in units of the point's size: what a point may need at most.
MEM_FACTOR = 8
# failure kinds, ordered: the worst on any rank wins
WRONG, RAISED = 1.0, 2.0
MEM_RESERVE = 1 * GiB
# Each timed slice opens with untimed calls filling this long.  A rank
# that slept in the agreements between slices wakes beside its peer on
# one core, and the scheduler takes milliseconds to part processes that
# are not bound to a core (as MPI's are): a slice's first calls then took
# 4 us where they take 0.5.
SLICE_WARM_S = 0.02
CSV_COLUMNS = ("transport", "world_size", "op", "bytes", "backend", "iters", "avg_us", "p50_us",
               "gbps", "bw_ratio_vs_mpi", "p50_ratio_vs_mpi", "bw_ratio_vs_gloo",
               "p50_ratio_vs_gloo", "bw_ratio_vs_fake", "p50_ratio_vs_fake", "status")


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


class TorchCalls:
    """The ops of one torch process group (a backend under test)."""
    checks = True  # whether check_once can verify its results

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.g = dist, group

    @staticmethod
    def blocks(world, k, fill=0.0):
        """A list of world chunks as torch users pass them: a tensor each."""
        import torch
        return [torch.full((k,), fill) for _ in range(world)]

    def send(self, t, peer):
        self.dist.send(t, peer, group=self.g)

    def recv(self, t, peer):
        self.dist.recv(t, peer, group=self.g)

    def all_reduce(self, t):
        self.dist.all_reduce(t, group=self.g)

    def broadcast(self, t):
        self.dist.broadcast(t, 0, group=self.g)

    def all_gather(self, out, inp):
        self.dist.all_gather(out, inp, group=self.g)

    def reduce_scatter(self, out, inp):
        self.dist.reduce_scatter(out, inp, group=self.g)

    def all_to_all(self, out, inp):
        self.dist.all_to_all(out, inp, group=self.g)

    def barrier(self):
        self.dist.barrier(group=self.g)


class FakeCalls(TorchCalls):
    """torch's do-nothing test backend: the cost of torch alone.  No bytes
    move, so there is nothing to check."""
    checks = False


class MpiCalls:
    """The same ops through mpi4py on the tensors' own memory (numpy views,
    no copies); lists of chunks are views of one flat tensor, as MPI
    users lay them out."""
    checks = True

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI, self.c = MPI, comm

    @staticmethod
    def blocks(world, k, fill=0.0):
        import torch
        return list(torch.full((world * k,), fill).view(world, k))

    @staticmethod
    def flat(blocks):
        """The one tensor a list from blocks() views."""
        base = blocks[0]._base
        if base is None or base.numel() != len(blocks) * blocks[0].numel():
            raise ValueError("MPI chunks must be views of one flat tensor (blocks())")
        return base.numpy()

    def send(self, t, peer):
        self.c.Send(t.numpy(), peer)

    def recv(self, t, peer):
        self.c.Recv(t.numpy(), peer)

    def all_reduce(self, t):
        self.c.Allreduce(self.MPI.IN_PLACE, t.numpy())

    def broadcast(self, t):
        self.c.Bcast(t.numpy(), 0)

    def all_gather(self, out, inp):
        self.c.Allgather(inp.numpy(), self.flat(out))

    def reduce_scatter(self, out, inp):
        self.c.Reduce_scatter_block(self.flat(inp), out.numpy())

    def all_to_all(self, out, inp):
        self.c.Alltoall(self.flat(inp), self.flat(out))

    def barrier(self):
        self.c.Barrier()


class Point:
    """One op at one size on one backend (its calls): run() does one
    iteration on the timed buffers; check_once() one iteration on fresh
    patterned buffers, saying what is wrong (None if nothing)."""

    def __init__(self, op, n, chunk, calls, rank, world):
        import torch
        self.op, self.calls, self.rank = op, calls, rank
        z = torch.zeros  # touched pages, finite sums
        if op == "send_recv":
            self.peer = rank ^ 1 if (rank ^ 1) < world else None
            self.buf = z(n)
        elif op in ("all_reduce", "broadcast"):
            self.buf = z(n)
        elif op == "all_gather":
            self.inp, self.out = z(chunk), calls.blocks(world, chunk)
        elif op == "reduce_scatter":
            self.inp, self.out = calls.blocks(world, chunk), z(chunk)
        elif op == "all_to_all":
            self.inp, self.out = calls.blocks(world, chunk), calls.blocks(world, chunk)
        else:
            raise ValueError(op)

    def run(self):
        op, c = self.op, self.calls
        if op == "send_recv":
            # one iteration = one round trip of the pair (rank, rank ^ 1)
            if self.peer is None:
                return
            if self.rank % 2 == 0:
                c.send(self.buf, self.peer)
                c.recv(self.buf, self.peer)
            else:
                c.recv(self.buf, self.peer)
                c.send(self.buf, self.peer)
        elif op in ("all_reduce", "broadcast"):
            getattr(c, op)(self.buf)
        else:
            getattr(c, op)(self.out, self.inp)

    def free(self):
        for name in ("buf", "inp", "out"):
            self.__dict__.pop(name, None)

    @staticmethod
    def check_once(op, n, c, calls, r, w):
        import torch
        R = 4096.0  # keeps every rank's values apart

        def differs(got, want, what):
            if torch.equal(got, want):
                return None
            bad = (got != want).nonzero()[0].item()
            return (f"{what}: element {bad} is {got.flatten()[bad].item()}, "
                    f"expected {want.flatten()[bad].item()}")

        def patterned(offsets):  # a list of chunks, chunk j = pattern(c, offsets[j])
            blocks = calls.blocks(w, c)
            for b, off in zip(blocks, offsets):
                b.copy_(pattern(c, off))
            return blocks

        if op == "send_recv":
            peer = r ^ 1
            if peer >= w:
                return None
            mine, theirs = pattern(n, R * r), pattern(n, R * peer)
            got = torch.full((n,), -1.0)
            if r % 2 == 0:
                calls.send(mine, peer)
                calls.recv(got, peer)
            else:
                calls.recv(got, peer)
                calls.send(mine, peer)
            return differs(got, theirs, f"received from rank {peer}")
        if op == "all_reduce":
            t = pattern(n, R * r)
            calls.all_reduce(t)
            return differs(t, pattern(n, 0) * w + R * (w * (w - 1) / 2), "sum")
        if op == "broadcast":
            t = pattern(n, 0) if r == 0 else torch.full((n,), -1.0)
            calls.broadcast(t)
            return differs(t, pattern(n, 0), "broadcast from rank 0")
        if op == "all_gather":
            out = calls.blocks(w, c, -1.0)
            calls.all_gather(out, pattern(c, R * r))
            for j in range(w):
                err = differs(out[j], pattern(c, R * j), f"chunk from rank {j}")
                if err:
                    return err
            return None
        if op == "reduce_scatter":
            # rank s puts base + R*s + 7*j into chunk j
            out = torch.full((c,), -1.0)
            calls.reduce_scatter(out, patterned([R * r + 7 * j for j in range(w)]))
            return differs(out, pattern(c, 0) * w + R * (w * (w - 1) / 2) + 7 * w * r,
                           "reduced chunk")
        if op == "all_to_all":
            # rank s sends base + R*s + 16*j to rank j
            out = calls.blocks(w, c, -1.0)
            calls.all_to_all(out, patterned([R * r + 16 * j for j in range(w)]))
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
        self.groups, self.calls = {}, {}
        for b in cfg["backends"]:
            if b == "mpi":
                from mpi4py import MPI
                self.calls[b] = MpiCalls(MPI.COMM_WORLD.Dup())
                continue
            if b == "fake":
                import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers it)
            self.groups[b] = dist.new_group(backend=b, timeout=op_timeout)
            self.calls[b] = (FakeCalls if b == "fake" else TorchCalls)(self.groups[b])
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
        rows = {b: {"world_size": world, "transport": cfg["transport"], "op": op, "bytes": n * ELEM, "backend": b,
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
                points[b] = Point(op, n, chunk, self.calls[b], self.rank, world)
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
        # from the agreed calibration: the same count on every rank
        warm_calls = {b: int(min(cfg["max_iters"], math.ceil(SLICE_WARM_S / max(t, 1e-7))))
                      for b, t in zip(live, slowest)}
        steps, total = {b: [] for b in live}, {b: 0.0 for b in live}
        for k in range(rounds):
            for b in (live if k % 2 == 0 else live[::-1]):
                # this slice's even share of the point's iterations
                count = iters[b] * (k + 1) // rounds - iters[b] * k // rounds
                try:
                    self.calls[b].barrier()
                    run = points[b].run
                    for _ in range(warm_calls[b]):
                        run()
                    stamps = [0.0] * (count + 1)
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
            if not self.calls[b].checks:
                continue
            try:
                wrong = Point.check_once(op, n, chunk, self.calls[b], self.rank, world)
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
                self.log("  " + progress_line(cfg["transport"], self.world, op, size,
                                              [got[b] for b in cfg["backends"]]))
        self.dist.barrier()
        for g in self.groups.values():
            self.dist.destroy_process_group(g)
        self.dist.destroy_process_group()
        return rows


def progress_line(transport, world, op, size, rows):
    parts = [f"[{transport}, {world} ranks] {op} {human(size)}:"]
    for r in rows:
        if r["avg_us"] is None:
            parts.append(f"{r['backend']} {r['status']}")
        else:
            parts.append(f"{r['backend']} {r['avg_us']:.1f} us {fmt_gbps(r['gbps'])} GB/s")
    return "  ".join(parts)


def rank_rows(rank, port, world, cfg):
    """One rank's whole job: rank 0's rows (None on the others)."""
    import torch
    import torch.distributed as dist
    # read when the dlslime group opens its context
    os.environ["DLSLIME_TRANSPORT"] = cfg["transport"]
    # two cores for every rank: one intra-op thread each
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    rows = Worker(rank, world, store, cfg).run()
    return rows if rank == 0 else None


def worker_main(rank, port, world, cfg, conn):
    try:
        conn.send(("done", rank_rows(rank, port, world, cfg)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def mpi_rank_main(port, job_dir):
    """A rank that mpirun started (see mpirun_ranks): Open MPI says which;
    the outcome goes to job_dir/rank<r>.json as ["done", rows] or
    ["error", traceback]."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    job = Path(job_dir)
    try:
        cfg = json.loads((job / "cfg.json").read_text())
        result = ["done", rank_rows(rank, int(port), world, cfg)]
    except BaseException:
        result = ["error", traceback.format_exc()]
    (job / f"rank{rank}.json").write_text(json.dumps(result))
    return 0 if result[0] == "done" else 1


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


def mpirun_ranks(world, cfg, deadline_s):
    """As spawn_ranks, with the ranks started by mpirun, so that each is
    also an MPI process and the "mpi" backend runs in the same processes,
    taking turns with the others.  Every rank is unbound (--bind-to none
    unless cfg["bind"] says otherwise), as under spawn or torchrun."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    with tempfile.TemporaryDirectory(prefix="torch_dist_bench_") as job:
        (Path(job) / "cfg.json").write_text(json.dumps(cfg))
        cmd = [*mpi_launch.mpirun(world, cfg["transport"], cfg["bind"]), sys.executable,
               str(Path(__file__).resolve()), "--mpi-rank", str(store.port), job]
        proc = subprocess.Popen(cmd, env=mpi_launch.env(), start_new_session=True)
        errors = []
        try:
            proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            errors.append("still running after the deadline; killed")
            proc.terminate()  # mpirun takes its ranks down with it
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rows = []
        for rank in range(world):
            out = Path(job) / f"rank{rank}.json"
            if not out.exists():
                errors.append(f"rank {rank}: no result (mpirun exit status {proc.returncode})")
                continue
            kind, value = json.loads(out.read_text())
            if kind == "error":
                errors.append(f"rank {rank} raised:\n{value}")
            elif rank == 0:
                rows = value
    return rows, errors


def run_job(world, cfg, deadline_s):
    """Runs every point on `world` ranks; returns rank 0's rows (and the
    errors of ranks that failed as a whole)."""
    if "mpi" in cfg["backends"]:
        return mpirun_ranks(world, cfg, deadline_s)
    return spawn_ranks(world, worker_main, (world, cfg), deadline_s)


def add_ratios(rows):
    """For every reference R measured: bw_ratio_vs_R = the backend's GB/s
    over R's at the same point (= R's avg_us / the backend's: same bytes);
    p50_ratio_vs_R = R's p50 / the backend's.  Above 1: faster than R."""
    def key(r):
        return r["transport"], r["world_size"], r["op"], r["bytes"]

    for ref in REFERENCES:
        base = {key(r): r for r in rows if r["backend"] == ref}
        for r in rows:
            g = base.get(key(r))
            ok = g is not None and r["avg_us"] and g["avg_us"]
            r[f"bw_ratio_vs_{ref}"] = g["avg_us"] / r["avg_us"] if ok else None
            r[f"p50_ratio_vs_{ref}"] = (g["p50_us"] / r["p50_us"]
                                        if ok and r["p50_us"] and g["p50_us"] else None)


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_gbps(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v >= 0.1 else f"{v:.3g}"


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def print_table(rows, backends):
    refs = [b for b in REFERENCES if b in backends]
    ours = [b for b in backends if b not in REFERENCES]
    heads = ["op", "size"]
    for b in backends:
        heads += [f"{b} us", f"{b} p50"] + ([f"{b} GB/s"] if b in ours else [])
    for b in ours:
        for ref in refs:
            # the floor reads best as how many times torch's own cost we take
            heads += ([f"{b}/{ref}"] if ref == "fake" else
                      [f"{ref}/{b}", f"p50 {ref}/{b}"])
    for transport, world in sorted({(r["transport"], r["world_size"]) for r in rows}):
        by_point = {}
        for r in rows:
            if (r["transport"], r["world_size"]) == (transport, world):
                by_point.setdefault((r["op"], r["bytes"]), {})[r["backend"]] = r
        lines, notes, ops = [], [], []
        for (op, nbytes), got in by_point.items():
            cells = [op, human(nbytes)]
            for b in backends:
                r = got.get(b)
                if r is None or r["avg_us"] is None:
                    cells += ["-"] * (3 if b in ours else 2)
                    if r is not None:
                        notes.append(f"{b} {op} {human(nbytes)}: {r['status']}")
                else:
                    cells += [fmt(r["avg_us"]), fmt(r["p50_us"])]
                    cells += [fmt_gbps(r["gbps"])] if b in ours else []
            for b in ours:
                r = got.get(b) or {}
                for ref in refs:
                    bw, p50 = r.get(f"bw_ratio_vs_{ref}"), r.get(f"p50_ratio_vs_{ref}")
                    cells += ([fmt_ratio(bw and 1 / bw)] if ref == "fake" else
                              [fmt_ratio(bw), fmt_ratio(p50)])
            lines.append(cells)
            ops.append(op)
        widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(heads)]
        show = lambda cells: print("  ".join(  # noqa: E731
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
        print(f"\n== {transport}, world size {world} ==")
        show(heads)
        print("  ".join("-" * w for w in widths))
        for i, cells in enumerate(lines):
            if i and ops[i] != ops[i - 1]:
                print()
            show(cells)
        for n in notes:
            print(f"  note: {n}")


def point_name(r):
    return f"{r['op']} {human(r['bytes'])} on {r['world_size']} ranks over {r['transport']}"


def verdict(ok):
    return "meets" if ok else "MISSES"


def target_worst(rows, ref, what, bound):
    """One 'at least `bound` x ref' target over rows: the worst point, the
    points below the bound; a point without a number misses it."""
    if not rows:
        print(f"  {what}: not measured")
        return
    key = f"bw_ratio_vs_{ref}"
    valid = [r for r in rows if r[key] is not None]
    missing = len(rows) - len(valid)
    if not valid:
        print(f"  {what}: no point with both numbers -> MISSES")
        return
    worst = min(valid, key=lambda r: r[key])
    below = sorted((r for r in valid if r[key] < bound), key=lambda r: r[key])
    print(f"  {what}: worst {worst[key]:.2f}x at {point_name(worst)}; {len(below)} of "
          f"{len(rows)} points below{f', {missing} without a number' if missing else ''} "
          f"-> {verdict(not below and not missing)}")
    for r in below[:10]:
        print(f"    below: {point_name(r)}: {r[key]:.2f}x (p50 {fmt_ratio(r[f'p50_ratio_vs_{ref}'])})")
    if len(below) > 10:
        print(f"    ... and {len(below) - 10} more")


def print_targets(rows, backends):
    """Issue 17's targets, reported (never asserted: this is a benchmark);
    ratios of avg times measured side by side."""
    print("\ntargets (reported, not asserted; ratios of avg times measured side by side):")
    ours = [r for r in rows if r["backend"] == "dlslime" and not r["status"].startswith("skipped")]
    if not ours:
        print("  none: they are about dlslime; run it")
        return
    if "mpi" in backends:
        for transport in sorted({r["transport"] for r in ours}):
            sel = [r for r in ours if r["transport"] == transport and r["world_size"] == 2
                   and r["op"] in ("send_recv", "all_reduce") and r["bytes"] >= 64 * KiB]
            target_worst(sel, "mpi", f"send_recv and all_reduce >= 1.0x MPI from 64 KiB, 2 ranks, "
                                     f"{transport}", 1.0)
        target_worst([r for r in ours if r["bytes"] >= 64 * KiB], "mpi",
                     "every op >= 1.0x MPI from 64 KiB (all world sizes)", 1.0)
    if "fake" in backends:
        for op in ("send_recv", "all_reduce"):
            sel = [r for r in ours if r["world_size"] == 2 and r["op"] == op and r["bytes"] == 8]
            target_worst(sel, "fake", f"{op} 8 B within 1.5x of torch's floor (fake/dlslime >= "
                                      f"0.67), 2 ranks", 1 / 1.5)
    if "gloo" in backends:
        target_worst(ours, "gloo", "never slower than gloo (every point run)", 1.0)


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
    jobs = sorted({(r["transport"], r["world_size"]) for r in rows})
    lo, hi = min(r["bytes"] for r in rows), max(r["bytes"] for r in rows)
    # per world size a block of panels, up to 3 a row
    cols = min(3, len(ops))
    block = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(block * len(jobs), cols, squeeze=False,
                             figsize=(4.6 * cols, 3.4 * block * len(jobs)))
    for ax in axes.flat:
        ax.set_visible(False)
    for i, (transport, world) in enumerate(jobs):
        for j, op in enumerate(ops):
            ax = axes[i * block + j // cols][j % cols]
            ax.set_visible(True)
            for b in backends:
                pts = sorted((r["bytes"], r["gbps"]) for r in rows
                             if (r["transport"], r["world_size"]) == (transport, world)
                             and r["op"] == op
                             and r["backend"] == b and r["gbps"])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            markersize=3, label=b)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {world} ranks, {transport}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ticks = [t for t in (4, 64, 1 * KiB, 16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB,
                                 256 * MiB) if lo <= t <= hi]
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


def parse_args(argv):
    """The command line: (args, ops, backends, transports, worlds, sizes)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {', '.join(human(s) for s in QUICK_SIZES)}, short timings, "
                         f"2 ranks unless --world-sizes: well under 2 minutes")
    ap.add_argument("--world-sizes", help="comma list of world sizes (default 2,4; quick: 2)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list of {','.join(OPS)}")
    ap.add_argument("--backends", default=None,
                    help=f"comma list of torch backends and mpi (default {','.join(DEFAULT_BACKENDS)}; "
                         f"mpi is dropped with a note where Open MPI or mpi4py is missing)")
    ap.add_argument("--transport", default="shm",
                    help="comma list of shm,tcp: dlslime's transport (DLSLIME_TRANSPORT) and "
                         "MPI's (vader or tcp on loopback); Gloo is always tcp (default shm)")
    ap.add_argument("--bind", choices=("none", "core"), default="none",
                    help="mpirun's --bind-to for every rank, all backends alike (default none, "
                         "as torchrun and spawn leave them)")
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
    backends = [b.strip() for b in (args.backends or ",".join(DEFAULT_BACKENDS)).split(",")
                if b.strip()]
    if not backends or len(set(backends)) != len(backends):
        ap.error("--backends takes a comma list of distinct backend names")
    transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    if not transports or any(t not in mpi_launch.TRANSPORT_MCA for t in transports):
        ap.error("--transport takes a comma list of shm,tcp")
    why = "mpi" in backends and mpi_launch.missing()
    if why and args.backends:
        ap.error(f"mpi: {why}")
    if why:
        print(f"mpi: not measured: {why}", file=sys.stderr)
        backends.remove("mpi")
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
    return args, ops, backends, transports, worlds, sizes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--mpi-rank"]:  # a rank of mpirun_ranks' job
        return mpi_rank_main(*argv[1:])
    args, ops, backends, transports, worlds, sizes = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    csv_path = Path(args.csv) if args.csv else REPO / "bench" / "results" / f"torch_dist_{stamp}.csv"
    png_path = Path(args.plot) if args.plot else csv_path.with_suffix(".png")

    cfg = {"ops": ops, "sizes": sizes, "backends": backends,
           "time": args.time if args.time is not None else (0.05 if args.quick else 0.15),
           "min_iters": args.min_iters, "max_iters": 200000, "rounds": args.rounds,
           "op_timeout": args.op_timeout, "bind": args.bind}
    # a generous bound on the whole job, so a hang cannot last forever
    deadline = 120 + len(ops) * len(sizes) * len(backends) * (cfg["time"] + 2) * 4 + \
        sum(s for s in sizes if s >= 16 * MiB) / MiB * 1.0 * len(ops) * len(backends)

    started = time.monotonic()
    rows, errors = [], []
    for transport in transports:
        for world in worlds:
            print(f"# {transport}, {world} ranks: {len(ops)} ops x {len(sizes)} sizes x "
                  f"{', '.join(backends)}", file=sys.stderr, flush=True)
            got, errs = run_job(world, {**cfg, "transport": transport}, deadline)
            rows += got
            errors += [f"{transport}, {world} ranks: {e}" for e in errs]
    add_ratios(rows)

    print_table(rows, backends)
    print("\nus = avg time of one op (max over ranks of each rank's average), p50 = median op "
          "time (max over ranks);\nsend_recv: pairs (0,1), (2,3) ping-pong at once, one op = "
          "half a round trip. GB/s = 10^9 bytes / avg time, bytes = the size column:\n"
          "the tensor for send_recv, all_reduce, broadcast; the whole list of world chunks on one "
          "rank for all_gather (output),\nreduce_scatter (input) and all_to_all (input). "
          "R/b = R's avg / b's (= b's GB/s over R's; above 1: b is faster); p50 R/b the same of "
          "the medians;\nb/fake = b's avg over torch's do-nothing backend's: how many times "
          "torch's own cost the op takes. mpi = Open MPI through mpi4py\n(ob1; vader on shm, "
          "tcp on loopback), lists of chunks laid out flat as MPI takes them.")
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
        print(f"torch_dist_bench.py: FAILED: {r['backend']} {point_name(r)}: {r['status']}",
              file=sys.stderr)
    return 1 if errors or failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
