"""The process under attack, and the genuine peer that checks it still
serves.  The target runs in its own process (c_peer.Peer), so a crash
there fails the test with its exit status instead of killing pytest.
"""

import os
import resource
import threading
import time

import numpy as np

from c_peer import CONNECT_TIMEOUT_MS, assert_bytes_equal, pattern
from dlslime_torch import _C

from rogue import TOKEN

WAIT_MS = 10000
ECHO_BYTES = 4096


def rss_kib():
    """This process's private resident set now (from /proc, not the peak):
    the heap a peer could make grow.  Shared pages are left out: an shm
    peer's rings (8 MiB, mapped populated) are resident while it is
    connected, and whether a departed one's are still mapped is what
    mappings() tells."""
    with open("/proc/self/statm") as f:
        resident, shared = (int(v) for v in f.read().split()[1:3])
    return (resident - shared) * resource.getpagesize() // 1024


def mappings():
    """How many memory mappings this process has."""
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def footprint():
    """(private resident KiB, mappings): what assert_flat compares."""
    return rss_kib(), mappings()


# A server that lets go of what each departed peer left grows by neither:
# the old code grew by about 1 KiB a peer (1-2 MiB over a test's cycles);
# a peer still connected when asked holds a ring mapping or two, one left
# behind by each departed peer would be hundreds.
GROWTH_MAX_KIB = 512
MAPPINGS_MAX = 16


def assert_flat(warm, end, who, peers):
    """The footprint end is that of warm, over peers that came and went."""
    print(f"{who}: (private KiB, mappings) {warm} -> {end} over {peers}")  # with -s
    assert end[0] - warm[0] < GROWTH_MAX_KIB, f"{who} grew by {end[0] - warm[0]} KiB over {peers} that came and went"
    assert end[1] - warm[1] < MAPPINGS_MAX, (
        f"{who} has {end[1] - warm[1]} more mappings after {peers} came and went")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def limit_fds(headroom):
    """From now on this process may open only headroom more fds."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + headroom, hard))


def target(link, transport, fd_headroom=None, token=TOKEN):
    """A context with the suite's token; on ("serve", id) it accepts
    peers until the one with context id, and echoes one message to it
    (a rogue it welcomed may come first); "rss" answers its private resident set in KiB; ("why", id) why the endpoint of
    peer id went down (why_down);
    ("fds", n) lets it open n more fds (fd_headroom at the start).  With
    token None, the context is made without one."""
    ctx = _C.Context(transport=transport, token=token)
    if fd_headroom is not None:
        limit_fds(fd_headroom)
    link.put(ctx.address())
    while True:
        cmd = link.get()
        if cmd == "bye":
            return None
        if cmd == "rss":
            link.put(rss_kib())
            continue
        if isinstance(cmd, tuple) and cmd[0] == "fds":
            limit_fds(cmd[1])
            continue
        if isinstance(cmd, tuple) and cmd[0] == "why":
            link.put(why_down(ctx, cmd[1]))
            continue
        ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
        while ep.peer_id != cmd[1]:
            ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
        buf = np.zeros(ECHO_BYTES, dtype=np.uint8)
        ep.recv(buf, tag=1).wait(timeout_ms=WAIT_MS)
        ep.send(buf, tag=2).wait(timeout_ms=WAIT_MS)
        link.put("served")


def why_down(ctx, peer_id):
    """Accepts peers until the one with context id peer_id, waits for its
    endpoint to go down, and says why (the error a send to it raises);
    None if it stays up."""
    ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
    while ep.peer_id != peer_id:
        ep = ctx.accept(timeout_ms=CONNECT_TIMEOUT_MS)
    deadline = time.monotonic() + WAIT_MS / 1000
    while ep.status == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        ep.send(np.zeros(1, dtype=np.uint8), tag=3).wait(timeout_ms=WAIT_MS)
    except _C.SlimeError as e:
        return str(e)
    return None


def assert_serves(peer, address, transport, token=TOKEN, ctx=None, timeout_ms=CONNECT_TIMEOUT_MS):
    """A genuine peer (with token; None: without one, given the target's
    address) connects to the target and gets its echo back.  The peer is
    ctx where given (closed here), else a new context."""
    peer.proc.join(0.5)  # a crash the attack caused shows by now
    assert peer.proc.is_alive(), f"the target died (exit code {peer.proc.exitcode})"
    ctx = ctx or _C.Context(transport=transport, token=token)
    peer.put(("serve", ctx.id))
    try:
        ep = ctx.connect(address, timeout_ms=timeout_ms)
        data = pattern(ECHO_BYTES, 7)
        back = np.zeros(ECHO_BYTES, dtype=np.uint8)
        r = ep.recv(back, tag=2)
        ep.send(data, tag=1).wait(timeout_ms=WAIT_MS)
        r.wait(timeout_ms=WAIT_MS)
        assert_bytes_equal(back, data, "echo from the target")
        assert peer.get() == "served"
    finally:
        ctx.close()


def serve_echo(srv, reply_timeout_ms=WAIT_MS):
    """Answers every call on the RPC server srv with its own bytes, in a
    thread, until srv is closed; the thread, for the caller to join."""
    def serve():
        while True:
            try:
                call = srv.next(timeout_ms=200)
            except _C.SlimeClosedError:
                return
            if call is not None:
                call.reply(memoryview(call), timeout_ms=reply_timeout_ms)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread
