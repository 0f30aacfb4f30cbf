"""SlimeRPC next to Ray actors, torch.distributed.rpc and Pulsing, doing
what users do, all in one run.

    python bench/rpc_bench.py                    # every system found, full sizes
    python bench/rpc_bench.py --quick            # fewer sizes, shorter runs
    python bench/rpc_bench.py --systems slime,torch_rpc --no-netns

Each system serves in processes of its own on this host and calls from
a client process of its own, and only during its turn: its processes
(Ray's daemons among them) start for the turn and stop after it, so
that no system's idle processes share the cores with another's calls,
as a user of one does not run the others beside it.  The systems take
turns in rounds (--rounds, the order rotating; each round a share of
every point's iterations), so that the machine's drift weighs on all
alike; a point's figure is the median of its rounds' p50s (calls/s:
of their rates).  The points:

  raw      echo of a bytes payload (slime: @method(raw=True))
  tensor   a method taking and returning a float32 tensor (slime: @method)
  obj      a small call with Python arguments: a dict of a few fields
  threads-N, async-N   calls per second of `obj` with N callers in flight
           against one server (N threads; N asyncio tasks)
  cold     slime's first 4 MiB tensor call after connect, against warm
           calls after the same pause and back to back, with the
           machine's own copy of those bytes beside it (see COLD_BYTES)
  pair     slime's tensor and raw echoes of the same bytes, the calls
           alternating: the codec's cost over the bytes

Systems: slime (dlslime_torch.rpc, shm on one host), ray (2.58.0 actors,
an isolated local runtime), torch_rpc (rpc_sync / rpc_async over
TensorPipe), pulsing (0.1.2 ActorRef.ask with a pickled payload; its
typed proxy fails across processes in 0.1.2, and its API is asyncio: its
latencies are measured inside its event loop, its threads-N callers hand
their calls to that loop).  bench/run_rpc_bench.sh installs ray and
pulsing (pinned).

Then, as root with iproute2, the raw/tensor/obj latencies once more with
the server in one network namespace and the client in another, joined by
a veth pair (10.214.0.1/30 and 10.214.0.2/30), so every byte crosses tcp
(slime, torch_rpc, pulsing; Ray would need a two-node cluster).  Skipped
with the reason otherwise.

Writes bench/results/rpc_bench.csv (system, where, kind, bytes or
callers, rounds, iters, p50_us, avg_us, calls_s) and rpc_summary.csv (per point:
slime's number and each peer's ratio to it: peer latency / slime latency,
or slime calls/s / peer calls/s; above 1, slime is ahead), and
rpc_bench.png.  Numbers from a loaded host are noisy: compare the ratios
of one run.
"""

import argparse
import asyncio
import csv
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")

from dlslime_torch import rpc  # noqa: E402  (after the path: the checkout's package)

