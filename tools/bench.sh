#!/usr/bin/env bash
# The benchmark, in one command:   bash tools/bench.sh [--quick] [--json FILE] [--no-install]
#                                                    [--only CASE,...] [--class avx2|sse]
#   --quick         small sizes, 1 to 3 repetitions (well under a minute); results still checked
#   --class C       measure a narrower x86 class than this CPU's on this CPU: the native backend's
#                   kernels built for it (-march=x86-64-v3 for avx2, -v2 for sse), PyTorch on its
#                   kernels of that class (ATEN_CPU_CAPABILITY, oneDNN's ISA cap) and OpenBLAS on
#                   its (OPENBLAS_CORETYPE Haswell, Nehalem) and PoCL on its kernel library of that
#                   class (POCL_KERNELLIB_NAME avx2, sse41: its device is then named haswell or
#                   penryn; a warning where it is not). The table's machine line names the OpenCL
#                   device; the first line says which kernels each side runs. A machine of that
#                   class is the real measurement.
#   --json FILE     also write to FILE one JSON object per (case, backend) row:
#                   {"case", "backend", "ours", "pytorch", "ratio_pytorch", "bound", "bound_kind",
#                    "frac_bound", "rate", "unit", "anchor_name", "anchor", "ratio_anchor",
#                    "bytes", "flops", "reps"}
#                   (times in seconds, null where there is none; ratio_pytorch = pytorch / ours,
#                   frac_bound = bound / ours, ratio_anchor = anchor / ours), after a first object
#                   {"case": "machine", ...} with the CPU, threads and measured bandwidths
#   --no-install    do not install missing Debian packages
#   --only LIST     run only these cases (comma-separated): chain8 add gates sum max row_sums
#                   softmax layer_norm matmul mlp mlp_train conv trace replay coldstart half
#                   allreduce_devices models allreduce_mpi
#
# models (tools/bench/models.py; skipped with a note where /usr/bin/python3 cannot import torch
# and torchvision): ResNet-18, ResNet-50, MobileNetV2, SqueezeNet 1.0 (batch 8, 224x224) and a
# TransformerEncoder ([8, 64, 128]) from PyTorch's weights (examples/models.c): a cached forward
# beside PyTorch eager's (rows models_<M>; 3 rounds of ours then PyTorch's, after a first
# PyTorch run, each row the median over the rounds: tools/bench/models.py), and the first
# forward of a fresh process with empty caches (coldstart_<M>, with the kernels compiled and
# launched in its note); the Fashion-MNIST CNN's epoch of 6,400 images (train_cnn_epoch), a
# step of the small GPT (gpt_step) and a training step of ResNet-18 through tools/tb_fx.py
# (fx_train_resnet18) beside their PyTorch twins. --quick: ResNet-18 at batch 1, 64x64 only.
#
# replay: a cached graph of 100 small steps (r = max(r + x, 1) on f32[8,32]) beside PyTorch
# eager and, on OpenCL, the same steps enqueued by hand as 100 kernels; replay_overhead: the
# chain with each step reading r's rows in reverse (one kernel per step), for the cost of a
# launch (on OpenCL its paired difference with the same kernels enqueued by hand; target 5 us).
#
# half: chain8, axpy (2.5 x + y), sum and matmul (512) with f16 and bf16 storage (rows
# chain8_f16, axpy_bf16, sum_bf16, matmul_f16_512, ...), each timed beside the same case in f32
# on the same backend: the row's anchor is ours_f32, so an/ours is the speed-up of 16-bit
# storage. Every op of a 16-bit chain rounds its result (as PyTorch eager), so a chain whose
# f32 form is bound by arithmetic, not memory (chain8's exp), pays those roundings.
#
# allreduce_devices: the all-reduce (sum) of 16M floats held by opencl:0 and opencl:1 of one
# process (POCL_DEVICES defaults to "pthread pthread" here, which gives PoCL two devices),
# tb_sharded_all_reduce beside the same work written by hand with the OpenCL API (device 1's
# buffer mapped and written to device 0, the hand-written add, the sum mapped and written back);
# anchor / ours is the target (>= 0.9).
#
# allreduce_mpi (last; skipped with a note where mpicc or mpirun is missing: Debian's
# libopenmpi-dev and openmpi-bin) is tools/bench/mpi/allreduce.c built with mpicc and run under
# `mpirun -np 2`: tb_all_reduce (sum) of 16M floats (--quick: 1M) on cpu:0, native:0 and
# opencl:0 beside raw MPI_Allreduce of the same values in the same run; MPI / ours is the
# target (>= 0.9). A call's time is the slowest rank's, each call after a barrier.
#
# Every case runs on opencl:0 and native:0 (a backend that cannot run here is skipped with a
# note) beside its peers, measured in the same run:
#   - PyTorch eager on the same number of threads (the native backend's: online cores, or
#     TB_NATIVE_THREADS), run by /usr/bin/python3 tools/bench/torch_peer.py on the same inputs,
#     its result checked like ours; skipped with a note where torch cannot be imported;
#   - the bound: in the bandwidth cases a side of the case's own rounds (flushed and timed like
#     every side, so it sees the memory the case saw: the bandwidth of these VMs moves by 1.5x
#     from minute to minute) that moves the case's least traffic over buffers much larger than
#     the caches on the same threads: a read where the case only reads, else a copy with
#     non-temporal stores (no read of the written lines, as the kernels that write large
#     outputs store; x86); rows with bound kind "bandwidth_side". Read, copy (plain and
#     non-temporal) and triad are also measured before and after the cases (noted; the bound
#     of the other bandwidth rows and of --quick runs). For matmul and the MLP, OpenBLAS on the
#     same threads (and CLBlast on the OpenCL device);
#   - on OpenCL, a hand-written kernel doing the same work (contiguous chunks, float16 vectors,
#     several accumulators), tuned over a few launch shapes.
# mlp_train is one training step (784-512-512-10, ReLU, batch 256, cross-entropy on integer
# targets, AdamW lr 1e-3): ours records the forward pass, asks tb_grad for the gradients and
# runs tb_optimizer_step (one graph per step); its anchor is the same step written with the
# library's plain ops on the same backend (backward and AdamW by hand, tb_assign), so anchor /
# ours is what autograd and the optimizer cost (target >= 0.9); its bound is the step in C on
# the host with OpenBLAS's sgemm; PyTorch runs torch.optim.AdamW. A note adds ours with the
# gradients passed through tb_detach. Every side starts from the same parameters and must agree
# with ours on the cpu reference backend after 3 steps; after the timing a few more steps are
# watched: a note says LEAK where they grow the device's bytes in use or the host heap.
# Every result (ours on each backend, PyTorch's, the anchors') is checked against the cpu
# reference backend or the host before anything is timed; a wrong one stops the run (exit
# status 1). Timing: two warm-up calls per side, then rounds that call every side once in an
# order shuffled every round; each side's median is reported. In the bandwidth cases the caches are
# flushed (a large buffer read, untimed) before each timed call, so every side streams from
# memory as the bound does. BLAS sides sleep after each call (their threads spin); in matmul,
# mlp and mlp_train every side gets an untimed call before each timed one. The table gives per
# (case, backend): our time, PyTorch's and PyTorch / ours (> 1: we are faster), the bound and
# bound / ours, our rate (GB/s of least traffic, or GFLOP/s), the anchor's time and anchor /
# ours. A note gives each side's page faults per timed call where any has some (fresh memory
# is slow to touch on some virtual machines).
#
# Steps: install the Debian packages the benchmark needs (compiler, OpenCL headers and ICD
# loader, PoCL) and, when missing, its peers (libopenblas-dev, libclblast-dev, python3-torch,
# python3-numpy; a note when they cannot be installed), compile tools/bench/*.c with -O2 against
# torch_backend.h (objects in build/bench/obj, rebuilt when their sources change) and run it.
#
# Environment: CC picks the compiler (default gcc; the native backend uses it too).
# TB_NATIVE_THREADS sets the native backend's threads and so every peer's. TB_CACHE_DIR, when
# set, is used as the program cache; otherwise the benchmark makes a fresh one and removes it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export POCL_DEVICES=${POCL_DEVICES:-pthread pthread} # two PoCL devices for allreduce_devices

