#!/usr/bin/env python3
"""Point-to-point latency and bandwidth of libdlslime next to this machine's
physical references and Open MPI, measured in the same run.

For every (transport, op, size) it reports the time of one operation as the
user sees it and the bandwidth that implies, then the same figure for
single-thread memcpy, for a plain blocking TCP socket over loopback and for
Open MPI (send/recv and the collectives, bench/mpi_bench.c under mpirun, where
Open MPI is installed), and our figure as a ratio of each.  The measuring
is done by the C programs bench/p2p_bench.c and bench/mpi_bench.c (see
their headers for what each time means); this script builds them if
needed, runs them (libdlslime and MPI taking turns, a few rounds each),
prints a table and writes a CSV.

    python bench/p2p_bench.py --quick --csv /tmp/p2p.csv
    python bench/p2p_bench.py --transport shm --ops sendrecv --max-size 64MiB
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import mpi_launch  # noqa: E402

COLL_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
OPS = ("sendrecv", "read", "write", *COLL_OPS)
SOCKET_OPS = ("sendrecv", "read", "write")  # the socket has no collectives
MPI_OPS = ("sendrecv", *COLL_OPS)
TRANSPORTS = ("shm", "tcp")
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
QUICK_SIZES = (8, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
CSV_COLUMNS = (
    "transport", "op", "bytes", "iters", "avg_us", "p50_us", "p99_us", "gbps",
    "memcpy_gbps", "vs_memcpy", "socket_avg_us", "socket_gbps", "vs_socket",
    "mpi_avg_us", "mpi_p50_us", "vs_mpi", "vs_mpi_p50",
)


@dataclass
class Row:
    bench: str
    transport: str
    op: str
    bytes: int
    iters: int
    avg_us: float
    p50_us: float
    p99_us: float
    gbps: float


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 256M)")
    unit = {"": 1, "k": KiB, "m": MiB, "g": GiB}[m.group(2).lower()]
    value = int(m.group(1)) * unit
    if value < 1:
        raise argparse.ArgumentTypeError("a size must be at least 1 byte")
    return value


def human(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def choose_sizes(args) -> list[int]:
    if args.sizes:
        sizes = sorted(set(args.sizes))
    elif args.quick:
        sizes = list(QUICK_SIZES)
    else:
        sizes, s = [], 8
        while s <= 256 * MiB:
            sizes.append(s)
            s *= 2
    return [s for s in sizes if s <= args.max_size]


def build_binary() -> Path:
    build = REPO / "build"
    cache = build / "CMakeCache.txt"
    # setup.py configures build/ without the benchmarks; switch them on
    # there, keeping its other options
    if not (build / "build.ninja").exists() or "DLSLIME_BENCH:BOOL=ON" not in cache.read_text():
        run_checked(["cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DDLSLIME_BENCH=ON"],
                    "configuring")
    run_checked(["ninja", "-C", str(build), "p2p_bench"], "building p2p_bench")
    return build / "p2p_bench"


def build_mpi_binary() -> Path | None:
    """bench/mpi_bench.c built with mpicc (None, said plainly, where Open
    MPI is missing).  Not a CMake target: the core never needs MPI."""
    why = mpi_launch.missing(tools=("mpicc", "mpirun"), modules=())
    if why:
        print(f"p2p_bench.py: mpi: not measured: {why}", file=sys.stderr)
        return None
    src, out = REPO / "bench" / "mpi_bench.c", REPO / "build" / "mpi_bench"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(exist_ok=True)
        run_checked(["mpicc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
                     "-o", str(out), str(src)], "building mpi_bench")
    return out


def run_checked(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"p2p_bench.py: {what} failed: {' '.join(cmd)}")


def run_bench(launch: list[str], argv: list[str], timing: list[str], deadline_s: int) -> tuple[list[Row], str | None]:
    """Runs one part (launch: the program, after mpirun's words for MPI);
    returns the rows it printed and an error text if it failed.

    Rows printed before a failure passed their own correctness check, so
    they are kept."""
    cmd = [*launch, *argv, *timing, "--deadline", str(deadline_s)]
    print("# " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        # stderr passes through: the program reports progress and errors there
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=deadline_s + 30,
                              env=mpi_launch.env())
        rc = done.returncode
        out = done.stdout
        error = (None if rc == 0 else f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        error = f"timed out after {deadline_s + 30} s"
    rows = []
    for line in out.splitlines():
        f = line.split(",")
        if f[0] != "row" or len(f) != 10:
            continue
        row = Row(f[1], f[2], f[3], int(f[4]), int(f[5]),
                  float(f[6]), float(f[7]), float(f[8]), float(f[9]))
        if row.bench != "memcpy" and row.avg_us > 0:
            # exact, not the printed rounding; memcpy's comes from its best run
            row.gbps = row.bytes / (row.avg_us * 1e3)
        rows.append(row)
    if error:
        error = f"{' '.join(argv[:3])}: {error}"
    return rows, error


def merge_rounds(rows: list[Row]) -> list[Row]:
    """One row per point of libdlslime and MPI from their rounds: avg over
    all the rounds' iterations, p50 the median of the rounds' p50s, p99
    the largest.  memcpy's rows stay as they are (joined() takes the best)."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.bench, r.transport, r.op, r.bytes), []).append(r)
    out = []
    for (bench, transport, op, nbytes), rs in groups.items():
        if bench == "memcpy" or len(rs) == 1:
            out += rs
            continue
        iters = sum(r.iters for r in rs)
        avg = sum(r.avg_us * r.iters for r in rs) / iters
        p50s = sorted(r.p50_us for r in rs)
        mid = len(p50s) // 2
        p50 = p50s[mid] if len(p50s) % 2 else (p50s[mid - 1] + p50s[mid]) / 2
        out.append(Row(bench, transport, op, nbytes, iters, avg, p50,
                       max(r.p99_us for r in rs), nbytes / (avg * 1e3) if avg > 0 else 0.0))
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def joined(rows: list[Row]) -> list[dict]:
    memcpy = {}
    for r in rows:  # measured before and after: the best pass is the machine's
        if r.bench == "memcpy" and (r.bytes not in memcpy or r.gbps > memcpy[r.bytes].gbps):
            memcpy[r.bytes] = r
    sock = {(r.op, r.bytes): r for r in rows if r.bench == "socket"}
    mpi = {(r.transport, r.op, r.bytes): r for r in rows if r.bench == "mpi"}
    out = []
    for r in rows:
        if r.bench != "slime":
            continue
        m, s = memcpy.get(r.bytes), sock.get((r.op, r.bytes))
        mp = mpi.get((r.transport, r.op, r.bytes))
        out.append({
            "transport": r.transport, "op": r.op, "bytes": r.bytes, "iters": r.iters,
            "avg_us": r.avg_us, "p50_us": r.p50_us, "p99_us": r.p99_us, "gbps": r.gbps,
            "memcpy_gbps": m.gbps if m else None,
            "vs_memcpy": ratio(r.gbps, m.gbps if m else None),
            "socket_avg_us": s.avg_us if s else None,
            "socket_gbps": s.gbps if s else None,
            # same bytes, so the bandwidth ratio is the inverse time ratio
            "vs_socket": ratio(s.avg_us if s else None, r.avg_us),
            "mpi_avg_us": mp.avg_us if mp else None,
            "mpi_p50_us": mp.p50_us if mp else None,
            "vs_mpi": ratio(mp.avg_us if mp else None, r.avg_us),
            "vs_mpi_p50": ratio(mp.p50_us if mp else None, r.p50_us),
        })
    return out


def fmt(v, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_gbps(v) -> str:
    """Three significant digits: 8-byte rates are tiny but still compared."""
    if v is None:
        return "-"
    return f"{v:.3f}" if v >= 0.1 else f"{v:.3g}"


def print_table(table: list[dict]) -> None:
    heads = ("transport", "op", "size", "iters", "avg_us", "p50_us", "p99_us", "GB/s",
             "memcpy GB/s", "vs_memcpy", "socket us", "socket GB/s", "vs_socket",
             "mpi us", "mpi p50", "vs_mpi", "vs_mpi p50")
    lines = [[d["transport"], d["op"], human(d["bytes"]), str(d["iters"]),
              fmt(d["avg_us"], 2), fmt(d["p50_us"], 2), fmt(d["p99_us"], 2),
              fmt_gbps(d["gbps"]), fmt(d["memcpy_gbps"], 2), fmt_gbps(d["vs_memcpy"]),
              fmt(d["socket_avg_us"], 2), fmt_gbps(d["socket_gbps"]), fmt_gbps(d["vs_socket"]),
              fmt(d["mpi_avg_us"], 2), fmt(d["mpi_p50_us"], 2), fmt_gbps(d["vs_mpi"]),
              fmt_gbps(d["vs_mpi_p50"])]
             for d in table]
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(heads)]
    left = {0, 1}
    def show(cells):
        print("  ".join(c.ljust(w) if i in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(cells, widths))))
    show(heads)
    print("  ".join("-" * w for w in widths))
    prev = None
    for d, cells in zip(table, lines):
        if prev is not None and (d["transport"], d["op"]) != prev:
            print()
        prev = (d["transport"], d["op"])
        show(cells)