KIB, MIB = 1024, 1024 * 1024
SIZES = [KIB, 4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB]
CALLERS = [1, 4, 16]
OBJ = {"id": 7, "name": "layer.3.weight", "shape": [4096, 1024], "lr": 3e-4, "tags": ["a", "b"], "ok": True}
NS = ("slimebench0", "slimebench1")
NS_ADDRS = ("10.214.0.1", "10.214.0.2")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# The driver's own tensor work (making payloads, checking replies) is
# numpy's, on one thread: torch's parallel ops (torch.equal on 1 MiB)
# leave OpenMP threads spinning for milliseconds, which on 2 cores took
# the core of the calls timed next (the first 10-20 took 1-5 ms, down
# to 60 us), and --quick's 10 iterations at 1 MiB measured that spin.
# numpy rather than torch.set_num_threads(1): the peers' clients share
# this process, and their own threads are left as they are.
def payload(kind, size):
    if kind == "raw":
        return os.urandom(size)
    if kind == "tensor":
        import numpy as np
        import torch
        return torch.from_numpy(np.random.default_rng().standard_normal(size // 4, dtype=np.float32))
    return dict(OBJ)


def same(kind, got, sent):
    if kind == "tensor":
        import numpy as np
        return np.array_equal(got.numpy(), sent.numpy())
    return bytes(got) == sent if kind == "raw" else got == sent


# ---------------------------------------------------------------- servers
# Each runs as `python rpc_bench.py --serve SYSTEM --addr HOST:PORT` (in a
# namespace: under `ip netns exec`) until stdin closes.

class BenchService:
    rpc_name = "bench.Service"

    @rpc.method(raw=True)
    def raw(self, data):
        return data

    @rpc.method
    def tensor(self, t):
        return t

    @rpc.method
    def obj(self, d):
        return d


def _serve_slime(host, port):
    from torch.distributed import TCPStore
    store = TCPStore(host, port, is_master=True, wait_for_workers=False)
    rpc.init("bench-server", store=store)
    with rpc.Server(BenchService(), threads=2).start():
        sys.stdin.read()
    rpc.shutdown()


def _torch_echo(x):
    return x


def _serve_torch_rpc(host, port):
    import torch.distributed.rpc as trpc
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    # rank 0 hosts the rendezvous store at MASTER_ADDR: the server's address
    trpc.init_rpc("server", rank=0, world_size=2,
                  rpc_backend_options=trpc.TensorPipeRpcBackendOptions(rpc_timeout=300))
    trpc.shutdown()   # waits for the client's shutdown


def _serve_pulsing(host, port):
    import pulsing as pul

    class Echo(pul.Actor):
        async def receive(self, msg):
            return msg[1]

    async def main():
        await pul.init(addr=f"{host}:{port}")
        await pul.spawn(Echo(), name="bench_echo", public=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await pul.shutdown()

    asyncio.run(main())


SERVERS = {"slime": _serve_slime, "torch_rpc": _serve_torch_rpc, "pulsing": _serve_pulsing}


def start_server(system, host, port, netns=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", system, "--addr", f"{host}:{port}"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
        env.update(TP_SOCKET_IFNAME="sbv0", GLOO_SOCKET_IFNAME="sbv0")
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env)


# ---------------------------------------------------------------- clients

class Client:
    """One system seen from the calling process: call (sync), acall
    (a coroutine), arun (runs a coroutine where the system's calls may
    be awaited), close."""

    server = None

    def acall(self, kind, x):
        raise NotImplementedError

    def arun(self, coro):
        return asyncio.run(coro)

    def latencies(self, kind, x, n, budget_s):
        out = []
        end = time.monotonic() + budget_s
        for _ in range(n):
            t0 = time.perf_counter()
            back = self.call(kind, x)
            out.append(time.perf_counter() - t0)
            if time.monotonic() > end:
                break
        if not same(kind, back, x):
            raise RuntimeError(f"{kind}: the reply differs from the request")
        return out

    def close(self):
        if self.server is not None:
            self.server.stdin.close()
            self.server.wait(60)


class SlimeClient(Client):
    def __init__(self, host, netns=None):
        from torch.distributed import TCPStore
        port = free_port() if netns is None else 29611
        self.server = start_server("slime", host, port, netns)
        store = TCPStore(host, port, is_master=False, timeout=__import__("datetime").timedelta(seconds=60))
        rpc.init("bench-client", store=store)
        t0 = time.perf_counter()
        self.proxy = rpc.proxy("bench-server", BenchService, timeout=120)
        self.connect_s = time.perf_counter() - t0
        self.methods = {k: getattr(self.proxy, k) for k in ("raw", "tensor", "obj")}

    def cold(self, pause_s):
        """Times in microseconds: [the first 4 MiB tensor call after
        connect], warm calls after the same pause, warm calls back to
        back."""
        x = payload("tensor", COLD_BYTES)

        def timed():
            t0 = time.perf_counter()
            back = self.call("tensor", x)
            return (time.perf_counter() - t0) * 1e6, back

        time.sleep(pause_s)
        first, back = timed()
        if not same("tensor", back, x):
            raise RuntimeError("cold: the reply differs from the request")
        del back
        paused, tight = paused_and_tight(lambda: timed()[0], pause_s)
        return [first], paused, tight

    def call(self, kind, x):
        return self.methods[kind](x).wait()

    async def acall(self, kind, x):
        return await self.methods[kind](x)

    def close(self):
        self.proxy.close()
        rpc.shutdown()
        super().close()


class RayClient(Client):
    def __init__(self, host, netns=None):
        import ray
        self.ray = ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=f"/tmp/ray_bench_{os.getpid()}", object_store_memory=512 * MIB)
        class Actor:   # defined here: Ray ships a local class by value
            def raw(self, data):
                return data

            def tensor(self, t):
                return t

            def obj(self, d):
                return d

        self.actor = ray.remote(Actor).remote()
        ray.get(self.actor.obj.remote(OBJ))

    def call(self, kind, x):
        return self.ray.get(getattr(self.actor, kind).remote(x))

    async def acall(self, kind, x):
        return await getattr(self.actor, kind).remote(x)

    def close(self):
        self.ray.shutdown()


class TorchRpcClient(Client):
    def __init__(self, host, netns=None):
        import torch.distributed.rpc as trpc
        self.trpc = trpc
        port = free_port() if netns is None else 29612
        self.server = start_server("torch_rpc", host, port, netns)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
        trpc.init_rpc("client", rank=1, world_size=2,
                      rpc_backend_options=trpc.TensorPipeRpcBackendOptions(rpc_timeout=300))

    def call(self, kind, x):
        return self.trpc.rpc_sync("server", _torch_echo, args=(x,))

    async def acall(self, kind, x):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        fut = self.trpc.rpc_async("server", _torch_echo, args=(x,))
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(done.set_result, f))
        return (await done).wait()

    def close(self):
        self.trpc.shutdown()
        super().close()


def _pulsing_reply(reply):
    """A Python actor's reply reaches another process as a Message whose
    payload is the pickle of what receive() returned (0.1.2)."""
    import pickle
    payload = getattr(reply, "payload", None)
    return reply if payload is None else pickle.loads(bytes(payload))


class PulsingClient(Client):
    """Pulsing's API is asyncio: its calls run on one event loop thread."""

    def __init__(self, host, netns=None):
        import pulsing as pul
        self.pul = pul
        port = free_port(host) if netns is None else 29613
        self.server = start_server("pulsing", host, port, netns)
        mine = NS_ADDRS[1] if netns else host
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.arun(pul.init(addr=f"{mine}:{free_port(mine)}", seeds=[f"{host}:{port}"]))
        self.ref = self.arun(pul.resolve("bench_echo", timeout=60))

    def arun(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    def call(self, kind, x):
        return self.arun(self.acall(kind, x))

    async def acall(self, kind, x):
        return _pulsing_reply(await self.ref.ask((kind, x)))

    def latencies(self, kind, x, n, budget_s):
        async def run():
            out, end = [], time.monotonic() + budget_s
            for _ in range(n):
                t0 = time.perf_counter()
                back = await self.acall(kind, x)
                out.append(time.perf_counter() - t0)
                if time.monotonic() > end:
                    break
            if not same(kind, back, x):
                raise RuntimeError(f"{kind}: the reply differs from the request")
            return out
        return self.arun(run())

    def close(self):
        try:
            self.arun(self.pul.shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            super().close()


CLIENTS = {"slime": SlimeClient, "ray": RayClient, "torch_rpc": TorchRpcClient, "pulsing": PulsingClient}


def available(name):
    modules = {"ray": "ray", "pulsing": "pulsing"}
    if name in modules:
        try:
            __import__(modules[name])
        except ImportError:
            return "not installed (bench/run_rpc_bench.sh installs it)"
    return None


# ---------------------------------------------------------------- measuring

def iters_for(size, quick):
    budget = (20 if quick else 200) * MIB  # bytes per point, one way
    return max(5, min(300 if quick else 2000, budget // max(size, 1)))


def latency_row(name, where, kind, size, client, quick, rounds):
    """One round's share of a point: its iterations and time budget
    divided among the rounds, the warm-up not (a turn's processes are
    new)."""
    x = payload(kind, size)
    n = max(5, iters_for(size, quick) // rounds)
    client.latencies(kind, x, max(2, n // 10), 5)           # warm-up: at least n/10 calls
    client.latencies(kind, x, 10 ** 6, 0.5)                 # and half a second
    us = sorted(s * 1e6 for s in client.latencies(kind, x, n, (3 if quick else 10) / rounds))
    return {"system": name, "where": where, "kind": kind, "bytes": size, "iters": len(us),
            "p50_us": us[len(us) // 2], "avg_us": statistics.fmean(us)}


def pair_rows(name, size, client, quick, rounds):
    """Tensor against raw of the same bytes, the calls alternating (so the
    machine's drift weighs on both alike): one round's share, p50 each."""
    xs = {kind: payload(kind, size) for kind in PAIR_KINDS}
    n = max(5, iters_for(size, quick) // rounds)
    for kind in PAIR_KINDS:
        client.latencies(kind, xs[kind], max(2, n // 10), 5)
    times = {kind: [] for kind in PAIR_KINDS}
    end = time.monotonic() + (3 if quick else 10) / rounds
    while len(times["raw"]) < n and time.monotonic() < end:
        for kind in PAIR_KINDS:
            t0 = time.perf_counter()
            client.call(kind, xs[kind])
            times[kind].append(time.perf_counter() - t0)
    for kind in PAIR_KINDS:   # one more reply each: what the calls did
        if not same(kind, client.call(kind, xs[kind]), xs[kind]):
            raise RuntimeError(f"pair {kind}: the reply differs from the request")
    return [{"system": name, "where": "local", "kind": f"pair-{kind}", "bytes": size, "iters": len(ts),
             "p50_us": statistics.median(ts) * 1e6, "avg_us": statistics.fmean(ts) * 1e6}
            for kind, ts in times.items()]


PAIR_KINDS = ("raw", "tensor")


def threads_rate(client, n, seconds):
    counts = [0] * n
    stop = time.monotonic() + seconds

    def worker(i):
        while time.monotonic() < stop:
            client.call("obj", OBJ)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


async def async_rate(client, n, seconds):
    counts = [0] * n
    stop = time.monotonic() + seconds

    async def worker(i):
        while time.monotonic() < stop:
            await client.acall("obj", OBJ)
            counts[i] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(n)))
    return sum(counts) / (time.monotonic() - t0)


def rate_row(name, mode, n, client, quick, rounds):
    seconds = max(0.5, (1.0 if quick else 3.0) / rounds)
    if mode == "threads":
        rate = threads_rate(client, n, seconds)
    else:
        rate = client.arun(async_rate(client, n, seconds))
    return {"system": name, "where": "local", "kind": f"{mode}-{n}", "bytes": n, "calls_s": rate}


# The cold point: the first call after connect against warm calls made
# under the same conditions.  On the 2-core VM these numbers were first
# taken on, buffers that sat idle for 10 ms or more were mostly gone from
# the cache: a 4 MiB copy back to back took ~190 us, the same copy after
# a 10-500 ms sleep 500-1100 us.  A call after connect follows such a
# pause, so it is compared with warm calls that follow the same pause
# (what is left is the connection's own first-call cost); the
# back-to-back p50 is shown beside it, and the machine's own copy of the
# same bytes both ways, in the same process.
COLD_BYTES = 4 * MIB
COLD_CALLS = 9
COLD_PAUSE_S = 0.05


def copy_times(pause_s):
    """The machine's own 4 MiB copy, times in microseconds: after a
    pause, back to back."""
    import numpy as np
    src = np.random.default_rng().standard_normal(COLD_BYTES // 4, dtype=np.float32)
    dst = np.zeros_like(src)

    def timed():
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return (time.perf_counter() - t0) * 1e6
    return paused_and_tight(timed, pause_s)


def paused_and_tight(timed, pause_s):
    """COLD_CALLS runs of timed() back to back, then COLD_CALLS each after
    a pause: (the paused times, the back-to-back ones)."""
    tight = [timed() for _ in range(COLD_CALLS)]
    paused = []
    for _ in range(COLD_CALLS):
        time.sleep(pause_s)
        paused.append(timed())
    return paused, tight


def cold_rows(name, client):
    def row(system, kind, times):
        return {"system": system, "where": "local", "kind": kind, "bytes": COLD_BYTES, "rounds": 1,
                "iters": len(times), "p50_us": statistics.median(times), "avg_us": statistics.fmean(times)}
    first, paused, tight = client.cold(COLD_PAUSE_S)
    copy_paused, copy_tight = copy_times(COLD_PAUSE_S)
    return [row(name, "first-call", first), row(name, "warm-paused", paused), row(name, "warm-tight", tight),
            row("memcpy", "warm-paused", copy_paused), row("memcpy", "warm-tight", copy_tight)]


COLD_KINDS = ("first-call", "warm-paused", "warm-tight")
# points of slime alone (and the machine's copy): no peer's ratio
OWN_KINDS = COLD_KINDS + ("pair-raw", "pair-tensor")


WORK = {"latency": lambda name, c, where, kind, size, quick, rounds:
        latency_row(name, where, kind, size, c, quick, rounds),
        "rate": lambda name, c, mode, n, quick, rounds: rate_row(name, mode, n, c, quick, rounds),
        "cold": lambda name, c: cold_rows(name, c),
        "pair": lambda name, c, size, quick, rounds: pair_rows(name, size, c, quick, rounds)}


def _client_process(name, host, netns, conn):
    """One system's client, in a process of its own (so that no system's
    threads take the GIL from another's calls): runs the WORK it is sent."""
    try:
        client = CLIENTS[name](host, netns)
    except Exception as exc:
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", None))
    try:
        for what, args in iter(conn.recv, None):
            try:
                conn.send(("ok", WORK[what](name, client, *args)))
            except Exception as exc:
                conn.send(("err", f"{type(exc).__name__}: {exc}"))
    finally:
        client.close()


class Remote:
    """The calling side of a _client_process."""

    def __init__(self, name, host, netns):
        import multiprocessing as mp
        self.conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(target=_client_process, args=(name, host, netns, child))
        self.proc.start()
        self._answer(600)

    def _answer(self, timeout_s):
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"no answer within {timeout_s} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def run(self, what, *args):
        self.conn.send((what, args))
        return self._answer(1800)

    def close(self):
        if self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(120)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def merge(rounds_rows):
    """One row per point from the rows of every round: the median of the
    rounds' p50s and calls/s, the mean of their averages, the sum of
    their iterations."""
    points = {}
    for r in rounds_rows:
        points.setdefault((r["system"], r["where"], r["kind"], r["bytes"]), []).append(r)
    rows = []
    for (system, where, kind, size), rs in points.items():
        row = {"system": system, "where": where, "kind": kind, "bytes": size, "rounds": len(rs)}
        if "calls_s" in rs[0]:
            row["calls_s"] = statistics.median(r["calls_s"] for r in rs)
        else:
            row.update(iters=sum(r["iters"] for r in rs), p50_us=statistics.median(r["p50_us"] for r in rs),
                       avg_us=statistics.fmean(r["avg_us"] for r in rs))
        rows.append(row)
    return rows


def show(row):
    shown = f"p50 {row['p50_us']:10.1f} us" if "p50_us" in row else f"{row['calls_s']:10.0f} calls/s"
    print(f"  {row['where']:6s} {row['kind']:10s} {row['bytes']:>9d}  {row['system']:9s} {shown}", flush=True)


def turn(name, host, netns, where, quick, rounds, rates, cold):
    """One system's turn: starts its processes (client and server), runs
    every point, stops them.  Its rows; raises if it cannot start or a
    point fails."""
    client = Remote(name, host, netns)
    try:
        todo = [("latency", (where, kind, size, quick, rounds))
                for kind in ("raw", "tensor") for size in (QUICK_SIZES if quick else SIZES)]
        todo.append(("latency", (where, "obj", 0, quick, rounds)))
        if rates:
            todo += [("rate", (mode, n, quick, rounds)) for mode in ("threads", "async") for n in CALLERS]
        if name == "slime" and where == "local":
            todo += [("pair", (size, quick, rounds)) for size in (QUICK_SIZES if quick else SIZES)]
        if cold and name == "slime":
            todo.insert(0, ("cold", ()))
        rows = []
        for what, args in todo:
            try:
                got = client.run(what, *args)
            except Exception as exc:
                exc.rows = rows  # the points measured before this one count
                raise
            got = got if isinstance(got, list) else [got]
            rows += got
            for row in got:
                show(row)
        return rows
    finally:
        client.close()


def in_turns(names, host, where, quick, rounds, netns=None, rates=True, cold=True):
    """Every point of every system, each system with only its own
    processes alive during its turn (a user of one does not run the
    others' daemons beside it), the systems taking turns in rounds, the
    order rotating, so that the machine's drift weighs on all alike.  A
    system that fails is dropped from its later points and rounds, not
    the others; what it measured before the failure stays."""
    names = list(names)
    for name in list(names):
        why = available(name)
        if why:
            print(f"[{name}] skipped: {why}", flush=True)
            names.remove(name)
    rows = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        print(f"round {r + 1}/{rounds}: {', '.join(order)}; load average {os.getloadavg()[0]:.2f}", flush=True)
        for name in order:
            try:
                rows += turn(name, host, netns, where, quick, rounds, rates, cold=cold and r == 0)
            except Exception as exc:
                rows += getattr(exc, "rows", [])
                print(f"[{name}] failed: {type(exc).__name__}: {exc}; dropped from the later points and "
                      f"rounds (its points so far are kept)", flush=True)
                names.remove(name)
    rows = merge(rows)
    print_cold(rows)
    print_pairs(rows)
    return rows


def print_pairs(rows):
    got = {(r["kind"], r["bytes"]): r["p50_us"] for r in rows if r["system"] == "slime" and "p50_us" in r}
    sizes = sorted(size for kind, size in got if kind == "pair-tensor")
    if sizes:
        print("  slime, tensor against raw of the same bytes, calls alternating (p50 tensor / p50 raw): "
              + ", ".join(f"{size // KIB} KiB {got[('pair-tensor', size)] / got[('pair-raw', size)]:.2f}x"
                          for size in sizes), flush=True)


def print_cold(rows):
    got = {(r["system"], r["kind"]): r["p50_us"] for r in rows if r["kind"] in COLD_KINDS}
    if ("slime", "first-call") not in got:
        return
    first, paused, tight = (got[("slime", k)] for k in COLD_KINDS)
    copy_paused, copy_tight = got[("memcpy", "warm-paused")], got[("memcpy", "warm-tight")]
    pause = f"{COLD_PAUSE_S * 1e3:.0f} ms"
    print(f"  slime, {COLD_BYTES // MIB} MiB tensor: the first call after connect {first:.0f} us; warm calls after "
          f"a {pause} pause p50 {paused:.0f} us (first {first / paused:.2f}x), back to back p50 {tight:.0f} us "
          f"(first {first / tight:.2f}x)", flush=True)
    print(f"  the machine's own {COLD_BYTES // MIB} MiB copy: after a {pause} pause p50 {copy_paused:.0f} us, back "
          f"to back {copy_tight:.0f} us ({copy_paused / copy_tight:.2f}x)", flush=True)


# ---------------------------------------------------------------- two namespaces

def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def netns_down():
    for ns in NS:
        _ip("netns", "del", ns)


def netns_up():
    """Makes the two namespaces and their veth pair; the reason it cannot
    be done, or None."""
    import shutil
    if os.geteuid() != 0:
        return "not root (network namespaces need it)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    netns_down()
    steps = [("netns", "add", NS[0]), ("netns", "add", NS[1]),
             ("link", "add", "sbv0", "netns", NS[0], "type", "veth", "peer", "name", "sbv1", "netns", NS[1])]
    for i in (0, 1):
        steps += [("-n", NS[i], "addr", "add", f"{NS_ADDRS[i]}/30", "dev", f"sbv{i}"),
                  ("-n", NS[i], "link", "set", "lo", "up"), ("-n", NS[i], "link", "set", f"sbv{i}", "up")]
    for step in steps:
        r = _ip(*step)
        if r.returncode:
            netns_down()
            return f"ip {' '.join(step)}: {r.stderr.strip()}"
    return None


def run_netns(names, quick, rounds, out_dir):
    names = [n for n in names if n != "ray" and not available(n)]
    why = netns_up()
    if why:
        print(f"[netns] skipped: {why}", flush=True)
        return []
    rows_file = os.path.join(out_dir, "rpc_netns_rows.csv")
    cmd = ["ip", "netns", "exec", NS[1], sys.executable, os.path.abspath(__file__), "--netns-client",
           "--systems", ",".join(names), "--rows-out", rows_file, "--rounds", str(rounds)]
    cmd += ["--quick"] if quick else []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"[netns] server in {NS[0]} ({NS_ADDRS[0]}), client in {NS[1]} ({NS_ADDRS[1]}); "
          "Ray is not measured here (it would need a two-node cluster)", flush=True)
    try:
        r = subprocess.run(cmd, env=env, timeout=3600)
        if r.returncode or not os.path.exists(rows_file):
            print(f"[netns] the client in {NS[1]} failed ({r.returncode})", flush=True)
            return []
        with open(rows_file) as f:
            rows = list(csv.DictReader(f))
        os.unlink(rows_file)
        for row in rows:
            row["bytes"], row["rounds"] = int(row["bytes"]), int(row["rounds"])
            for k in ("p50_us", "avg_us"):
                row[k] = float(row[k])
        return rows
    finally:
        netns_down()


def netns_client(names, quick, rounds, rows_file):
    os.environ["TP_SOCKET_IFNAME"] = "sbv1"
    os.environ["GLOO_SOCKET_IFNAME"] = "sbv1"
    rows = in_turns(names, NS_ADDRS[0], "netns", quick, rounds, netns=NS[0], rates=False, cold=False)
    write_csv(rows_file, rows, ["system", "where", "kind", "bytes", "rounds", "iters", "p50_us", "avg_us"])


# ---------------------------------------------------------------- reporting

def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()})


def summarize(rows):
    """Per point: slime's number and each peer's ratio to it (above 1:
    slime ahead)."""
    points = {}
    for r in rows:
        points.setdefault((r["where"], r["kind"], r["bytes"]), {})[r["system"]] = r
    peers = sorted({r["system"] for r in rows if r["kind"] not in OWN_KINDS} - {"slime"})
    summary = []
    for (where, kind, size), by in points.items():
        s = by.get("slime")
        if s is None or kind in OWN_KINDS:
            continue
        rate = "calls_s" in s
        key = "calls_s" if rate else "p50_us"
        row = {"where": where, "kind": kind, "bytes": size, "slime": s[key]}
        for p in peers:
            if p in by:
                row[p] = by[p][key]
                row[f"x_{p}"] = s[key] / by[p][key] if rate else by[p][key] / s[key]
        summary.append(row)
    return summary, peers


def print_summary(summary, peers):
    print("\nlatency: p50 us, x_peer = peer / slime;  threads-N, async-N: calls/s, x_peer = slime / peer")
    cols = ["where", "kind", "bytes", "slime"] + [c for p in peers for c in (p, f"x_{p}")]
    print("  ".join(f"{c:>11s}" for c in cols))
    for row in summary:
        cells = []
        for c in cols:
            v = row.get(c, "")
            cells.append(f"{v:11.1f}" if isinstance(v, float) else f"{v!s:>11s}")
        print("  ".join(cells))
    return cols


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    systems = sorted({r["system"] for r in rows if r["kind"] not in OWN_KINDS})
    for ax, kind in zip(axes[:2], ("raw", "tensor")):
        for name in systems:
            for where, style in (("local", "-"), ("netns", "--")):
                pts = [r for r in rows if r["system"] == name and r["kind"] == kind and r["where"] == where]
                if pts:
                    ax.plot([r["bytes"] for r in pts], [r["p50_us"] for r in pts], style, marker="o",
                            label=f"{name} ({where})")
        ax.set(xscale="log", yscale="log", xlabel="payload bytes", ylabel="p50 round trip (us)",
               title=f"{kind} echo")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    modes = [f"{m}-{n}" for m in ("threads", "async") for n in CALLERS]
    width = 0.8 / max(1, len(systems))
    for i, name in enumerate(systems):
        by = {r["kind"]: r["calls_s"] for r in rows if r["system"] == name and "calls_s" in r}
        axes[2].bar([j + i * width for j in range(len(modes))], [by.get(m, 0) for m in modes], width, label=name)
    axes[2].set_xticks([j + 0.4 - width / 2 for j in range(len(modes))], modes, rotation=30)
    axes[2].set(yscale="log", ylabel="calls/s", title="small calls, N callers in flight")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="slime,ray,torch_rpc,pulsing")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-netns", action="store_true", help="skip the two-namespace part")
    ap.add_argument("--no-local", action="store_true", help="only the two-namespace part")
    ap.add_argument("--rounds", type=int, help="turns of every system (default 3; --quick: 2)")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--netns-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = args.systems.split(",")
    rounds = max(1, args.rounds or (2 if args.quick else 3))
    if args.serve:
        host, port = args.addr.rsplit(":", 1)
        SERVERS[args.serve](host, int(port))
        return 0
    if args.netns_client:
        netns_client(names, args.quick, rounds, args.rows_out)
        return 0
    os.makedirs(args.out, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus", flush=True)
    rows = [] if args.no_local else in_turns(names, "127.0.0.1", "local", args.quick, rounds)
    if not args.no_netns:
        rows += run_netns(names, args.quick, rounds, args.out)
    if not any(r["system"] == "slime" for r in rows):
        print("no slime results: nothing to compare")
        return 1
    write_csv(os.path.join(args.out, "rpc_bench.csv"), rows,
              ["system", "where", "kind", "bytes", "rounds", "iters", "p50_us", "avg_us", "calls_s"])
    summary, peers = summarize(rows)
    cols = print_summary(summary, peers)
    write_csv(os.path.join(args.out, "rpc_summary.csv"), summary, cols)
    plot(rows, os.path.join(args.out, "rpc_bench.png"))
    print(f"\nwrote {args.out}/rpc_bench.csv, rpc_summary.csv and rpc_bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
