"""Messages of default methods: a pickle whose tensors travel outside it.

Layout (little endian):
    b"SRP1" | u32 n | u64 pickle_len | n x (u64 offset, u64 nbytes) |
    pickle | segments, each at a 64-byte aligned offset

A tensor in the arguments or the result is pickled as a reference to
its segment (persistent_id); the receiver rebuilds it with
torch.frombuffer over the received memory (no copy; the memory lives as
long as the tensor).  torch is imported only when a message holds
tensors.  The largest tensor of TAIL_MIN bytes or more is the message's
tail: its segment comes last and is sent straight from the tensor's
memory (RpcClient.call / RpcCall.reply's tail), everything before it
(the head) is written into a buffer; smaller tensors are copied into the
head.  So a call with one large tensor moves its bytes once each way,
as a raw call does.

Speed matters here: this is all a default call does beyond a raw one.
The bytes move by memmove, never by a torch op (a copy_ of 32 Ki
elements or more wakes torch's intra-op thread pool, whose spinning
threads cost milliseconds on a busy host); picklers and unpicklers are
plain C ones given a persistent_id / persistent_load attribute, so no
Python __init__ runs per message.
"""

import ctypes
import io
import pickle
import struct
import sys
import threading

MAGIC = b"SRP1"
_HEAD = struct.Struct("<4sIQ")
_SEG = struct.Struct("<QQ")
ALIGN = 64
TAIL_MIN = 64 << 10
_PROTO = pickle.HIGHEST_PROTOCOL

_dtype_names = {}   # torch.dtype -> its name in the torch module, both ways
_dtypes = {}


def _dtype_name(dtype):
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).split(".")[-1]
        _dtypes[name] = dtype
    return name


def _dtype(torch, name):
    dtype = _dtypes.get(name)
    if dtype is None:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"unknown tensor dtype {name!r}")
        _dtypes[name] = dtype
    return dtype


def _numpy():
    """numpy, which lends a tensor's memory the buffer protocol; None
    without it (tensors are then copied into the message)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _tensor_ids(tensor_type, tensors):
    """The persistent_id of a pickler that sends tensors out of band."""
    def persistent_id(obj):
        if not isinstance(obj, tensor_type):
            return None
        t = obj
        if not t.is_cpu or not t.is_contiguous():
            t = t.detach().cpu().contiguous()
        tensors.append(t)
        return ("T", len(tensors) - 1, _dtype_name(t.dtype), tuple(t.shape))
    return persistent_id


def _address(buf, nbytes):
    """Address of a writable buffer; the ctypes view holds it exported:
    drop the view before the buffer's owner needs it unexported."""
    view = (ctypes.c_char * nbytes).from_buffer(buf)
    return view, ctypes.addressof(view)


class Encoded:
    """A message ready to be written: its length, and write_into(buffer)."""

    __slots__ = ("pickled", "tensors", "offsets", "sizes", "nbytes", "tail", "head_len")

    def __init__(self, obj):
        torch = sys.modules.get("torch")
        f = io.BytesIO()
        self.tensors = []
        p = pickle.Pickler(f, _PROTO)
        if torch is not None:
            p.persistent_id = _tensor_ids(torch.Tensor, self.tensors)
        p.dump(obj)
        self.pickled = f.getbuffer()
        self.sizes = [t.numel() * t.element_size() for t in self.tensors]
        self.tail = None
        if self.sizes and max(self.sizes) >= TAIL_MIN and _numpy() is not None:
            self.tail = self.sizes.index(max(self.sizes))
        pos = _HEAD.size + _SEG.size * len(self.tensors) + len(self.pickled)
        self.offsets = [0] * len(self.tensors)
        order = list(range(len(self.tensors)))
        if self.tail is not None:   # the tail's segment goes last
            order.append(order.pop(self.tail))
        for i in order:
            pos = (pos + ALIGN - 1) // ALIGN * ALIGN
            self.offsets[i] = pos
            pos += self.sizes[i]
        self.nbytes = pos
        self.head_len = pos if self.tail is None else self.offsets[self.tail]

    def write_into(self, buf):
        """Writes the message into buf (writable, at least nbytes)."""
        self._write(buf, None)

    def write_head(self, buf):
        """Writes the message's first head_len bytes (all of it but the
        tail's segment) into buf."""
        self._write(buf, self.tail)

    def tail_buffer(self):
        """The tail tensor's bytes as a buffer-protocol object (None
        without a tail): sent from the tensor's memory, which it keeps."""
        if self.tail is None:
            return None
        import torch
        return self.tensors[self.tail].reshape(-1).view(torch.uint8).numpy()

    def _write(self, buf, skip):
        mv = memoryview(buf).cast("B")
        try:
            _HEAD.pack_into(mv, 0, MAGIC, len(self.tensors), len(self.pickled))
            pos = _HEAD.size
            for off, n in zip(self.offsets, self.sizes):
                _SEG.pack_into(mv, pos, off, n)
                pos += _SEG.size
            mv[pos:pos + len(self.pickled)] = self.pickled
            copies = [i for i, n in enumerate(self.sizes) if n and i != skip]
            if copies:
                view, base = _address(mv, len(mv))
                for i in copies:
                    ctypes.memmove(base + self.offsets[i], self.tensors[i].data_ptr(), self.sizes[i])
                del view
        finally:
            mv.release()

    def to_scratch(self):
        """(buffer, view of the head written into it, tail_buffer()): the
        message to send; give the buffer back with scratch_put once the
        message has left."""
        buf = _scratch.take(self.head_len)
        view = memoryview(buf)[:self.head_len]
        self.write_head(view)
        return buf, view, self.tail_buffer()


