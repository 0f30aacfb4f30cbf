"""Paged KV cache moved from a prefill worker to decode workers with
one-sided writes: the decode side takes no part until it is told "done".

    torchrun --standalone --nproc-per-node 2 examples/rdma_read_write.py [--pages 256]

Rank 0 is the prefill worker; every other rank is a decode worker.  Each
holds a paged KV cache, [pages, 2 (K and V), heads, tokens per page,
head dim] of bfloat16, registered as a window (dlslime_torch.rdma), plus
a small int32 mailbox window.  For each decode rank:

  1. the decode rank picks free pages scattered over its cache and tells
     rank 0 which (the only message it sends);
  2. rank 0 writes its sequence's pages, scattered over its own cache,
     into those pages with ONE batch of one-sided writes (one item per
     page), waits for it, then write_with_imm's the page list into the
     decode rank's mailbox with the page count as the immediate: "done";
  3. the decode rank, woken by the immediate, checks every written page
     byte for byte against what rank 0 computed, and that every other
     page is untouched; then it reads the sequence's first pages back out
     of rank 0's cache with a batch of one-sided reads and checks those.

Exits non-zero if any byte differs.  kv_transfer() is the whole exchange
as one call (the main demo uses it).
"""

import argparse
import time

import torch
import torch.distributed as dist

from dlslime_torch import rdma

HEADS, PAGE_TOKENS, HEAD_DIM = 8, 16, 64
PAGE_SHAPE = (2, HEADS, PAGE_TOKENS, HEAD_DIM)       # K and V of one page
PAGE_NUMEL = 2 * HEADS * PAGE_TOKENS * HEAD_DIM
UNTOUCHED = -7.0                                    # what free pages hold


def computed_kv(seq, n_pages):
    """The KV pages prefill computed for sequence `seq` (deterministic, so
    the decode rank knows what must arrive)."""
    g = torch.Generator().manual_seed(1000 + seq)
    return torch.randn((n_pages,) + PAGE_SHAPE, generator=g).to(torch.bfloat16)


def scattered(n_total, n_pick, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_total, generator=g)[:n_pick].tolist()


def prefill_pages(pages, seq_pages, decode):
    """Where prefill keeps the sequence for decode rank `decode`: scattered
    over its cache, apart from every other sequence's pages."""
    perm = scattered(pages, pages, seed=0)
    return perm[(decode - 1) * seq_pages:decode * seq_pages]


def kv_transfer(rank, size, group=None, pages=256, seq_pages=96, timeout=60):
    """Runs the exchange above on every rank of group (collective).
    Returns {"pages", "bytes", "write_s", "read_s"} for this rank; raises
    AssertionError on a decode rank whose pages came out wrong."""
    if size < 2:
        raise ValueError("kv_transfer needs at least 2 ranks")
    if seq_pages * (size - 1) > pages:
        raise ValueError(f"{size - 1} sequences of {seq_pages} pages do not fit "
                         f"in a cache of {pages} pages")
    cache = torch.full((pages,) + PAGE_SHAPE, UNTOUCHED, dtype=torch.bfloat16)
    mailbox = torch.full((seq_pages,), -1, dtype=torch.int32)
    cache_win = rdma.register_window(cache, group)
    mail_win = rdma.register_window(mailbox, group)
    stats = {"pages": 0, "bytes": 0, "write_s": 0.0, "read_s": 0.0}
    try:
        for decode in range(1, size):
            if rank == 0:
                _prefill(decode, cache, cache_win, mail_win, pages, seq_pages,
                         group, stats, timeout)
            elif rank == decode:
                _decode(cache, mailbox, cache_win, mail_win, pages, seq_pages,
                        group, stats, timeout, rank)
    finally:   # collective: no rank's cache goes while a peer may still read it
        cache_win.free()
        mail_win.free()
    return stats


def _prefill(decode, cache, cache_win, mail_win, pages, seq_pages, group, stats, timeout):
    src_pages = prefill_pages(pages, seq_pages, decode)
    cache[src_pages] = computed_kv(decode, seq_pages)
    dst = torch.empty(seq_pages, dtype=torch.int64)
    dist.recv(dst, src=_global(group, decode), group=group)
    dst_pages = dst.tolist()
    start = time.perf_counter()
    # One item per page: (local page, remote cache, element offset there).
    rdma.batch_write([(cache[s], cache_win[decode], d * PAGE_NUMEL)
                      for s, d in zip(src_pages, dst_pages)]).wait(timeout)
    table = torch.tensor(dst_pages, dtype=torch.int32)
    rdma.write_with_imm(table, mail_win[decode], imm=seq_pages).wait(timeout)
    stats["write_s"] += time.perf_counter() - start
    stats["pages"] += seq_pages
    stats["bytes"] += seq_pages * PAGE_NUMEL * 2


def _decode(cache, mailbox, cache_win, mail_win, pages, seq_pages, group, stats, timeout, rank):
    dst_pages = scattered(pages, seq_pages, seed=10_000 + rank)   # our free pages
    done = mail_win.recv_imm(0)          # posted before rank 0 can send it
    dist.send(torch.tensor(dst_pages), dst=_global(group, 0), group=group)
    count = done.result(timeout)
    if count != seq_pages or mailbox.tolist() != dst_pages:
        raise AssertionError(f"the 'done' message is wrong: imm {count}, "
                             f"page table {mailbox.tolist()[:8]}...")
    want = computed_kv(rank, seq_pages)
    for i, p in enumerate(dst_pages):
        if not torch.equal(cache[p].view(torch.int16), want[i].view(torch.int16)):
            raise AssertionError(f"page {p} (sequence page {i}) differs from what "
                                 f"prefill computed")
    others = sorted(set(range(pages)) - set(dst_pages))
    if not bool((cache[others] == UNTOUCHED).all()):
        raise AssertionError("a page nobody wrote to was changed")
    # Pull the first 16 pages of the sequence straight out of rank 0's cache.
    src_pages = prefill_pages(pages, seq_pages, rank)
    pulled = torch.empty((16,) + PAGE_SHAPE, dtype=torch.bfloat16)
    start = time.perf_counter()
    rdma.batch_read([(pulled[i], cache_win[0], s * PAGE_NUMEL)
                     for i, s in enumerate(src_pages[:16])]).wait(timeout)
    stats["read_s"] += time.perf_counter() - start
    if not torch.equal(pulled.view(torch.int16), want[:16].view(torch.int16)):
        raise AssertionError("pages read back from rank 0 differ")
    stats["pages"] += seq_pages
    stats["bytes"] += seq_pages * PAGE_NUMEL * 2


def _global(group, group_rank):
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def body(rank, size, gloo, args):
    from _common import say
    stats = kv_transfer(rank, size, pages=args.pages, seq_pages=args.seq_pages)
    mib = stats["bytes"] / 2**20
    if rank == 0:
        say(f"wrote {stats['pages']} scattered KV pages ({mib:.1f} MiB) to "
            f"{size - 1} decode rank(s) with one batch of one-sided writes each, "
            f"then write_with_imm 'done': {mib / stats['write_s']:.0f} MiB/s")
    else:
        say(f"got {stats['pages']} pages ({mib:.1f} MiB), every byte checked; "
            f"read 16 pages back from rank 0 in {stats['read_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
    from _common import main
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=256, help="pages per cache")
    parser.add_argument("--seq-pages", type=int, default=96,
                        help="pages of the sequence moved to each decode rank")
    args = parser.parse_args()
    main(lambda rank, size, gloo: body(rank, size, gloo, args))
