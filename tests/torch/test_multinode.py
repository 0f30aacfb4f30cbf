"""A two-node torchrun job on "dlslime": examples/multinode.sh runs
`torchrun --nnodes 2 --nproc-per-node 2` in each of two network
namespaces (two hosts joined by a veth pair).

The test checks the job's own report again, from outside: the results of
all_reduce and of a send/recv ring that crosses the nodes (whose 4 MiB
crossed the veth: multinode.sh turns tcp's same-machine CMA off, as
between real hosts), and that each
rank's endpoint to a rank of the other node is tcp and to the rank of its
own node shm (the node of a rank is taken from which torchrun printed its
lines, not from what the rank says).  Skipped, with the reason, where
network namespaces cannot be made (not root, no iproute2).
"""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "multinode.sh")
NODES, PER_NODE = 2, 2
SIZE = NODES * PER_NODE
CANNOT = 77    # multinode.sh: namespaces cannot be made here

pytestmark = pytest.mark.timeout(300)

LINE = re.compile(r"^\[node (\d)\] \[rank (\d+)\] (.*)$")


def run_job():
    env = dict(os.environ, JOB_TIMEOUT_S="180")
    proc = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=280)
    if proc.returncode == CANNOT:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the job failed ({proc.returncode}):\n{output[-6000:]}"
    return output


def reports(output):
    """{rank: (node, [the rank's lines])} from the job's output."""
    ranks = {}
    for line in output.splitlines():
        m = LINE.match(line.strip())
        if m:
            node, rank, text = int(m[1]), int(m[2]), m[3]
            assert ranks.setdefault(rank, (node, []))[0] == node, f"rank {rank} on two nodes"
            ranks[rank][1].append(text)
    return ranks


def test_two_node_job_over_tcp_and_shm():
    ranks = reports(run_job())
    assert sorted(ranks) == list(range(SIZE)), ranks
    node_of = {rank: node for rank, (node, _) in ranks.items()}
    assert sorted(node_of.values()) == [n for n in range(NODES) for _ in range(PER_NODE)]
    for rank, (node, lines) in ranks.items():
        text = "\n".join(lines)
        assert f"all_reduce sum = {SIZE * (SIZE + 1) // 2}" in text, text
        assert f"ring recv from rank {(rank - 1) % SIZE} = {(rank - 1) % SIZE}" in text, text
        # the ring's 4 MiB from the other "host" came over the socket
        cma = int(re.search(r"tcp cma fetches = (\d+)", text)[1])
        assert cma == 0, f"rank {rank}: {cma} CMA fetches between namespaces standing in for hosts"
        m = re.search(r"transports (.*)", text)
        assert m, text
        seen = {}
        for entry in m[1].split():
            peer, _, transport = entry.split(":")
            seen[int(peer)] = transport
        want = {peer: "shm" if node_of[peer] == node else "tcp"
                for peer in range(SIZE) if peer != rank}
        assert seen == want, f"rank {rank} (node {node}): {seen}, expected {want}"
