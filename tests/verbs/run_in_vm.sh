#!/usr/bin/env bash
# run_in_vm.sh - runs a host-built command inside a throw-away QEMU VM
# that boots Debian's own kernel, whose rdma_rxe module gives two
# soft-RoCE devices, and returns the command's exit status.  This is how
# the verbs transport is tested for real on machines without RDMA.
#
#   tests/verbs/run_in_vm.sh [--] COMMAND [ARGS...]
#
# Exit status: COMMAND's; 77 when the VM cannot run here (the reason is
# printed: no qemu, no busybox, no kernel package); 125 when the VM ran
# but no exit status came back (crash, or the hard timeout).
#
# The guest sees the host's whole filesystem read-only (9p) under a tmpfs
# overlay: every host path is there and writable, writes are thrown away,
# except in $DLSLIME_VM_OUT (a per-run host directory shared read-write,
# exported to COMMAND).  COMMAND runs as root in the host's working
# directory with the host's PATH; its output is the serial console (this
# script's stdout).  The VM has no network card: nothing leaves it.
#
# Soft-RoCE layout: a veth pair veth0 <-> veth1 with only IPv6 link-local
# addresses, rxe0 on veth0, rxe1 on veth1, so RoCE v2 packets cross the
# guest's UDP stack between two devices (use GID index 0).
#
# Environment:
#   DLSLIME_VM_CACHE    kernel + initramfs cache (~/.cache/dlslime-softroce)
#   DLSLIME_VM_TIMEOUT  hard limit of the whole VM run in seconds (900)
#   DLSLIME_VM_MEM      guest MiB (2048)      DLSLIME_VM_CPUS  vCPUs (2)
#   DLSLIME_VM_MTU      veth MTU (1500 -> RoCE MTU 1024; 9000 -> 4096)
#   DLSLIME_VM_KPKG     kernel package (default: what linux-image-amd64
#                       depends on); the cached one is used when apt
#                       cannot tell
#   DLSLIME_VM_KEEP=1   keep the run directory even on success
# Host packages (scripts/setup.sh installs them): qemu-system-x86
# busybox-static cpio kmod iproute2 ibverbs-providers ibverbs-utils.
# KVM is not used: where it exists it is often unusable for a stock
# kernel (nested/PVM), and TCG boots this kernel in a few seconds.
set -euo pipefail

CACHE=${DLSLIME_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlslime-softroce}
TIMEOUT=${DLSLIME_VM_TIMEOUT:-900}
MEM=${DLSLIME_VM_MEM:-2048}
CPUS=${DLSLIME_VM_CPUS:-2}
MTU=${DLSLIME_VM_MTU:-1500}
# the initramfs is rebuilt when this changes
LAYOUT_VERSION=3

say() { echo "[run_in_vm] $*" >&2; }
skip() { say "SKIP: $*"; exit 77; }

[ "${1:-}" = "--" ] && shift
if [ $# -lt 1 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d'
    exit 2
fi

# ---------------------------------------------------------- can we? ----
for tool in qemu-system-x86_64 cpio depmod modprobe dpkg-deb gzip timeout; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is missing (apt-get install qemu-system-x86 cpio kmod)"
done
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] || skip "busybox is missing (apt-get install busybox-static)"
# the initramfs has no C library: busybox must be the static build
! ldd "$BUSYBOX" >/dev/null 2>&1 || skip "$BUSYBOX is dynamically linked (apt-get install busybox-static)"
command -v rdma >/dev/null 2>&1 || skip "iproute2's 'rdma' tool is missing (apt-get install iproute2)"

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9 # one build of the cache at a time; runs themselves may overlap

KPKG=${DLSLIME_VM_KPKG:-$(apt-cache depends linux-image-amd64 2>/dev/null |
                          awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)}
if [ -z "$KPKG" ]; then
    # apt cannot tell (no lists): use what an earlier run cached
    KPKG=$(ls "$CACHE"/linux-image-*_amd64.deb 2>/dev/null | sed -n '1s#.*/\(linux-image-[^_]*\)_.*#\1#p')
