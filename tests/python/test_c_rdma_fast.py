"""Context.rdma_post / rdma_batch, the C fast path of dlslime_torch.rdma:
a good op moves the right bytes; every op the Python path must judge
(bad or unusual) gives None with nothing posted, nothing held and the
target untouched; malformed arguments raise.  Two contexts of this
process stand for the two sides (b owns the remote tensor).

And _C.rdma_check (with rdma_check_tensor, rdma_check_count), the same
checks as the checked Python path calls them: each bad op the fast path
declines is refused by the check of that name, the unusual ones pass,
and dlslime_torch/rdma/checks.py words each refusal as the Python path
always did."""

import dataclasses
import enum
import weakref

import pytest
import torch

from c_peer import local_pair
from dlslime_torch import _C
from dlslime_torch.rdma import RdmaAccessError, RdmaInvalidError, checks, ops

pytestmark = pytest.mark.timeout(60)

WAIT_MS = 10000
JOB = b"job digest"


@dataclasses.dataclass(frozen=True)
class Peer:            # the fields the fast path reads of dlslime_torch.rdma's
    context_id: int
    job: bytes


@dataclasses.dataclass(frozen=True)
class Remote:          # ... and of its RemoteTensor
    desc: bytes
    owner: Peer
    dtype: torch.dtype
    numel: int

    def __str__(self):   # what the checked path's errors name
        return f"remote {self.numel}"


class Count(int):      # an int subclass: the checks take it, the fast path does not
    pass


class Region:          # what a weakref in the registry's ranges leads to
    def __init__(self, ctx, tensor):
        self.tensor = tensor
        self.mr = ctx.reg_mr(tensor.view(torch.uint8).numpy())


class Side:
    def __init__(self, transport):
        self.a, self.b, self.ab, self.ba = local_pair(transport)
        self.theirs = torch.arange(1000, dtype=torch.float32)
        self.their_mr = self.b.reg_mr(self.theirs.view(torch.uint8).numpy())
        self.remote = Remote(self.their_mr.desc(), Peer(self.b.id, JOB), torch.float32, 1000)
        self.mine = torch.zeros(1000, dtype=torch.float32)
        self.region = Region(self.a, self.mine)
        self.asked = []
        self.env = (JOB, self.a.id, Remote, torch.Tensor, {}, self.endpoint_of)

    def endpoint_of(self, peer):
        self.asked.append(peer)
        return self.ab

    def ranges(self):
        r = self.region.mr
        return ((r.addr, r.addr + r.length, weakref.ref(self.region)),)

    def post(self, op, local, offset, imm=None, remote=None):
        return self.a.rdma_post(op, local, remote or self.remote, offset, imm,
                                self.env, self.ranges())

    def batch(self, op, items):
        return self.a.rdma_batch(op, items, self.env, self.ranges())

    def close(self):
        self.region.mr.dereg()   # refused if a declined call held it
        self.their_mr.dereg()
        self.a.close()
        self.b.close()


@pytest.fixture
def side(transport):
    s = Side(transport)
    yield s
    s.close()


def test_good_ops_move_the_bytes(side):
    req = side.post(_C.OP_READ, side.mine[10:20], 500)
    assert isinstance(req, _C.Request)
    req.wait(WAIT_MS)
    assert torch.equal(side.mine[10:20], side.theirs[500:510])
    side.mine[:4] = -1
    side.post(_C.OP_WRITE, side.mine[:4], 996).wait(WAIT_MS)
    assert torch.equal(side.theirs[996:], torch.full((4,), -1.0))
    # endpoint_of is asked for a peer the endpoints dict does not hold
    assert len(side.asked) == 2
    side.env[4][side.b.id] = side.ab
    side.post(_C.OP_READ, side.mine[:1], 0).wait(WAIT_MS)
    assert len(side.asked) == 2


def test_write_imm_arrives(side):
    imm = side.ba.imm_recv()
    side.mine[:8] = 7
    req = side.post(_C.OP_WRITE_IMM, side.mine[:8], 100, imm=0xFFFFFFFF)
    assert isinstance(req, _C.Request)
    req.wait(WAIT_MS)
    assert torch.equal(side.theirs[100:108], torch.full((8,), 7.0))
    assert imm.wait(WAIT_MS).imm == 0xFFFFFFFF


