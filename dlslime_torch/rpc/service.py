"""Service definitions: @method, method ids, the service digest and port.

A service is a class; its remote methods carry @method.  The service's
name is its module and qualified name (or the class attribute rpc_name),
and every id derives from names only, so the two sides agree without
talking: a method's id hashes "<service>.<method>", the port the server
listens on hashes the service name, and the digest hashes every method's
name and kind (and the codec's version), so that a client and a server
with different definitions are refused at connect time instead of
calling the wrong method.
"""

import hashlib
import inspect

KIND_DEFAULT = "default"   # args and result by codec.py, tensors as raw bytes
KIND_RAW = "raw"           # bytes in, bytes-like out
KIND_INPLACE = "raw_inplace"  # bytes in, reply written into the send buffer
KIND_STREAM = "stream"     # a generator: the caller iterates its items (stream.py)


def method(fn=None, *, raw=False, inplace=False, max_reply=None):
    """Marks a remote method.

    @method: called with Python arguments (tensors move as raw bytes);
    @method(raw=True): handler(self, data) gets a memoryview of the request
    (no copy, valid during the call) and returns bytes-like; a memoryview
    of the request it returns (data, a slice, changed in place or not) is
    answered with no copy and released with the reply;
    @method(raw=True, inplace=True): handler(self, data, out) writes the
    reply into the writable memoryview out (max_reply bytes; default the
    larger of the request's length and 64 KiB) and returns its length;
    @method on a generator function (def or async def with yield): a
    stream, whose items the caller iterates as they come (stream.py).
    """
    if inplace and not raw:
        raise ValueError("@method(inplace=True) needs raw=True")

    def mark(f):
        kind = KIND_INPLACE if inplace else KIND_RAW if raw else KIND_DEFAULT
        if inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f):
            if raw:
                raise ValueError(f"{f.__qualname__} is a generator: a stream of Python objects, "
                                 "not a raw method")
            kind = KIND_STREAM
        f.__slime_rpc__ = {"kind": kind, "max_reply": max_reply}
        return f

    return mark(fn) if fn is not None else mark


# The message format of default methods (codec.py); in the digest, so a
# peer with another format is refused at connect instead of misreading.
CODEC_VERSION = 2


def _h64(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class ServiceSpec:
    """What both sides derive from a service class."""

    def __init__(self, cls):
        if not isinstance(cls, type):
            cls = type(cls)
        self.cls = cls
        # a spawned child imports the parent's __main__ as __mp_main__
        module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
        self.name = getattr(cls, "rpc_name", None) or f"{module}.{cls.__qualname__}"
        self.methods = {}          # name -> (id, kind, max_reply)
        for attr in dir(cls):
            fn = getattr(cls, attr, None)
            info = getattr(fn, "__slime_rpc__", None)
            if info is not None:
                self.methods[attr] = (_h64(f"{self.name}.{attr}"), info["kind"], info["max_reply"])
        if not self.methods:
            raise TypeError(f"{self.name} has no @method: nothing to serve or call")
        self.by_id = {mid: (name, kind, mr) for name, (mid, kind, mr) in self.methods.items()}
        if len(self.by_id) != len(self.methods):
            raise TypeError(f"{self.name}: two methods hash to one id; rename one")
        definition = self.name + "|" + ";".join(f"{n}:{k}" for n, (_, k, _) in sorted(self.methods.items()))
        self.digest = _h64(f"digest|codec{CODEC_VERSION}|" + definition)
        self.port = _h64("port|" + self.name) & 0xFFFF


_specs = {}


def spec_of(cls):
    """The (cached) ServiceSpec of a class or instance."""
    if not isinstance(cls, type):
        cls = type(cls)
    spec = _specs.get(cls)
    if spec is None:
        spec = _specs[cls] = ServiceSpec(cls)
    return spec
