#!/usr/bin/env bash
# Prepares a fresh Debian machine (Python 3.11 with pip, run as root or
# with sudo) to build, run and test dlslime-torch, then installs the
# package in editable mode.  Safe to run again: what is there is kept.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}

section() { printf '\n==== %s ====\n' "$*"; }

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

section "python packages"
# torch is pinned: an unpinned torch pulls several GB of CUDA wheels.
"$PYTHON" -m pip install -q "torch==2.13.0" pytest pytest-timeout numpy "setuptools>=64" wheel </dev/null

section "dlslime-torch (editable)"
"$PYTHON" -m pip install -q --no-build-isolation -e . </dev/null
"$PYTHON" -c "import dlslime_torch; print('dlslime_torch', dlslime_torch.__version__, 'from', dlslime_torch.__file__)"
