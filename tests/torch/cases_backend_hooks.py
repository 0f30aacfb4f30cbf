"""Catalog cases: the choices c10d leaves to a backend, made as Gloo (and,
for timing, NCCL) make them: coalescing through the *_coalesced ops rather
than start/endCoalescing, and collectives timing (see cases.py)."""

import torch
import torch.distributed as dist

from cases import case, same


def _backends(env):
    cpu = torch.device("cpu")
    return dist.group.WORLD._get_backend(cpu), env.gloo._get_backend(cpu)


@case("backend-choices-as-gloo")
def _(env):
    slime, gloo = _backends(env)
    # No start/endCoalescing: torch's coalescing manager then calls the
    # *_coalesced ops (cases_coalesced.py checks they are one collective).
    assert slime.supports_coalescing == gloo.supports_coalescing == False  # noqa: E712


@case("collectives-timing")
def _(env):
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    try:
        work._get_duration()
    except RuntimeError as exc:
        assert "enable collectives timing" in str(exc), exc
    else:
        raise AssertionError("an untimed op had a duration")
    dist.group.WORLD._enable_collectives_timing()
    env.gloo._enable_collectives_timing()      # accepted by Gloo too
    for op in (lambda: dist.all_reduce(t, async_op=True),
               lambda: dist.broadcast(t, src=0, async_op=True)):
        work = op()
        work.wait()
        duration = work._get_duration()
        assert isinstance(duration, float) and duration >= 0.0, duration
    same(t, torch.full((3,), float(env.size ** 2)))   # two all_reduces
