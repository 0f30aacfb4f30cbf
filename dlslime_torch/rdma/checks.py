"""The checks of the one-sided API, in words.

What is allowed is decided in one place, csrc/python/rdma_check.c, and
both paths of ops.py run it: the C fast path (which posts nothing when a
check refuses) and the checked path here.  A check that refuses raises
_C.RdmaRefusal(check, *values), its name and the values it judged; this
module, and only it, turns that into the error that names the tensor and
the offsets.
"""

import torch

from .. import _C
from .errors import RdmaAccessError, RdmaInvalidError

Refusal = _C.RdmaRefusal

# check -> (class, the part of the op the error names, the text after it
# given the refusal's values).  Parts: "tensor" (the local tensor),
# "remote" (the remote side), "count" (an offset or length, by name),
# "op" (the whole op, described).
_WORDS = {
    "tensor": (RdmaInvalidError, "tensor",
               lambda t: f" must be a torch.Tensor, got {type(t).__name__}"),
    "device": (RdmaInvalidError, "tensor",
               lambda t: f" is on {t.device}; the core moves CPU memory only (copy it "
                         f"to the CPU first)"),
    "contiguous": (RdmaInvalidError, "tensor",
                   lambda t: f" is not contiguous (shape {list(t.shape)}, stride "
                             f"{list(t.stride())}); pass tensor.contiguous() or a "
                             f"contiguous slice"),
    "remote": (RdmaInvalidError, "remote",
               lambda r: f" must be a RemoteTensor (Region.descriptor() of its owner), "
                         f"got {type(r).__name__}"),
    "count": (RdmaInvalidError, "count",
              lambda v: f" must be an int (elements), got {v!r}"),
    "negative": (RdmaAccessError, "count", lambda v: f" is negative ({v})"),
    "job": (RdmaAccessError, "op",
            lambda: ": the descriptor comes from another job (its job id differs from "
                    "this process's); descriptors are valid only in the job that made "
                    "them"),
    "desc": (RdmaInvalidError, "op", lambda n: f": malformed descriptor ({n} bytes)"),
    "dtype": (RdmaInvalidError, "op",
              lambda mine, theirs: f": the local tensor is {mine} but the remote one is "
                                   f"{theirs}; they must match"),
    "bounds": (RdmaAccessError, "op",
               lambda start, end, numel: f": elements [{start}, {end}) are outside the "
                                         f"remote tensor of {numel} elements"),
    "imm": (RdmaInvalidError, "op",
            lambda imm: f": imm must be an int in [0, 2**32), got {imm!r}"),
    "imm_empty": (RdmaInvalidError, "op",
                  lambda: ": write_with_imm needs at least one element to carry the "
                          "immediate"),
    "imm_self": (RdmaInvalidError, "op",
                 lambda: ": the region belongs to this process, which cannot send "
                         "itself an immediate"),
}


def error(refusal, name):
    """The RdmaError for refusal; name(part) words the part of the op it
    names (see _WORDS).  The error's check is the refusing check's name."""
    check, *values = refusal.args
    cls, part, text = _WORDS[check]
    err = cls(f"dlslime rdma: {name(part)}{text(*values)}")
    err.check = check
    return err


def check_tensor(tensor, what):
    """A CPU, contiguous tensor, or a clear error naming `what`."""
    try:
        _C.rdma_check_tensor(tensor, torch.Tensor)
    except Refusal as refusal:
        raise error(refusal, lambda part: what) from None
    return tensor


def check_count(value, name, label=""):
    """An offset or length in elements: an int (not a bool), not negative."""
    try:
        _C.rdma_check_count(value)
    except Refusal as refusal:
        raise error(refusal, lambda part: f"{label}{name}") from None
    return value
