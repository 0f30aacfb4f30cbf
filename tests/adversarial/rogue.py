"""The misbehaving peer: the wire formats of csrc/core/wire.h and the shm
segment of csrc/transport/shm_internal.h, spoken from Python with raw
sockets and memfds, so a test can send what no genuine peer would.

The rogue holds the job's token (it computes the same proof as the core,
core/token.c): the attacks here are those of a peer inside the job.
"""

import collections
import fcntl
import hashlib
import os
import socket
import struct

from c_peer import CONNECT_TIMEOUT_MS
from dlslime_torch import _C

TOKEN = b"adversarial-suite-token"

HELLO_MAGIC = 0x4C4C4548
WELCOME_MAGIC = 0x434C4557
SEG_MAGIC = 0x534C494D45534547
MR_TABLE_MAGIC = 0x4D525441424C4531
TRANSPORT_TCP, TRANSPORT_SHM = 1, 2
WELCOME_OK, WELCOME_REFUSED, WELCOME_DUPLICATE = 0, 1, 2
ID_SECRET = 16                            # wire.h: SLIME_ID_SECRET

SEG_HDR = 4096
BOX_AREA = 8 * 2 * (16 * 1024 + 256)      # shm_internal.h: SHM_BOX_AREA, between header and rings
PINS_AREA = 2 * 4096 * 4                  # shm_internal.h: SHM_PINS_AREA, after the boxes
RINGS = SEG_HDR + BOX_AREA + PINS_AREA    # where ring[0]'s bytes start
RING0_TAIL, RING0_HEAD = 64, 128          # seg_hdr_t.ring[0]: dialer -> acceptor
RING_LINE, PACKET_HDR = 64, 8              # shm_internal.h: SHM_LINE, SHM_PACKET_HDR
MR_TABLE_SIZE = 64 + 4096 * 64            # sizeof(mr_shared_t)
F_READ_REQ = 7

_HELLO = struct.Struct("<IHBBQQIIQ")
_WELCOME = struct.Struct("<IHHQII96s")
_FRAME = struct.Struct("<BBHIQIIQQQQ")   # wire.h: frame_t
_FRAME_SHORT = struct.Struct("<BBHIQ")     # its short form (FF_SHORT): type to a, the length in u32
_FRAME_REST = struct.Struct("<IIQQQQ")     # the long form's rest: rkey to len
FF_SHORT = 0x4

Frame = collections.namedtuple("Frame", "type flags u32 a rkey b c d len")

_MASK = (1 << 64) - 1


def _mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def token_digest(domain, token):
    """core/token.c: token_digest."""
    h = 0xCBF29CE484222325
    for b in domain.encode() + b"\xff" + token:
        h = ((h ^ b) * 0x100000001B3) & _MASK
    return _mix(h ^ len(token))


def context_id(secret):
    """core/token.c: context_id, the id a secret proves."""
    return int.from_bytes(hashlib.sha256(b"dlslime-id-1\0" + secret).digest()[:8], "little")


# the secrets behind the ids rogue_id made: a rogue claims those as its own
_SECRETS = {}


def hello(address, transport, ctx_id, token=TOKEN, pid=None):
    """A hello to the context at address (in its wire version) from a
    context ctx_id that holds token: with the secret behind ctx_id where
    rogue_id made it, else (a squatter's claim) a secret that is not;
    naming pid as its process (default: ours)."""
    version = address_version(address)
    proof = token_digest("dlslime-hello-1", token)
    job = token_digest("dlslime-job-1", token)
    pid = os.getpid() if pid is None else pid
    head = _HELLO.pack(HELLO_MAGIC, version, transport, 0, proof, ctx_id, pid, 0, job)
    if version < 3:  # before ids were bound to a secret
        return head
    return head + _SECRETS.get(ctx_id, os.urandom(ID_SECRET))


def parse_welcome(data):
    magic, _version, verdict, ctx_id, pid, _pad, reason = _WELCOME.unpack(data)
    assert magic == WELCOME_MAGIC, f"not a welcome: {data!r}"
    return verdict, reason.split(b"\0", 1)[0].decode(errors="replace")


