"""SlimeRPC: remote method calls over dlslime endpoints.

    from dlslime_torch import rpc

    class Echo:
        @rpc.method
        def add(self, a, b):               # Python objects; tensors as raw bytes
            return a + b

        @rpc.method(raw=True)
        def echo(self, data):              # memoryview in, bytes-like out
            return data

    # server (rank 1, or rpc.init("server", store=TCPStore(...)))
    rpc.serve(Echo(), threads=2)
    # client
    p = rpc.proxy(1, Echo)                 # or rpc.proxy("server", Echo)
    p.add(torch.ones(4), 2).wait(timeout=5)
    p.echo(b"abc", out=buf).wait()        # the reply lands in buf: a view of it

A generator method (def or async def with yield) is a stream: the caller
iterates its items as they come, `for x in p.gen(n)` or `async for`, with
at most a window of items in flight (p.gen.with_options(window=4,
timeout=5)(n)); leaving the loop early or close() stops the generator
(GeneratorExit), and an exception in it reaches the caller after the
items before it (stream.py).

rpc.init returns the default Job, the one the module-level functions
use; rpc.shutdown() leaves it, and rpc.init(name, store=<another store>)
joins another.  rpc.Job(name, store) joins a further job at the same
time (job.proxy, job.Server, job.serve, job.shutdown): each job has its
own token, and a peer of one job is refused by another (peers.py).

The datapath is the C core's (csrc/rpc/, rpc.h): requests and replies
land in pre-posted receive slots with credit-based flow control, larger
payloads move by a bulk transfer on the same endpoint.
"""

from .client import Future, Proxy, proxy, wait_all
from .errors import RemoteRpcError, ReplyTooLargeError, RpcError, RpcTimeoutError
from .peers import Job, init, shutdown
from .server import Server, serve, serve_once
from .service import method
from .stream import Stream

__all__ = ["method", "serve", "serve_once", "Server", "proxy", "Proxy", "Future", "Stream", "wait_all",
           "init", "shutdown", "Job", "RpcError", "RpcTimeoutError", "RemoteRpcError", "ReplyTooLargeError"]