args=()
install=1
quick=0
json=""
only=""
class=""
while [ $# -gt 0 ]; do
    case "$1" in
    --quick)
        args+=(--quick)
        quick=1
        ;;
    --json)
        if [ $# -lt 2 ]; then
            echo "bench.sh: --json needs a FILE" >&2
            exit 2
        fi
        json=$2
        shift
        ;;
    --json=*) json=${1#--json=} ;;
    --only)
        if [ $# -lt 2 ]; then
            echo "bench.sh: --only needs a LIST" >&2
            exit 2
        fi
        only=$2
        shift
        ;;
    --only=*) only=${1#--only=} ;;
    --no-install) install=0 ;;
    --class)
        if [ $# -lt 2 ]; then
            echo "bench.sh: --class needs avx2 or sse" >&2
            exit 2
        fi
        class=$2
        shift
        ;;
    --class=*) class=${1#--class=} ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
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

# ---- a narrower CPU class than this machine's, on this machine ----
case "$class" in
"") ;;
avx2 | sse)
    if [ "$class" = avx2 ]; then
        march=x86-64-v3 aten=avx2 dnnl=AVX2 blas=Haswell pocl=avx2 pocl_cpu=haswell
    else
        march=x86-64-v2 aten=default dnnl=SSE41 blas=Nehalem pocl=sse41 pocl_cpu=penryn
    fi
    export TB_NATIVE_CFLAGS="${TB_NATIVE_CFLAGS:+$TB_NATIVE_CFLAGS }-march=$march"
    export ATEN_CPU_CAPABILITY=$aten ONEDNN_MAX_CPU_ISA=$dnnl DNNL_MAX_CPU_ISA=$dnnl
    export OPENBLAS_CORETYPE=$blas
    # PoCL compiles for the target of its kernel library (the device's name says which); its
    # vector width query still reads this CPU, and the library takes the narrower of the two
    export POCL_KERNELLIB_NAME=$pocl
    echo "bench: class $class on this CPU: native kernels built with -march=$march," \
        "PyTorch's $aten kernels (ATEN_CPU_CAPABILITY, oneDNN $dnnl), OpenBLAS's $blas" \
        "kernels, PoCL's $pocl kernel library (POCL_KERNELLIB_NAME)"
    # PoCL keeps its own library where it cannot use the one asked for
    if command -v clinfo >/dev/null 2>&1; then
        pocl_names=$(clinfo 2>/dev/null | grep -E '^ *Device Name .*pthread-' || true)
        if [ -n "$pocl_names" ] && ! grep -e "pthread-$pocl_cpu-" <<<"$pocl_names" >/dev/null; then
            echo "bench: warning: PoCL did not take POCL_KERNELLIB_NAME=$pocl (its device:" \
                "$(head -n 1 <<<"$pocl_names" | sed 's/^ *Device Name *//')): its OpenCL rows" \
                "are of this CPU's class"
        fi
    fi
    ;;