def print_targets(table: list[dict]) -> None:
    """The issue's targets, reported (never asserted: this is a benchmark)."""
    print("\ntargets (reported, not asserted):")
    lines = 0
    def verdict(ok):
        nonlocal lines
        lines += 1
        return "meets" if ok else "MISSES"
    big = [d for d in table if d["transport"] == "shm" and d["bytes"] >= 16 * MiB
           and d["vs_memcpy"] is not None]
    for op in ("sendrecv", "read", "write", "allreduce"):  # the bandwidth target's ops
        rows = [d for d in big if d["op"] == op]
        if rows:
            worst = min(rows, key=lambda d: d["vs_memcpy"])
            print(f"  shm {op:8s} bandwidth >= 50% of memcpy from 16 MiB: worst "
                  f"{worst['vs_memcpy']:.0%} at {human(worst['bytes'])} -> "
                  f"{verdict(worst['vs_memcpy'] >= 0.5)}")
    for d in table:
        if d["transport"] == "shm" and d["op"] == "sendrecv" and d["bytes"] == 8:
            rtt, rtt50 = 2 * d["avg_us"], 2 * d["p50_us"]
            print(f"  shm 8-byte round trip < 5 us: avg {rtt:.2f} us, p50 {rtt50:.2f} us -> "
                  f"{verdict(rtt < 5)}")
    for op in OPS:
        rows = [d for d in table if d["transport"] == "tcp" and d["op"] == op
                and d["vs_socket"] is not None]
        if rows:
            worst = min(rows, key=lambda d: d["vs_socket"])
            print(f"  tcp {op:8s} >= 90% of the plain socket: worst {worst['vs_socket']:.0%} "
                  f"at {human(worst['bytes'])} -> {verdict(worst['vs_socket'] >= 0.9)}")
    for transport in TRANSPORTS:
        # tcp from 64 KiB, where the issue sets it; shm at every size
        lo = 64 * KiB if transport == "tcp" else 0
        for op in MPI_OPS:
            rows = [d for d in table if d["transport"] == transport and d["op"] == op
                    and d["bytes"] >= lo and d["vs_mpi"] is not None]
            if rows:
                worst = min(rows, key=lambda d: d["vs_mpi"])
                print(f"  {transport} {op:9s} >= 1.0x MPI{' from 64 KiB' if lo else ''}: worst "
                      f"{worst['vs_mpi']:.2f}x at {human(worst['bytes'])}, "
                      f"{sum(d['vs_mpi'] < 1 for d in rows)} of {len(rows)} sizes below -> "
                      f"{verdict(worst['vs_mpi'] >= 1)}")
    for d in table:
        if d["transport"] == "shm" and d["op"] == "allreduce" and d["bytes"] == 8:
            print(f"  shm 8-byte allreduce < 1 us: avg {d['avg_us']:.2f} us, p50 "
                  f"{d['p50_us']:.2f} us -> {verdict(d['avg_us'] < 1)}")
    if not lines:
        print("  none: the rows they need were not measured in this run")


