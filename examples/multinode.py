"""A two-node job on the "dlslime" backend: the ranks of one node talk
over shm, the ranks of different nodes over tcp.

    # on each of two hosts (NODE_ADDR: this host's address, HOST0: node 0's)
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29400 --rdzv-id demo --local-addr NODE_ADDR \\
        examples/multinode.py

examples/multinode.sh runs exactly that on one machine, with two network
namespaces as the two hosts.  Every rank checks, and prints for the
caller to check again:
  - all_reduce (SUM) of rank + 1 over all ranks;
  - a ring of send/recv, each rank to the next across the whole job, and
    how many tcp rendezvous this rank fetched by CMA (none between real
    hosts, nor under multinode.sh, which turns that shortcut off);
  - which transport carries each of its peers, read from the very
    endpoints the backend made (Context.connect returns the existing
    endpoint to a peer): shm on its own node, tcp to the other.
"""

import os

import torch
import torch.distributed as dist

from _common import check, main, say
from dlslime_torch import _C, runtime

CONNECT_TIMEOUT_MS = 30000


def peer_transports(rank, size, gloo):
    """{peer rank: transport} of this rank's endpoints, and {rank: node}."""
    me = (int(os.environ["GROUP_RANK"]), runtime.current().address())
    everyone = [None] * size
    dist.all_gather_object(everyone, me, group=gloo)
    ctx = runtime.current()
    transports = {peer: ctx.connect(addr, timeout_ms=CONNECT_TIMEOUT_MS).transport
                  for peer, (_, addr) in enumerate(everyone) if peer != rank}
    return transports, {r: node for r, (node, _) in enumerate(everyone)}


def body(rank, size, gloo):
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t)
    total = size * (size + 1) / 2
    check(torch.equal(t, torch.full((1024,), total)), f"all_reduce sum {t[0]} != {total}")
    say(f"all_reduce sum = {t[0].item():g}")

    out = torch.full((1 << 20,), float(rank))          # 4 MiB: rendezvous path
    got = torch.empty_like(out)
    send = dist.isend(out, (rank + 1) % size)
    dist.recv(got, (rank - 1) % size)
    send.wait()
    check(bool((got == float((rank - 1) % size)).all()), "ring send/recv")
    say(f"ring recv from rank {(rank - 1) % size} = {got[0].item():g}")
    # CMA reaches only a peer of this machine in another network namespace
    # (DLSLIME_TCP_CMA): never one on another host
    say(f"tcp cma fetches = {runtime.current().counter(_C.COUNTER_TCP_CMA_FETCHES)}")

    transports, nodes = peer_transports(rank, size, gloo)
    for peer, transport in transports.items():
        want = "shm" if nodes[peer] == nodes[rank] else "tcp"
        check(transport == want, f"rank {peer} (node {nodes[peer]}) over {transport}, not {want}")
    say(f"node {nodes[rank]} transports " +
        " ".join(f"{peer}:node{nodes[peer]}:{tp}" for peer, tp in sorted(transports.items())))


if __name__ == "__main__":
    main(body)
