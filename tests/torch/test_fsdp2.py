"""FSDP2 (fully_shard over a 1-D CPU device mesh) trains the same on
"dlslime" as on Gloo: same seeds, same data; the losses of every step and
the parameters after the last one are equal bit for bit.  Exact, not
close: with 2 ranks every reduction is one sum of two floats (one
possible rounding) and AVG's division by 2 is exact, in both backends.

FSDP2's collectives are the coalesced ones (all_gather_into_tensor_coalesced
and reduce_scatter_tensor_coalesced through torch's coalescing manager) and
all_gather_into_tensor; the test checks they ran on the dlslime group."""

import datetime

import pytest
import torch
import torch.distributed as dist

from harness import run_job

pytestmark = pytest.mark.timeout(180)

STEPS = 8


def _train(group, rank):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 31), torch.nn.Tanh(),  # 31: uneven shards
                                torch.nn.Linear(31, 3))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = torch.randn(12, 3, generator=torch.Generator().manual_seed(7))
    data = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 12, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    params = [p.full_tensor().detach().clone() for p in model.parameters()]
    return params, torch.stack(losses)


def _fsdp2(rank, size, store):
    import dlslime_torch  # noqa: F401
    dist.init_process_group("dlslime", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    slime = dist.group.WORLD
    backend = slime._get_backend(torch.device("cpu"))
    before = backend._get_sequence_number_for_group()
    params, losses = _train(slime, rank)
    ran = backend._get_sequence_number_for_group() - before
    gloo_params, gloo_losses = _train(gloo, rank)
    out = {
        "collectives on dlslime": ran,
        "losses equal": torch.equal(losses, gloo_losses),
        "losses": (losses.tolist(), gloo_losses.tolist()),
        "params equal": all(torch.equal(a, b) for a, b in zip(params, gloo_params)),
        "worst param diff": max((a - b).abs().max().item() for a, b in zip(params, gloo_params)),
        "loss fell": bool(losses[-1] < losses[0]),
    }
    dist.destroy_process_group()
    return out


def test_fsdp2_matches_gloo_exactly():
    for rank, out in enumerate(run_job(2, _fsdp2)):
        # 2 all-gathers per layer and step forward and backward, reduce-scatters, ...
        assert out["collectives on dlslime"] >= 3 * STEPS, out
        assert out["losses equal"], f"rank {rank}: {out['losses']}"
        assert out["params equal"], f"rank {rank}: differ by up to {out['worst param diff']}"
        assert out["loss fell"], out
