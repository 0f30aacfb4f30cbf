"""SlimeRPC inside a torchrun job: rank 1 serves a small service, rank 0
calls it with bytes and a tensor, checks the answers and prints latency.

    torchrun --standalone --nproc-per-node 2 examples/rpc_demo.py

Exits non-zero if a check failed.
"""

import sys
import time

import torch
import torch.distributed as dist

import dlslime_torch  # noqa: F401  (registers the "dlslime" backend)
from dlslime_torch import rpc


class Demo:
    rpc_name = "examples.Demo"

    @rpc.method(raw=True)
    def echo(self, data):
        return data

    @rpc.method
    def scale(self, t, factor=2.0):
        return t * factor


def main():
    dist.init_process_group("dlslime")
    rank = dist.get_rank()
    ok = True
    server = rpc.Server(Demo(), threads=1).start() if rank == 1 else None
    dist.barrier()
    if rank == 0:
        demo = rpc.proxy(1, Demo)
        payload = b"x" * 1024
        for _ in range(200):  # warm-up
            demo.echo(payload).wait()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            back = demo.echo(payload).wait()
        us = (time.perf_counter() - t0) / n * 1e6
        ok &= bytes(back) == payload
        t = torch.randn(1 << 20)
        t0 = time.perf_counter()
        out = demo.scale(t, factor=3.0).wait()
        ms = (time.perf_counter() - t0) * 1e3
        ok &= torch.equal(out, t * 3.0)
        print(f"rpc_demo: 1 KiB raw echo round trip {us:.1f} us (avg of {n}); "
              f"4 MiB tensor scale call {ms:.2f} ms; checks {'passed' if ok else 'FAILED'}", flush=True)
        demo.close()
    dist.barrier()
    if server is not None:
        server.close()
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    return 0 if flag.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
