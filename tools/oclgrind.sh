#!/usr/bin/env bash
# The OpenCL op tests on Oclgrind:   bash tools/oclgrind.sh [--filter NAME] [--jobs N]
#
# Oclgrind (Debian package oclgrind) simulates an OpenCL device and reports what a real one
# would do silently: reads and writes out of bounds, data races between work items, work-group
# divergence at barriers, API errors. The simulator is a GPU to the planner, so every kernel
# runs in its GPU variant (work-group reductions and norms, matmul in local-memory tiles, split
# reductions), at the small shapes of the op tests of the compiled-backend suite
# (tests/backend_suite, built as tests/test_opencl.c; TB_TEST_SMALL=1 leaves out their cases of
# millions of elements), each result checked against the cpu backend.
#
# Each test of the list below runs alone (TB_TEST_FILTER) with an ICD folder that holds only
# Oclgrind's, OCLGRIND_DATA_RACES=1 and OCLGRIND_CHECK_API=1; it fails on a failed cmocka test,
# a crash or a timeout, or any line in the format of Oclgrind's reports. (OCLGRIND_UNINITIALIZED
# is left off: that plugin of Oclgrind 21.10 stops at LLVM's `freeze` instruction.) Prints
# "ok ..." or "FAIL ..." per test and a last line "N passed, N failed"; exits 1 if anything
# failed. Without Oclgrind installed it says so and exits 0.
#
#   --filter NAME   only the tests whose name contains NAME
#   --jobs N        tests run at once (default: the number of CPUs, at most 2)
#
# Environment: CC (default gcc); TB_OCLGRIND_TIMEOUT limits each test in seconds (default 300).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

filter=""
jobs=$(nproc 2>/dev/null || echo 1)
[ "$jobs" -gt 2 ] && jobs=2
while [ $# -gt 0 ]; do
    case "$1" in
    --filter)
        filter=${2:?--filter needs a NAME}
        shift
        ;;
    --filter=*) filter=${1#--filter=} ;;
    --jobs)
        jobs=${2:?--jobs needs a number}
        shift
        ;;
    --jobs=*) jobs=${1#--jobs=} ;;
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "oclgrind.sh: unknown argument: $1 (see bash tools/oclgrind.sh --help)" >&2
        exit 2
        ;;
    esac
    shift
done

# The op tests of the compiled-backend suite (tests/backend_suite). Left out, with the reason: test_vector_exp,
# test_norm_rows_streamed and test_elementwise_rows check the vector and streaming code only
# CPU devices get; test_matmul_through_reshape is a matmul of 10 million multiply-adds (half a
# minute simulated; test_matmul and test_gpu_code_paths run the tiled matmul); the random-graph
# tests take minutes simulated; the tests of the
# OpenCL machinery itself (devices, caches, the loader, allocation failures) run no kernels
# worth simulating.
tests=(
    test_unary
    test_cast_and_not
    test_binary
    test_scalar_operands_and_ternary
    test_reductions
    test_argmax_nan_and_ties
    test_matmul
    test_softmax_layer_norm
    test_movement
    test_concat_pad_gather
    test_conv_pool
    test_concat_many_inputs
    test_concat_many_inputs_grad
    test_generators
    test_rand_bit_identical
    test_edge_shapes
    test_fusion_patterns
    test_run_time_errors
    test_run_time_error_reports_one_item
    test_scalar_feeds_every_kernel_kind
    test_scalar_special_values
    test_gpu_code_paths
)

# Oclgrind's ICD library: from its package, or where Debian puts it.
lib=""
if command -v dpkg >/dev/null 2>&1; then
    lib=$(dpkg -L oclgrind 2>/dev/null | grep -m1 'liboclgrind-rt-icd\.so$' || true)
fi
[ -z "$lib" ] && [ -e /usr/lib/oclgrind/liboclgrind-rt-icd.so ] &&
    lib=/usr/lib/oclgrind/liboclgrind-rt-icd.so
if [ -z "$lib" ]; then
    echo "oclgrind.sh: Oclgrind is not installed (Debian: apt-get install oclgrind); nothing run"
    echo "0 passed, 0 failed"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tb_oclgrind.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/icd" build/oclgrind
echo "$lib" >"$work/icd/oclgrind.icd"

# Oclgrind's report lines: errors of its plugins (bounds, races, uninitialised values,
# barriers), API errors (OCLGRIND_CHECK_API) and its fatal errors (a kernel it cannot run).
markers='Invalid (read|write)|data race|Uninitiali[sz]ed|divergence|Work-item finished without'
markers+='|Oclgrind - OpenCL runtime error|OCLGRIND FATAL|Unhandled|Undefined external|^	Kernel: '

CC=${CC:-gcc}
bin=build/oclgrind/test_opencl
log=build/oclgrind/build.log
# shellcheck disable=SC2086
if ! $CC -std=c11 -g -O2 -Wall -Wextra -Werror -pedantic -I. tests/test_opencl.c -o "$bin" \
    -lcmocka -ldl -lpthread -lm >"$log" 2>&1; then
    echo "FAIL build: tests/test_opencl.c"
    sed 's/^/    /' "$log"
    echo "0 passed, 1 failed"
    exit 1
fi

timeout_s=${TB_OCLGRIND_TIMEOUT:-300}
# run_one NAME: the test on Oclgrind; its log and a verdict line in $work.
run_one() {
    local name=$1 out=$work/$1.log rc reports secs start local_mem=32768
    # test_matmul's batches put several tiled matmuls in one program, and Oclgrind adds up the
    # work-group memory of every kernel of a program (106,496 bytes there) where a device counts
    # each kernel's own (16 KiB at most)
    [ "$name" = test_matmul ] && local_mem=262144
    start=$(date +%s)
    env -u POCL_DEVICES -u TB_BACKEND -u TB_DEVICE -u TB_CHECK \
        OCL_ICD_VENDORS="$work/icd" OCL_ICD_FILENAMES= OCLGRIND_DATA_RACES=1 \
        OCLGRIND_CHECK_API=1 OCLGRIND_LOCAL_MEM_SIZE=$local_mem TB_TEST_SMALL=1 \
        TB_CACHE_DIR=off CMOCKA_MESSAGE_OUTPUT=stdout TB_TEST_FILTER="$name" \
        timeout -k 10 "$timeout_s" "$bin" >"$out" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    reports=$(grep -cE "$markers" "$out")
    if [ "$rc" -eq 0 ] && [ "$reports" -eq 0 ] && grep -q "^\[       OK \] $name\$" "$out"; then
        echo "ok oclgrind: $name (${secs}s)" >"$work/$name.verdict"
    else
        {
            echo "FAIL oclgrind: $name (exit status $rc, $reports report lines, ${secs}s)"
            grep -E -A6 "$markers" "$out" | head -n 60 | sed 's/^/    /'
            grep -E '^\[  (FAILED|ERROR)|^ERROR|error: Failure' "$out" | head -n 20 | sed 's/^/    /'
        } >"$work/$name.verdict"
    fi
}

selected=()
for t in "${tests[@]}"; do
    if [ -z "$filter" ] || [[ "$t" == *"$filter"* ]]; then
        selected+=("$t")
    fi
done

for t in "${selected[@]+"${selected[@]}"}"; do
    run_one "$t" &
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        wait -n
    done
done
wait

passed=0
failed=0
for t in "${selected[@]+"${selected[@]}"}"; do
    if [ -f "$work/$t.verdict" ]; then
        cat "$work/$t.verdict"
        if head -n 1 "$work/$t.verdict" | grep -q '^ok '; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    else
        echo "FAIL oclgrind: $t (no result)"
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
