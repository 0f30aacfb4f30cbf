"""Two processes move bytes through dlslime_torch._C.

Rank 0 and rank 1 each open a context, swap address blobs through a
multiprocessing pipe (the out-of-band exchange torchrun's store will do
later), connect, and then:

  1. send/recv: rank 1 sends a buffer to rank 0, several times;
  2. write + write_imm: rank 1 writes into a region rank 0 registered;
     the immediate value tells rank 0 the data is in place;
  3. read: rank 1 reads a region rank 0 registered.

Every transfer is checked against the bytes that were sent, and the
demo prints what moved and how fast.  It exits non-zero if anything
failed or a process hung.

    python examples/p2p_demo.py [--size-mib 64] [--iters 5] [--transport shm|tcp|auto]
"""

import argparse
import multiprocessing as mp
import sys
import time
import traceback

TIMEOUT_MS = 30_000
TAG_DATA = 1
TAG_DESC = 2
TAG_DONE = 3
IMM_WRITTEN = 0x5EED


def pattern(size, salt):
    """Deterministic bytes that differ per salt, so a wrong copy shows."""
    block = bytes((i * 7 + salt) & 0xFF for i in range(251))  # prime length
    return bytearray((block * (size // len(block) + 1))[:size])


def rate(nbytes, seconds):
    return f"{nbytes / seconds / 1e9:6.2f} GB/s" if seconds > 0 else "n/a"


def say(rank, text):
    # One write per line, so the two ranks' lines do not interleave.
    sys.stdout.write(f"[rank {rank}] {text}\n")
    sys.stdout.flush()


def check(what, got, want):
    if bytes(got) != bytes(want):
        first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
        raise AssertionError(f"{what}: bytes differ (lengths {len(got)}/{len(want)}, "
                             f"first difference at {first})")


def rank0(C, ctx, ep, conn, size, iters):
    """Passive side: receives, and exposes regions for one-sided ops."""
    # One slice per message, all posted before rank 1 starts, so each
    # message is checked on its own and the timing sees no late receive.
    sent = pattern(size, salt=1)
    inbox = bytearray(iters * size)
    view = memoryview(inbox)
    reqs = [ep.recv(view[i * size:(i + 1) * size], TAG_DATA) for i in range(iters)]
    conn.send("receives posted")
    for req in reqs:
        req.wait(TIMEOUT_MS)
        if req.bytes != size:
            raise AssertionError(f"recv got {req.bytes} bytes, expected {size}")
    ep.send(b"", TAG_DATA).wait(TIMEOUT_MS)  # ack: all messages arrived
    for i in range(iters):
        check(f"send/recv message {i}", view[i * size:(i + 1) * size], sent)
    view.release()
    say(0, f"send/recv: {iters} messages of {size} bytes verified")

    target = bytearray(size)            # rank 1 writes here
    source = pattern(size, salt=3)      # rank 1 reads this
    target_mr = ctx.reg_mr(target, access=C.ACCESS_REMOTE_WRITE)
    source_mr = ctx.reg_mr(source, access=C.ACCESS_REMOTE_READ)
    imm = ep.imm_recv()
    ep.send(target_mr.desc() + source_mr.desc(), TAG_DESC).wait(TIMEOUT_MS)

    imm.wait(TIMEOUT_MS)
    if imm.imm != IMM_WRITTEN:
        raise AssertionError(f"imm {imm.imm:#x}, expected {IMM_WRITTEN:#x}")
    check("write", target, pattern(size, salt=2))
    say(0, f"write: {size} bytes verified (signalled by imm {imm.imm:#x})")

    # The regions must stay registered until rank 1 has finished reading.
    ep.recv(bytearray(0), TAG_DONE).wait(TIMEOUT_MS)
    target_mr.dereg()
    source_mr.dereg()


def rank1(C, ctx, ep, conn, size, iters):
    """Active side: sends, writes and reads, and reports the rates."""
    outbox = pattern(size, salt=1)
    ack = bytearray(0)
    conn.recv()  # rank 0 has posted its receives
    start = time.perf_counter()
    reqs = [ep.send(outbox, TAG_DATA) for _ in range(iters)]
    for req in reqs:
        req.wait(TIMEOUT_MS)
    ep.recv(ack, TAG_DATA).wait(TIMEOUT_MS)
    elapsed = time.perf_counter() - start
    say(1, f"send/recv  {iters} x {size >> 20} MiB in {elapsed * 1e3:8.1f} ms  {rate(iters * size, elapsed)}")

    descs = bytearray(2 * C.DESC_SIZE)
    ep.recv(descs, TAG_DESC).wait(TIMEOUT_MS)
    target_desc, source_desc = bytes(descs[:C.DESC_SIZE]), bytes(descs[C.DESC_SIZE:])

    written = pattern(size, salt=2)
    written_mr = ctx.reg_mr(written)
    start = time.perf_counter()
    for _ in range(iters - 1):
        ep.write(written_mr, 0, target_desc, 0, size).wait(TIMEOUT_MS)
    ep.write_imm(written_mr, 0, target_desc, 0, size, IMM_WRITTEN).wait(TIMEOUT_MS)
    elapsed = time.perf_counter() - start
    say(1, f"write      {iters} x {size >> 20} MiB in {elapsed * 1e3:8.1f} ms  {rate(iters * size, elapsed)}")

    landed = bytearray(size)
    landed_mr = ctx.reg_mr(landed)
    start = time.perf_counter()
    for _ in range(iters):
        ep.read(landed_mr, 0, source_desc, 0, size).wait(TIMEOUT_MS)
    elapsed = time.perf_counter() - start
    say(1, f"read       {iters} x {size >> 20} MiB in {elapsed * 1e3:8.1f} ms  {rate(iters * size, elapsed)}")
    check("read", landed, pattern(size, salt=3))
    say(1, f"read: {size} bytes verified")

    ep.send(b"", TAG_DONE).wait(TIMEOUT_MS)
    written_mr.dereg()
    landed_mr.dereg()


def worker(rank, conn, size, iters, transport):
    try:
        from dlslime_torch import _C as C

        with C.Context(transport=transport) as ctx:
            conn.send(ctx.address())
            peer_address = conn.recv()
            # Rank 1 dials, rank 0 takes the incoming endpoint.
            ep = ctx.connect(peer_address, TIMEOUT_MS) if rank == 1 else ctx.accept(TIMEOUT_MS)
            say(rank, f"connected over {ep.transport} (context {ctx.id:#018x})")
            (rank0 if rank == 0 else rank1)(C, ctx, ep, conn, size, iters)
        say(rank, "done")
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64, help="bytes per transfer, in MiB")
    parser.add_argument("--iters", type=int, default=5, help="transfers per operation")
    parser.add_argument("--transport", choices=["auto", "shm", "tcp"], default=None,
                        help="force a transport (default: $DLSLIME_TRANSPORT, else auto)")
    args = parser.parse_args()
    if args.size_mib < 1 or args.iters < 1:
        parser.error("--size-mib and --iters must be at least 1")
    size = args.size_mib << 20

    spawn = mp.get_context("spawn")
    end0, end1 = spawn.Pipe()
    procs = [spawn.Process(target=worker, args=(rank, end, size, args.iters, args.transport))
             for rank, end in ((0, end0), (1, end1))]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 3 * TIMEOUT_MS / 1000 + 30
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    failed = False
    for rank, p in enumerate(procs):
        if p.is_alive():
            print(f"rank {rank} hung; terminating it", file=sys.stderr)
            p.terminate()
            p.join(5)
            failed = True
        elif p.exitcode != 0:
            print(f"rank {rank} failed (exit code {p.exitcode})", file=sys.stderr)
            failed = True
    print("p2p demo: " + ("FAILED" if failed else "all transfers verified"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
