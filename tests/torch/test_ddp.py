"""DistributedDataParallel trains the same on "dlslime" as on Gloo: same
seeds, same data, and the parameters after the last step are equal bit
for bit (2 ranks: a sum of two floats does not depend on the order)."""

import datetime

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(120)

STEPS = 8


def _train(process_group, rank, python_hook):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 3))
    # Small buckets: several all_reduces per step, in flight together.
    ddp = DDP(model, process_group=process_group, bucket_cap_mb=0.002)
    if python_hook:   # chains Python on Work.get_future()
        ddp.register_comm_hook(process_group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)
    for _ in range(STEPS):
        x = torch.randn(16, 12, generator=data)
        y = torch.randn(16, 3, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    slime = dist.group.WORLD
    out = {}
    for hook in (False, True):
        a = _train(slime, rank, hook)
        b = _train(gloo, rank, hook)
        out[hook] = (all(torch.equal(x, y) for x, y in zip(a, b)),
                     max((x - y).abs().max().item() for x, y in zip(a, b)),
                     sum(x.double().sum().item() for x in a))
    dist.destroy_process_group()
    return out


def test_ddp_matches_gloo_exactly():
    results = run_job(2, _ddp)
    for rank, out in enumerate(results):
        for hook, (equal, worst, _) in out.items():
            assert equal, f"rank {rank}, python hook {hook}: parameters differ by up to {worst}"
    # Both ranks hold the same model (DDP kept them in step).
    for hook in (False, True):
        assert results[0][hook][2] == results[1][hook][2]
