#!/usr/bin/env bash
# The native backend on the CPU classes this machine is not, under user-mode emulation:
#
#   bash tools/test_arch.sh
#
# tests/native_arch_check.c (every kind of kernel and vector path on native:0 against the cpu
# backend) runs
#   - under qemu-x86_64 as an AVX2 CPU (EPYC-Milan) and as an SSE4.2 one (Nehalem): the backend
#     reads the emulated CPU's features, plans for its vector shape and keeps the compiler (run
#     natively, for this machine) from targeting more than the emulated CPU has;
#   - built for aarch64 by Debian's cross compiler (gcc-aarch64-linux-gnu, with
#     libc6-dev-arm64-cross) and run under qemu-aarch64, the backend compiling its programs with
#     that cross compiler (NEON: 32 registers of 16 bytes). The program is linked statically:
#     QEMU 7.2 hangs in the dynamic loader's thread and fork set-up of glibc 2.36 programs here.
# Each run prints the program's lines, then "ok arch: ..." or "FAIL arch: ..."; a class whose
# tools are missing is skipped with a message (Debian: qemu-user, gcc-aarch64-linux-gnu). The
# exit status is 1 if any run failed.
#
# Environment: CC (default gcc) builds the x86-64 program and is the native backend's compiler
# there; TB_CACHE_DIR (default a fresh temporary folder).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

CC=${CC:-gcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TB_CACHE_DIR=${TB_CACHE_DIR:-$tmp/cache}
failed=0

# run_one LABEL COMMAND...: runs the check, its output indented, and says ok or FAIL.
run_one() {
    local label=$1 log=$tmp/run.log rc
    shift
    timeout --foreground -k 10 900 "$@" >"$log" 2>&1
    rc=$?
    sed 's/^/    /' "$log"
    if [ "$rc" -eq 0 ] && grep -q ' 0 failed$' "$log"; then
        echo "ok arch: $label ($(tail -n 1 "$log"))"
    else
        echo "FAIL arch: $label (exit status $rc)"
        failed=1
    fi
}

if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "test_arch.sh: skipped: no qemu-x86_64 (Debian: apt-get install qemu-user)"
    exit 0
fi

# shellcheck disable=SC2086
if $CC -std=c11 -O2 -I. tests/native_arch_check.c -o "$tmp/check" -ldl -lpthread -lm; then
    if [ "$(uname -m)" = x86_64 ]; then
        for cpu in EPYC-Milan:AVX2 Nehalem:SSE4.2; do
            run_one "x86-64 as an ${cpu#*:} CPU (qemu-x86_64 -cpu ${cpu%%:*})" \
                qemu-x86_64 -cpu "${cpu%%:*}" "$tmp/check"
        done
    fi
else
    echo "FAIL arch: tests/native_arch_check.c does not build with $CC"
    failed=1
fi

cross=aarch64-linux-gnu-gcc
if ! command -v "$cross" >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    echo "test_arch.sh: aarch64 skipped: needs $cross and qemu-aarch64 (Debian:" \
        "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
elif "$cross" -std=c11 -O2 -static -I. tests/native_arch_check.c -o "$tmp/check-aarch64" \
    -ldl -lpthread -lm 2>"$tmp/cross.log"; then
    run_one "aarch64 (qemu-aarch64, programs built by $cross)" \
        env CC="$cross" qemu-aarch64 -L /usr/aarch64-linux-gnu "$tmp/check-aarch64"
else
    # the static link warns that dlopen needs the shared C library at run time: not an error
    sed 's/^/    /' "$tmp/cross.log"
    echo "FAIL arch: tests/native_arch_check.c does not build with $cross"
    failed=1
fi
exit "$failed"
