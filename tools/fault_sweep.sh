#!/usr/bin/env bash
# The fault-injection sweeps in full (the test suite runs a sample of the OpenCL ones):
#
#     bash tools/fault_sweep.sh [--fast] [--persist] [--jobs N] [alloc-cpu] [alloc-opencl] [cl]
#
#   alloc-cpu     tests/test_alloc_faults.c: every allocation of the workload refused in turn,
#                 on the cpu backend (the suite does this one in full too)
#   alloc-opencl  tests/test_alloc_faults_opencl.c: the same on the opencl backend
#   cl            tests/test_opencl_faults.c: every call of every OpenCL entry point failed in
#                 turn, programs from source and from the disk cache
#
# Default: all three. Each sweep is split over N processes (default: the number of cores),
# which run at once under nice. The programs are built with the suite's sanitizers (gcc
# -fsanitize=address,undefined); --fast builds them at -O1 without sanitizers (several times
# faster; it still finds wrong values, errors without a message, and blocks or OpenCL objects
# left behind, but not memory errors). --persist refuses every allocation from the n-th on
# (memory that stays short, so that the error paths themselves find none) instead of just the
# n-th. One line per process, "ok sweep: NAME i/N" or "FAIL sweep: NAME i/N" with the problems
# found; the last line is "N passed, N failed"; the exit status is 1 on a failure. Uses
# build/sweep/; needs what tools/test.sh needs (cmocka, PoCL, the OpenCL headers). With the
# sanitizers on two cores: alloc-cpu about a minute, alloc-opencl about 40 minutes, cl about 20.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

fast=0
persist=0
jobs=$(nproc 2>/dev/null || echo 2)
sweeps=()
while [ $# -gt 0 ]; do
    case "$1" in
    --fast) fast=1 ;;
    --persist) persist=1 ;;
    --jobs)
        if [ $# -lt 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
            echo "fault_sweep.sh: --jobs needs a positive whole number" >&2
            exit 2
        fi
        jobs=$2
        shift
        ;;
    alloc-cpu | alloc-opencl | cl) sweeps+=("$1") ;;
    -h | --help)
        sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "fault_sweep.sh: unknown argument: $1 (see bash tools/fault_sweep.sh --help)" >&2
        exit 2
        ;;
    esac
    shift
done
[ "${#sweeps[@]}" -gt 0 ] || sweeps=(alloc-cpu alloc-opencl cl)

CC=${CC:-gcc}
out=build/sweep
mkdir -p "$out"
if [ "$fast" -eq 1 ]; then
    flags="-std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -I."
else
    flags="-std=c11 -g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer
        -fno-sanitize-recover=undefined -Wall -Wextra -Werror -pedantic -I."
fi
cache_dir=$(mktemp -d "${TMPDIR:-/tmp}/tb_sweep_cache.XXXXXX")
trap 'rm -rf "$cache_dir"' EXIT
export POCL_DEVICES="pthread pthread"
export TB_CACHE_DIR=$cache_dir
export TB_BACKEND_PATH=$repo/build/plugins
export CMOCKA_MESSAGE_OUTPUT=stdout
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
unset TB_BACKEND TB_DEVICE TB_CHECK CMOCKA_XML_FILE
export TB_TEST_ALLOC_PERSIST=$persist

passed=0
failed=0
if ! CC="$CC" bash tests/plugins/build.sh build/plugins >"$out/plugins.log" 2>&1 ||
    ! CC="$CC" bash tests/cl_fault/build.sh build/cl_fault >"$out/cl_fault.log" 2>&1; then
    echo "FAIL build: tests/plugins/build.sh or tests/cl_fault/build.sh"
    sed 's/^/    /' "$out/plugins.log" "$out/cl_fault.log"
    echo "0 passed, 1 failed"
    exit 1
fi

for sweep in "${sweeps[@]}"; do
    case "$sweep" in
    alloc-cpu) src=tests/test_alloc_faults.c env_full=TB_TEST_ALLOC_SWEEP env_shard=TB_TEST_ALLOC_SHARD ;;
    alloc-opencl) src=tests/test_alloc_faults_opencl.c env_full=TB_TEST_ALLOC_SWEEP env_shard=TB_TEST_ALLOC_SHARD ;;
    cl) src=tests/test_opencl_faults.c env_full=TB_TEST_CL_FAULT_SWEEP env_shard=TB_TEST_CL_FAULT_SHARD ;;
    esac
    bin=$out/$(basename "$src" .c)
    echo "-- $sweep: $src, $jobs processes$([ "$fast" -eq 1 ] && echo ", no sanitizers")"
    # shellcheck disable=SC2086
    if ! $CC $flags "$src" -o "$bin" -lcmocka -ldl -lpthread -lm >"$bin.build.log" 2>&1; then
        echo "FAIL sweep: $sweep (does not build)"
        sed 's/^/    /' "$bin.build.log"
        failed=$((failed + 1))
        continue
    fi
    started=$(date +%s)
    pids=()
    for ((i = 0; i < jobs; i++)); do
        env "$env_full=full" "$env_shard=$i/$jobs" nice "$bin" >"$bin.$i.log" 2>&1 &
        pids+=($!)
    done
    for ((i = 0; i < jobs; i++)); do
        if wait "${pids[$i]}"; then
            echo "ok sweep: $sweep $i/$jobs"
            passed=$((passed + 1))
        else
            echo "FAIL sweep: $sweep $i/$jobs (full log: $bin.$i.log)"
            grep -v '^\[' "$bin.$i.log" | head -n 40 | sed 's/^/    /'
            failed=$((failed + 1))
        fi
    done
    echo "   $sweep took $(($(date +%s) - started)) s"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
