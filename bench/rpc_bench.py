"""SlimeRPC next to Ray actors and torch.distributed.rpc: echo of raw bytes.

    python bench/rpc_bench.py                    # 1 KiB .. 64 MiB, every system found
    python bench/rpc_bench.py --quick            # fewer sizes and iterations
    python bench/rpc_bench.py --systems slime,torch_rpc

Each system runs a server in a second process on this host and echoes
bytes back; the client makes sequential round trips (after warm-up) and
times each one.  Systems:

  slime      dlslime_torch.rpc, a @method(raw=True) echo (peers through a
             TCPStore, DLSLIME_TRANSPORT as set, default auto = shm)
  ray        a Ray actor's echo method (ray.init of an isolated local
             runtime; Ray 2.58.0: bench/run_rpc_bench.sh installs it)
  torch_rpc  torch.distributed.rpc.rpc_sync (TensorPipe) of an echo function
  pulsing    when the pulsing package is installed (not on this machine)

Writes bench/results/rpc_<system>.csv (bytes, iters, avg_us, p50_us,
p99_us, MB_s), bench/results/rpc_summary.csv (per size: each system's
avg and the ratio peer avg / slime avg) and rpc_bench.png.  Numbers from
a loaded machine are noisy: compare the ratios of one run.
"""

import argparse
import csv
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")

from dlslime_torch import rpc  # noqa: E402  (after the path: the checkout's package)

KIB, MIB = 1024, 1024 * 1024
SIZES = [KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]


