#!/usr/bin/env bash
# The fuzz stage of scripts/run_tests.sh: builds the libFuzzer targets
# (tests/fuzz, clang) in a build directory of their own, runs each for a
# short fixed time from the checked-in corpus, and fails on any crash,
# leak, undefined behaviour or hang (an input running past 10 s), printing
# the executions of each target.  Exits 77 (skipped), saying why, where
# clang or its libFuzzer runtime is missing (scripts/setup.sh installs
# them).
#
# Usage: tests/fuzz/stage.sh [SECONDS_PER_TARGET]   (default 15)
#        tests/fuzz/stage.sh --corpus   rewrites tests/fuzz/corpus (gen_corpus.c)
# Environment: DLSLIME_FUZZ_CC (default clang-14, else clang),
#              DLSLIME_FUZZ_BUILD_DIR (default build-fuzz).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${DLSLIME_FUZZ_BUILD_DIR:-build-fuzz}
CC_FUZZ=${DLSLIME_FUZZ_CC:-$(command -v clang-14 || command -v clang || true)}

if [[ -z $CC_FUZZ ]]; then
    echo "SKIP: no clang here (apt-get install clang-14 libclang-rt-14-dev, or run scripts/setup.sh)"
    exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    >"$probe/p.c"
if ! "$CC_FUZZ" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
    echo "SKIP: $CC_FUZZ cannot link libFuzzer ($(head -1 "$probe/err")); apt-get install libclang-rt-14-dev"
    exit 77
fi

generator=()
[[ -f $BUILD/CMakeCache.txt ]] || generator=(-G Ninja)
start=$(date +%s)
mkdir -p "$BUILD"
if ! { CC=$CC_FUZZ cmake -S . -B "$BUILD" "${generator[@]}" -DDLSLIME_FUZZ=ON -DDLSLIME_TESTS=OFF \
        -DDLSLIME_BENCH=OFF && cmake --build "$BUILD" --target fuzz; } >"$BUILD/build.log" 2>&1; then
    tail -40 "$BUILD/build.log"
    echo "FAILED: building the fuzz targets ($BUILD/build.log)"
    exit 1
fi
echo "fuzz targets built in $(($(date +%s) - start)) s"
bin=$BUILD/tests/fuzz

if [[ ${1:-} == --corpus ]]; then
    # rewrites the seeds it makes; the regress-* inputs stay
    exec "$bin/fuzz_corpus" tests/fuzz/corpus
fi
seconds=${1:-15}

# Leaks fail a run too; the first directory takes what a run finds new
# (scratch), the checked-in corpus is only read.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
failed=()
for target in "$bin"/fuzz_*; do
    name=${target##*/fuzz_}
    [[ $name == corpus ]] && continue
    scratch=$BUILD/corpus-run/$name
    artifacts=$BUILD/artifacts/$name/
    rm -rf "$scratch"
    mkdir -p "$scratch" "$artifacts"
    log=$BUILD/fuzz_$name.log
    "$target" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts" \
        "$scratch" "tests/fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if ((rc == 0)); then
        echo "fuzz_$name: ${execs:-?} executions in $seconds s, no finding"
    else
        echo "FAILED: fuzz_$name (exit $rc after ${execs:-?} executions); the report:"
        grep -E -A40 '^==[0-9]+==ERROR|runtime error|ALARM|deadly signal' "$log" | head -60
        echo "the input that did it: $(ls "$artifacts" | head -1 | sed "s|^|$artifacts|")" \
             "(tests/fuzz/README.md: how to reproduce and keep it)"
        failed+=("fuzz_$name")
    fi
done
for dir in tests/fuzz/corpus/*/; do
    name=$(basename "$dir")
    [[ -x $bin/fuzz_$name ]] || echo "fuzz_$name: not built here, so not run (tests/fuzz/CMakeLists.txt: what it needs)"
done
echo "fuzz stage: $(($(date +%s) - start)) s"
((${#failed[@]} == 0))
