#!/usr/bin/env bash
# RoCE v2 over IPv4 GIDs, inside the soft-RoCE VM (run by vm_tests.sh).
#
# rxe0 (on veth0) and rxe1 (on veth1) sit in one network namespace, where
# the kernel would route traffic between two local IPv4 addresses through
# lo, never over the veth pair.  So the addresses go in a documentation
# range (192.0.2.0/24, routable nowhere), the rule that looks up local
# addresses moves after two source rules that send each address's traffic
# out of its own veth, and the far veth accepts packets from a local
# source.  Then each rxe device has an IPv4-mapped GID, which device
# selection prefers, and the tests run over it.
#
# Usage: tests/verbs/ipv4_gids.sh BUILD_DIR
set -euo pipefail
BUILD=${1:-build}
for d in veth0 veth1 all default; do
    echo 0 > /proc/sys/net/ipv4/conf/$d/rp_filter
done
echo 1 > /proc/sys/net/ipv4/conf/veth0/accept_local
echo 1 > /proc/sys/net/ipv4/conf/veth1/accept_local
ip addr add 192.0.2.1/24 dev veth0
ip addr add 192.0.2.2/24 dev veth1
ip route add 192.0.2.2/32 dev veth0 src 192.0.2.1 table 100
ip route add 192.0.2.1/32 dev veth1 src 192.0.2.2 table 101
ip rule add pref 10 from 192.0.2.1 to 192.0.2.2 iif lo lookup 100
ip rule add pref 11 from 192.0.2.2 to 192.0.2.1 iif lo lookup 101
ip rule add pref 1000 lookup local
ip rule del pref 0 lookup local
# and each side knows the other's MAC: the address resolution of a
# RoCE queue pair (modify to RTR) gives up before ARP between two local
# addresses completes here
ip neigh replace 192.0.2.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
ip neigh replace 192.0.2.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
# the IPv4 GIDs appear once the addresses are up
for i in $(seq 50); do
    grep -q "0000:0000:0000:0000:0000:ffff:c000:02" /sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null && break
    sleep 0.1
done
export DLSLIME_TRANSPORT=verbs DLSLIME_TEST_EXPECT_GID=192.0.2.
failed=0
"$BUILD/test_verbs_native" describe || failed=1
"$BUILD/test_sendrecv" || failed=1
"$BUILD/test_onesided" large write_imm || failed=1
exit $failed
