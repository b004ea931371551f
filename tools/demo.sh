#!/usr/bin/env bash
# The demo: installs what is missing, builds examples/hello.c against torch_backend.h and runs it.
# It uses the OpenCL backend when an OpenCL device is present, else the cpu reference backend.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in gcc libc6-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# OpenCL is optional for the demo: the loader and PoCL make the opencl backend usable.
for pkg in ocl-icd-libopencl1 pocl-opencl-icd; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo=sudo
    echo "demo: installing ${need[*]}"
    $sudo apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" ||
        echo "demo: could not install ${need[*]}; going on with what is there"
fi

mkdir -p build
${CC:-cc} -std=c99 -O2 -I. examples/hello.c -o build/hello -ldl -lpthread -lm
./build/hello