def write_csv(path: str, table: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for d in table:
            w.writerow({k: ("" if d[k] is None else
                            f"{d[k]:.6g}" if isinstance(d[k], float) else d[k])
                        for k in CSV_COLUMNS})


def plan_parts(binary, mpi_binary, args, ops, transports, sizes, seconds):
    """(launch, arguments, seconds per size) of every run, in order: memcpy,
    the socket, then per transport libdlslime and MPI taking turns
    (ABBA...) for --rounds rounds, and memcpy again (the load on a small
    shared machine drifts)."""
    size_arg = ",".join(map(str, sizes))
    memcpy = ([str(binary)], ["memcpy", "--sizes", size_arg], seconds)
    parts = [memcpy]
    sock_ops = [o for o in ops if o in SOCKET_OPS]
    if sock_ops:
        parts.append(([str(binary)], ["socket", "--ops", ",".join(sock_ops), "--sizes", size_arg],
                      seconds))
    mpi_ops = [o for o in ops if o in MPI_OPS]
    share = seconds / args.rounds
    for t in transports:
        slime = ([str(binary)], ["slime", "--transport", t, "--ops", ",".join(ops),
                                 "--sizes", size_arg], share)
        turns = [slime]
        if mpi_binary and mpi_ops and t in mpi_launch.TRANSPORT_MCA:
            turns.append(([*mpi_launch.mpirun(2, t, args.mpi_bind), str(mpi_binary)],
                          ["--transport", t, "--ops", ",".join(mpi_ops), "--sizes", size_arg],
                          share))
        for k in range(args.rounds):
            parts += turns if k % 2 == 0 else turns[::-1]
    parts.append(memcpy)
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # verbs only when asked: it needs an RDMA device (soft-RoCE numbers,
    # from tests/verbs/run_in_vm.sh, are no performance claim)
    ap.add_argument("--transport", choices=(*TRANSPORTS, "verbs", "all"), default="all")
    ap.add_argument("--ops", default=",".join(OPS),
                    help=f"comma list of {','.join(OPS)} (default: all)")
    ap.add_argument("--max-size", type=parse_size, default=256 * MiB,
                    help="largest size, e.g. 64MiB (default 256MiB; --quick stops at 64MiB)")
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                    help="explicit comma list of sizes instead of the default sweep")
    ap.add_argument("--quick", action="store_true",
                    help="a few sizes and short timings: the whole run takes under a minute")
    ap.add_argument("--time", type=float, default=None,
                    help="seconds of timed iterations per size (default 0.2, quick 0.05)")
    ap.add_argument("--csv", metavar="PATH", help="write the table as CSV here")
    ap.add_argument("--binary", type=Path, help="p2p_bench binary (default: build it in build/)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="libdlslime and MPI take turns this many times per transport, each "
                         "with --time / rounds per size (default 2)")
    ap.add_argument("--mpi-bind", choices=("core", "none"), default="core",
                    help="mpirun's --bind-to for MPI's pair (default core: mpirun's own default "
                         "for 2 ranks, as MPI users run it)")
    ap.add_argument("--no-mpi", action="store_true", help="leave MPI out")
    args = ap.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        ap.error(f"--ops takes a comma list of {','.join(OPS)}")
    transports = list(TRANSPORTS) if args.transport == "all" else [args.transport]
    sizes = choose_sizes(args)
    if not sizes:
        ap.error("no size left under --max-size")

    binary = args.binary or build_binary()
    if not os.access(binary, os.X_OK):
        ap.error(f"{binary} is not an executable")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    mpi_binary = None if args.no_mpi else build_mpi_binary()
    seconds = args.time if args.time is not None else (0.05 if args.quick else 0.2)
    min_iters = ["--min-iters", "3" if args.quick else "5"]
    deadline = 300 if args.quick else 1800
    rows, errors = [], []
    for launch, part, time_s in plan_parts(binary, mpi_binary, args, ops, transports, sizes,
                                           seconds):
        got, err = run_bench(launch, part, ["--time", str(time_s), *min_iters], deadline)
        rows += got
        if err:
            errors.append(err)

    table = joined(merge_rounds(rows))
    table.sort(key=lambda d: (transports.index(d["transport"]), ops.index(d["op"]), d["bytes"]))
    print()
    print_table(table)
    print("\none-way times: sendrecv = half a ping-pong round trip; read/write = one "
          "operation posted and completed by the initiator; the collectives = one call of 2 "
          "ranks as the initiator sees it (float32 SUM; broadcast from the initiator; the size "
          "is allgather's output and reduce_scatter's input).\nmpi = Open MPI (ob1; vader on shm, tcp on loopback; "
          f"--bind-to {args.mpi_bind}), taking turns with libdlslime ({args.rounds} rounds); "
          "vs_mpi = MPI's avg time / ours (above 1: faster than MPI).\nGB/s = 10^9 bytes/s from avg_us; "
          "memcpy GB/s is single-thread, best of a few runs before and after; socket = plain blocking TCP on "
          "127.0.0.1, same op shape.")
    print_targets(table)
    if args.csv:
        write_csv(args.csv, table)
        print(f"\nwrote {args.csv}")
    for e in errors:
        print(f"p2p_bench.py: FAILED: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