def test_batch_of_scattered_items(side):
    items = [(side.mine[i * 3:i * 3 + 3], side.remote, (299 - i) * 3) for i in range(300)]
    req = side.batch(_C.OP_READ, items)
    assert isinstance(req, _C.Request)
    req.wait(WAIT_MS)
    want = side.theirs[:900].reshape(300, 3).flip(0).reshape(-1)
    assert torch.equal(side.mine[:900], want)
    assert side.asked == [side.remote.owner]   # once per batch, not per item


def declined_ops(side):
    """(what, op, local, offset, imm, remote) that the Python path judges."""
    other_job = dataclasses.replace(side.remote, owner=Peer(side.b.id, b"another job"))
    own = dataclasses.replace(side.remote, owner=Peer(side.a.id, JOB))
    short = dataclasses.replace(side.remote, desc=side.remote.desc[:10])
    m = side.mine
    return [
        ("dtype", _C.OP_WRITE, m.view(torch.int32)[:4], 0, None, None),
        ("past the end", _C.OP_WRITE, m[:4], 997, None, None),
        ("negative offset", _C.OP_WRITE, m[:4], -1, None, None),
        ("float offset", _C.OP_WRITE, m[:4], 1.0, None, None),
        ("bool offset", _C.OP_WRITE, m[:4], True, None, None),
        ("not contiguous", _C.OP_WRITE, m[:100].reshape(10, 10).t(), 0, None, None),
        ("zero elements", _C.OP_WRITE, m[:0], 0, None, None),
        ("not a tensor", _C.OP_WRITE, [1.0], 0, None, None),
        ("unregistered", _C.OP_WRITE, torch.ones(4), 0, None, None),
        ("not a Remote", _C.OP_WRITE, m[:4], 0, None, side.remote.desc),
        ("another job", _C.OP_WRITE, m[:4], 0, None, other_job),
        ("this process", _C.OP_WRITE, m[:4], 0, None, own),
        ("short descriptor", _C.OP_WRITE, m[:4], 0, None, short),
        ("imm too big", _C.OP_WRITE_IMM, m[:4], 0, 1 << 32, None),
        ("imm None", _C.OP_WRITE_IMM, m[:4], 0, None, None),
        ("imm negative", _C.OP_WRITE_IMM, m[:4], 0, -1, None),
        ("on meta", _C.OP_WRITE, torch.ones(4, device="meta"), 0, None, None),
        ("int subclass offset", _C.OP_WRITE, m[:4], Count(2), None, None),
        ("imm, zero elements", _C.OP_WRITE_IMM, m[:0], 0, 1, None),
        ("imm to this process", _C.OP_WRITE_IMM, m[:4], 0, 1, own),
    ]


# what refuses each of declined_ops: the check's name and values, or
# None where the checks pass and the fast path leaves the case to Python
REFUSED_BY = {
    "dtype": ("dtype", torch.int32, torch.float32),
    "past the end": ("bounds", 997, 1001, 1000),
    "negative offset": ("negative", -1),
    "float offset": ("count", 1.0),
    "bool offset": ("count", True),
    "not contiguous": ("contiguous",),
    "zero elements": None,
    "not a tensor": ("tensor", [1.0]),
    "unregistered": None,
    "not a Remote": ("remote",),
    "another job": ("job",),
    "this process": None,
    "short descriptor": ("desc", 10),
    "imm too big": ("imm", 1 << 32),
    "imm None": None,
    "imm negative": ("imm", -1),
    "on meta": ("device",),
    "int subclass offset": None,
    "imm, zero elements": ("imm_empty",),
    "imm to this process": ("imm_self",),
}

