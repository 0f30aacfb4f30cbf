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