*)
    echo "bench.sh: unknown class: $class (avx2 or sse)" >&2
    exit 2
    ;;
esac

# ---- packages: the ones the benchmark needs, then its peers (optional) ----
missing_of() {
    local p
    for p in "$@"; do
        if ! dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
            echo "$p"
        fi
    done
}
apt_updated=0
apt_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo=(sudo); fi
    if [ "$apt_updated" -eq 0 ]; then
        "${sudo[@]+"${sudo[@]}"}" apt-get update || return 1
        apt_updated=1
    fi
    "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}
if [ "$install" -eq 1 ] && command -v dpkg >/dev/null 2>&1; then
    mapfile -t missing < <(missing_of gcc libc6-dev ocl-icd-opencl-dev opencl-headers \
        ocl-icd-libopencl1 pocl-opencl-icd)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "bench: installing ${missing[*]}"
        if ! apt_install "${missing[@]}"; then
            echo "bench: could not install ${missing[*]}; going on with what is there" >&2
        fi
    fi
    mapfile -t missing < <(missing_of libopenblas-dev libclblast-dev python3-torch python3-numpy)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "bench: installing the peers ${missing[*]}"
        if ! apt_install "${missing[@]}"; then
            echo "bench: note: could not install ${missing[*]}; their columns stay empty" >&2
        fi
    fi