# the words of each refusal (checks.py), as the checked path always raised them
WORDS = {
    "dtype": (RdmaInvalidError, "write of 4 int32 elements to remote 1000 at element 0: "
              "the local tensor is torch.int32 but the remote one is torch.float32; "
              "they must match"),
    "past the end": (RdmaAccessError, "write of 4 float32 elements to remote 1000 at "
                     "element 997: elements [997, 1001) are outside the remote tensor "
                     "of 1000 elements"),
    "negative offset": (RdmaAccessError, "offset is negative (-1)"),
    "float offset": (RdmaInvalidError, "offset must be an int (elements), got 1.0"),
    "bool offset": (RdmaInvalidError, "offset must be an int (elements), got True"),
    "not contiguous": (RdmaInvalidError, "the local tensor of write is not contiguous "
                       "(shape [10, 10], stride [1, 10]); pass tensor.contiguous() or a "
                       "contiguous slice"),
    "not a tensor": (RdmaInvalidError, "the local tensor of write must be a "
                     "torch.Tensor, got list"),
    "not a Remote": (RdmaInvalidError, "the remote side of write must be a RemoteTensor "
                     "(Region.descriptor() of its owner), got bytes"),
    "another job": (RdmaAccessError, "write of 4 float32 elements to remote 1000 at "
                    "element 0: the descriptor comes from another job (its job id "
                    "differs from this process's); descriptors are valid only in the "
                    "job that made them"),
    "short descriptor": (RdmaInvalidError, "write of 4 float32 elements to remote 1000 "
                         "at element 0: malformed descriptor (10 bytes)"),
    "imm too big": (RdmaInvalidError, "write_with_imm of 4 float32 elements to remote "
                    "1000 at element 0: imm must be an int in [0, 2**32), got 4294967296"),
    "imm negative": (RdmaInvalidError, "write_with_imm of 4 float32 elements to remote "
                     "1000 at element 0: imm must be an int in [0, 2**32), got -1"),
    "on meta": (RdmaInvalidError, "the local tensor of write is on meta; the core moves "
                "CPU memory only (copy it to the CPU first)"),
    "imm, zero elements": (RdmaInvalidError, "write_with_imm of 0 float32 elements to "
                           "remote 1000 at element 0: write_with_imm needs at least one "
                           "element to carry the immediate"),
    "imm to this process": (RdmaInvalidError, "write_with_imm of 4 float32 elements to "
                            "remote 1000 at element 0: the region belongs to this "
                            "process, which cannot send itself an immediate"),
}
KINDS = {_C.OP_READ: "read", _C.OP_WRITE: "write", _C.OP_WRITE_IMM: "write_with_imm"}


def test_declined_ops_post_nothing(side):
    side.mine[:] = 5
    for what, op, local, offset, imm, remote in declined_ops(side):
        assert side.post(op, local, offset, imm, remote) is None, what
    assert torch.equal(side.theirs, torch.arange(1000, dtype=torch.float32))
    assert side.asked == []    # no endpoint asked for before every check passed


def test_a_known_remote_is_checked_again_in_another_env(side):
    """The last remote is remembered across calls, with what it was
    checked against: the same object under another job or as this
    process's own region is declined."""
    side.post(_C.OP_READ, side.mine[:4], 0).wait(WAIT_MS)
    other_job = (b"another job",) + side.env[1:]
    own = side.env[:1] + (side.b.id,) + side.env[2:]
    for env in (other_job, own):
        assert side.a.rdma_post(_C.OP_WRITE, side.mine[:4], side.remote, 0, None,
                                env, side.ranges()) is None
    side.post(_C.OP_READ, side.mine[:4], 0).wait(WAIT_MS)


def test_one_bad_item_declines_the_batch(side):
    side.mine[:] = 5
    good = [(side.mine[i:i + 1], side.remote, i) for i in range(50)]
    for what, op, local, offset, imm, remote in declined_ops(side):
        if op == _C.OP_WRITE_IMM:
            continue
        bad = good[:25] + [(local, remote or side.remote, offset)] + good[25:]
        assert side.batch(_C.OP_WRITE, bad) is None, what
    for items in (good[:10] + [good[10][:2]], good + [list(good[0])],
                  [(side.mine, side.remote, 0, 0, 4)], []):
        assert side.batch(_C.OP_WRITE, items) is None
    assert torch.equal(side.theirs, torch.arange(1000, dtype=torch.float32))