class _ScratchPool:
    """Large message buffers kept for reuse.  A fresh bytearray of many MiB
    is fresh memory: the writes into it fault in one page per 4 KiB every
    call, which costs more than moving the bytes over shm."""

    MIN = 256 << 10
    IDLE_MAX = 4

    def __init__(self):
        self._lock = threading.Lock()
        self._idle = []

    def take(self, nbytes):
        if nbytes >= self.MIN:
            with self._lock:   # the smallest that fits, if not twice too large
                fits = [b for b in self._idle if nbytes <= len(b) <= 2 * nbytes]
                if fits:
                    best = min(fits, key=len)
                    self._idle.remove(best)
                    return best
        return bytearray(nbytes)

    def put(self, buf):
        if len(buf) >= self.MIN:
            with self._lock:
                if len(self._idle) == self.IDLE_MAX:
                    self._idle.pop(0)
                self._idle.append(buf)


_scratch = _ScratchPool()
scratch_put = _scratch.put


def _tensor_loader(mv, segments):
    """The persistent_load of an unpickler: tensors over mv's segments."""
    def persistent_load(pid):
        tag, index, dtype_name, shape = pid
        if tag != "T" or not 0 <= index < len(segments):
            raise pickle.UnpicklingError(f"unknown out-of-band object {pid!r}")
        import torch
        dtype = _dtype(torch, dtype_name)
        offset, nbytes = segments[index]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(mv, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        return flat if len(shape) == 1 else flat.view(*shape)
    return persistent_load


def decode(view):
    """The object in a message (a writable buffer that the tensors will
    alias: keep it alive, as they do)."""
    mv = memoryview(view).cast("B")
    if len(mv) < _HEAD.size:
        raise ValueError(f"a {len(mv)}-byte rpc message is too short")
    magic, n, plen = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ValueError(f"not a SlimeRPC message (magic {bytes(magic)!r})")
    start = _HEAD.size + _SEG.size * n
    if start + plen > len(mv):
        raise ValueError("an rpc message's pickle lies outside the message")
    segments = [_SEG.unpack_from(mv, _HEAD.size + _SEG.size * i) for i in range(n)]
    for off, nbytes in segments:
        if off + nbytes > len(mv):
            raise ValueError("an rpc message segment lies outside the message")
    u = pickle.Unpickler(io.BytesIO(mv[start:start + plen]))
    if n:
        u.persistent_load = _tensor_loader(mv, segments)
    return u.load()


def warm_up():
    """Runs every step of a tensor message once, so that the first real
    call does not pay for torch's lazy set-up of the ops it uses."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    enc = Encoded(((torch.zeros(16), torch.zeros(0, dtype=torch.uint8), torch.zeros(TAIL_MIN // 4)), {}))
    buf = bytearray(enc.nbytes)
    enc.write_into(buf)
    memoryview(enc.tail_buffer() if enc.tail is not None else b"").release()
    decode(buf)