fi

# ---- optional anchors: used when a test program compiles and links ----
mkdir -p build/bench/obj
probe=build/bench/probe
defs=()
libs=()
if printf '#include <clblast_c.h>\nint main(void) { return (int)CLBlastClearCache(); }\n' |
    $CC -x c - -o "$probe" -lclblast -lOpenCL >/dev/null 2>&1; then
    defs+=(-DBENCH_CLBLAST)
    libs+=(-lclblast)
    echo "bench: CLBlast found: SGEMM anchor on the OpenCL device"
else
    echo "bench: note: CLBlast not installed (libclblast-dev): its matmul anchor is skipped"
fi
if printf '#include <cblas.h>\nint openblas_get_num_threads(void);\nint main(void) { return openblas_get_num_threads() > 0 ? 0 : 1; }\n' |
    $CC -x c - -o "$probe" -lopenblas >/dev/null 2>&1; then
    defs+=(-DBENCH_OPENBLAS)
    libs+=(-lopenblas)
    echo "bench: OpenBLAS found: the matmul and mlp bound on the host"
else
    echo "bench: note: OpenBLAS not installed (libopenblas-dev): its host anchors are skipped"
fi
# OpenBLAS picks its kernels by the CPU's model. A model it does not know yet (Debian 12's
# 0.3.21 on a Xeon of family 6, model 207) gets its oldest x86-64 kernels (Prescott: SSE3),
# 4-5 times slower than its AVX-512 ones there, in the bound and under PyTorch alike. Where it
# fell back so on a CPU with AVX2 or AVX-512, the bench names the core of the CPU's class
# (OPENBLAS_CORETYPE, as a user of such a CPU would) and says so; one set by the caller is kept.
if [ -z "$class" ] && [ -z "${OPENBLAS_CORETYPE:-}" ] && [[ " ${defs[*]-} " == *" -DBENCH_OPENBLAS "* ]] &&
    printf '#include <stdio.h>\nchar *openblas_get_corename(void);\nint main(void) { puts(openblas_get_corename()); return 0; }\n' |
    $CC -x c - -o "$probe" -lopenblas >/dev/null 2>&1; then
    blas_core=$("$probe" 2>/dev/null || true)
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) "
    blas_want=""
    case "$cpu_flags" in
    *" avx512f "*) blas_want=SkylakeX ;;
    *" avx2 "*) blas_want=Haswell ;;
    esac
    case "${blas_core,,}" in
    prescott | core2 | penryn | dunnington | nehalem | atom | katmai | coppermine | northwood | banias | sandybridge)
        if [ -n "$blas_want" ]; then
            export OPENBLAS_CORETYPE=$blas_want
            echo "bench: note: OpenBLAS chose its $blas_core kernels for this CPU (a model it does" \
                "not know); the anchors run its $blas_want kernels (OPENBLAS_CORETYPE=$blas_want)"
        fi
        ;;
    esac
fi
rm -f "$probe"
if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "bench: note: /usr/bin/python3 cannot import torch and numpy (python3-torch," \
        "python3-numpy): the PyTorch column stays empty"
fi

if command -v python3 >/dev/null 2>&1 && ! python3 amalgamate.py --check >/dev/null 2>&1; then
    echo "bench: note: torch_backend.h differs from src/ (python3 amalgamate.py regenerates it);"
    echo "bench: benchmarking torch_backend.h as it is"
fi