def address_version(address):
    """The wire version in an address blob (wire_addr_t.version)."""
    return struct.unpack_from("<H", address, 4)[0]


def address_ctx_id(address):
    """The context id in an address blob (wire_addr_t.ctx_id)."""
    return struct.unpack_from("<Q", address, 8)[0]


def rogue_id():
    """A fresh id of the rogue's own, with the secret that proves it."""
    secret = os.urandom(ID_SECRET)
    ctx_id = context_id(secret)
    _SECRETS[ctx_id] = secret
    return ctx_id


def memfd(name, size, sealed):
    """A memfd of size bytes, sealed against resizing when asked."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def segment(ring, claimed_ring=None, sealed=True):
    """The rings' segment a dialer passes: sized for ring, its header
    claiming claimed_ring (default: ring)."""
    fd = memfd("rogue-ring", RINGS + 2 * ring, sealed)
    os.pwrite(fd, struct.pack("<QQ", SEG_MAGIC, ring if claimed_ring is None else claimed_ring), 0)
    return fd


def mr_table(sealed=True):
    fd = memfd("rogue-mrs", MR_TABLE_SIZE, sealed)
    os.pwrite(fd, struct.pack("<Q", MR_TABLE_MAGIC), 0)
    return fd


def shm_dial(address, ctx_id, seg_fd, table_fd, timeout=CONNECT_TIMEOUT_MS / 1000, fds_out=None, token=TOKEN):
    """Says hello to the shm listener of the context at address with the
    two fds; returns
    the socket and the welcome (verdict, reason).  A connection the target
    drops without a word gives verdict None.  The fd that came with the
    welcome (the target's MR table) goes to fds_out if given, else closed."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    sock.connect(b"\0dlslime-%016x" % address_ctx_id(address))
    socket.send_fds(sock, [hello(address, TRANSPORT_SHM, ctx_id, token)], [seg_fd, table_fd])
    data, fds, _flags, _addr = socket.recv_fds(sock, _WELCOME.size, 1)
    for fd in fds:
        if fds_out is None:
            os.close(fd)
        else:
            fds_out.append(fd)
    if not data:
        return sock, (None, "")
    return sock, parse_welcome(data)


def packet_header(pos, length):
    """A ring packet's header (shm_internal.h: shm_packet_header): its
    length and the stamp of its line."""
    return struct.pack("<Q", ((pos // RING_LINE) & 0xFFFFFFFF) << 32 | length)


def post_frame(seg_fd, sock, frame):
    """Writes one frame into the dialer's fresh ring as its first packet
    and publishes it (the header last, and the writer's count of bytes
    sent), then rings the target's doorbell."""
    os.pwrite(seg_fd, frame, RINGS + PACKET_HDR)
    os.pwrite(seg_fd, packet_header(0, len(frame)), RINGS)
    os.pwrite(seg_fd, struct.pack("<Q", len(frame)), RING0_TAIL)
    sock.send(b"\1")


def first_packet(seg_fd, ring_at, n):
    """The first n bytes of the first packet in the ring at ring_at, once
    its header is there, or None."""
    (header,) = struct.unpack("<Q", os.pread(seg_fd, PACKET_HDR, ring_at))
    return os.pread(seg_fd, n, ring_at + PACKET_HDR) if header else None


MR_SLOTS_AT, MR_ENTRY = 64, 64              # mr_shared_t.slots, sizeof(mr_entry_t)
MR_VALID = 1


def forge_mr_entry(table_fd, slot, rkey, addr, length, access=3):
    """Writes a valid-looking entry into slot of a mapped MR table
    (mr_entry_t: state, gen, inflight, rkey, access, block_fd, addr, len)."""
    entry = struct.pack("<IIiIIiQQ", MR_VALID, 0, 0, rkey, access, -1, addr, length)
    os.pwrite(table_fd, entry, MR_SLOTS_AT + slot * MR_ENTRY)


def read_request(handle, length, req_id=1, rkey=0):
    """An F_READ_REQ frame: the target must answer it (here with an error,
    as no region has that handle)."""
    return frame(F_READ_REQ, a=handle, c=req_id, d=length, rkey=rkey)


def address_tcp_port(address):
    """The tcp listener's port in an address blob (wire_addr_t.port)."""
    return struct.unpack_from("<H", address, 56)[0]


def silent_connections(address, transport, n):
    """n connections to the target's listener that never say hello."""
    socks = []
    for _ in range(n):
        if transport == "shm":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(b"\0dlslime-%016x" % address_ctx_id(address))
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.connect(("127.0.0.1", address_tcp_port(address)))
        socks.append(s)
    return socks


F_EAGER, F_RTS, F_IMM = 1, 2, 9


def frame(ftype, a=0, b=0, c=0, d=0, u32=0, length=0, flags=0, rkey=0):
    """A frame header in its long form (wire.h: frame_t)."""
    return _FRAME.pack(ftype, flags, 0, u32, a, rkey, 0, b, c, d, length)


def read_frame(recv_exact):
    """The next frame header from recv_exact(n) (n bytes, all of them),
    in either form, as a Frame."""
    ftype, flags, _pad, u32, a = _FRAME_SHORT.unpack(recv_exact(_FRAME_SHORT.size))
    if flags & FF_SHORT:
        return Frame(ftype, flags & ~FF_SHORT, 0, a, 0, 0, 0, 0, u32)
    rkey, _pad2, b, c, d, length = _FRAME_REST.unpack(recv_exact(_FRAME_REST.size))
    return Frame(ftype, flags, u32, a, rkey, b, c, d, length)


def tcp_session(address, ctx_id, timeout=CONNECT_TIMEOUT_MS / 1000, pid=None):
    """A connection the target welcomed as peer ctx_id (of process pid,
    by its hello), its frames ours to send."""
    sock = socket.create_connection(("127.0.0.1", address_tcp_port(address)), timeout=timeout)
    sock.sendall(hello(address, TRANSPORT_TCP, ctx_id, pid=pid))
    data = b""
    while len(data) < _WELCOME.size:
        chunk = sock.recv(_WELCOME.size - len(data))
        assert chunk, "the target hung up on the hello"
        data += chunk
    verdict, reason = parse_welcome(data)
    assert verdict == WELCOME_OK, reason
    return sock


def tcp_dial(address, ctx_id, token=TOKEN, timeout=CONNECT_TIMEOUT_MS / 1000):
    """Says hello to the tcp listener of the context at address; returns
    the welcome (verdict, reason), verdict None if it hung up instead."""
    with socket.create_connection(("127.0.0.1", address_tcp_port(address)), timeout=timeout) as sock:
        sock.sendall(hello(address, TRANSPORT_TCP, ctx_id, token))
        data = b""
        while len(data) < _WELCOME.size:
            chunk = sock.recv(_WELCOME.size - len(data))
            if not chunk:
                return None, ""
            data += chunk
    return parse_welcome(data)


def proc_cpu_seconds(pid):
    """User + system CPU time of process pid so far (/proc/pid/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---- SlimeRPC (csrc/rpc/rpc_internal.h) ----
RPC_MAGIC = 0x43505253
RPC_REQUEST = 3
RPC_F_BULK = 0x1
RPC_TAG_SPACE = 0xFFFF << 48
_RPC_HDR = struct.Struct("<IHBBIIQQQQ")


def rpc_request_tag(port):
    return RPC_TAG_SPACE | port  # kind 00: the request mailbox


def rpc_bulk_announcement(cid, method, req_id, length, slot=64 << 10):
    """A request header that says its payload of length bytes follows by
    bulk (which the rogue never sends)."""
    return _RPC_HDR.pack(RPC_MAGIC, _C.RPC_VERSION, RPC_REQUEST, RPC_F_BULK, cid, 0, method, req_id, length, slot)


def proc_vm_kib(pid):
    """Address space of process pid (VmSize), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    raise AssertionError("no VmSize")
