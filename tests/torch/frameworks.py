"""Shared by the tests of torch's frameworks on "dlslime" (DTensor,
DeviceMesh, pipelining, tensor parallel, checkpoints): each rank runs the same
scenarios once over dlslime groups and once over Gloo groups of the same
ranks, in the same job, and the parent compares the two runs and a plain
local reference.

A scenario that raises is recorded as its traceback rather than ending
the job, so one missing op fails only the tests that need it and the
failure names the op.
"""

import datetime
import io
import traceback

import torch
import torch.distributed as dist

BACKENDS = ("dlslime", "gloo")
TIMEOUT = datetime.timedelta(seconds=60)


def init(rank, size, store):
    """The job's default group, on dlslime (what subgroups inherit)."""
    import dlslime_torch  # noqa: F401  registers the backend
    dist.init_process_group("dlslime", store=store, rank=rank,
                            world_size=size, timeout=TIMEOUT)


def meshes(shape, names):
    """A CPU DeviceMesh per backend, every dim's group checked to be on
    that backend (so a dlslime result really came over dlslime)."""
    from torch.distributed.device_mesh import init_device_mesh
    out = {}
    for backend in BACKENDS:
        override = None if backend == "dlslime" else dict.fromkeys(names, backend)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names,
                                backend_override=override)
        for name in names:
            got = dist.get_backend(mesh.get_group(name))
            if got != backend:
                raise AssertionError(f"mesh dim {name!r}: group on {got}, "
                                     f"wanted {backend}")
        out[backend] = mesh
    return out


def run_scenarios(scenarios, context_of):
    """{backend: {scenario name: result or "raised:\\n<traceback>"}}.

    context_of(backend) is what each scenario is called with; results
    are detached CPU tensors, or lists/dicts of them."""
    out = {}
    for backend in BACKENDS:
        context = context_of(backend)
        out[backend] = {}
        for name, fn in scenarios.items():
            try:
                out[backend][name] = _pack(fn(context))
            except Exception:  # recorded: the test for this scenario fails
                out[backend][name] = "raised:\n" + traceback.format_exc()
    return out


def _plain(value):
    """value with every functional collective's result waited for (its
    AsyncCollectiveTensor wrapper does not survive torch.load)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    if isinstance(value, AsyncCollectiveTensor):
        return value.wait()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _pack(value):
    """Bytes, so the result crosses the pipe by value: torch's pickler
    would share a tensor's storage with a process about to exit."""
    buf = io.BytesIO()
    torch.save(_plain(value), buf)
    return buf.getvalue()


def _unpack(value):
    return value if isinstance(value, str) else torch.load(io.BytesIO(value))


def _flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _flat(value[k])]
    return [t for v in value for t in _flat(v)]


def _describe(value):
    if isinstance(value, str):
        return value
    return repr([tuple(t.shape) for t in _flat(value)])


def mismatch(got, want, exact=True):
    """None when got equals want (bit for bit, or allclose when not
    exact), else a description of the difference or of the error."""
    for side in (got, want):
        if isinstance(side, str):
            return side
    if isinstance(got, dict) and sorted(got) != sorted(want):
        return f"keys differ: {sorted(got)} vs {sorted(want)}"
    a, b = _flat(got), _flat(want)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return f"shapes differ: {_describe(got)} vs {_describe(want)}"
    for i, (x, y) in enumerate(zip(a, b)):
        same = torch.equal(x, y) if exact else torch.allclose(x, y, rtol=1e-5, atol=1e-6)
        if not same:
            return (f"tensor {i} differs by up to "
                    f"{(x.double() - y.double()).abs().max().item()}")
    return None


def check(results, name, reference, exact_reference=True):
    """Asserts scenario `name` gave on dlslime exactly what it gave on
    Gloo on every rank, and what reference(rank) gives (computed
    locally, without any group)."""
    failures = []
    for rank, per_backend in enumerate(results):
        slime = _unpack(per_backend["dlslime"][name])
        problem = mismatch(slime, _unpack(per_backend["gloo"][name]))
        if problem:
            failures.append(f"rank {rank}, dlslime vs gloo: {problem}")
        problem = mismatch(slime, reference(rank), exact_reference)
        if problem:
            failures.append(f"rank {rank}, dlslime vs local: {problem}")
    assert not failures, f"{name}:\n" + "\n".join(failures)
