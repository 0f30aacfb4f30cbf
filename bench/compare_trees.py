"""Old head against new head: the quick benchmarks of two checkouts, side by side.

    python bench/compare_trees.py --old /path/to/old/checkout --new . --rounds 3

Before a speed change (or a change that must not change speed) lands, build
both checkouts in place (`python setup.py build_ext --inplace`, which also
builds the C core in `build/`), then run this.  Each round runs
`bench/p2p_bench.py --quick` (the C core) and `bench/torch_dist_bench.py
--quick` (through torch) of each checkout, with the checkouts taking turns
and the first one alternating from round to round, so that the machine's
drift hits both alike.  Each checkout's own scripts and build are used
(they import the dlslime_torch beside them).

The table gives, per point, the median over rounds of each checkout's
average time, new/old (above 1: the new head is slower), and the noise:
the largest max/min spread of one checkout's own rounds at that point.
A point is flagged when new/old lies outside that spread.
"""
import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KiB, MiB = 1 << 10, 1 << 20


def human(n):
    for unit, div in (("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def run_p2p(tree, out):
    binary = tree / "build" / "p2p_bench"
    cmd = [sys.executable, str(tree / "bench" / "p2p_bench.py"), "--quick", "--csv", str(out)]
    if binary.exists():
        cmd += ["--binary", str(binary)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {("p2p", r["transport"], r["op"], int(r["bytes"])): float(r["avg_us"])
                for r in csv.DictReader(f)}


def run_torch(tree, out):
    cmd = [sys.executable, str(tree / "bench" / "torch_dist_bench.py"), "--quick", "--no-plot",
           "--csv", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {("torch", r["backend"], r["op"], int(r["bytes"])): float(r["avg_us"])
                for r in csv.DictReader(f) if r["status"] == "ok" and r["world_size"] == "2"}


def collect(trees, rounds, benches, workdir):
    """{tree: {point: [avg_us per round]}}, the trees taking turns."""
    times = {t: {} for t in trees}
    for i in range(rounds):
        order = trees if i % 2 == 0 else trees[::-1]
        for bench in benches:
            for t in order:
                label = "old" if t == trees[0] else "new"
                print(f"# round {i + 1}/{rounds}: {bench} on {label} ({t})", file=sys.stderr, flush=True)
                run = run_p2p if bench == "p2p" else run_torch
                for point, us in run(t, workdir / f"{bench}_{label}_{i}.csv").items():
                    times[t].setdefault(point, []).append(us)
    return times


def spread(xs):
    return max(xs) / min(xs) if min(xs) > 0 else float("inf")


def report(old, new):
    print("| bench | transport/backend | op | size | old us | new us | new/old | noise |")
    print("|---|---|---|---|---|---|---|---|")
    flagged = 0
    for point in sorted(set(old) & set(new)):
        o, n = statistics.median(old[point]), statistics.median(new[point])
        noise = max(spread(old[point]), spread(new[point]))
        ratio = n / o if o > 0 else float("inf")
        mark = ""
        if ratio > noise:
            mark, flagged = " **slower**", flagged + 1
        elif ratio < 1 / noise:
            mark = " faster"
        bench, who, op, size = point
        print(f"| {bench} | {who} | {op} | {human(size)} | {o:.1f} | {n:.1f} | {ratio:.2f}{mark} | {noise:.2f} |")
    print(f"\n{flagged} point(s) slower than their own round-to-round noise")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the old checkout, built in place")
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the new checkout, built in place (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--benches", default="p2p,torch", help="comma list of p2p, torch")
    args = ap.parse_args(argv)
    benches = [b for b in args.benches.split(",") if b]
    if args.rounds < 1 or not benches or any(b not in ("p2p", "torch") for b in benches):
        ap.error("--rounds must be at least 1 and --benches a comma list of p2p, torch")
    trees = [args.old.resolve(), args.new.resolve()]
    with tempfile.TemporaryDirectory() as d:
        times = collect(trees, args.rounds, benches, Path(d))
    report(times[trees[0]], times[trees[1]])


if __name__ == "__main__":
    main()