def test_the_core_refusing_is_declined(side):
    with _C.Context(token=b"another job entirely") as other:
        theirs = torch.zeros(1000)
        mr = other.reg_mr(theirs.view(torch.uint8).numpy())
        forged = dataclasses.replace(side.remote, desc=mr.desc())
        side.mine[:] = 5
        assert side.post(_C.OP_WRITE, side.mine[:4], 0, remote=forged) is None
        items = [(side.mine[:4], side.remote, 0), (side.mine[:4], forged, 0)]
        assert side.batch(_C.OP_WRITE, items) is None
        assert not theirs.any()
        mr.dereg()
    assert torch.equal(side.theirs, torch.arange(1000, dtype=torch.float32))


def test_a_region_gone_at_the_target_fails_the_request(side):
    side.their_mr.dereg()
    req = side.post(_C.OP_READ, side.mine[:4], 0)
    with pytest.raises(_C.SlimeAccessError):
        req.wait(WAIT_MS)
    side.their_mr = side.b.reg_mr(side.theirs.view(torch.uint8).numpy())


def test_dead_or_deregistered_regions_are_declined(side):
    side.region.mr.dereg()
    assert side.post(_C.OP_READ, side.mine[:4], 0) is None
    side.region = Region(side.a, side.mine)
    ranges = side.ranges()
    side.region = Region(side.a, side.mine)      # the old one is collected
    assert side.a.rdma_post(_C.OP_READ, side.mine[:4], side.remote, 0, None,
                            side.env, ranges) is None


def test_endpoint_errors_raise(side):
    def refuse(peer):
        raise ConnectionError("no route to that peer")
    env = side.env[:5] + (refuse,)
    with pytest.raises(ConnectionError, match="no route"):
        side.a.rdma_post(_C.OP_READ, side.mine[:4], side.remote, 0, None, env, side.ranges())
    with pytest.raises(ConnectionError, match="no route"):
        side.a.rdma_batch(_C.OP_READ, [(side.mine[:4], side.remote, 0)] * 2, env, side.ranges())
    env = side.env[:5] + (lambda peer: "not an endpoint",)
    with pytest.raises(TypeError, match="expected an Endpoint"):
        side.a.rdma_post(_C.OP_READ, side.mine[:4], side.remote, 0, None, env, side.ranges())


def test_malformed_arguments_raise(side):
    m, r = side.mine[:4], side.remote
    with pytest.raises(TypeError, match="takes 7 arguments"):
        side.a.rdma_post(_C.OP_READ, m, r, 0)
    with pytest.raises(ValueError, match="OP_READ, OP_WRITE or OP_WRITE_IMM"):
        side.post(_C.OP_SEND, m, 0)
    with pytest.raises(TypeError, match="env must be"):
        side.a.rdma_post(_C.OP_READ, m, r, 0, None, (JOB,), side.ranges())
    with pytest.raises(TypeError, match="ranges must be a tuple"):
        side.a.rdma_post(_C.OP_READ, m, r, 0, None, side.env, [])
    with pytest.raises(ValueError, match="OP_READ or OP_WRITE"):
        side.batch(_C.OP_WRITE_IMM, [(m, r, 0)])
    with pytest.raises(TypeError):
        side.batch(_C.OP_READ, 5)
    side.a.close()
    with pytest.raises(_C.SlimeError):
        side.post(_C.OP_READ, m, 0)


def test_the_checks_refuse_what_the_fast_path_declines(side):
    """The fast path declined each of these (above); _C.rdma_check, which
    the checked path calls, names the check that refused it and the values
    it judged, or passes the ones the fast path leaves to Python."""
    for what, op, local, offset, imm, remote in declined_ops(side):
        want = REFUSED_BY[what]
        args = (local, remote or side.remote, offset, imm, side.env)
        if want is None:
            assert _C.rdma_check(*args) is (what == "this process"), what
            continue
        with pytest.raises(_C.RdmaRefusal) as info:
            _C.rdma_check(*args)
        got = info.value.args
        assert got[0] == want[0] and all(
            g is w or g == w for g, w in zip(got[1:], want[1:])), (what, got)
    assert _C.rdma_check(side.mine[:4], side.remote, 996, None, side.env) is False