fi
[ -n "$KPKG" ] || skip "cannot name a kernel package (apt-cache depends linux-image-amd64 says nothing; run apt-get update)"
KVER=${KPKG#linux-image-}
VMLINUZ=$CACHE/vmlinuz-$KVER
INITRD=$CACHE/initramfs-$KVER-v$LAYOUT_VERSION.cpio.gz

build_initramfs() {
    local deb kroot stage
    deb=$(ls "$CACHE"/"$KPKG"_*_amd64.deb 2>/dev/null | head -1 || true)
    if [ -z "$deb" ]; then
        say "downloading $KPKG (about 70 MB, once)"
        (cd "$CACHE" && apt-get download "$KPKG" 2>&1 | grep -v -e unsandboxed -e '^Get:' -e '^Fetched' || true)
        deb=$(ls "$CACHE"/"$KPKG"_*_amd64.deb 2>/dev/null | head -1 || true)
        [ -n "$deb" ] || skip "apt-get download $KPKG failed (no network, or the mirror dropped it; set DLSLIME_VM_KPKG)"
    fi
    say "building the initramfs for $KVER"
    kroot=$(mktemp -d "$CACHE/kroot.XXXXXX")
    stage=$(mktemp -d "$CACHE/stage.XXXXXX")
    dpkg-deb -x "$deb" "$kroot"
    depmod -b "$kroot" "$KVER" # the package ships no modules.dep
    cp "$kroot/boot/vmlinuz-$KVER" "$VMLINUZ.tmp"
    mkdir -p "$stage"/{bin,dev,proc,sys,lib/modules}
    cp "$BUSYBOX" "$stage/bin/busybox"
    # modprobe --show-depends lists a module's dependencies first, in load
    # order.  rxe computes its ICRC with the "crc32" crypto hash but does not
    # depend on a module for it: without crc32_generic, `rdma link add` fails
    # with "No such file or directory" ("failed to init crc32 algorithm").
    local m ko
    for m in virtio_pci 9pnet_virtio 9p overlay veth crc32_generic crc32_pclmul rdma_rxe; do
        modprobe -d "$kroot" -S "$KVER" --show-depends "$m"
    done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
        cp "$ko" "$stage/lib/modules/"
        basename "$ko" >> "$stage/lib/modules/order"
    done
    cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m || echo "VM-INIT: insmod $m failed"
done
opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /lower /upper /root
mount -t 9p -o $opts,ro,cache=loose hostroot /lower || echo "VM-INIT: mounting the host root failed"
mount -t tmpfs -o mode=755 tmpfs /upper
mkdir -p /upper/data /upper/work
# host files read-only below, writes to RAM above
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /root ||
    { echo "VM-INIT: overlay failed; the root is read-only"; mount --bind /lower /root; }
for fs in proc:proc sysfs:sys devtmpfs:dev; do mount -t ${fs%%:*} ${fs%%:*} /root/${fs#*:}; done
mkdir -p /root/dev/pts /root/dev/shm
mount -t devpts devpts /root/dev/pts
mount -t tmpfs tmpfs /root/dev/shm
mount -t tmpfs tmpfs /root/run
# vmout=... came on the kernel command line
mkdir -p "/root$vmout"
mount -t 9p -o $opts vmout "/root$vmout" || echo "VM-INIT: mounting the output directory failed"
chroot /root /bin/bash "$vmout/job.sh" </dev/console >/dev/console 2>&1
echo "VM-EXIT: $?"
sync
umount "/root$vmout" 2>/dev/null
poweroff -f
INIT
    chmod +x "$stage/init"
    (cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
    mv "$VMLINUZ.tmp" "$VMLINUZ"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$kroot" "$stage" # about 400 MB unpacked
}

[ -s "$VMLINUZ" ] && [ -s "$INITRD" ] || build_initramfs
exec 9>&-

# -------------------------------------------------------------- job ----
RUNS=$CACHE/runs
mkdir -p "$RUNS"
OUT=$(mktemp -d "$RUNS/run.XXXXXX")
chmod 755 "$OUT"
{
    echo '#!/bin/bash'
    printf 'export DLSLIME_VM_OUT=%q PATH=%q HOME=%q LANG=C.UTF-8\n' "$OUT" "$PATH" "${HOME:-/root}"
    printf 'MTU=%q\n' "$MTU"
    cat <<'JOB'
ulimit -l unlimited   # ibv_reg_mr pins pages
sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
# rxe sends a large transfer as a burst of MTU-sized UDP packets that veth
# hands to the receiving side's backlog at once: the default 1000 packets
# overflow and the drops turn into RC retries (or exhausted retries)
sysctl -qw net.core.netdev_max_backlog=250000
ip link set lo up
ip link add veth0 mtu "$MTU" type veth peer name veth1 mtu "$MTU"
ip link set veth0 up
ip link set veth1 up
# RoCE wants in-order delivery, and a fabric gives it; veth queues each
# packet on the CPU that sent it, so with two vCPUs a QP's packets can
# overtake each other and every overtaking costs a go-back-N retry (and
# rxe 6.1 has been seen to leave an RDMA READ hanging after such retries).
# Receiving on one CPU keeps them in order.
echo 1 > /sys/class/net/veth0/queues/rx-0/rps_cpus
echo 1 > /sys/class/net/veth1/queues/rx-0/rps_cpus
rdma link add rxe0 type rxe netdev veth0
rdma link add rxe1 type rxe netdev veth1
for i in $(seq 100); do
    down=$(cat /sys/class/infiniband/*/ports/1/state 2>/dev/null | grep -vc ACTIVE)
    [ "$down" = 0 ] && break
    sleep 0.1
done
echo "VM-READY: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
JOB
    printf 'cd %q || exit 126\n' "$PWD"
    printf '%q ' "$@"
    echo
    echo 'rc=$?; echo $rc > "$DLSLIME_VM_OUT/status"; exit $rc'
} > "$OUT/job.sh"

# no_timer_check: on a loaded host the emulated CPU can miss the kernel's
# IO-APIC timer check, which then panics at boot ("IO-APIC + timer doesn't
# work"); the timer works, the check is only a timing heuristic.
say "booting ($KVER, TCG, $CPUS vCPUs, $MEM MiB, hard limit ${TIMEOUT}s); output dir $OUT"
start=$(date +%s.%N)
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" -smp "$CPUS" \
    -display none -vga none -serial stdio -monitor none -no-reboot -nic none \
    -kernel "$VMLINUZ" -initrd "$INITRD" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check vmout=$OUT" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$OUT,mount_tag=vmout,security_model=none" \
    </dev/null | tee "$OUT/console.log" | tr -d '\r'
qemu_rc=${PIPESTATUS[0]}
set -e
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
if [ -s "$OUT/status" ]; then
    rc=$(cat "$OUT/status")
else
    say "no exit status came back (qemu/timeout status $qemu_rc, limit ${TIMEOUT}s); console in $OUT/console.log"
    rc=125
fi
say "guest exit status $rc after ${took}s"
if [ "$rc" = 0 ] && [ "${DLSLIME_VM_KEEP:-0}" != 1 ]; then rm -rf "$OUT"; fi
exit "$rc"
