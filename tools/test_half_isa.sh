#!/usr/bin/env bash
# tests/test_half.c against PyTorch's kernels of each x86 instruction-set class:
#
#   bash tools/test_half_isa.sh
#
# PyTorch 1.13 picks its 16-bit kernels by the CPU it runs on (bf16 matmul rounds its partial
# sums to bf16 without AVX-512, bf16 gelu approximates erf differently on AVX2), so the test's
# oracle, tests/half_torch.py, gives other results on other machines. This builds
# tests/test_half.c (-O2, no sanitizers) and runs it once with the oracle on this CPU, then with
# the oracle under qemu-x86_64 user emulation (Debian: qemu-user) as an AVX2 CPU (EPYC-Milan)
# and as an SSE4.2 one (Nehalem), through TB_HALF_ORACLE_PREFIX. (QEMU's emulation has no
# AVX-512: that class is covered where this machine has it.) One line per run, "ok ..." or
# "FAIL ...", after the test's own output; the exit status is 1 if any run failed. The
# emulated runs are skipped with a message where qemu-x86_64 is missing, all of them where
# /usr/bin/python3 cannot import torch.
#
# Environment: CC (default gcc); TB_CACHE_DIR (default a fresh temporary directory).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

CC=${CC:-gcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TB_CACHE_DIR=${TB_CACHE_DIR:-$tmp/cache}
failed=0

if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    echo "test_half_isa.sh: skipped: /usr/bin/python3 cannot import torch (PyTorch 1.13)"
    exit 0
fi
# CC may hold a command with arguments ("ccache gcc")
# shellcheck disable=SC2086
if ! $CC -std=c11 -O2 -g -I. tests/test_half.c -o "$tmp/test_half" -lcmocka -ldl -lpthread -lm; then
    echo "FAIL test_half: does not build"
    exit 1
fi

# run_one LABEL PREFIX: the test with the oracle under PREFIX ("" for this CPU). The oracle
# must load: a skipped conversion or cpu test means it did not.
run_one() {
    local label=$1 prefix=$2 log=$tmp/log rc
    echo
    echo "== test_half, PyTorch $label =="
    TB_HALF_ORACLE_PREFIX=$prefix "$tmp/test_half" 2>&1 |
        grep -v "TCG doesn't support requested feature" | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "FAIL test_half, PyTorch $label (exit status $rc)"
        failed=1
    elif grep -qE 'SKIPPED \] (test_exhaustive_conversions|test_ops_cpu)' "$log"; then
        echo "FAIL test_half, PyTorch $label: the oracle did not load (see above)"
        failed=1
    else
        echo "ok test_half, PyTorch $label"
    fi
}

host=SSE
grep -qw avx2 /proc/cpuinfo 2>/dev/null && host=AVX2
grep -qw avx512f /proc/cpuinfo 2>/dev/null && host=AVX-512
run_one "on this CPU ($host)" ""
if command -v qemu-x86_64 >/dev/null 2>&1; then
    run_one "as an AVX2 CPU (qemu-x86_64 -cpu EPYC-Milan)" "qemu-x86_64 -cpu EPYC-Milan"
    # OpenBLAS picks its kernels at run time, and on QEMU's Nehalem it picks AVX ones that
    # stop on an illegal instruction: it is told the core, as a real Nehalem would report.
    run_one "as an SSE4.2 CPU (qemu-x86_64 -cpu Nehalem)" \
        "env OPENBLAS_CORETYPE=Nehalem qemu-x86_64 -cpu Nehalem"
else
    echo "test_half_isa.sh: the AVX2 and SSE4.2 runs skipped: no qemu-x86_64" \
        "(Debian: apt-get install qemu-user)"
fi
exit "$failed"