# ---- build: each object is rebuilt when it is older than its source, tools/bench/bench.h or
# torch_backend.h, or was built with other flags; then linked ----
# The library opens the ICD loader at run time; -lOpenCL is for the anchors' own OpenCL calls
# (both end up in the same libOpenCL.so.1, so they share the library's context and queue).
# CC may hold a command with arguments ("ccache gcc"): it is split on spaces on purpose.
# shellcheck disable=SC2206
cc=($CC)
cflags=(-std=gnu11 -O2 -I. -Itools/bench -pthread "${defs[@]+"${defs[@]}"}")
stamp=build/bench/obj/flags
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${cc[*]} ${cflags[*]}" ]; then
    rm -f build/bench/obj/*.o
    printf '%s' "${cc[*]} ${cflags[*]}" >"$stamp"
fi
objs=()
pids=()
for src in tools/bench/*.c; do
    obj=build/bench/obj/$(basename "${src%.c}").o
    objs+=("$obj")
    if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$obj" -nt tools/bench/bench.h ] &&
        [ "$obj" -nt torch_backend.h ]; then
        continue
    fi
    echo "bench: compiling $src"
    "${cc[@]}" "${cflags[@]}" -c "$src" -o "$obj" &
    pids+=($!)
done
for pid in "${pids[@]+"${pids[@]}"}"; do
    wait "$pid"
done
link=0
[ -x build/bench/bench ] || link=1
for obj in "${objs[@]}"; do
    [ "$obj" -nt build/bench/bench ] && link=1
done
if [ "$link" -eq 1 ]; then
    "${cc[@]}" "${objs[@]}" -o build/bench/bench -lOpenCL "${libs[@]+"${libs[@]}"}" -ldl \
        -lpthread -lm
else
    echo "bench: build/bench/bench is up to date"
fi
# ---- the cases of build/bench/bench, then models and allreduce_mpi ----
run_mpi=1
run_models=1
if [ -n "$only" ]; then
    run_mpi=0
    run_models=0
    rest=""
    IFS=, read -r -a cases <<<"$only"
    for c in "${cases[@]}"; do
        if [ "$c" = allreduce_mpi ]; then
            run_mpi=1
        elif [ "$c" = models ]; then
            run_models=1
        else
            rest=${rest:+$rest,}$c
        fi
    done
    if [ -n "$rest" ]; then
        args+=(--only "$rest")
    fi
fi
if [ -n "$json" ]; then
    args+=(--json "$json")
fi
rc=0
if [ -z "$only" ] || [ -n "${rest:-}" ]; then
    build/bench/bench --torch-peer tools/bench/torch_peer.py "${args[@]+"${args[@]}"}" || rc=$?
elif [ -n "$json" ]; then
    : >"$json"
fi
if [ "$run_models" -eq 1 ]; then
    models_args=()
    [ "$quick" -eq 1 ] && models_args+=(--quick)
    [ -n "$json" ] && models_args+=(--json "$json")
    CC="$CC" python3 tools/bench/models.py "${models_args[@]+"${models_args[@]}"}" || rc=1
fi
if [ "$run_mpi" -eq 1 ]; then
    if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
        echo "bench: note: allreduce_mpi skipped: no mpicc/mpirun (Debian: libopenmpi-dev openmpi-bin)"
    elif mpicc -std=gnu11 -O2 -I. tools/bench/mpi/allreduce.c -o build/bench/mpi_allreduce \
        -ldl -lpthread -lm; then
        mpi_flags=(--oversubscribe)
        if [ "$(id -u)" -eq 0 ]; then
            mpi_flags+=(--allow-run-as-root)
        fi
        mpi_args=()
        [ "$quick" -eq 1 ] && mpi_args+=(--quick)
        [ -n "$json" ] && mpi_args+=(--json "$json")
        mpirun "${mpi_flags[@]}" -np 2 build/bench/mpi_allreduce "${mpi_args[@]+"${mpi_args[@]}"}" ||
            rc=1
    else
        echo "bench: allreduce_mpi: tools/bench/mpi/allreduce.c does not build" >&2
        rc=1
    fi
fi
exit "$rc"