def iters_for(size, quick):
    budget = 20 * MIB if quick else 200 * MIB  # bytes per size, one way
    n = max(5, min(2000 if not quick else 500, budget // size))
    return n, max(2, n // 10)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(call, payload, n, warmup):
    for _ in range(warmup):
        call(payload)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        back = call(payload)
        out.append(time.perf_counter() - t0)
    if len(back) != len(payload):
        raise RuntimeError(f"echo of {len(payload)} bytes came back with {len(back)}")
    return out


def summarize(size, samples):
    us = sorted(s * 1e6 for s in samples)
    avg = statistics.fmean(us)
    return {"bytes": size, "iters": len(us), "avg_us": avg, "p50_us": us[len(us) // 2],
            "p99_us": us[min(len(us) - 1, int(len(us) * 0.99))], "MB_s": 2 * size / avg}


# ---- slime ----
class EchoService:
    rpc_name = "bench.Echo"

    @rpc.method(raw=True)
    def echo(self, data):
        return data


def _slime_server(port):
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", port, is_master=False)
    rpc.init("bench-server", store=store)
    with rpc.Server(EchoService(), threads=1).start():
        store.wait(["bench-stop"])


def run_slime(sizes, quick):
    from torch.distributed import TCPStore
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    proc = mp.get_context("spawn").Process(target=_slime_server, args=(port,))
    proc.start()
    try:
        rpc.init("bench-client", store=store)
        echo = rpc.proxy("bench-server", EchoService, timeout=60).echo
        call = lambda p: echo(p).wait()  # noqa: E731
        rows = []
        for size in sizes:
            payload = os.urandom(size)
            if bytes(call(payload)) != payload:
                raise RuntimeError(f"slime: echo of {size} bytes came back different")
            rows.append(summarize(size, timed(call, payload, *iters_for(size, quick))))
        return rows
    finally:
        store.set("bench-stop", "1")
        proc.join(30)
        rpc.shutdown()


# ---- ray ----
def run_ray(sizes, quick):
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=False,
             _temp_dir=f"/tmp/ray_bench_{os.getpid()}", object_store_memory=512 * MIB)
    try:
        @ray.remote
        class Echo:
            def echo(self, data):
                return data

        actor = Echo.remote()
        call = lambda p: ray.get(actor.echo.remote(p))  # noqa: E731
        rows = []
        for size in sizes:
            payload = os.urandom(size)
            if bytes(call(payload)) != payload:
                raise RuntimeError(f"ray: echo of {size} bytes came back different")
            rows.append(summarize(size, timed(call, payload, *iters_for(size, quick))))
        return rows
    finally:
        ray.shutdown()


# ---- torch.distributed.rpc ----
def _torch_echo(data):
    return data


def _torch_rpc_worker(rank, port, sizes, quick, conn):
    import torch.distributed.rpc as trpc
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = trpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    trpc.init_rpc("client" if rank == 0 else "server", rank=rank, world_size=2, rpc_backend_options=opts)
    rows = []
    if rank == 0:
        call = lambda p: trpc.rpc_sync("server", _torch_echo, args=(p,))  # noqa: E731
        for size in sizes:
            payload = os.urandom(size)
            if call(payload) != payload:
                raise RuntimeError(f"torch_rpc: echo of {size} bytes came back different")
            rows.append(summarize(size, timed(call, payload, *iters_for(size, quick))))
    trpc.shutdown()
    if conn is not None:
        conn.send(rows)


def run_torch_rpc(sizes, quick):
    port = free_port()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    server = ctx.Process(target=_torch_rpc_worker, args=(1, port, sizes, quick, None))
    client = ctx.Process(target=_torch_rpc_worker, args=(0, port, sizes, quick, child))
    server.start()
    client.start()
    if not parent.poll(1800):
        raise RuntimeError("torch_rpc: no result")
    rows = parent.recv()
    client.join(60)
    server.join(60)
    return rows


# ---- pulsing (optional) ----
def run_pulsing(sizes, quick):
    raise RuntimeError("pulsing support is not written: the package is not installed here to test it")


SYSTEMS = {"slime": run_slime, "ray": run_ray, "torch_rpc": run_torch_rpc, "pulsing": run_pulsing}


def available(name):
    if name == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            return "not installed (bench/run_rpc_bench.sh installs ray==2.58.0)"
    if name == "pulsing":
        try:
            import pulsing  # noqa: F401
        except ImportError:
            return "not installed"
    return None


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items() if k in fields})


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, rows in results.items():
        xs = [r["bytes"] for r in rows]
        ax1.plot(xs, [r["avg_us"] for r in rows], marker="o", label=name)
        ax2.plot(xs, [r["MB_s"] for r in rows], marker="o", label=name)
    for ax, title, ylabel in ((ax1, "echo round trip", "avg latency (us)"),
                              (ax2, "echo bandwidth (both ways)", "MB/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload bytes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="slime,ray,torch_rpc,pulsing")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    sizes = QUICK_SIZES if args.quick else SIZES
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for name in args.systems.split(","):
        why = available(name)
        if why:
            print(f"[{name}] skipped: {why}", flush=True)
            continue
        print(f"[{name}] running ...", flush=True)
        try:
            rows = SYSTEMS[name](sizes, args.quick)
        except Exception as exc:  # one system failing must not lose the others
            print(f"[{name}] failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        results[name] = rows
        write_csv(os.path.join(args.out, f"rpc_{name}.csv"), rows,
                  ["bytes", "iters", "avg_us", "p50_us", "p99_us", "MB_s"])
        for r in rows:
            print(f"  {name:9s} {r['bytes']:>10d} B  avg {r['avg_us']:10.1f} us  p50 {r['p50_us']:10.1f}  "
                  f"p99 {r['p99_us']:10.1f}  {r['MB_s']:9.1f} MB/s", flush=True)
    if "slime" not in results:
        print("no slime results: nothing to compare")
        return 1
    summary = []
    peers = [n for n in results if n != "slime"]
    for i, r in enumerate(results["slime"]):
        row = {"bytes": r["bytes"], "slime_avg_us": r["avg_us"], "slime_p50_us": r["p50_us"],
               "slime_p99_us": r["p99_us"]}
        for p in peers:
            pr = results[p][i]
            row[f"{p}_avg_us"] = pr["avg_us"]
            row[f"{p}_vs_slime"] = pr["avg_us"] / r["avg_us"]
        summary.append(row)
    fields = list(summary[0].keys())
    write_csv(os.path.join(args.out, "rpc_summary.csv"), summary, fields)
    print("\nratio = peer avg latency / slime avg latency (higher: slime faster)")
    print("  " + "  ".join(f"{f:>16s}" for f in fields))
    for row in summary:
        print("  " + "  ".join(f"{row[f]:16.2f}" if isinstance(row[f], float) else f"{row[f]:16d}" for f in fields))
    plot(results, os.path.join(args.out, "rpc_bench.png"))
    print(f"\nwrote {args.out}/rpc_*.csv and rpc_bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
