#!/usr/bin/env bash
# Two "hosts" on one machine: runs examples/multinode.py under
# `torchrun --nnodes 2 --nproc-per-node 2`, one torchrun in each of two
# network namespaces joined by a veth pair, so the job's cross-node
# endpoints go over tcp and the same-node ones over shm.
#
#     sudo bash examples/multinode.sh        (root: it makes namespaces)
#
# The namespaces get 10.213.0.1 and 10.213.0.2 (a private /30 that exists
# only inside them; nothing is added to the host's own network) and are
# deleted on exit.  Exit status: the job's (0: every check passed on every
# rank), or 77 when namespaces cannot be made here, with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
JOB_TIMEOUT_S=${JOB_TIMEOUT_S:-240}
ADDRS=(10.213.0.1 10.213.0.2)
NS=("dls-mn0-$$" "dls-mn1-$$")
RDZV_PORT=29400

cannot() { echo "multinode: $*" >&2; exit 77; }
((EUID == 0)) || cannot "network namespaces need root"
command -v ip >/dev/null || cannot "the ip command (iproute2) is not installed"

made=()
cleanup() { for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done; }
trap cleanup EXIT
why=$(ip netns add "${NS[0]}" 2>&1) || cannot "ip netns add is unavailable here: $why"
made+=("${NS[0]}")
ip netns add "${NS[1]}" && made+=("${NS[1]}") || exit 1
# Both ends are made inside the namespaces directly.
ip link add mnv0 netns "${NS[0]}" type veth peer name mnv1 netns "${NS[1]}" || exit 1
for node in 0 1; do
    ip -n "${NS[node]}" addr add "${ADDRS[node]}/30" dev "mnv$node" &&
        ip -n "${NS[node]}" link set lo up &&
        ip -n "${NS[node]}" link set "mnv$node" up || exit 1
done

export PYTHONPATH="$PWD/examples:$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset DLSLIME_HOST DLSLIME_TRANSPORT
# The namespaces stand in for hosts, and between hosts no process reads
# another's memory: tcp's same-machine CMA shortcut is off, so the bytes
# between "nodes" really cross the veth as they would cross a network.
export DLSLIME_TCP_CMA=0
# Node 0 hosts the rendezvous store: said outright, since torch's guess
# (is the endpoint one of my addresses?) does not look inside a namespace.
pids=()
for node in 0 1; do
    # The examples' Gloo group (their check of the outcome) would look
    # its address up by host name, which is the same in both namespaces.
    ip netns exec "${NS[node]}" env GLOO_SOCKET_IFNAME="mnv$node" timeout "$JOB_TIMEOUT_S" \
        "$PYTHON" -m torch.distributed.run --nnodes 2 --nproc-per-node 2 \
        --rdzv-backend c10d --rdzv-endpoint "${ADDRS[0]}:$RDZV_PORT" --rdzv-id multinode \
        --rdzv-conf "is_host=$((node == 0))" --local-addr "${ADDRS[node]}" \
        examples/multinode.py \
        > >(sed -u "s/^/[node $node] /") 2>&1 &
    pids+=($!)
done
status=0
for node in 0 1; do
    wait "${pids[node]}" || { status=$?; echo "multinode: node $node's torchrun exited with $status" >&2; }
done
exit "$status"
