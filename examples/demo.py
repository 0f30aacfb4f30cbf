"""The main job: two ranks move tensors over the "dlslime" backend.

    torchrun --standalone --nproc-per-node 2 examples/demo.py [--size-mib 64] [--iters 5]

On the default transport (shared memory between two processes of one
host), rank 0 and rank 1:

  1. ping-pong a tensor with send/recv (rank 0 sends, rank 1 sends it
     back), --iters times;
  2. all_reduce (SUM) a float32 tensor, --iters times;
  3. one-sided: rank 0 writes a tensor into rank 1's registered tensor
     (write_with_imm: the immediate tells rank 1 it is in place) and reads
     it back, --iters times, while rank 1's code only waits;
  4. SlimeRPC: rank 1 serves a small service, rank 0 calls a raw 1 KiB
     echo many times and a method that takes and returns a tensor.

Every transfer is checked element for element outside the timed part.
Steps 1 and 2 also run on a Gloo group of the same two processes, for
comparison.  Rank 0 prints what moved and how fast; the job exits
non-zero if any check failed.
"""

import argparse
import time

import torch
import torch.distributed as dist

from _common import check, main, say
from dlslime_torch import rdma, rpc


def ping_pong(rank, group, size_bytes, iters):
    n = size_bytes // 4
    mine = torch.empty(n, dtype=torch.float32)
    got = torch.empty(n, dtype=torch.float32)
    seconds = 0.0
    for i in range(iters):
        mine.copy_(torch.arange(n, dtype=torch.float32)).add_(i * 3 + rank)
        dist.barrier(group=group)
        start = time.perf_counter()
        if rank == 0:
            dist.send(mine, dst=1, group=group)
            dist.recv(got, src=1, group=group)
        else:
            dist.recv(got, src=0, group=group)
            dist.send(got, dst=0, group=group)
        seconds += time.perf_counter() - start
        if rank == 0:   # came back unchanged
            check(torch.equal(got, mine), f"ping-pong {i}: the tensor came back different")
        else:
            check(torch.equal(got, torch.arange(n, dtype=torch.float32) + i * 3),
                  f"ping-pong {i}: received the wrong tensor")
    return 2 * size_bytes * iters / seconds


def all_reduce(rank, group, size_bytes, iters):
    n = size_bytes // 4
    t = torch.empty(n, dtype=torch.float32)
    seconds = 0.0
    for i in range(iters):
        t.fill_(float(rank + 1 + i))
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        seconds += time.perf_counter() - start
        check(bool((t == float(3 + 2 * i)).all()), f"all_reduce {i}: wrong sum")
    return size_bytes * iters / seconds


def one_sided(rank, size_bytes, iters):
    """Step 3; returns (write, read) bytes per second on rank 0."""
    n = size_bytes // 4      # int32: exact, whatever the size
    # rdma.zeros: a block that rank 0 maps on shm, so both directions are
    # one memcpy (an ordinary tensor works too, by cross-memory copies)
    target = rdma.zeros(n, dtype=torch.int32)
    win = rdma.register_window(target)
    write_s = read_s = 0.0
    if rank == 0:
        src = torch.arange(n, dtype=torch.int32)
        back = torch.empty(n, dtype=torch.int32)
        for i in range(iters):
            src.add_(1)
            start = time.perf_counter()
            rdma.write_with_imm(src, win[1], imm=i).wait(60)
            write_s += time.perf_counter() - start
            dist.barrier()      # rank 1 checks what landed
            start = time.perf_counter()
            rdma.read(back, win[1]).wait(60)
            read_s += time.perf_counter() - start
            check(torch.equal(back, src), f"one-sided {i}: read back something else")
    else:
        for i in range(iters):
            imm = win.recv_imm(0).result(60)
            check(imm == i, f"one-sided {i}: immediate {imm}")
            check(torch.equal(target, torch.arange(n, dtype=torch.int32) + i + 1),
                  f"one-sided {i}: the written tensor is wrong")
            dist.barrier()
    dist.barrier()
    win.free()
    return (size_bytes * iters / write_s, size_bytes * iters / read_s) if rank == 0 else None


class DemoService:
    rpc_name = "examples.demo.DemoService"

    @rpc.method(raw=True)
    def echo(self, data):
        return bytes(data)

    @rpc.method
    def scale(self, t, factor=2.0):
        return t * factor


def remote_calls(rank, calls=2000):
    """Step 4; returns (1 KiB echo round trip in us, tensor call in ms)
    on rank 0."""
    server = rpc.Server(DemoService(), threads=1).start() if rank == 1 else None
    dist.barrier()
    result = None
    if rank == 0:
        service = rpc.proxy(1, DemoService)
        payload = bytes(range(256)) * 4
        for _ in range(200):  # warm-up
            service.echo(payload).wait()
        start = time.perf_counter()
        for _ in range(calls):
            back = service.echo(payload).wait()
        echo_us = (time.perf_counter() - start) / calls * 1e6
        check(bytes(back) == payload, "rpc: the echo came back different")
        t = torch.randn(1 << 20)
        start = time.perf_counter()
        out = service.scale(t, factor=3.0).wait()
        call_ms = (time.perf_counter() - start) * 1e3
        check(torch.equal(out, t * 3.0), "rpc: scale returned the wrong tensor")
        service.close()
        result = (echo_us, call_ms)
    dist.barrier()
    if server is not None:
        server.close()
    return result


def transport_in_use(rank):
    from dlslime_torch import runtime
    addrs = [None, None]
    dist.all_gather_object(addrs, runtime.current().address())
    return runtime.connect(addrs[1 - rank], 10_000).transport


def body(rank, size, gloo):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    check(size == 2, f"the demo runs on 2 ranks, not {size}")
    nbytes = args.size_mib << 20
    transport = transport_in_use(rank)
    rates = {}
    for name, group in (("dlslime", dist.group.WORLD), ("gloo", gloo)):
        rates[name] = (ping_pong(rank, group, nbytes, args.iters),
                       all_reduce(rank, group, nbytes, args.iters))
    one_sided_rates = one_sided(rank, nbytes, args.iters)
    calls = remote_calls(rank)
    if rank == 0:
        moved = 2 * nbytes * args.iters + nbytes * args.iters
        say(f"dlslime over {transport}, 2 ranks; moved {moved >> 20} MiB per rank, "
            f"every element checked")
        say(f"{'':28s}{'dlslime':>12s}{'gloo':>12s}")
        say(f"{f'send/recv ping-pong {args.size_mib} MiB':28s}"
            f"{rates['dlslime'][0] / 1e9:8.2f} GB/s{rates['gloo'][0] / 1e9:8.2f} GB/s")
        say(f"{f'all_reduce SUM {args.size_mib} MiB':28s}"
            f"{rates['dlslime'][1] / 1e9:8.2f} GB/s{rates['gloo'][1] / 1e9:8.2f} GB/s")
        say(f"(bytes moved per second over {args.iters} iterations; ping-pong "
            f"counts both directions, all_reduce the buffer once)")
        write_bps, read_bps = one_sided_rates
        say(f"one-sided {args.size_mib} MiB into rank 1's tensor: write_with_imm "
            f"{write_bps / 1e9:.2f} GB/s, read {read_bps / 1e9:.2f} GB/s")
        say(f"SlimeRPC: 1 KiB raw echo round trip {calls[0]:.1f} us; "
            f"call with a 4 MiB tensor argument and result {calls[1]:.2f} ms")


if __name__ == "__main__":
    main(body)
