"""Services and process bodies for the SlimeRPC API tests (importable by
spawned processes)."""

import os
import time

import torch

from dlslime_torch import rpc


class Calc:
    rpc_name = "tests.Calc"

    @rpc.method
    def add(self, a, b=0, *, scale=1):
        return (a + b) * scale

    @rpc.method
    def pack(self, *tensors, **named):
        """Returns what it got, so dtypes, shapes and bytes round trip."""
        return {"tensors": list(tensors), "named": named, "pid": os.getpid()}

    @rpc.method(raw=True)
    def echo(self, data):
        return data

    @rpc.method(raw=True, inplace=True)
    def reverse(self, data, out):
        n = len(data)
        out[:n] = data[::-1]
        return n

    @rpc.method
    def boom(self, text):
        raise KeyError(text)

    @rpc.method
    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

    @rpc.method
    def thread_name(self):
        import threading
        time.sleep(0.05)
        return threading.current_thread().name


class Blobs:
    """Raw methods whose replies are, or are not, ranges of the request
    (for lent payloads: test_rpc_lend.py)."""
    rpc_name = "tests.Blobs"

    def __init__(self):
        self.kept = []

    @rpc.method(raw=True)
    def echo(self, data):
        return data

    @rpc.method(raw=True)
    def bump_tail(self, data):
        """Adds 1 to the first 4 bytes in place, replies from byte 2 on."""
        for i in range(4):
            data[i] = (data[i] + 1) % 256
        return data[2:]

    @rpc.method(raw=True)
    def copy(self, data):
        return bytes(data)

    @rpc.method(raw=True)
    def write_pages(self, data):
        """Writes a byte in each page of the payload in place; replies
        with the page faults this thread took meanwhile."""
        import resource
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for i in range(0, len(data), 4096):
            data[i] = 1
        return str(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before).encode()

    @rpc.method(raw=True)
    def as_array(self, data):
        import numpy as np
        return np.frombuffer(data, dtype=np.uint8)

    @rpc.method(raw=True)
    def keep(self, data):
        """Keeps a view past the reply; replies its first 8 bytes."""
        self.kept.append(data[8:])
        return bytes(data[:8])

    @rpc.method
    def tensor_echo(self, t, scale=None):
        return t if scale is None else t * scale

    @rpc.method
    def tensor_keep(self, t):
        """Keeps the argument (it aliases the request); replies its first 4 values."""
        self.kept.append(t)
        return t[:4].clone()

    @rpc.method(raw=True)
    def kept_intact(self, digest):
        """Whether every kept view still holds what was sent (by its sha256)."""
        import hashlib
        return b"".join(hashlib.sha256(v.numpy().tobytes() if hasattr(v, "numpy") else bytes(v)).digest()
                        for v in self.kept)


def serve_blobs(rank, size, store, name):
    rpc.init(name, store=store)
    with rpc.Server(Blobs(), threads=2).start() as server:
        store.wait(["stop"])
        served = server.served
    rpc.shutdown()
    return served


class CalcOtherDefinition:
    """Same service name as Calc, other methods: refused at connect."""
    rpc_name = "tests.Calc"

    @rpc.method
    def add(self, a, b=0):
        return a + b


def serve_calc(rank, size, store, name, threads):
    """Serves Calc as `name` until the test sets 'stop'."""
    rpc.init(name, store=store)
    with rpc.Server(Calc(), threads=threads).start() as server:
        store.wait(["stop"])
        served = server.served
    rpc.shutdown()
    return served


def serve_calc_until_killed(rank, size, store, name):
    rpc.init(name, store=store)
    rpc.Server(Calc(), threads=1).start()
    time.sleep(120)
