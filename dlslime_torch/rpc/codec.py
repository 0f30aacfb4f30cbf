"""Messages of default methods: a pickle whose tensors travel outside it.

Layout (little endian):
    b"SRP1" | u32 n | u64 pickle_len | n x (u64 offset, u64 nbytes) |
    pickle | segments, each at a 64-byte aligned offset

A tensor in the arguments or the result is pickled as a reference to
its segment (persistent_id), and its bytes are copied once, raw, into
the message; the receiver rebuilds it with torch.frombuffer over the
received memory (no copy; the memory lives as long as the tensor).
torch is imported only when a message holds tensors.
"""

import io
import pickle
import struct
import sys
import threading

MAGIC = b"SRP1"
_HEAD = struct.Struct("<4sIQ")
_SEG = struct.Struct("<QQ")
ALIGN = 64


def _torch():
    return sys.modules.get("torch")


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            self.tensors.append(t)
            return ("T", len(self.tensors) - 1, str(t.dtype).split(".")[-1], tuple(t.shape))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, view, segments):
        super().__init__(f)
        self.view = view
        self.segments = segments

    def persistent_load(self, pid):
        tag, index, dtype_name, shape = pid
        if tag != "T":
            raise pickle.UnpicklingError(f"unknown out-of-band object {tag!r}")
        import torch
        dtype = getattr(torch, dtype_name)
        offset, nbytes = self.segments[index]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self.view, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        return flat.reshape(shape)


class Encoded:
    """A message ready to be written: its length, and write_into(buffer)."""

    __slots__ = ("pickled", "tensors", "offsets", "nbytes")

    def __init__(self, obj):
        f = io.BytesIO()
        self.tensors = []
        _Pickler(f, self.tensors).dump(obj)
        self.pickled = f.getbuffer()
        pos = _HEAD.size + _SEG.size * len(self.tensors) + len(self.pickled)
        self.offsets = []
        for t in self.tensors:
            pos = (pos + ALIGN - 1) // ALIGN * ALIGN
            self.offsets.append(pos)
            pos += t.numel() * t.element_size()
        self.nbytes = pos

    def write_into(self, buf):
        """Writes the message into buf (writable, at least nbytes)."""
        mv = memoryview(buf).cast("B")
        _HEAD.pack_into(mv, 0, MAGIC, len(self.tensors), len(self.pickled))
        pos = _HEAD.size
        for t, off in zip(self.tensors, self.offsets):
            _SEG.pack_into(mv, pos, off, t.numel() * t.element_size())
            pos += _SEG.size
        mv[pos:pos + len(self.pickled)] = self.pickled
        if self.tensors:
            torch = _torch()
            for t, off in zip(self.tensors, self.offsets):
                n = t.numel() * t.element_size()
                if n:
                    dst = torch.frombuffer(mv, dtype=torch.uint8, count=n, offset=off)
                    dst.copy_(t.reshape(-1).view(torch.uint8))
        mv.release()

    def to_scratch(self):
        """(buffer, view of its first nbytes) with the message written in;
        give the buffer back with scratch_put once the message has left."""
        buf = _scratch.take(self.nbytes)
        view = memoryview(buf)[:self.nbytes]
        self.write_into(view)
        return buf, view


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


def decode(view):
    """The object in a message (a writable buffer that the tensors will
    alias: keep it alive, as they do)."""
    mv = memoryview(view).cast("B")
    if len(mv) < _HEAD.size:
        raise ValueError(f"a {len(mv)}-byte rpc message is too short")
    magic, n, plen = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ValueError(f"not a SlimeRPC message (magic {bytes(magic)!r})")
    segments = [_SEG.unpack_from(mv, _HEAD.size + _SEG.size * i) for i in range(n)]
    start = _HEAD.size + _SEG.size * n
    for off, nbytes in segments:
        if off + nbytes > len(mv):
            raise ValueError("an rpc message segment lies outside the message")
    return _Unpickler(io.BytesIO(mv[start:start + plen]), mv, segments).load()
