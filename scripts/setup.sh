#!/usr/bin/env bash
# Prepares a fresh Debian machine (Python 3.11 with pip, run as root or
# with sudo) to build, run and test dlslime-torch, then installs the
# package in editable mode.  Safe to run again: what is there is kept.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}

section() { printf '\n==== %s ====\n' "$*"; }

# install_debs WHAT PACKAGE...: installs the Debian packages not yet
# installed; WHAT names them when all are present.
install_debs() {
    local what=$1 p missing=()
    shift
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then
        echo "$what: present"
        return 0
    fi
    local sudo=""
    if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
}

section "system packages"
# command -> Debian package.  iproute2 gives `ip netns` for the tests
# that build private networks; gcc brings the ASan/UBSan runtimes.
declare -A package_of=([cmake]=cmake [ninja]=ninja-build [gcc]=gcc [g++]=g++ [ip]=iproute2)
missing=()
for tool in "${!package_of[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
if ((${#missing[@]})); then
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
else
    echo "cmake, ninja, gcc, g++ and ip are present"
fi

section "verbs: header and soft-RoCE VM packages"
# The verbs transport builds against <infiniband/verbs.h> (libibverbs-dev;
# libibverbs itself is loaded at run time).  Its tests run inside a QEMU VM
# with soft-RoCE (tests/verbs/run_in_vm.sh, which downloads Debian's kernel
# package itself): qemu, a static busybox, cpio, kmod, iproute2's `rdma`,
# the rxe provider and ibv_devinfo.  Not rdma-core: it pulls udev and
# systemd upgrades and nothing of it is used.
verbs_packages=(libibverbs-dev ibverbs-providers ibverbs-utils qemu-system-x86 busybox-static cpio kmod iproute2)
# without them the verbs transport is compiled out or its tests skip,
# each saying why: worth a warning, not a failed setup
install_debs "libibverbs-dev and the soft-RoCE VM packages" "${verbs_packages[@]}" ||
    echo "WARNING: could not install them; the verbs tests will be skipped"

section "fuzzing: clang and its libFuzzer runtime"
# tests/fuzz builds its targets with clang -fsanitize=fuzzer; Debian 12
# ships libFuzzer in libclang-rt-14-dev.
install_debs "clang-14 and libclang-rt-14-dev" clang-14 libclang-rt-14-dev

section "python packages"
# torch is pinned: an unpinned torch pulls several GB of CUDA wheels.
# matplotlib draws the benchmark plots (bench/torch_dist_bench.py);
# torch's own distributed tests (tests/torch_suite) import expecttest.
"$PYTHON" -m pip install -q "torch==2.13.0" pytest pytest-timeout numpy matplotlib expecttest "setuptools>=64" wheel </dev/null

section "dlslime-torch (editable)"
"$PYTHON" -m pip install -q --no-build-isolation -e . </dev/null
"$PYTHON" -c "import dlslime_torch; print('dlslime_torch', dlslime_torch.__version__, 'from', dlslime_torch.__file__)"
