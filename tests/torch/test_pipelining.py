"""torch.distributed.pipelining over "dlslime": a small model split into
two stages on two ranks, trained one step by ScheduleGPipe and by
Schedule1F1B with four microbatches.  Activations go forward and their
gradients backward by send/recv (batch_isend_irecv) on the stages'
group; the losses and every parameter's gradient equal bit for bit the
same schedule's run on a Gloo group, and, to rounding, a plain local
forward and backward of the whole model.
"""

import pytest
import torch
import torch.distributed as dist

from frameworks import BACKENDS, check, init, run_scenarios
from harness import run_job

pytestmark = pytest.mark.timeout(150)

SIZE = 2
MICROBATCHES = 4
BATCH = 8
SPLIT = 2       # layers [0, SPLIT) are stage 0, the rest stage 1


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def stage_module(rank):
    layers = list(model())
    return torch.nn.Sequential(*(layers[:SPLIT] if rank == 0 else layers[SPLIT:]))


def _grads(module):
    return [p.grad.detach().clone() for p in module.parameters()]


def _schedule(name):
    def scenario(group):
        from torch.distributed import pipelining
        rank = dist.get_rank(group)
        module = stage_module(rank)
        stage = pipelining.PipelineStage(module, rank, SIZE, torch.device("cpu"),
                                         group=group)
        schedule = getattr(pipelining, name)(stage, MICROBATCHES, loss_fn=loss_fn)
        x, y = batch()
        losses = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        return {"losses": [l.detach() for l in losses], "grads": _grads(module)}
    return scenario


SCHEDULES = ("ScheduleGPipe", "Schedule1F1B")


def _job(rank, size, store):
    init(rank, size, store)
    groups = {"dlslime": dist.group.WORLD,
              "gloo": dist.new_group(backend="gloo")}
    assert [dist.get_backend(groups[b]) for b in BACKENDS] == list(BACKENDS)
    out = run_scenarios({name: _schedule(name) for name in SCHEDULES},
                        groups.__getitem__)
    dist.destroy_process_group()
    return out


def reference(rank):
    """The whole model run locally on the same microbatches; gradients
    averaged over them, as the schedules do (scale_grads)."""
    full = model()
    x, y = batch()
    losses = []
    for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
        loss = loss_fn(full(xs), ys)
        loss.backward()
        losses.append(loss.detach())
    layers = list(full)
    mine = layers[:SPLIT] if rank == 0 else layers[SPLIT:]
    grads = [p.grad / MICROBATCHES for m in mine for p in m.parameters()]
    return {"losses": losses if rank == SIZE - 1 else [], "grads": grads}


_results = []


@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_matches_gloo_and_local(name):
    if not _results:
        _results.append(run_job(SIZE, _job, timeout=120))
    check(_results[0], name, reference, exact_reference=False)
