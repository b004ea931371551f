#!/usr/bin/env bash
# Builds the OpenCL fault-injection stand-in:   bash tests/cl_fault/build.sh OUTDIR
#   OUTDIR/libtb_cl_fault.so   tests/cl_fault/cl_fault.c, an ICD loader stand-in that forwards
#                              to libOpenCL.so.1 and fails chosen calls
# tests/test_opencl_faults.c finds it in build/cl_fault/ (or at $TB_TEST_CL_FAULT) and hands it
# to the library through TB_OPENCL_LIBRARY. CC picks the compiler (default cc; it may hold
# arguments). Needs the OpenCL headers (Debian: opencl-headers). A plain shared object, without
# sanitizers: it loads into sanitized test programs.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash tests/cl_fault/build.sh OUTDIR" >&2
    exit 2
fi
out=$1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p "$out"
cc=${CC:-cc}
# shellcheck disable=SC2086
$cc -std=gnu11 -g -O1 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    tests/cl_fault/cl_fault.c -o "$out/libtb_cl_fault.so" -ldl -lpthread
echo "built $out/libtb_cl_fault.so"
