"""Messages of default methods: the arguments or the result, tensors out
of band.

The codec is C (csrc/python/codec.h has the layout): None, bool, int,
float, str, bytes, tuples, lists and dicts of those, and torch tensors
are written with tags, with no Python code per object.  Anything else
(a class, a subclass of those types, an int beyond 64 bits) makes the
whole message a pickle, whose tensors still travel out of band: a flag
in the message's head says which.  The receiver rebuilds a tensor of
TAIL_MIN bytes or more over the received memory (no copy; the memory
lives as long as the tensor) and copies a smaller one; a pickled
message's tensors are all rebuilt over the memory.  torch is imported
only when a message holds tensors.  Where the shim (dlslime_torch._shim)
loads, the C codec reads and makes tensors through its ATen calls, else
through torch's Python API (new_empty, torch.frombuffer: two to three
times the time a tensor); _C.codec_tensor_path() says which.

The largest tensor of TAIL_MIN bytes or more is the message's tail: its
segment comes last and is sent straight from the tensor's memory
(RpcClient.call / RpcCall.reply's tail); the head (everything before it)
is one bytes object, into which smaller tensors are copied.  So a call
with one large tensor moves its bytes once each way, as a raw call does.
"""

import io
import pickle
import sys

from .. import _C

TAIL_MIN = _C.CODEC_TAIL_MIN
DEPTH_MAX = _C.CODEC_DEPTH_MAX
_PROTO = pickle.HIGHEST_PROTOCOL


def _dtype(torch, name):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError(f"unknown tensor dtype {name!r}")
    return dtype


def pickle_body(obj, tensors):
    """The pickle of obj; its tensors are appended to tensors (the C
    codec sends them as segments) and pickled as their index.  A tensor
    subclass (nn.Parameter) pickles by its own reduce, whose plain tensor
    inside is a segment, so it comes back as its class."""
    f = io.BytesIO()
    p = pickle.Pickler(f, _PROTO)
    torch = sys.modules.get("torch")
    if torch is not None:
        tensor_type = torch.Tensor

        def persistent_id(o):
            if type(o) is not tensor_type:
                return None
            t = o if o.is_cpu and o.is_contiguous() else o.detach().cpu().contiguous()
            tensors.append(t)
            return ("T", len(tensors) - 1, str(t.dtype).split(".")[-1], tuple(t.shape))
        p.persistent_id = persistent_id
    p.dump(obj)
    return f.getbuffer()


def unpickle_body(message, start, end, segments):
    """The object in a pickled body message[start:end]; its tensors over
    the message's segments.  ValueError if it does not unpickle."""
    mv = memoryview(message).cast("B")
    u = pickle.Unpickler(io.BytesIO(mv[start:end]))

    def persistent_load(pid):
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "T"
                and isinstance(pid[1], int) and 0 <= pid[1] < len(segments)):
            raise pickle.UnpicklingError(f"unknown out-of-band object {pid!r}")
        import torch
        _, index, dtype_name, shape = pid
        dtype = _dtype(torch, dtype_name)
        offset, nbytes = segments[index]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(mv, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        return flat if len(shape) == 1 else flat.view(*shape)
    u.persistent_load = persistent_load
    try:
        return u.load()
    except Exception as exc:   # whatever a corrupt pickle raises, one kind of error
        raise ValueError(f"malformed rpc message: its pickle: {exc!r}") from exc


def encode(obj):
    """(head, tail): the message of obj.  head is bytes; tail is None or a
    buffer over the largest tensor's memory (which it keeps), to be sent
    right after head."""
    return _C.codec_encode(obj, pickle_body)


def decode(message):
    """The object in a message (a buffer object that the tensors will
    alias: they keep it alive).  ValueError if it is malformed."""
    return _C.codec_decode(message, unpickle_body)


def warm_up():
    """Runs every step of a tensor message once, so that the first real
    call does not pay for torch's lazy set-up of the ops it uses."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    obj = ((torch.zeros(16), torch.zeros(0, dtype=torch.uint8), torch.zeros(TAIL_MIN // 4).view(2, -1)), {})
    for o in (obj, (obj, object)):   # the tagged and the pickled path
        head, tail = encode(o)
        decode(bytearray(head) + (bytes(memoryview(tail)) if tail is not None else b""))
