"""One side of the cross-host test (test_c_netns.py), run inside a network
namespace with `ip netns exec`.

    python netns_peer.py --role server|client --host ADDR --dir DIR

The server publishes its address blob in DIR/server.addr; the client
reads it and dials.  Then, over tcp between the two namespaces:
  1. client -> server send of 1 MiB + 3, checked by the server;
  2. server -> client send of 3 MiB + 5, checked by the client;
  3. the server sends the descriptors of two regions: DST (zeros) and
     SRC (a pattern);
  4. the client write_imm()s a pattern into DST; the server collects the
     immediate and checks DST;
  5. the client read()s SRC and checks it;
  6. the client says "done" and both exit 0, printing "NETNS PEER OK".
Any failure raises (exit code 1).
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from dlslime_torch import _C  # noqa: E402

WAIT_MS = 30000
TOKEN = b"netns-test-token"
IMM = 0x5EED
SEND_UP = (1 << 20) + 3
SEND_DOWN = (3 << 20) + 5
REGION = (2 << 20) + 11


def pattern(nbytes, seed):
    block = np.random.default_rng(seed).integers(0, 256, 65521, dtype=np.uint8)
    return np.resize(block, nbytes)


def check(got, expected, what):
    if not np.array_equal(got, expected):
        first = int(np.argmax(got != expected))
        raise AssertionError(f"{what}: first difference at byte {first}")


def publish(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def wait_for_file(path, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.02)
    with open(path, "rb") as f:
        return f.read()


def run_server(ctx, directory):
    publish(os.path.join(directory, "server.addr"), ctx.address())
    ep = ctx.accept(timeout_ms=WAIT_MS)
    assert ep.transport == "tcp", ep.transport

    up = np.zeros(SEND_UP, dtype=np.uint8)
    r = ep.recv(up, tag=1).wait(timeout_ms=WAIT_MS)
    assert r.bytes == SEND_UP
    check(up, pattern(SEND_UP, 1), "client->server message")

    ep.send(pattern(SEND_DOWN, 2), tag=2).wait(timeout_ms=WAIT_MS)

    dst = np.zeros(REGION, dtype=np.uint8)
    src = pattern(REGION, 4).copy()
    dst_mr = ctx.reg_mr(dst)
    src_mr = ctx.reg_mr(src, access=_C.ACCESS_REMOTE_READ)
    imm = ep.imm_recv()
    ep.send(dst_mr.desc() + src_mr.desc(), tag=3).wait(timeout_ms=WAIT_MS)

    assert imm.wait(timeout_ms=WAIT_MS).imm == IMM
    check(dst, pattern(REGION, 3), "DST after the client's write_imm")

    done = bytearray(4)
    ep.recv(done, tag=4).wait(timeout_ms=WAIT_MS)
    assert bytes(done) == b"done"
    check(src, pattern(REGION, 4), "SRC after the client's read")
    dst_mr.dereg()
    src_mr.dereg()


def run_client(ctx, directory):
    addr = wait_for_file(os.path.join(directory, "server.addr"))
    ep = ctx.connect(addr, timeout_ms=WAIT_MS)
    assert ep.transport == "tcp", ep.transport

    ep.send(pattern(SEND_UP, 1), tag=1).wait(timeout_ms=WAIT_MS)

    down = np.zeros(SEND_DOWN, dtype=np.uint8)
    r = ep.recv(down, tag=2).wait(timeout_ms=WAIT_MS)
    assert r.bytes == SEND_DOWN
    check(down, pattern(SEND_DOWN, 2), "server->client message")

    descs = bytearray(128)
    ep.recv(descs, tag=3).wait(timeout_ms=WAIT_MS)
    dst_desc, src_desc = bytes(descs[:64]), bytes(descs[64:])
    assert _C.desc_length(dst_desc) == REGION

    local = pattern(REGION, 3).copy()
    local_mr = ctx.reg_mr(local)
    ep.write_imm(local_mr, 0, dst_desc, 0, REGION, IMM).wait(timeout_ms=WAIT_MS)

    local[:] = 0
    ep.read(local_mr, 0, src_desc, 0, REGION).wait(timeout_ms=WAIT_MS)
    check(local, pattern(REGION, 4), "SRC read by the client")
    local_mr.dereg()

    ep.send(b"done", tag=4).wait(timeout_ms=WAIT_MS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("server", "client"), required=True)
    parser.add_argument("--host", required=True, help="this namespace's address")
    parser.add_argument("--dir", required=True, help="where address blobs go")
    args = parser.parse_args()
    ctx = _C.Context(transport="tcp", tcp_host=args.host, token=TOKEN)
    if args.role == "server":
        run_server(ctx, args.dir)
    else:
        run_client(ctx, args.dir)
    ctx.close()
    print(f"NETNS PEER OK {args.role} {args.host}", flush=True)


if __name__ == "__main__":
    main()
