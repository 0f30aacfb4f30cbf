"""dlslime-torch: a C transfer core for PyTorch jobs.

`dlslime_torch._C` is the thin CPython binding of libdlslime (contexts,
endpoints, memory regions, requests).  Importing the package also
registers the torch.distributed backend "dlslime" (CPU tensors):

    import torch.distributed as dist
    import dlslime_torch
    dist.init_process_group("dlslime")

Registering needs torch, which takes a second or two to import, while
many users of _C never touch torch.  So the package registers at once
when torch is already imported, and otherwise the moment torch finishes
importing (a one-shot import hook): either way "dlslime" is known before
init_process_group can be called, and `import dlslime_torch` alone stays
cheap.  The backend's Python API (register_backend, monitored_barrier,
backend_available, BACKEND_NAME) loads on first use, and so do the
one-sided API `dlslime_torch.rdma` (read / write / write_with_imm between
registered tensors of different ranks) and `dlslime_torch.futures`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

try:
    from . import _C
except ImportError as exc:  # say how to fix it, keep the loader's reason
    raise ImportError(
        f"dlslime_torch._C could not be loaded ({exc}); build it with "
        f"`pip install --no-build-isolation -e .` or scripts/setup.sh"
    ) from exc

_BACKEND_API = ("BACKEND_NAME", "backend_available", "monitored_barrier",
                "register_backend")
_SUBMODULES = ("futures", "rdma")   # import torch: loaded on first use
__all__ = ["_C", "__version__", *_BACKEND_API, *_SUBMODULES]


def _register_backend():
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return
        from .backend import register_backend
        register_backend()
    except Exception as exc:  # never break the import of torch
        warnings.warn(f"dlslime: could not register the torch.distributed "
                      f"backend: {exc}", RuntimeWarning, stacklevel=2)


class _RegisterAfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is about to be imported, wraps
    its loader so that the backend registers right after torch's own
    module has run.  Removes itself on first use."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_torch = loader.exec_module

        def exec_module(module):
            run_torch(module)
            _register_backend()

        loader.exec_module = exec_module
        return spec


if sys.modules.get("torch") is not None:
    _register_backend()
elif importlib.util.find_spec("torch") is not None:
    sys.meta_path.insert(0, _RegisterAfterTorch())


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _BACKEND_API:
        from . import backend
        return {"BACKEND_NAME": backend.BACKEND_NAME,
                "backend_available": backend.available,
                "monitored_barrier": backend.monitored_barrier,
                "register_backend": backend.register_backend}[name]
    raise AttributeError(f"module 'dlslime_torch' has no attribute '{name}'")
