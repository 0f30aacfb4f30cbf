"""torch's own distributed test suite against "dlslime", next to Gloo.

    python tests/torch_suite/run_suite.py [--world-sizes 2 3] [--all] [NAME...]

For each world size it runs the installed torch's
testing/_internal/distributed/distributed_test.py (suite_child.py, one
process per backend) over the same tests by name: selection.SELECTION,
or every test that applies to a CPU backend with --all, or the NAMEs
given.  Gloo runs first; dlslime then runs with the gates Gloo passes
lifted (gates.gloo_like).  The summary gives, per backend and world
size, how many tests passed, failed and were skipped, and the tests torch
runs on Gloo only, with why.  Exit status 1 when a test passes on Gloo
and fails on dlslime, unless selection.EXPECTED_FAILURES names it (with
its reason); 2 when a run itself broke.  Each run's full output is in
--log-dir.
"""

import argparse
import collections
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gates import GLOO_BY_NAME  # noqa: E402  (imports no torch)
from selection import EXPECTED_FAILURES, SELECTION  # noqa: E402

RUN_TIMEOUT_S = 600       # one backend at one world size, every test
TEST_TIMEOUT_S = 60       # one test: torch's harness kills its ranks then


class RunBroke(RuntimeError):
    pass


def run_one(backend, size, names, log_dir, gloo_result=None):
    """Runs names on backend at size in a fresh process; returns its
    result (see suite_child.py)."""
    tag = f"{backend}-{size}"
    out = os.path.join(log_dir, f"{tag}.json")
    log = os.path.join(log_dir, f"{tag}.log")
    temp_dir = tempfile.mkdtemp(prefix=f"{tag}-", dir=log_dir)
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(size), TEMP_DIR=temp_dir,
               INIT_METHOD="env://", PYTORCH_PRINT_REPRO_ON_FAILURE="0",
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(TEST_TIMEOUT_S))
    cmd = [sys.executable, os.path.join(HERE, "suite_child.py"), "--out", out]
    if gloo_result is not None:
        cmd += ["--gloo-skips", gloo_result]
    start = time.monotonic()
    with open(log, "w") as f:
        # A session of its own, so a run past its time goes with its ranks.
        proc = subprocess.Popen(cmd + list(names), stdout=f, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            code = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RunBroke(f"{tag}: no result within {RUN_TIMEOUT_S} s (log: {log})")
    if code != 0 or not os.path.exists(out):
        raise RunBroke(f"{tag}: the run exited with {code} (log: {log})")
    with open(out) as f:
        result = json.load(f)
    result["seconds"] = time.monotonic() - start
    return result, out


def last_line(detail):
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:240] if lines else ""


def compare(size, gloo, dls, findings):
    """Sorts each test that passes on Gloo and not on dlslime at this world
    size into findings["regressions"] (lines) or findings["expected"]
    (name: sizes); an expected failure that passes goes to "fixed"."""
    for name, (outcome, detail) in sorted(dls["outcomes"].items()):
        if outcome == "passed" and name in EXPECTED_FAILURES:
            findings["fixed"].setdefault(name, []).append(size)
        if outcome == "passed" or gloo["outcomes"].get(name, [""])[0] != "passed":
            continue
        if outcome == "failed" and name in EXPECTED_FAILURES:
            findings["expected"].setdefault(name, []).append(size)
        else:
            findings["regressions"].append(
                f"{name} at {size} ranks: passes on Gloo, {outcome} on dlslime: "
                f"{last_line(detail)}")


def counts_line(backend, size, result):
    c = collections.Counter(outcome for outcome, _ in result["outcomes"].values())
    return (f"  {backend:8s} {size} ranks: {c['passed']:3d} passed, {c['failed']:3d} failed, "
            f"{c['skipped']:3d} skipped  ({result['seconds']:.0f} s)")


def applicable(gloo_skip_map, gpu_tests):
    """Every test Gloo runs on a CPU-only machine (before world-size
    skips), for --all."""
    return [name for name, reason in sorted(gloo_skip_map.items())
            if reason is None and name not in gpu_tests]


def _print_findings(findings):
    for name, sizes in sorted(findings["expected"].items()):
        print(f"  expected failure ({', '.join(map(str, sizes))} ranks): {name}: "
              f"{EXPECTED_FAILURES[name]}")
    for name, sizes in sorted(findings["fixed"].items()):
        print(f"  note: {name} passes now ({', '.join(map(str, sizes))} ranks): "
              f"drop it from selection.EXPECTED_FAILURES")
    for line in findings["regressions"]:
        print(f"  REGRESSION: {line}")


def summarize(results, lifted, findings):
    print("\n==== torch distributed suite: summary ====")
    for (backend, size), result in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(counts_line(backend, size, result))
    print("  gated to Gloo by name (torch refuses any other backend; not run on dlslime):")
    for name, reason in sorted(GLOO_BY_NAME.items()):
        print(f"    {name}: {reason}")
    if lifted:
        print(f"  gates lifted for dlslime as Gloo-like (gates.gloo_like), "
              f"{len(lifted)} tests, by gate:")
        for reason, count in collections.Counter(lifted.values()).most_common():
            print(f"    {count:3d} x '{reason}'")
    _print_findings(findings)
    total = sum(r["seconds"] for r in results.values())
    count = len(findings["regressions"])
    print(f"  {'FAILED' if count else 'OK'}: {count} regression(s) against Gloo; "
          f"{total:.0f} s in all")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--all", action="store_true",
                        help="every test that applies to a CPU backend, not SELECTION")
    parser.add_argument("--log-dir", help="where each run's output goes (default: a new temp dir)")
    parser.add_argument("names", nargs="*", help="run these tests instead")
    args = parser.parse_args()
    if importlib.util.find_spec("expecttest") is None:
        print("torch distributed suite: torch's test helpers need the expecttest "
              "package (pip install expecttest; scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    log_dir = os.path.abspath(args.log_dir or tempfile.mkdtemp(prefix="torch-suite-"))
    os.makedirs(log_dir, exist_ok=True)
    print(f"torch distributed suite: logs in {log_dir}", flush=True)

    results, lifted = {}, {}
    findings = {"regressions": [], "expected": {}, "fixed": {}}
    try:
        for size in args.world_sizes:
            names = list(args.names or SELECTION)
            if args.all:   # a listing run of Gloo tells which tests apply
                listing, _ = run_one("gloo", size, [], log_dir)
                names = applicable(listing["skips"], set(listing["gpu"]))
            gloo, gloo_path = run_one("gloo", size, names, log_dir)
            dls_names = [n for n in names if n not in GLOO_BY_NAME]
            dls, _ = run_one("dlslime", size, dls_names, log_dir, gloo_result=gloo_path)
            results[("gloo", size)], results[("dlslime", size)] = gloo, dls
            lifted.update({n: r for n, r in dls["lifted"].items() if n in dls_names})
            compare(size, gloo, dls, findings)
            print(counts_line("gloo", size, gloo), flush=True)
            print(counts_line("dlslime", size, dls), flush=True)
    except RunBroke as exc:
        print(f"torch distributed suite: {exc}", file=sys.stderr)
        return 2
    summarize(results, lifted, findings)
    if findings["regressions"]:
        return 1
    if args.log_dir is None:   # nothing to look at: keep no temp files
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
