"""torch.distributed.pipelining over "dlslime": a small model split into
stages over two ranks, trained one step with four microbatches by
ScheduleGPipe and Schedule1F1B (one stage a rank) and by
ScheduleInterleaved1F1B and ScheduleLoopedBFS (two stages a rank, the
model cut in four, rank r holding stages r and r + 2).  Activations go
forward and their gradients backward by send/recv (batch_isend_irecv)
on the stages' group; the losses and every parameter's gradient equal
bit for bit the same schedule's run on Gloo, and, to rounding, a plain
local forward and backward of the whole model.

Two layouts: the two ranks of the world as the pipeline; and four ranks
as a 2x2 DeviceMesh ("pp", "dp"), two pipelines side by side on
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

RANKS = 2       # of a pipeline
MICROBATCHES = 4
BATCH = 8
STAGES_PER_RANK = {"ScheduleGPipe": 1, "Schedule1F1B": 1,
                   "ScheduleInterleaved1F1B": 2, "ScheduleLoopedBFS": 2}
SCHEDULES = tuple(STAGES_PER_RANK)


def model():
    """Four blocks: a pipeline of 2 stages has two each, one of 4 one."""
    torch.manual_seed(0)

    def block(n_in, n_out):
        return torch.nn.Sequential(torch.nn.Linear(n_in, n_out), torch.nn.Tanh())
    return torch.nn.Sequential(block(6, 16), block(16, 16), block(16, 16),
                               torch.nn.Linear(16, 3))


def batch(replica):
    g = torch.Generator().manual_seed(7 + replica)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


def stage_indices(name, rank):
    """The stages a pipeline rank holds under schedule `name`."""
    return [rank + k * RANKS for k in range(STAGES_PER_RANK[name])]


def stage_modules(full, name, rank):
    """rank's stages of model `full` under schedule `name`, by index."""
    blocks = list(full)
    per_stage = len(blocks) // (RANKS * STAGES_PER_RANK[name])
    return {i: torch.nn.Sequential(*blocks[i * per_stage:(i + 1) * per_stage])
            for i in stage_indices(name, rank)}


def _pipeline(name, group, replica):
    """One step of schedule `name` on group, this rank holding the
    stages of its group rank.  Returns its losses (the last stage's
    rank) and its gradients."""
    from torch.distributed import pipelining
    rank = dist.get_rank(group)
    modules = stage_modules(model(), name, rank)
    stages = [pipelining.PipelineStage(module, i, RANKS * STAGES_PER_RANK[name],
                                       torch.device("cpu"), group=group)
              for i, module in modules.items()]
    schedule = getattr(pipelining, name)(stages if len(stages) > 1 else stages[0],
                                         MICROBATCHES, loss_fn=loss_fn)
    x, y = batch(replica)
    losses = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    return losses, [p.grad for m in modules.values() for p in m.parameters()]


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
    by_backend = meshes((RANKS, 2), ("pp", "dp"))
    out = run_scenarios({name: _on_mesh(name) for name in SCHEDULES},
                        by_backend.__getitem__)
    dist.destroy_process_group()
    return out


def local_run(name, rank, replica):
    """The whole model run locally on the same microbatches; gradients
    (of rank's stages) averaged over them, as the schedules do
    (scale_grads)."""
    full = model()
    x, y = batch(replica)
    losses = []
    for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
        loss = loss_fn(full(xs), ys)
        loss.backward()
        losses.append(loss.detach())
    grads = [p.grad / MICROBATCHES for m in stage_modules(full, name, rank).values()
             for p in m.parameters()]
    return (losses if rank == RANKS - 1 else []), grads


def flat_reference(name):
    def reference(rank):
        losses, grads = local_run(name, rank, 0)
        return {"losses": losses, "grads": grads}
    return reference


def mesh_reference(name):
    """Mesh [[0, 1], [2, 3]]: rank r is pipeline rank r // 2 of replica
    r % 2."""
    def reference(rank):
        stage_rank, replica = divmod(rank, 2)
        losses, grads = local_run(name, stage_rank, replica)
        _, other = local_run(name, stage_rank, 1 - replica)
        return {"losses": losses, "grads": [(a + b) / 2 for a, b in zip(grads, other)]}
    return reference


_jobs = {}


def results(layout):
    if layout not in _jobs:
        size, job = (RANKS, _flat_job) if layout == "flat" else (2 * RANKS, _mesh_job)
        _jobs[layout] = run_job(size, job, timeout=180)
    return _jobs[layout]


@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_matches_gloo_and_local(name):
    check(results("flat"), name, flat_reference(name), exact_reference=False)


@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_on_2d_mesh_matches_gloo_and_local(name):
    check(results("mesh"), name, mesh_reference(name), exact_reference=False)
