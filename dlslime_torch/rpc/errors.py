"""The exceptions of SlimeRPC."""


class RpcError(RuntimeError):
    """An RPC failed: no channel, the server is gone, a closed client."""


class RpcTimeoutError(RpcError, TimeoutError):
    """A call did not complete in time; its late reply will be dropped."""


class ReplyTooLargeError(RpcError):
    """A raw call's reply did not fit the out= buffer given for it.  The
    reply is not lost: `reply` is a memoryview of it (in memory of its
    own), `size` its length and `capacity` the buffer's."""

    def __init__(self, size, capacity, reply):
        self.size = size
        self.capacity = capacity
        self.reply = reply
        super().__init__(f"rpc: the {size}-byte reply does not fit the {capacity}-byte out= buffer "
                         "(it is kept in this error's .reply)")


class RemoteRpcError(RpcError):
    """The remote handler raised.  remote_type, remote_message and
    remote_traceback describe the exception on the server."""

    def __init__(self, remote_type, remote_message, remote_traceback=""):
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        text = f"{remote_type}: {remote_message}"
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)


def encode_remote(exc_type, message, traceback_text=""):
    """The error payload of a failed call: "Type\\0message\\0traceback"."""
    return b"\0".join(s.encode("utf-8", "replace") for s in (exc_type, message, traceback_text))


def decode_remote(payload):
    """RemoteRpcError from an error payload (the C layer writes the same
    format for its own errors, as type RpcError)."""
    parts = bytes(payload).split(b"\0")
    parts += [b""] * (3 - len(parts))
    return RemoteRpcError(*(p.decode("utf-8", "replace") for p in parts[:3]))
