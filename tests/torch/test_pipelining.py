"""torch.distributed.pipelining over "dlslime": a small model split into
two stages, trained one step by ScheduleGPipe and by Schedule1F1B with
four microbatches.  Activations go forward and their gradients backward
by send/recv (batch_isend_irecv) on the stages' group; the losses and
every parameter's gradient equal bit for bit the same schedule's run on
Gloo, and, to rounding, a plain local forward and backward of the whole
model.

Two layouts: the two ranks of the world as the two stages; and four
ranks as a 2x2 DeviceMesh ("pp", "dp"), two pipelines side by side on
the mesh's pp subgroups ([0, 2] and [1, 3]: a stage's group rank is not
its global rank), each on its own data, their gradients then averaged
over the dp subgroups as data parallelism would.
"""

import pytest
import torch
import torch.distributed as dist

from frameworks import BACKENDS, check, init, meshes, run_scenarios
from harness import run_job

pytestmark = pytest.mark.timeout(200)

STAGES = 2
MICROBATCHES = 4
BATCH = 8
SPLIT = 2       # layers [0, SPLIT) are stage 0, the rest stage 1
SCHEDULES = ("ScheduleGPipe", "Schedule1F1B")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def batch(replica):
    g = torch.Generator().manual_seed(7 + replica)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def stage_layers(layers, stage):
    return layers[:SPLIT] if stage == 0 else layers[SPLIT:]


def _pipeline(name, group, replica):
    """One step of schedule `name` on group; this rank's stage is its
    group rank.  Returns its losses (last stage) and its gradients."""
    from torch.distributed import pipelining
    stage_index = dist.get_rank(group)
    module = torch.nn.Sequential(*stage_layers(list(model()), stage_index))
    stage = pipelining.PipelineStage(module, stage_index, STAGES, torch.device("cpu"),
                                     group=group)
    schedule = getattr(pipelining, name)(stage, MICROBATCHES, loss_fn=loss_fn)
    x, y = batch(replica)
    losses = []
    if stage_index == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    return losses, [p.grad for p in module.parameters()]


def _flat(name):
    def scenario(group):
        losses, grads = _pipeline(name, group, 0)
        return {"losses": losses, "grads": grads}
    return scenario


def _on_mesh(name):
    def scenario(mesh):
        replica = mesh.get_local_rank("dp")
        losses, grads = _pipeline(name, mesh.get_group("pp"), replica)
        for g in grads:
            dist.all_reduce(g, group=mesh.get_group("dp"))
            g /= mesh.size(mesh.mesh_dim_names.index("dp"))
        return {"losses": losses, "grads": grads}
    return scenario


def _flat_job(rank, size, store):
    init(rank, size, store)
    groups = {"dlslime": dist.group.WORLD,
              "gloo": dist.new_group(backend="gloo")}
    assert [dist.get_backend(groups[b]) for b in BACKENDS] == list(BACKENDS)
    out = run_scenarios({name: _flat(name) for name in SCHEDULES}, groups.__getitem__)
    dist.destroy_process_group()
    return out


def _mesh_job(rank, size, store):
    init(rank, size, store)
    by_backend = meshes((STAGES, 2), ("pp", "dp"))
    out = run_scenarios({name: _on_mesh(name) for name in SCHEDULES},
                        by_backend.__getitem__)
    dist.destroy_process_group()
    return out


def local_run(stage, replica):
    """The whole model run locally on the same microbatches; gradients
    averaged over them, as the schedules do (scale_grads)."""
    full = model()
    x, y = batch(replica)
    losses = []
    for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
        loss = loss_fn(full(xs), ys)
        loss.backward()
        losses.append(loss.detach())
    grads = [p.grad / MICROBATCHES for m in stage_layers(list(full), stage)
             for p in m.parameters()]
    return (losses if stage == STAGES - 1 else []), grads


def flat_reference(rank):
    losses, grads = local_run(rank, 0)
    return {"losses": losses, "grads": grads}


def mesh_reference(rank):
    """Mesh [[0, 1], [2, 3]]: rank r is stage r // 2 of replica r % 2."""
    stage, replica = divmod(rank, 2)
    losses, grads = local_run(stage, replica)
    _, other = local_run(stage, 1 - replica)
    return {"losses": losses, "grads": [(a + b) / 2 for a, b in zip(grads, other)]}


_jobs = {}


def results(layout):
    if layout not in _jobs:
        size, job = (STAGES, _flat_job) if layout == "flat" else (2 * STAGES, _mesh_job)
        _jobs[layout] = run_job(size, job, timeout=180)
    return _jobs[layout]


@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_matches_gloo_and_local(name):
    check(results("flat"), name, flat_reference, exact_reference=False)


@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_on_2d_mesh_matches_gloo_and_local(name):
    check(results("mesh"), name, mesh_reference, exact_reference=False)
