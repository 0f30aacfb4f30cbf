"""SlimeRPC inside a torchrun-style job on the "dlslime" backend: peers
are ranks, found through the default group's store, and the calls ride
the endpoints the backend made."""

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)


def rpc_between_ranks(rank, size, store):
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from rpc_services import Calc
    from dlslime_torch import rpc, runtime

    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size)
    ctx = runtime.current()  # made by the backend; RPC must use the same
    if rank == 1:
        server = rpc.Server(Calc(), threads=2).start()
    dist.barrier()
    out = None
    if rank == 0:
        calc = rpc.proxy(1, Calc)
        assert calc.job.ctx is ctx  # the default job rides the backend's context
        t = torch.arange(1000, dtype=torch.float32)
        out = calc.add(t, t).wait()
        assert torch.equal(out, 2 * t)
        assert bytes(calc.echo(b"abc" * 1000).wait()) == b"abc" * 1000
        assert runtime.current() is ctx
        calc.close()
    # the backend still works next to RPC
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((8,), 3.0))
    dist.barrier()
    if rank == 1:
        server.close()
    dist.destroy_process_group()
    return "ok"


def test_rpc_inside_torchrun_job():
    assert run_job(2, rpc_between_ranks) == ["ok", "ok"]
