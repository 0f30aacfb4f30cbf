#!/usr/bin/env bash
# The test suite: C tests (plain, then ASan + UBSan) and the Python tests.
# Every stage runs even if an earlier one failed; the exit status is
# non-zero if any stage failed.  Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
JOBS=${JOBS:-2}
# setup.py builds the core for Python in the same plain build directory.
export DLSLIME_BUILD_DIR=${DLSLIME_BUILD_DIR:-build}
ASAN_BUILD_DIR=${DLSLIME_ASAN_BUILD_DIR:-build-asan}
failed=()

section() { printf '\n==== %s ====\n' "$*"; }

# configure_and_build DIR CMAKE_ARGS...: configures DIR (Ninja for a new
# directory; an existing one keeps its generator) and builds everything.
configure_and_build() {
    local dir=$1; shift
    local generator=()
    [[ -f $dir/CMakeCache.txt ]] || generator=(-G Ninja)
    cmake -S . -B "$dir" "${generator[@]}" "$@" && cmake --build "$dir"
}

section "C tests: $DLSLIME_BUILD_DIR (RelWithDebInfo)"
if configure_and_build "$DLSLIME_BUILD_DIR" -DDLSLIME_SANITIZE=OFF -DDLSLIME_TESTS=ON -DDLSLIME_BENCH=ON; then
    ctest --test-dir "$DLSLIME_BUILD_DIR" --output-on-failure --no-tests=error -j "$JOBS" \
        || failed+=("C tests")
else
    failed+=("C build")
fi

section "C tests: $ASAN_BUILD_DIR (AddressSanitizer + UndefinedBehaviorSanitizer)"
# LeakSanitizer works on this kind of machine (ptrace is allowed), so
# leaks fail the tests too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if configure_and_build "$ASAN_BUILD_DIR" -DDLSLIME_SANITIZE=ON -DDLSLIME_TESTS=ON -DDLSLIME_BENCH=OFF; then
    ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure --no-tests=error -j "$JOBS" \
        || failed+=("C tests under ASan/UBSan")
else
    failed+=("C build with ASan/UBSan")
fi
unset ASAN_OPTIONS UBSAN_OPTIONS

section "Python tests"
# Rebuild the extension in place first, so the tests never run against a
# stale libdlslime.so or _C left by an earlier install.
if "$PYTHON" setup.py -q build_ext --inplace; then
    # pytest exits 5 when it collects nothing: that is a failure here,
    # since tests/python holds the binding's tests.
    "$PYTHON" -m pytest "$@" || failed+=("Python tests (pytest exit $?)")
else
    failed+=("Python extension build")
fi

section "summary"
if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "all stages passed: C tests, C tests under ASan/UBSan, Python tests"
