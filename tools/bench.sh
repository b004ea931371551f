#!/usr/bin/env bash
# The benchmark, in one command:   bash tools/bench.sh [--quick] [--json FILE] [--no-install]
#                                                    [--only CASE,...]
#   --quick         small sizes, 1 to 3 repetitions (well under a minute); results still checked
#   --json FILE     also write one JSON object per (case, anchor) and line to FILE:
#                   {"case", "tb", "anchor_name", "anchor", "unit", "ratio", "value", "reps"}
#                   (tb and anchor in seconds; ratio = anchor / tb; value = our rate in unit)
#   --no-install    do not install missing Debian packages
#   --only LIST     run only these cases (comma-separated): chain8 sum max row_sums softmax
#                   layer_norm matmul mlp trace replay coldstart
#
# Steps: install the Debian packages the benchmark needs (compiler, OpenCL headers and ICD
# loader, PoCL), look for the optional anchors (CLBlast and OpenBLAS are used when their headers
# and libraries are installed, skipped with a note otherwise), compile tools/bench.c with -O2
# against torch_backend.h (and -lOpenCL for the hand-written anchor kernels), and run it on
# opencl:0. Every case checks its result against the cpu reference backend or the host before
# it is timed and stops the run (exit status 1) when a result is wrong. The table gives our
# time, the anchor's time and ratio = anchor time / our time (> 1: we are faster).
#
# Environment: CC picks the compiler (default gcc). TB_CACHE_DIR, when set, is used as the
# OpenCL program cache; otherwise the benchmark makes a fresh one in $TMPDIR and removes it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

args=()
install=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) args+=(--quick) ;;
    --json)
        if [ $# -lt 2 ]; then
            echo "bench.sh: --json needs a FILE" >&2
            exit 2
        fi
        args+=(--json "$2")
        shift
        ;;
    --json=*) args+=(--json "${1#--json=}") ;;
    --only)
        if [ $# -lt 2 ]; then
            echo "bench.sh: --only needs a LIST" >&2
            exit 2
        fi
        args+=(--only "$2")
        shift
        ;;
    --only=*) args+=(--only "${1#--only=}") ;;
    --no-install) install=0 ;;
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "bench.sh: unknown argument: $1 (see bash tools/bench.sh --help)" >&2
        exit 2
        ;;
    esac
    shift
done

CC=${CC:-gcc}

# ---- packages ----
packages=(gcc libc6-dev ocl-icd-opencl-dev opencl-headers ocl-icd-libopencl1 pocl-opencl-icd)
if [ "$install" -eq 1 ] && command -v dpkg >/dev/null 2>&1; then
    missing=()
    for p in "${packages[@]}"; do
        if ! dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "bench: installing ${missing[*]}"
        sudo=()
        if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo=(sudo); fi
        if ! { "${sudo[@]+"${sudo[@]}"}" apt-get update &&
            "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
                "${missing[@]}"; }; then
            echo "bench: could not install ${missing[*]}; going on with what is there" >&2
        fi
    fi
fi

# ---- optional anchors: used when a test program compiles and links ----
mkdir -p build/bench
probe=build/bench/probe
defs=()
libs=()
if printf '#include <clblast_c.h>\nint main(void) { return (int)CLBlastClearCache(); }\n' |
    $CC -x c - -o "$probe" -lclblast -lOpenCL >/dev/null 2>&1; then
    defs+=(-DBENCH_CLBLAST)
    libs+=(-lclblast)
    echo "bench: CLBlast found: SGEMM anchor on the same OpenCL device"
else
    echo "bench: note: CLBlast not installed (libclblast-dev): its matmul anchor is skipped"
fi
if printf '#include <cblas.h>\nint openblas_get_num_threads(void);\nint main(void) { return openblas_get_num_threads() > 0 ? 0 : 1; }\n' |
    $CC -x c - -o "$probe" -lopenblas >/dev/null 2>&1; then
    defs+=(-DBENCH_OPENBLAS)
    libs+=(-lopenblas)
    echo "bench: OpenBLAS found: cblas_sgemm anchor on the host"
else
    echo "bench: note: OpenBLAS not installed (libopenblas-dev): its host anchors are skipped"
fi
rm -f "$probe"

if command -v python3 >/dev/null 2>&1 && ! python3 amalgamate.py --check >/dev/null 2>&1; then
    echo "bench: note: torch_backend.h differs from src/ (python3 amalgamate.py regenerates it);"
    echo "bench: benchmarking torch_backend.h as it is"
fi

# ---- build (skipped when the program is newer than its sources and the flags are the same)
# and run ----
# The library opens the ICD loader at run time; -lOpenCL is for the anchors' own OpenCL calls
# (both end up in the same libOpenCL.so.1, so they share the library's context and queue).
# CC may hold a command with arguments ("ccache gcc"): it is split on spaces on purpose.
# shellcheck disable=SC2206
cmd=($CC -std=gnu11 -O2 -I. tools/bench.c -o build/bench/bench "${defs[@]+"${defs[@]}"}"
    -lOpenCL "${libs[@]+"${libs[@]}"}" -ldl -lpthread -lm)
stamp=build/bench/bench.cmd
if [ -x build/bench/bench ] && [ build/bench/bench -nt tools/bench.c ] &&
    [ build/bench/bench -nt torch_backend.h ] && [ -f "$stamp" ] &&
    [ "$(cat "$stamp")" = "${cmd[*]}" ]; then
    echo "bench: build/bench/bench is up to date"
else
    echo "bench: compiling: ${cmd[*]}"
    rm -f "$stamp"
    "${cmd[@]}"
    printf '%s' "${cmd[*]}" >"$stamp"
fi
exec build/bench/bench "${args[@]+"${args[@]}"}"
