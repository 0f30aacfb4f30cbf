"""dlslime-torch: a C transfer core for PyTorch jobs.

`dlslime_torch._C` is the thin CPython binding of libdlslime (contexts,
endpoints, memory regions, requests); the torch.distributed backend will
be built on it.
"""

__version__ = "0.1.0"

try:
    from . import _C
except ImportError as exc:  # say how to fix it, keep the loader's reason
    raise ImportError(
        f"dlslime_torch._C could not be loaded ({exc}); build it with "
        f"`pip install --no-build-isolation -e .` or scripts/setup.sh"
    ) from exc

__all__ = ["_C", "__version__"]
