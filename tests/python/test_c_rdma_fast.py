"""Context.rdma_post / rdma_batch, the C fast path of dlslime_torch.rdma:
a good op moves the right bytes; every op the Python path must judge
(bad or unusual) gives None with nothing posted, nothing held and the
target untouched; malformed arguments raise.  Two contexts of this
process stand for the two sides (b owns the remote tensor)."""

import dataclasses
import weakref

import pytest
import torch

from c_peer import local_pair
from dlslime_torch import _C

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
    ]


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