def test_the_checks_take_values_as_python_does():
    """Counts and immediates: an int subclass is an int, a bool or a float
    is not; 0 <= imm < 2**32; numpy ints are not ints."""
    np = pytest.importorskip("numpy")
    Flag = enum.IntEnum("Flag", {"ONE": 1})
    for good in (0, 5, Count(3), Flag.ONE, 1 << 70):
        assert _C.rdma_check_count(good) is None
    for bad, check in ((-1, "negative"), (Count(-2), "negative"), (-(1 << 70), "negative"),
                       (True, "count"), (1.0, "count"), (np.int64(3), "count"),
                       ("3", "count"), (None, "count")):
        with pytest.raises(_C.RdmaRefusal) as info:
            _C.rdma_check_count(bad)
        assert info.value.args[0] == check and info.value.args[1] is bad
    assert _C.rdma_check_tensor(torch.ones(3), torch.Tensor) is None
    for bad, check in (([1], "tensor"), (torch.ones(4, 4).t(), "contiguous"),
                       (torch.ones(2, device="meta"), "device")):
        with pytest.raises(_C.RdmaRefusal) as info:
            _C.rdma_check_tensor(bad, torch.Tensor)
        assert info.value.args[0] == check and info.value.args[1] is bad


def test_the_checks_of_imm_and_bounds_beyond_machine_ints(side):
    m, r, env = side.mine, side.remote, side.env
    assert _C.rdma_check(m[:4], r, 0, Count(0xFFFFFFFF), env) is False
    for bad in (True, Count(1 << 32), 1 << 80, -(1 << 80), 1.0):
        with pytest.raises(_C.RdmaRefusal, match="imm"):
            _C.rdma_check(m[:4], r, 0, bad, env)
    for offset in (Count(997), 1 << 64, 1 << 80):
        with pytest.raises(_C.RdmaRefusal) as info:
            _C.rdma_check(m[:4], r, offset, None, env)
        assert info.value.args == ("bounds", offset, offset + 4, 1000)
    huge = dataclasses.replace(r, numel=1 << 80)
    assert _C.rdma_check(m[:4], huge, 1 << 70, None, env) is False
    assert side.post(_C.OP_WRITE, m[:4], 0, remote=huge) is None   # left to Python


class _Call:           # what ops._Op reads of its call
    def __init__(self, env):
        self.env = env


@pytest.mark.parametrize("batch", (False, True), ids=("op", "batch item"))
def test_the_checked_path_words_each_refusal(side, batch):
    """ops._Op, the checked path, raises each refusal in the words it
    always used, naming the op (and the batch item), with the check's
    name on the error."""
    for what, op, local, offset, imm, remote in declined_ops(side):
        if what not in WORDS or (batch and imm is not None):
            continue
        cls, text = WORDS[what]
        label = f"{KINDS[op]} item 7: " if batch else ""
        with pytest.raises(cls) as info:
            ops._Op(KINDS[op], local, remote or side.remote, offset, _Call(side.env),
                    imm=imm, label=label)
        assert str(info.value) == f"dlslime rdma: {label}{text}", what
        assert info.value.check == REFUSED_BY[what][0]
    assert set(checks._WORDS) == {want[0] for want in REFUSED_BY.values() if want}


def test_long_batch_items_use_the_same_count_and_tensor_checks():
    with pytest.raises(RdmaAccessError, match=r"^dlslime rdma: read item 2: local_offset "
                       r"is negative \(-3\)$") as info:
        checks.check_count(-3, "local_offset", "read item 2: ")
    assert info.value.check == "negative"
    with pytest.raises(RdmaInvalidError, match="^dlslime rdma: the tensor to register "
                       "must be a torch.Tensor, got str$"):
        checks.check_tensor("x", "the tensor to register")
