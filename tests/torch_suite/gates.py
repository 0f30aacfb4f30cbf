"""Which of torch's distributed tests apply to a CPU backend, and the one
place where dlslime is treated as Gloo-like.

torch's distributed_test.py decides at import time, from the backend's
name in $BACKEND, which tests to skip: a gate such as
`BACKEND != "gloo"` or `require_backend_is_available({"gloo", ...})`
marks the test function skipped (unittest's __unittest_skip__).  Most
such gates guard CPU features that are not Gloo's alone (coalesced
all_reduce, batched p2p, DDP on CPU, process-group timeouts), so the
driver lifts them for dlslime: see gloo_like().  A few tests cannot run
on any backend but Gloo because torch itself refuses every other name:
GLOO_BY_NAME lists them with the reason, and the summary prints it.
"""

import inspect
import re

# Tests that torch.distributed itself runs only on a group whose backend
# is named "gloo": lifting the suite's gate would only show torch's
# refusal, not anything about dlslime.
_MONITORED = ("torch.distributed.monitored_barrier raises 'only implemented "
              "for GLOO backend' for any other backend (dlslime has its own: "
              "dlslime_torch.monitored_barrier)")
GLOO_BY_NAME = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    "test_monitored_barrier_gloo_rank_0_timeout": _MONITORED,
    "test_monitored_barrier_failure_order": _MONITORED,
    "test_monitored_barrier_wait_all_ranks": _MONITORED,
}

# A decorator on these lines means the test needs a GPU (it spawns its
# ranks and then exits with a "no GPU" skip, or is skipped outright).
_GPU_DECORATOR = re.compile(r"gpu|cuda|nccl_skip|require_n_gpus", re.IGNORECASE)


def needs_gpu(func):
    """Whether a test of the suite needs a GPU, from its decorators (read
    from the source: the skip itself only happens in the ranks)."""
    source = inspect.getsource(func)
    header = source[:source.find("def ")]
    return any(_GPU_DECORATOR.search(line) for line in header.splitlines()
               if line.strip().startswith("@"))


def skip_reason(func):
    """The reason torch's import-time gates skip func, or None."""
    if getattr(func, "__unittest_skip__", False):
        return getattr(func, "__unittest_skip_why__", "skipped")
    return None


def gloo_like(test_class, gloo_skips):
    """THE Gloo-like rule: for dlslime, lift every import-time gate that
    Gloo passes, so dlslime runs exactly the tests Gloo runs.

    gloo_skips maps each test name to its skip reason when the suite is
    imported for Gloo (None: Gloo runs it).  Returns {name: reason} of
    the gates lifted (the gate's own words, which name the backend).
    """
    lifted = {}
    for name in dir(test_class):
        if not name.startswith("test_") or name in GLOO_BY_NAME:
            continue
        func = getattr(test_class, name)
        reason = skip_reason(func)
        if reason is not None and gloo_skips.get(name, reason) is None:
            func.__unittest_skip__ = False
            lifted[name] = reason
    return lifted
