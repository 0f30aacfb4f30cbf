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

The datapath is the C core's (csrc/rpc/, rpc.h): requests and replies
land in pre-posted receive slots with credit-based flow control, larger
payloads move by a bulk transfer on the same endpoint.
"""

from .client import Future, Proxy, proxy, wait_all
from .errors import RemoteRpcError, ReplyTooLargeError, RpcError, RpcTimeoutError
from .peers import init, shutdown
from .server import Server, serve, serve_once
from .service import method

__all__ = ["method", "serve", "serve_once", "Server", "proxy", "Proxy", "Future", "wait_all", "init",
           "shutdown", "RpcError", "RpcTimeoutError", "RemoteRpcError", "ReplyTooLargeError"]
