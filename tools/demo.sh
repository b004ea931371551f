#!/usr/bin/env bash
# The demo: installs what is missing, builds examples/hello.c against torch_backend.h and runs it.
# It uses the OpenCL backend when an OpenCL device is present, else the native backend (C
# generated and compiled at run time) when a C compiler is, else the cpu reference backend.
#
#   bash tools/demo.sh                   the first lazy computation (examples/hello.c)
#   bash tools/demo.sh --train [EPOCHS]  trains an MLP on Fashion-MNIST (examples/train_mnist.c;
#                                        one epoch unless EPOCHS says more)
#   bash tools/demo.sh --train EPOCHS --torch
#                                        then trains the same model the same way in PyTorch
#                                        (tools/bench/train_mnist_torch.py), for the epoch times
set -euo pipefail
cd "$(dirname "$0")/.."

train=0
epochs=1
torch=0
usage() {
    echo "usage: bash tools/demo.sh [--train [EPOCHS] [--torch]]" >&2
    exit 2
}
if [ "${1-}" = "--train" ]; then
    train=1
    shift
    if [ $# -gt 0 ] && [ "$1" != "--torch" ]; then
        epochs=$1
        shift
    fi
    if [ "${1-}" = "--torch" ]; then
        torch=1
        shift
    fi
    [ $# -eq 0 ] || usage
elif [ $# -gt 0 ]; then
    usage
fi

need=()
for pkg in gcc libc6-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# OpenCL is optional for the demo: the loader and PoCL make the opencl backend usable.
for pkg in ocl-icd-libopencl1 pocl-opencl-icd; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "$train" -eq 1 ]; then
    dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || need+=(dataset-fashion-mnist)
fi
if [ "$torch" -eq 1 ]; then
    dpkg -s python3-torch >/dev/null 2>&1 || need+=(python3-torch)
fi
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo=sudo
    echo "demo: installing ${need[*]}"
    $sudo apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" ||
        echo "demo: could not install ${need[*]}; going on with what is there"
fi

mkdir -p build
# building an example compiles the whole library (one translation unit of ~39,000 lines)
build_note="about 10 s on 2 cores at -O2"
if [ "$train" -eq 1 ]; then
    echo "demo: building examples/train_mnist.c ($build_note)"
    ${CC:-cc} -std=c99 -O2 -I. examples/train_mnist.c -o build/train_mnist -ldl -lpthread -lm
    echo "demo: training; the first steps compile its kernels (seconds, once: a second run" \
        "finds them in the disk cache)"
    ./build/train_mnist "$epochs"
    if [ "$torch" -eq 1 ]; then
        echo "-- the same training in PyTorch --"
        MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE \
            /usr/bin/python3 tools/bench/train_mnist_torch.py "$epochs"
    fi
else
    echo "demo: building examples/hello.c ($build_note)"
    ${CC:-cc} -std=c99 -O2 -I. examples/hello.c -o build/hello -ldl -lpthread -lm
    ./build/hello
fi
