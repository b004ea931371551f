#!/usr/bin/env bash
# The test suite, in one command:   bash tools/test.sh [--quick] [--filter NAME] [--no-install]
#
#   --quick         build the test programs with -O2 and no sanitizers
#   --filter NAME   run only the tests whose file name contains NAME
#   --no-install    do not install missing Debian packages
#
# Steps: install the Debian packages the suite needs, check that torch_backend.h matches src/,
# test amalgamate.py, check the layering of src/ (tools/check_layers.py), check formatting,
# compile checks (C99/C11/C++11/C++17, gcc and clang), the plugins and the OpenCL fault
# stand-in the test programs load, the cmocka test programs tests/test_*.c under clang's
# undefined-behaviour sanitizer (float-cast-overflow included), the same programs under gcc's
# address and undefined-behaviour sanitizers, tests/test_threads.c under clang's thread
# sanitizer, the examples (each must
# compile; those with a "// test: run" line in their first 20 lines also run and must exit 0),
# torchvision's ResNet-18/50, MobileNetV2, SqueezeNet and a Transformer encoder at small sizes
# against PyTorch's outputs (examples/models.c on cpu, native and opencl),
# the README's C blocks, the build integration (CMake package, tools/install.sh, pkg-config,
# every example's build line: tools/test_integration.sh), a fuzz smoke run and a quick
# benchmark. Where steps are made of independent programs (the compile checks, the test
# programs, the examples' builds, the torch.fx devices) as many run at a time as there are
# cores, and each one's output is shown whole, in a fixed order, once it has ended; the longest
# test programs start first. The build integration, the fuzz smoke run and the Oclgrind run go
# on in the background beside the steps from the 16-bit ops to the README's blocks, and report
# at their place. Every program's output stays visible. The last line of the output is always
# "N passed, N failed"; the exit status is 1 if anything failed.
#
# Environment: CC and CXX pick the compilers (default gcc and g++; the compile checks also use
# clang and clang++). TB_TEST_TIMEOUT limits each program's run in seconds (default 600).
# TB_TEST_JOBS sets how many programs run at once (default: the cores, at most one per 2 GiB).
# TB_TEST_OPENCL_LEAKS=1 turns leak detection on for the OpenCL tests (with tools/lsan.supp).
# The tests run with POCL_DEVICES="pthread pthread" (two OpenCL devices on PoCL), a fresh
# TB_CACHE_DIR, TB_BACKEND_PATH=build/plugins, and TB_BACKEND, TB_DEVICE, TB_CHECK unset.
# TB_TEST_NO_FUZZ=1 skips the fuzz smoke run (tools/fuzz.sh, 20 seconds per harness);
# TB_TEST_NO_UBSAN=1 skips the clang UBSan run of the test programs. The full fault-injection
# sweeps (the suite runs samples of the OpenCL ones) are tools/fault_sweep.sh.
set -uo pipefail
shopt -s nullglob
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
repo=$PWD

quick=0
filter=""
install=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --filter)
        if [ $# -lt 2 ]; then
            echo "test.sh: --filter needs a NAME" >&2
            exit 2
        fi
        filter=$2
        shift
        ;;
    --filter=*) filter=${1#--filter=} ;;
    --no-install) install=0 ;;
    -h | --help)
        sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "test.sh: unknown argument: $1 (see bash tools/test.sh --help)" >&2
        exit 2
        ;;
    esac
    shift
done

# CC and CXX may hold a command with arguments ("ccache gcc"), so they are split on spaces.
CC=${CC:-gcc}
CXX=${CXX:-g++}
timeout_s=${TB_TEST_TIMEOUT:-600}
# programs run at once where a step runs several: TB_TEST_JOBS, else the cores, at most one per
# 2 GiB of memory (a sanitized program with PoCL's compiler in it can take one)
jobs_max=$(nproc 2>/dev/null || echo 2)
mem_gib=$(awk '/^MemTotal:/ { print int($2 / 1048576) }' /proc/meminfo 2>/dev/null || echo 0)
if [ "${mem_gib:-0}" -ge 2 ] && [ "$jobs_max" -gt $((mem_gib / 2)) ]; then
    jobs_max=$((mem_gib / 2))
fi
if [ -n "${TB_TEST_JOBS:-}" ]; then
    if ! [[ "$TB_TEST_JOBS" =~ ^[1-9][0-9]*$ ]]; then
        echo "test.sh: TB_TEST_JOBS must be a positive whole number, not '$TB_TEST_JOBS'" >&2
        exit 2
    fi
    jobs_max=$TB_TEST_JOBS
fi
# wait_for_slot: returns once fewer than jobs_max of this shell's background jobs are running.
wait_for_slot() {
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n
    done
}

passed=0
failed=0
failures=()

# step TITLE: starts a step; the time the previous one took goes into the summary.
step_name=""
step_start=$SECONDS
step_times=()
step() {
    if [ -n "$step_name" ]; then
        step_times+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$step_name")")
    fi
    step_name=$*
    step_start=$SECONDS
    echo
    echo "== $* =="
}
# pass [COUNT]; fail WHAT [COUNT]
pass() {
    passed=$((passed + ${1:-1}))
}
fail() {
    failed=$((failed + ${2:-1}))
    failures+=("$1")
}
# selected NAME: whether --filter lets NAME run.
selected() {
    [ -z "$filter" ] || [[ "$1" == *"$filter"* ]]
}
indent() {
    sed 's/^/    /'
}

cache_dir=$(mktemp -d "${TMPDIR:-/tmp}/tb_test_cache.XXXXXX")
# kill_tree PID: ends a process and everything it started (the parent first, so that it
# starts nothing more; timeout passes the signal on to its program).
kill_tree() {
    local child children
    children=$(pgrep -P "$1" 2>/dev/null)
    kill -TERM "$1" 2>/dev/null
    for child in $children; do
        kill_tree "$child"
    done
}
# the pool of test programs running in the background (test_programs), ended with the script
pool_pid=""
# the steps running beside the others (side_chain), ended with the script
side_pid=""
# other programs a step runs in the background, ended with the script
bg_pids=()
trap '[ -n "$pool_pid" ] && kill_tree "$pool_pid"
    [ -n "$side_pid" ] && [ ! -f build/side_chain.done ] && kill_tree "$side_pid"
    for p in "${bg_pids[@]+"${bg_pids[@]}"}"; do kill_tree "$p"; done
    rm -rf "$cache_dir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p build/compile build/tests build/examples build/plugins

# ---------------------------------------------------------------------------------------------
step "install Debian packages"
packages=(gcc g++ clang clang-format libclang-rt-14-dev libcmocka-dev pocl-opencl-icd
    ocl-icd-opencl-dev opencl-headers clinfo python3-numpy python3-torch python3-torchvision
    dataset-fashion-mnist
    gzip valgrind cmake pkg-config openmpi-bin libopenmpi-dev mpich qemu-user oclgrind fortunes
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if [ "$install" -eq 0 ]; then
    echo "skipped (--no-install)"
elif ! command -v dpkg >/dev/null 2>&1; then
    echo "no dpkg here (not Debian): install the equivalents of ${packages[*]} by hand"
else
    missing=()
    for p in "${packages[@]}"; do
        if ! dpkg -s "$p" 2>/dev/null | grep '^Status: install ok installed' >/dev/null; then
            missing+=("$p")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "all ${#packages[@]} packages are installed"
    else
        echo "missing: ${missing[*]}"
        sudo=()
        if [ "$(id -u)" -ne 0 ]; then
            if command -v sudo >/dev/null 2>&1; then
                sudo=(sudo)
            else
                sudo=(none)
            fi
        fi
        if [ "${sudo[*]-}" = none ]; then
            echo "FAIL install: not root and no sudo; run as root:"
            echo "    apt-get update && apt-get install -y ${missing[*]}"
            fail "install: ${missing[*]}"
        elif "${sudo[@]+"${sudo[@]}"}" apt-get update &&
            "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; then
            echo "installed: ${missing[*]}"
        else
            echo "FAIL install: apt-get could not install ${missing[*]}"
            fail "install: ${missing[*]}"
        fi
    fi
fi

# ---------------------------------------------------------------------------------------------
step "torch_backend.h matches src/"
if selected "amalgamate.py"; then
    if python3 amalgamate.py --check; then
        echo "ok header: torch_backend.h is up to date"
        pass
    else
        echo "FAIL header: run 'python3 amalgamate.py' and commit torch_backend.h"
        fail "amalgamate.py --check"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "amalgamate.py"
if selected "tools/test_amalgamate.sh" || selected "amalgamate.py"; then
    log=build/test_amalgamate.log
    CC="$CC" CXX="$CXX" bash tools/test_amalgamate.sh 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    n_ok=$(grep -c '^ok ' "$log")
    n_fail=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
        echo "FAIL amalgamate: tools/test_amalgamate.sh stopped with exit status $rc"
        n_fail=1
    fi
    pass "$n_ok"
    if [ "$n_fail" -gt 0 ]; then
        fail "tools/test_amalgamate.sh" "$n_fail"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "layers"
if selected "tools/check_layers.py"; then
    if python3 tools/check_layers.py; then
        echo "ok layers: no part calls a later one, internals are declared, sizes within budget"
        pass
    else
        echo "FAIL layers: see tools/check_layers.py's findings above"
        fail "tools/check_layers.py"
    fi
fi
# the documented environment variables and configuration macros are the ones the code reads
if selected "tools/check_docs.py"; then
    if python3 tools/check_docs.py; then
        echo "ok docs: README.md and the header name every variable and macro the code reads; README's diffs match the sources"
        pass
    else
        echo "FAIL docs: see tools/check_docs.py's findings above"
        fail "tools/check_docs.py"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "formatting"
if selected "tools/format.sh"; then
    if bash tools/format.sh --check; then
        echo "ok format: the sources match .clang-format"
        pass
    else
        echo "FAIL format: run 'bash tools/format.sh'"
        fail "tools/format.sh --check"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "compile checks"
c_warnings="-Wall -Wextra -Werror -pedantic -Wshadow -Wstrict-prototypes"
cxx_warnings="-Wall -Wextra -Werror -pedantic"
libs="-ldl -lpthread -lm"
out=build/compile

# The compilers: the user's choice first, then clang's, each once.
c_compilers=("$CC")
[ "$CC" = clang ] || c_compilers+=(clang)
cxx_compilers=("$CXX")
[ "$CXX" = clang++ ] || cxx_compilers+=(clang++)

# A compiler command as part of a file name.
tag() {
    printf '%s' "$*" | tr -c 'A-Za-z0-9+' '_'
}

# compile_check NAME SCRIPT: queues SCRIPT (shell commands, stopping at the first failure, each
# shown before it runs on failure); run_compile_checks runs the queue, as many at a time as there
# are cores, and prints "ok compile: NAME" or "FAIL compile: NAME" for each in the queue's order.
check_names=()
check_scripts=()
compile_check() {
    selected "tests/compile/$1" || return 0
    check_names+=("$1")
    check_scripts+=("$2")
}
run_compile_checks() {
    local i log
    for i in "${!check_names[@]}"; do
        log=$out/$(tag "${check_names[$i]}").log
        rm -f "$log.rc"
        (
            if bash -e -x -c "${check_scripts[$i]}" >"$log" 2>&1; then
                echo 0 >"$log.rc"
            else
                echo 1 >"$log.rc"
            fi
        ) &
        wait_for_slot
    done
    wait
    for i in "${!check_names[@]}"; do
        log=$out/$(tag "${check_names[$i]}").log
        if [ "$(cat "$log.rc" 2>/dev/null)" = 0 ]; then
            echo "ok compile: ${check_names[$i]}"
            pass
        else
            echo "FAIL compile: ${check_names[$i]}"
            indent <"$log"
            fail "compile: ${check_names[$i]}"
        fi
    done
}

for cc in "${c_compilers[@]}"; do
    for std in c99 c11; do
        bin=$out/impl_$(tag "$cc")_$std
        compile_check "impl.c ($cc -std=$std)" \
            "$cc -std=$std $c_warnings -I. tests/compile/impl.c -o $bin $libs; $bin"
    done
done
# Optimisers see more (inlining, value ranges) and warn about more: users build with -O2 -Werror.
for cc in "${c_compilers[@]}"; do
    for opt in -Og -O2 -O3; do
        compile_check "impl.c ($cc -std=c11 $opt)" \
            "$cc -std=c11 $opt $c_warnings -I. -c tests/compile/impl.c -o $out/impl_opt_$(tag "$cc")$opt.o"
    done
done
for cxx in "${cxx_compilers[@]}"; do
    compile_check "impl.cpp ($cxx -std=c++17 -O2)" \
        "$cxx -std=c++17 -O2 $cxx_warnings -I. -c tests/compile/impl.cpp -o $out/impl_opt_$(tag "$cxx").o"
done
for cxx in "${cxx_compilers[@]}"; do
    for std in c++11 c++17; do
        bin=$out/impl_$(tag "$cxx")_$std
        compile_check "impl.cpp ($cxx -std=$std)" \
            "$cxx -std=$std $cxx_warnings -I. tests/compile/impl.cpp -o $bin $libs; $bin"
    done
done
for cc in "${c_compilers[@]}"; do
    t=$(tag "$cc")
    compile_check "decl_only.c ($cc -std=c99)" \
        "$cc -std=c99 $c_warnings -I. -c tests/compile/decl_only.c -o $out/decl_only_$t.o"
    compile_check "static_impl.c ($cc -std=c99)" \
        "$cc -std=c99 $c_warnings -I. tests/compile/static_impl.c -o $out/static_impl_$t $libs
         $out/static_impl_$t"
    # Under a strict -std, feature-test macros must be set before the first system header; a
    # user's file (or cmocka's headers) may include some before this one.
    compile_check "impl_after_system_headers.c ($cc -std=c11)" \
        "$cc -std=c11 $c_warnings -I. tests/compile/impl_after_system_headers.c \
         -o $out/after_system_$t $libs; $out/after_system_$t"
    compile_check "twice.c ($cc -std=c99)" \
        "$cc -std=c99 $c_warnings -I. tests/compile/twice.c -o $out/twice_$t $libs; $out/twice_$t"
done
compile_check "tu_a.c + tu_b.c ($CC -std=c99)" \
    "$CC -std=c99 $c_warnings -I. -c tests/compile/tu_a.c -o $out/tu_a.o
     $CC -std=c99 $c_warnings -I. -c tests/compile/tu_b.c -o $out/tu_b.o
     $CC $out/tu_a.o $out/tu_b.o -o $out/tu_ab $libs
     $out/tu_ab"
# Mixed languages: the implementation in one language, a caller in the other (extern \"C\").
compile_check "tu_a.c as C + tu_b.c as C++ ($CC, $CXX)" \
    "$CC -std=c99 $c_warnings -I. -c tests/compile/tu_a.c -o $out/tu_a_c.o
     $CXX -x c++ -std=c++11 $cxx_warnings -I. -c tests/compile/tu_b.c -o $out/tu_b_cxx.o
     $CXX $out/tu_a_c.o $out/tu_b_cxx.o -o $out/tu_ab_mixed $libs
     $out/tu_ab_mixed"
compile_check "tu_a.c as C++ + tu_b.c as C ($CXX, $CC)" \
    "$CXX -x c++ -std=c++11 $cxx_warnings -I. -c tests/compile/tu_a.c -o $out/tu_a_cxx.o
     $CC -std=c99 $c_warnings -I. -c tests/compile/tu_b.c -o $out/tu_b_c.o
     $CXX $out/tu_a_cxx.o $out/tu_b_c.o -o $out/tu_ab_mixed2 $libs
     $out/tu_ab_mixed2"
# The configuration macros of the header's doc block, one at a time.
for macro in TB_NO_OPENCL TB_NO_NATIVE TB_NO_PLUGINS TB_NO_MPI; do
    compile_check "impl.c with -D$macro ($CC -std=c99)" \
        "$CC -std=c99 $c_warnings -D$macro -I. tests/compile/impl.c -o $out/impl_$macro $libs
         $out/impl_$macro"
done
# With neither compiled backend there is no code generator: the cpu backend alone.
compile_check "impl.c with -DTB_NO_OPENCL -DTB_NO_NATIVE ($CC -std=c99, $CXX -std=c++11)" \
    "$CC -std=c99 $c_warnings -DTB_NO_OPENCL -DTB_NO_NATIVE -I. tests/compile/impl.c \
         -o $out/impl_cpu_only $libs
     $out/impl_cpu_only
     $CXX -x c++ -std=c++11 $cxx_warnings -DTB_NO_OPENCL -DTB_NO_NATIVE -I. -c \
         tests/compile/impl.c -o $out/impl_cpu_only_cxx.o"
compile_check "impl.c with -DTB_OPENCL_LINKED and -lOpenCL ($CC -std=c99)" \
    "$CC -std=c99 $c_warnings -DTB_OPENCL_LINKED -I. tests/compile/impl.c -o $out/impl_linked \
     -lOpenCL $libs
     $out/impl_linked"
# The OpenCL ICD loader is opened at run time: linking needs no -lOpenCL and the program does
# not depend on libOpenCL.so.
compile_check "impl.c links without -lOpenCL ($CC)" \
    "$CC -std=c11 $c_warnings -I. tests/compile/impl.c -o $out/no_opencl -ldl -lpthread -lm
     if readelf -d $out/no_opencl | grep -i 'NEEDED.*libOpenCL'; then exit 1; fi
     $out/no_opencl"
run_compile_checks

# ---------------------------------------------------------------------------------------------
step "test plugins and the OpenCL fault stand-in"
export POCL_DEVICES="pthread pthread"
export TB_CACHE_DIR=$cache_dir
export TB_BACKEND_PATH=$repo/build/plugins
export CMOCKA_MESSAGE_OUTPUT=stdout
unset TB_BACKEND TB_DEVICE TB_CHECK CMOCKA_XML_FILE
if [ "$quick" -eq 1 ]; then
    test_flags="-std=c11 -g1 -O2 -Wall -Wextra -Werror -pedantic -I."
    echo "quick: -O2, no sanitizers"
else
    # -g1: line tables for the sanitizers' reports, at two thirds of -g's compile time. -Og:
    # the programs build in about half the time of -O1, and gcc's flow warnings (uninitialised
    # values, bounds) still run.
    test_flags="-std=c11 -g1 -Og -fsanitize=address,undefined -fno-omit-frame-pointer
        -fno-sanitize-recover=undefined -Wall -Wextra -Werror -pedantic -I."
fi
# stdbuf makes a program's stdout line-buffered so that it interleaves with stderr in the order
# it was written; it works by preloading a library, which ASan accepts only when told to.
line_buffered=()
if command -v stdbuf >/dev/null 2>&1; then
    line_buffered=(stdbuf -oL)
fi
# intercept_tls_get_addr=0: the sanitizers' __tls_get_addr interceptor (gcc up to 13, clang up
# to 16) takes a thread-local block whose address is 16 past a page boundary for one with a
# glibc 2.19 header and reads the two words before it; a block of glibc 2.25 or later lands
# there by chance, and LeakSanitizer's tracer then crashes at exit ("Tracer caught signal 11")
# after every test passed, on a second run as often as on the first. Without the interceptor,
# blocks that dlopen'ed libraries allocate for their thread-locals are not scanned for pointers.
asan_common="abort_on_error=0:verify_asan_link_order=0:intercept_tls_get_addr=0"
asan_default="detect_leaks=1:$asan_common"
asan_opencl="detect_leaks=0:$asan_common"
# what PoCL, the OpenCL loader and LLVM keep past exit (every frame in those libraries)
lsan_pocl="suppressions=$repo/tools/lsan.supp:print_suppressions=0"
if [ "${TB_TEST_OPENCL_LEAKS:-0}" = 1 ]; then
    asan_opencl=$asan_default
fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# The plugins the registry tests load from TB_BACKEND_PATH (examples/plugin_backend.c, one
# broken plugin per error path, and plugins that report errors through their own tb_set_error). Built without sanitizers: a plain shared object loads into a
# sanitized program, not the other way round.
plugin_src=examples/plugin_backend.c
log=build/plugins/build.log
if CC="$CC" bash tests/plugins/build.sh build/plugins >"$log" 2>&1; then
    echo "ok build: test plugins -> build/plugins ($(tail -n 1 "$log"))"
    pass
else
    echo "FAIL build: tests/plugins/build.sh"
    indent <"$log"
    fail "build: test plugins"
fi

# The cl_fault stand-in tests/test_opencl_faults.c loads through TB_OPENCL_LIBRARY (an ICD
# loader that forwards to libOpenCL.so.1 and fails chosen calls). Plain, like the plugins.
log=build/cl_fault/build.log
mkdir -p build/cl_fault
if CC="$CC" bash tests/cl_fault/build.sh build/cl_fault >"$log" 2>&1; then
    echo "ok build: OpenCL fault stand-in -> build/cl_fault ($(tail -n 1 "$log"))"
    pass
else
    echo "FAIL build: tests/cl_fault/build.sh"
    indent <"$log"
    fail "build: OpenCL fault stand-in"
fi

tests=()
for src in tests/test_*.c; do
    selected "$src" && tests+=("$src")
done
# The programs that take longest (PoCL's and gcc's compiles of their kernels with the caches
# empty, the kit backend's compiler calls) start first, so that no long one is left running
# alone at the end of a step; the reports keep the order of the file names.
long_programs=(test_opencl test_conv test_alloc_faults_opencl test_native test_kit test_train
    test_layers test_half_opencl test_autograd_opencl test_opencl_faults)

# count_cmocka LOG: prints "PASSED FAILED" summed over the groups cmocka reported.
count_cmocka() {
    awk '
        /^\[ *PASSED *\] *[0-9]+ test/ { sub(/^\[ *PASSED *\] */, ""); p += $1 + 0 }
        /^\[ *FAILED *\] *[0-9]+ test\(s\), listed below/ { sub(/^\[ *FAILED *\] */, ""); f += $1 + 0 }
        /^\[ *FAILED *\] *GROUP (SETUP|TEARDOWN)/ { f += 1 }
        END { print p + 0, f + 0 }
    ' "$1"
}

# The implementation is compiled once per compiler, flags and feature-test macros, and linked
# into each program that needs nothing else of it: a program whose translation unit defines
# TB_IMPLEMENTATION, names no internal identifier (tb__..., the implementation's static
# functions), sets no configuration macro and compiles without the implementation's part of the
# header is compiled with -DTB_IMPLEMENTATION_DONE, which leaves that part out of it, and
# linked with an object of the implementation built with the feature-test macros
# (_POSIX_C_SOURCE, _GNU_SOURCE, ...) the program has in effect. The others (the tests of the
# internals) build whole. That saves a compile of the whole library per program.
#
# The configuration macros: the TB_ names the header tests with #ifdef, #ifndef or defined(),
# and the ones it leaves to the user (TBDEF, the OpenCL headers' CL_ macros).
config_macros=$(
    grep -o -E '(#[[:space:]]*ifn?def[[:space:]]+|defined[[:space:]]*\(?[[:space:]]*)TB_[A-Z0-9_]+' \
        torch_backend.h | grep -o -E 'TB_[A-Z0-9_]+' | grep -v -x TB_IMPLEMENTATION
    printf '%s\n' TBDEF CL_TARGET_OPENCL_VERSION CL_USE_DEPRECATED_OPENCL_1_2_APIS
)
# shared_impl_ok SRC: whether SRC and the files it includes with quotes (torch_backend.h
# aside) name no internal identifier and set no configuration macro. (Under pipefail a pipe
# ends in grep without -q: grep -q stops reading at the first match, and the writer's SIGPIPE
# would make the whole pipe false.)
shared_impl_ok() {
    local dir inc
    grep -q -E '\b[tT][bB]__' "$1" && return 1
    grep -o -E '^#[[:space:]]*define[[:space:]]+[A-Za-z_][A-Za-z0-9_]*' "$1" |
        grep -o -E '[A-Za-z_][A-Za-z0-9_]*$' | grep -x -F "$config_macros" >/dev/null && return 1
    dir=$(dirname "$1")
    while read -r inc; do
        [ "$(basename "$inc")" = torch_backend.h ] && continue
        [ -f "$dir/$inc" ] || return 1
        shared_impl_ok "$dir/$inc" || return 1
    done < <(sed -n 's/^#[[:space:]]*include[[:space:]]*"\(.*\)".*$/\1/p' "$1")
    return 0
}
# feature_macros COMPILER FLAGS SRC: the feature-test macros SRC's translation unit defines, as
# #define lines, then a line "--", then the macros of glibc's features.h in effect (__USE_...,
# __GLIBC_USE_...) and NDEBUG where defined; false unless the translation unit defines
# TB_IMPLEMENTATION. SRC - reads the source from stdin.
feature_macros() {
    local dm
    # shellcheck disable=SC2086
    dm=$($1 $2 -DTB_IMPLEMENTATION_DONE -E -dM -x c "$3" 2>/dev/null) || return 1
    grep -q -E '^#define TB_IMPLEMENTATION ?$' <<<"$dm" || return 1
    grep -E '^#define _((POSIX_C|XOPEN|GNU|DEFAULT|BSD|SVID|ISOC99|ISOC11|LARGEFILE64)_SOURCE|XOPEN_SOURCE_EXTENDED|(FILE_OFFSET|TIME)_BITS)( |$)' <<<"$dm" | sort
    echo "--"
    grep -E '^#define (NDEBUG|__USE_[A-Z0-9_]+|__GLIBC_USE_[A-Z0-9_]+)( |$)' <<<"$dm" | sort
}
# build_program IMPL_DIR COMPILER FLAGS SRC BIN LIBS...: compiles SRC into BIN. Where
# shared_impl_ok and SRC compiles without the implementation, it is linked with
# IMPL_DIR/tb_impl_KEY.o, the implementation built with SRC's compiler, flags and feature-test
# macros (KEY); the first program that needs it builds it (its claim: IMPL_DIR/tb_impl_KEY.lock,
# with the builder's process id), the others wait for IMPL_DIR/tb_impl_KEY.done. False on a
# failure; the commands go to BIN.build.cmd, the compilers' output to stdout.
build_program() {
    local impl=$1 compiler=$2 flags=$3 src=$4 bin=$5 features="" impl_src="" key obj holder until
    shift 5
    if shared_impl_ok "$src" && features=$(feature_macros "$compiler" "$flags" "$src"); then
        # the object gets the program's feature-test macros and must end up with the same
        # macros in effect (one the program defines after a system header's include is none
        # of its features; NDEBUG is the program's alone): where not, the program builds whole
        impl_src=$(printf '%s\n#define TB_IMPLEMENTATION\n#include "torch_backend.h"' \
            "$(sed -n '/^--$/q;p' <<<"$features")")
        if [ "$(feature_macros "$compiler" "$flags" - <<<"$impl_src")" != "$features" ]; then
            features=""
        fi
    else
        features=""
    fi
    # a program that does not compile without the implementation uses what only that part of
    # the header declares (its structures, the system headers it includes): it builds whole,
    # and a program with an error of its own fails there
    # shellcheck disable=SC2086
    if [ -n "$features" ] &&
        ! $compiler $flags -DTB_IMPLEMENTATION_DONE -c "$src" -o "$bin.o" >/dev/null 2>&1; then
        features=""
    fi
    if [ -z "$features" ]; then
        # shellcheck disable=SC2116,SC2086
        echo "$compiler $(echo $flags) $src -o $bin $*" >"$bin.build.cmd"
        # shellcheck disable=SC2086
        $compiler $flags "$src" -o "$bin" "$@"
        return
    fi
    key=$(printf '%s\n%s\n%s\n' "$compiler" "$flags" "$features" | cksum | cut -d ' ' -f 1)
    obj=$impl/tb_impl_$key
    # shellcheck disable=SC2116,SC2086
    {
        echo "$compiler $(echo $flags) -DTB_IMPLEMENTATION_DONE -c $src -o $bin.o"
        echo "$compiler $(echo $flags) $bin.o $obj.o -o $bin $*"
    } >"$bin.build.cmd"
    if mkdir "$obj.lock" 2>/dev/null; then
        echo "$BASHPID" >"$obj.lock/pid"
        echo "$impl_src" >"$obj.c"
        # shellcheck disable=SC2116,SC2086
        echo "$compiler $(echo $flags) -c $obj.c -o $obj.o" >"$obj.cmd"
        # shellcheck disable=SC2086
        if $compiler $flags -c "$obj.c" -o "$obj.o" >"$obj.log" 2>&1; then
            echo 0 >"$obj.rc"
        else
            echo 1 >"$obj.rc"
        fi
        touch "$obj.done"
    fi
    # wait while the builder runs (a builder that ended without a result is a failure)
    until=$((SECONDS + 1800))
    while [ ! -f "$obj.done" ] && [ "$SECONDS" -lt "$until" ]; do
        holder=$(cat "$obj.lock/pid" 2>/dev/null)
        [ -n "$holder" ] && ! kill -0 "$holder" 2>/dev/null && [ ! -f "$obj.done" ] && break
        sleep 0.2
    done
    if [ "$(cat "$obj.rc" 2>/dev/null)" != 0 ]; then
        echo "the implementation did not compile: $(cat "$obj.cmd" 2>/dev/null)"
        cat "$obj.log" 2>/dev/null
        return 1
    fi
    # shellcheck disable=SC2086
    $compiler $flags "$bin.o" "$obj.o" -o "$bin" "$@"
}

# test_job DIR COMPILER FLAGS SRC: builds one test program into DIR and runs it. The build's
# output and status go to DIR/NAME.build.log and .build.rc; the run's output to DIR/NAME.log,
# its exit status and seconds to DIR/NAME.rc and .secs; DIR/NAME.done comes last.
test_job() {
    local dir=$1 compiler=$2 flags=$3 src=$4 name bin asan lsan log rc n_ok n_fail started
    name=$(basename "$src" .c)
    bin=$dir/$name
    log=$dir/$name.log
    if ! build_program "$dir" "$compiler" "$flags" "$src" "$bin" -lcmocka -ldl -lpthread -lm \
        >"$dir/$name.build.log" 2>&1; then
        echo 1 >"$dir/$name.build.rc"
        touch "$dir/$name.done"
        return 0
    fi
    echo 0 >"$dir/$name.build.rc"
    asan=$asan_default
    lsan=""
    case "$name" in
    # these also run on PoCL, whose LLVM keeps allocations past exit
    *opencl* | test_threads | test_train | test_distributed | test_shard)
        asan=$asan_opencl
        lsan=$lsan_pocl
        ;;
    # checked for leaks, but it runs on PoCL too: what PoCL's LLVM keeps when it compiles a
    # program its cache lacks is not ours (every frame of such a leak is in those libraries)
    test_conv | test_layers)
        lsan=$lsan_pocl
        ;;
    esac
    started=$SECONDS
    ASAN_OPTIONS=$asan LSAN_OPTIONS=$lsan timeout -k 10 "$timeout_s" \
        "${line_buffered[@]+"${line_buffered[@]}"}" "$bin" </dev/null >"$log" 2>&1
    rc=$?
    read -r n_ok n_fail < <(count_cmocka "$log")
    # LeakSanitizer's own failure at exit (its tracer thread crashing while it stops the
    # threads, "Tracer caught signal"), after every test passed, is no finding about the
    # program: it runs once more, and that run's result counts, leak check included
    if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ] && grep -q "^Tracer caught signal" "$log" &&
        grep -q "LeakSanitizer has encountered a fatal error" "$log"; then
        {
            cat "$log"
            echo "(LeakSanitizer's tracer failed at exit: running $name again)"
        } >"$log.first"
        ASAN_OPTIONS=$asan LSAN_OPTIONS=$lsan timeout -k 10 "$timeout_s" \
            "${line_buffered[@]+"${line_buffered[@]}"}" "$bin" </dev/null >"$log" 2>&1
        rc=$?
    fi
    echo "$rc" >"$dir/$name.rc"
    echo $((SECONDS - started)) >"$dir/$name.secs"
    touch "$dir/$name.done"
}

# test_programs DIR COMPILER FLAGS LABEL: builds and runs every selected test program, as many
# at a time as there are cores (a program is built just before it runs; the long ones first),
# and reports each in the order of the file names with its whole output once it has ended;
# counts cmocka's results.
# LABEL goes into the report lines.
test_programs() {
    local dir=$1 compiler=$2 flags=$3 label=$4 src name log rc n_ok n_fail note pool
    local start_order=()
    mkdir -p "$dir"
    for name in "${long_programs[@]}"; do
        for src in "${tests[@]+"${tests[@]}"}"; do
            [ "$(basename "$src" .c)" = "$name" ] && start_order+=("$src")
        done
    done
    for src in "${tests[@]+"${tests[@]}"}"; do
        [[ " ${long_programs[*]} " == *" $(basename "$src" .c) "* ]] || start_order+=("$src")
    done
    for src in "${tests[@]+"${tests[@]}"}"; do
        name=$(basename "$src" .c)
        rm -f "$dir/$name".{done,rc,secs,build.rc,build.cmd,log,log.first,job.log}
    done
    rm -rf "$dir"/tb_impl_*
    (
        for src in "${start_order[@]+"${start_order[@]}"}"; do
            # the shell's own word on a program killed by a signal goes to NAME.job.log: the
            # report says it in its place
            test_job "$dir" "$compiler" "$flags" "$src" 2>"$dir/$(basename "$src" .c).job.log" &
            wait_for_slot
        done
        wait
    ) &
    pool=$!
    pool_pid=$pool
    for src in "${tests[@]+"${tests[@]}"}"; do
        name=$(basename "$src" .c)
        log=$dir/$name.log
        echo
        echo "-- $src$label"
        while [ ! -f "$dir/$name.done" ] && kill -0 "$pool" 2>/dev/null; do
            sleep 1
        done
        if [ ! -f "$dir/$name.done" ]; then
            echo "FAIL test: $src$label (its job ended without a result)"
            fail "$src$label (no result)"
            continue
        fi
        if [ "$(cat "$dir/$name.build.rc" 2>/dev/null)" != 0 ]; then
            echo "FAIL build: $src$label"
            indent <"$dir/$name.build.cmd"
            indent <"$dir/$name.build.log"
            fail "build: $src$label"
            continue
        fi
        [ -f "$log.first" ] && cat "$log.first"
        cat "$log"
        [ -s "$dir/$name.job.log" ] && cat "$dir/$name.job.log"
        rc=$(cat "$dir/$name.rc" 2>/dev/null)
        [[ "$rc" =~ ^[0-9]+$ ]] || rc=1 # no exit status written: a failure
        read -r n_ok n_fail < <(count_cmocka "$log")
        note=""
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            note=", timed out after ${timeout_s}s"
        elif [ "$rc" -gt 128 ]; then
            note=", killed by signal $((rc - 128))"
        fi
        if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
            n_fail=1 # crashed, timed out or failed outside a cmocka test
        fi
        if [ "$rc" -eq 0 ] && [ "$n_ok" -eq 0 ] && [ "$n_fail" -eq 0 ]; then
            n_ok=1 # no cmocka summary: the program counts as one test
        fi
        pass "$n_ok"
        if [ "$n_fail" -gt 0 ]; then
            echo "FAIL test: $src$label ($n_ok passed, $n_fail failed, exit status $rc$note, $(cat "$dir/$name.secs") s)"
            fail "$src$label ($n_fail)" "$n_fail"
        else
            echo "ok test: $src$label ($n_ok passed, $(cat "$dir/$name.secs") s)"
        fi
    done
    wait "$pool"
    pool_pid=""
}

# ---------------------------------------------------------------------------------------------
step "test programs (clang, undefined behaviour)"
# The programs built with clang's undefined-behaviour sanitizer, float-to-integer overflow
# included, every report fatal. At -O0: the checks are put in by the front end whatever the
# optimisation level, and the programs build about four times faster than at -O1 (the
# out-of-bounds accesses that -O1's object-size check would add are the address sanitizer's,
# in the next step). They run first: with the caches empty, the kernels' compiles (PoCL's LLVM
# in the program's own process) take about 1.4 times as long under the address sanitizer's
# allocator; the next step finds them compiled (the cache tests make their own empty caches).
if [ "$quick" -eq 1 ] || [ "${TB_TEST_NO_UBSAN:-0}" = 1 ]; then
    echo "skipped: --quick or TB_TEST_NO_UBSAN=1"
elif [ "${#tests[@]}" -gt 0 ]; then
    ubsan_flags="-std=c11 -g1 -O0 -fsanitize=undefined,float-cast-overflow
        -fno-sanitize-recover=all -fno-omit-frame-pointer -Wall -Wextra -Werror -pedantic -I."
    test_programs build/tests-ubsan clang "$ubsan_flags" " (clang UBSan)"
fi

# ---------------------------------------------------------------------------------------------
step "test programs"
# gcc's address and undefined-behaviour sanitizers (in --quick: -O2, none).
test_programs build/tests "$CC" "$test_flags" ""

# ---------------------------------------------------------------------------------------------
step "threads (ThreadSanitizer)"
# tests/test_threads.c (eight threads: graphs on the cpu and opencl backends, the registry,
# metrics, DLPack deleters on other threads) built with clang -fsanitize=thread. tools/tsan.supp
# silences what TSan reports inside PoCL and the ICD loader, never the library's own code.
if selected tests/test_threads.c; then
    if [ "$quick" -eq 1 ]; then
        echo "skipped: --quick"
    else
        saved_tests=("${tests[@]+"${tests[@]}"}")
        tests=(tests/test_threads.c)
        tsan_flags="-std=c11 -g1 -O1 -fsanitize=thread -Wall -Wextra -Werror -pedantic -I."
        export TSAN_OPTIONS="suppressions=$repo/tools/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
        test_programs build/tests-tsan clang "$tsan_flags" " (clang ThreadSanitizer)"
        unset TSAN_OPTIONS
        tests=("${saved_tests[@]+"${saved_tests[@]}"}")
    fi
fi

# ---------------------------------------------------------------------------------------------
# The build integration, the fuzz smoke run and the Oclgrind run need nothing from the steps
# between here and their reports, and run on one core most of the time where those steps leave
# cores idle: from here on they run one after the other in the background (side_chain). Each
# writes its output to LOG, its exit status to LOG.rc and its seconds to LOG.secs; LOG.done
# comes last. Their reports come at their places below (side_report).
side_integration=0
side_fuzz=0
side_oclgrind=0
selected tools/test_integration.sh && side_integration=1
if selected tools/fuzz.sh && [ "$quick" -eq 0 ] && [ "${TB_TEST_NO_FUZZ:-0}" != 1 ]; then
    side_fuzz=1
fi
if selected tools/oclgrind.sh && [ "$quick" -eq 0 ] && [ "${TB_TEST_NO_OCLGRIND:-0}" != 1 ]; then
    side_oclgrind=1
fi
# side_run LOG COMMAND...: one step of the chain (its files are removed before the chain starts)
side_run() {
    local log=$1 started
    shift
    started=$(date +%s)
    "$@" >"$log" 2>&1
    echo $? >"$log.rc"
    echo $(($(date +%s) - started)) >"$log.secs"
    touch "$log.done"
}
side_chain() {
    renice -n 10 -p "$BASHPID" >/dev/null 2>&1
    if [ "$side_integration" = 1 ]; then
        side_run build/test_integration.log env CC="$CC" bash tools/test_integration.sh
    fi
    # fuzz.sh and oclgrind.sh pick their devices and caches themselves
    if [ "$side_fuzz" = 1 ]; then
        side_run build/fuzz_smoke.log env -u POCL_DEVICES -u TB_CACHE_DIR -u TB_BACKEND_PATH \
            bash tools/fuzz.sh --seconds 20
    fi
    if [ "$side_oclgrind" = 1 ]; then
        side_run build/oclgrind.log env -u POCL_DEVICES -u TB_CACHE_DIR bash tools/oclgrind.sh
    fi
    touch build/side_chain.done
}
# Started from a subshell, so that it is no job of this shell: the steps' own `wait` and job
# slots (wait_for_slot) do not count it. Niced: the steps in the foreground (some of them
# timed, the MPI rank-failure checks) keep the cores they ask for. It is ended only while
# build/side_chain.done is missing (its process id is no child of this shell's to wait for).
for log in build/test_integration.log build/fuzz_smoke.log build/oclgrind.log; do
    rm -f "$log" "$log".{rc,secs,done}
done
rm -f build/side_chain.done
side_pid=$( (side_chain </dev/null >/dev/null 2>&1 & echo $!))
# side_report LOG: waits for LOG's step of the chain and shows its output; sets rc to its exit
# status (1 if it ended without one) and adds its own time to the step's name.
side_report() {
    local log=$1
    while [ ! -f "$log.done" ] && [ ! -f build/side_chain.done ] && kill -0 "$side_pid" 2>/dev/null; do
        sleep 1
    done
    [ -f "$log" ] || : >"$log"
    cat "$log"
    rc=$(cat "$log.rc" 2>/dev/null)
    if [ ! -f "$log.done" ] || ! [[ "$rc" =~ ^[0-9]+$ ]]; then
        echo "(its run in the background ended without an exit status)"
        rc=1
    fi
    step_name+=" (beside the steps above: $(cat "$log.secs" 2>/dev/null || echo ?) s)"
}

# ---------------------------------------------------------------------------------------------
step "16-bit ops against PyTorch on each x86 class"
# tests/test_half.c with its oracle on this CPU and under qemu-x86_64 as an AVX2 and an SSE4.2
# CPU (tools/test_half_isa.sh; the emulated runs skip without qemu-user): PyTorch's own 16-bit
# kernels differ between these classes, and the test's tolerances must hold on every one.
if selected tools/test_half_isa.sh || selected test_half; then
    log=build/test_half_isa.log
    CC="$CC" TB_CACHE_DIR="$cache_dir" bash tools/test_half_isa.sh 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    n_ok=$(grep -c '^ok ' "$log")
    n_fail=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
        echo "FAIL half isa: tools/test_half_isa.sh stopped with exit status $rc"
        n_fail=1
    fi
    pass "$n_ok"
    if [ "$n_fail" -gt 0 ]; then
        fail "tools/test_half_isa.sh" "$n_fail"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "kernels for each CPU class"
# The native backend plans for the vector shape of the CPU (and of what the compiler targets):
# AVX-512, AVX2, SSE4.2 or NEON. The test programs above ran this CPU's class. Here
# tests/test_native.c (small shapes, built -O2 without sanitizers) runs with the programs
# compiled for each narrower x86-64 class this CPU can run (TB_NATIVE_CFLAGS=-march=x86-64-v3,
# -v2), and tests/native_arch_check.c under user-mode emulation as an AVX2 and an SSE4.2 CPU
# and as an aarch64 one (tools/test_arch.sh: qemu-user, gcc-aarch64-linux-gnu).
# On a CPU with AVX-512, tests/test_half_opencl.c (-O2) also runs on the code PoCL compiles for
# an AVX2 CPU (its kernel library POCL_KERNELLIB_NAME=avx2, the device then named haswell),
# where the OpenCL dialect hides widened f16 vectors from the optimiser (TB_VOPAQUE).
pocl_avx2_pid=""
if selected tests/test_half_opencl.c && grep -q -w avx512f /proc/cpuinfo 2>/dev/null &&
    command -v clinfo >/dev/null 2>&1 &&
    POCL_KERNELLIB_NAME=avx2 clinfo 2>/dev/null | grep -E '^ *Device Name .*pthread-haswell-' \
        >/dev/null; then
    mkdir -p build/tests-classes
    rm -f build/tests-classes/test_half_opencl.avx2.rc
    (
        # shellcheck disable=SC2086
        if $CC -std=c11 -g1 -O2 -Wall -Wextra -Werror -pedantic -I. tests/test_half_opencl.c \
            -o build/tests-classes/test_half_opencl -lcmocka -ldl -lpthread -lm \
            >build/tests-classes/test_half_opencl.avx2.log 2>&1; then
            POCL_KERNELLIB_NAME=avx2 timeout -k 10 "$timeout_s" \
                build/tests-classes/test_half_opencl </dev/null \
                >build/tests-classes/test_half_opencl.avx2.log 2>&1
            echo $? >build/tests-classes/test_half_opencl.avx2.rc
        else
            echo build >build/tests-classes/test_half_opencl.avx2.rc
        fi
    ) &
    pocl_avx2_pid=$!
    bg_pids+=("$pocl_avx2_pid")
fi
if selected tests/test_native.c || selected tools/test_arch.sh; then
    classes=()
    if grep -q -w avx512f /proc/cpuinfo 2>/dev/null; then
        classes+=("x86-64-v3:AVX2")
    fi
    if grep -q -w avx2 /proc/cpuinfo 2>/dev/null; then
        classes+=("x86-64-v2:SSE4.2")
    fi
    # tools/test_arch.sh runs beside the class runs; its output is shown after theirs
    arch_pid=""
    if selected tools/test_arch.sh || selected tests/test_native.c; then
        rm -f build/test_arch.rc
        (
            CC="$CC" TB_CACHE_DIR="$cache_dir" bash tools/test_arch.sh </dev/null \
                >build/test_arch.log 2>&1
            echo $? >build/test_arch.rc
        ) &
        arch_pid=$!
        bg_pids+=("$arch_pid")
    fi
    if [ "${#classes[@]}" -gt 0 ] && selected tests/test_native.c; then
        mkdir -p build/tests-classes
        # shellcheck disable=SC2086
        if $CC -std=c11 -g1 -O2 -Wall -Wextra -Werror -pedantic -I. tests/test_native.c \
            -o build/tests-classes/test_native -lcmocka -ldl -lpthread -lm \
            >build/tests-classes/build.log 2>&1; then
            # the classes run at once (most of a run is the compiler's, one process at a time)
            class_pids=()
            for c in "${classes[@]}"; do
                log=build/tests-classes/test_native.${c%%:*}.log
                TB_NATIVE_CFLAGS="-march=${c%%:*}" TB_TEST_SMALL=1 timeout -k 10 \
                    "$timeout_s" build/tests-classes/test_native </dev/null >"$log" 2>&1 &
                class_pids+=($!)
                bg_pids+=($!)
            done
            for i in "${!classes[@]}"; do
                c=${classes[$i]}
                log=build/tests-classes/test_native.${c%%:*}.log
                wait "${class_pids[$i]}"
                rc=$?
                kept=()
                for p in "${bg_pids[@]}"; do
                    [ "$p" = "${class_pids[$i]}" ] || kept+=("$p")
                done
                bg_pids=("${kept[@]+"${kept[@]}"}")
                read -r n_ok n_fail < <(count_cmocka "$log")
                if [ "$rc" -eq 0 ] && [ "$n_fail" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
                    echo "ok test: tests/test_native.c with ${c#*:} kernels ($n_ok passed)"
                    pass "$n_ok"
                else
                    indent <"$log"
                    echo "FAIL test: tests/test_native.c with ${c#*:} kernels (exit status $rc)"
                    fail "tests/test_native.c with ${c#*:} kernels" "$((n_fail > 0 ? n_fail : 1))"
                fi
            done
        else
            indent <build/tests-classes/build.log
            echo "FAIL build: tests/test_native.c (-O2)"
            fail "build: tests/test_native.c (-O2)"
        fi
    fi
    if [ -n "$arch_pid" ]; then
        wait "$arch_pid"
        log=build/test_arch.log
        cat "$log"
        rc=$(cat build/test_arch.rc 2>/dev/null || echo 1)
        n_ok=$(grep -c '^ok arch: ' "$log")
        n_fail=$(grep -c '^FAIL ' "$log")
        if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
            echo "FAIL arch: tools/test_arch.sh stopped with exit status $rc"
            n_fail=1
        fi
        pass "$n_ok"
        if [ "$n_fail" -gt 0 ]; then
            fail "tools/test_arch.sh" "$n_fail"
        fi
    fi
    bg_pids=(${pocl_avx2_pid:+"$pocl_avx2_pid"})
fi
if [ -n "$pocl_avx2_pid" ]; then
    wait "$pocl_avx2_pid"
    log=build/tests-classes/test_half_opencl.avx2.log
    rc=$(cat build/tests-classes/test_half_opencl.avx2.rc 2>/dev/null || echo 1)
    read -r n_ok n_fail < <(count_cmocka "$log")
    if [ "$rc" = 0 ] && [ "$n_fail" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
        echo "ok test: tests/test_half_opencl.c on PoCL's AVX2 kernel library ($n_ok passed)"
        pass "$n_ok"
    elif [ "$rc" = 0 ] && [ "$n_fail" -eq 0 ]; then
        echo "skipped: tests/test_half_opencl.c on PoCL's AVX2 kernel library: no test ran" \
            "($(grep -i -m 1 'skipped' "$log" || true))"
    else
        indent <"$log"
        echo "FAIL test: tests/test_half_opencl.c on PoCL's AVX2 kernel library (exit status $rc)"
        fail "tests/test_half_opencl.c on PoCL's AVX2 kernel library" "$((n_fail > 0 ? n_fail : 1))"
    fi
    bg_pids=()
fi

# ---------------------------------------------------------------------------------------------
step "examples"
# Each example compiles as C (with the test flags) and as C++; those marked '// test: run' run on
# the cpu backend and, where an OpenCL device is present, on the opencl backend too.
backends=(cpu)
if command -v clinfo >/dev/null 2>&1 && [ "$(clinfo -l 2>/dev/null | grep -c 'Device')" -gt 0 ]; then
    backends+=(opencl)
fi
# build_example SRC: compiles SRC as C into build/examples and checks it as C++; the status
# (0, "c" or "c++") goes to build/examples/NAME.build.log.rc. Several build at a time.
build_example() {
    local name bin log
    name=$(basename "$1" .c)
    bin=build/examples/$name
    log=build/examples/$name.build.log
    # shellcheck disable=SC2086
    if ! build_program build/tests "$CC" "$test_flags" "$1" "$bin" -ldl -lpthread -lm \
        >"$log" 2>&1; then
        echo c >"$log.rc"
    elif ! $CXX -x c++ -std=c++11 $cxx_warnings -I. -fsyntax-only "$1" >"$log" 2>&1; then
        echo c++ >"$log.rc"
    else
        echo 0 >"$log.rc"
    fi
}
for src in examples/*.c; do
    [ "$src" = "$plugin_src" ] && continue
    selected "$src" || continue
    rm -f "build/examples/$(basename "$src" .c).build.log.rc"
    build_example "$src" &
    wait_for_slot
done
wait
for src in examples/*.c; do
    [ "$src" = "$plugin_src" ] && continue
    selected "$src" || continue
    name=$(basename "$src" .c)
    bin=build/examples/$name
    log=build/examples/$name.build.log
    case "$(cat "$log.rc" 2>/dev/null)" in
    0) ;;
    c++)
        echo "FAIL example: $src (does not compile as C++)"
        indent <"$log"
        fail "example: $src as C++"
        continue
        ;;
    *)
        echo "FAIL example: $src (does not compile as C)"
        indent <"$bin.build.cmd"
        indent <"$log"
        fail "example: $src"
        continue
        ;;
    esac
    if ! head -n 20 "$src" | grep -q '^// test: run'; then
        echo "ok example: $src (compiles as C and C++; not marked '// test: run')"
        pass
        continue
    fi
    for backend in "${backends[@]}"; do
        echo "-- TB_BACKEND=$backend $bin"
        (cd build/examples && TB_BACKEND=$backend ASAN_OPTIONS=$asan_opencl \
            LSAN_OPTIONS=$lsan_pocl \
            timeout --foreground -k 10 "$timeout_s" "./$name")
        rc=$?
        if [ "$rc" -eq 0 ]; then
            echo "ok example: $src on $backend"
            pass
        else
            echo "FAIL example: $src on $backend (exit status $rc)"
            fail "example: $src on $backend"
        fi
    done
done

# ---------------------------------------------------------------------------------------------
step "training example"
# examples/train_mnist.c and examples/train_cnn.c (built above with the test flags) train for
# one short epoch on the first Fashion-MNIST images on each backend and must beat chance
# clearly on the test images, and print nothing on stderr (no compiler output at the default
# TB_DEBUG); the full runs (bash tools/demo.sh --train 5, ./train_cnn 10) are manual checks.
# train_example NAME IMAGES TEST_IMAGES MIN_ACCURACY
train_example() {
    local name=$1 images=$2 test_images=$3 min_acc=$4 fmnist=/usr/share/datasets/fashion-mnist
    local backend log rc acc
    selected "examples/$name.c" || return 0
    if [ ! -f "build/examples/$name" ]; then
        echo "FAIL training example: build/examples/$name was not built"
        fail "training example: build of $name"
        return 0
    fi
    if [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
        echo "skipped: $fmnist has no Fashion-MNIST (Debian package dataset-fashion-mnist)"
        return 0
    fi
    for backend in "${backends[@]}"; do
        log=build/examples/$name.$backend.log
        env -u TB_DEBUG ASAN_OPTIONS="$asan_opencl" \
            LSAN_OPTIONS="$lsan_pocl" \
            timeout --foreground -k 10 "$timeout_s" "build/examples/$name" 1 \
            --images "$images" --test-images "$test_images" --device "$backend:0" \
            2>"$log.stderr" | tee "$log"
        rc=${PIPESTATUS[0]}
        acc=$(sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$log" | tail -n 1)
        if [ -s "$log.stderr" ]; then
            echo "FAIL training example $name on $backend: it printed on stderr:"
            indent <"$log.stderr"
            fail "training example $name on $backend: output on stderr"
        elif [ "$rc" -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
            echo "ok training example $name on $backend (test accuracy $acc, nothing on stderr)"
            pass
        else
            echo "FAIL training example $name on $backend (exit status $rc, test accuracy '${acc}', need >= $min_acc)"
            fail "training example $name on $backend"
        fi
    done
}
train_example train_mnist 2560 1000 0.6
train_example train_cnn 768 300 0.45

# ---------------------------------------------------------------------------------------------
step "real models against PyTorch"
# tools/export_model.py writes a torchvision model's weights (random initialisation, seeded), an
# input and PyTorch's output at a small size; examples/models.c (built above with the test
# flags) rebuilds the model from the weights' names on cpu, native and opencl, and its output
# must be PyTorch's within 1e-5 of the output's scale. Full sizes and timings: the models rows
# of the README (./models FILE after tools/export_model.py MODEL FILE --time 5).
model_check() {
    local model=$1 size=$2 batch=$3 file backend log rc
    selected examples/models.c || return 0
    file=build/examples/$model.safetensors
    if [ ! -f build/examples/models ]; then
        echo "FAIL real models: build/examples/models was not built"
        fail "real models: build"
        return 0
    fi
    /usr/bin/python3 tools/export_model.py "$model" "$file" --size "$size" --batch "$batch"
    rc=$?
    if [ "$rc" -eq 2 ]; then
        echo "skipped $model: no torch or torchvision for /usr/bin/python3"
        return 0
    elif [ "$rc" -ne 0 ]; then
        echo "FAIL real models: tools/export_model.py $model (exit status $rc)"
        fail "real models: export of $model"
        return 0
    fi
    for backend in "${model_backends[@]}"; do
        log=build/examples/models.$model.$backend.log
        ASAN_OPTIONS=$asan_opencl LSAN_OPTIONS=$lsan_pocl \
            timeout --foreground -k 10 "$timeout_s" build/examples/models "$file" \
            --device "$backend:0" --reps 1 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        if [ "$rc" -eq 0 ]; then
            echo "ok real models: $model (size $size, batch $batch) on $backend"
            pass
        else
            echo "FAIL real models: $model on $backend (exit status $rc)"
            fail "real models: $model on $backend"
        fi
    done
}
model_backends=("${backends[@]}")
if command -v "${CC%% *}" >/dev/null 2>&1; then
    model_backends+=(native)
fi
model_check resnet18 32 2
model_check resnet50 32 1
model_check mobilenet_v2 32 2
model_check squeezenet1_0 64 2
model_check encoder 16 2

# ---------------------------------------------------------------------------------------------
step "PyTorch models through the torch.fx compiler (tools/tb_fx.py)"
# tests/fx_torch.py: torchvision models and small modules traced with torch.fx and compiled
# onto cpu, native and opencl by tools/tb_fx.py (the library built as a shared object, kept
# under build/fx_cache), each output within 1e-5 of PyTorch's scale; a training step; fallbacks
# and errors. --quick here (three models, smaller inputs); VGG-11 and AlexNet by hand:
# /usr/bin/python3 tests/fx_torch.py
# One process a device, as many at a time as there are cores; each one's output is shown whole
# when it has ended, in the order of the devices.
if selected tests/fx_torch.py || selected tools/tb_fx.py; then
    fx_devices=("${backends[@]}")
    if command -v "${CC%% *}" >/dev/null 2>&1; then fx_devices+=(native); fi
    for d in "${fx_devices[@]}"; do
        rm -f "build/fx_torch.$d.rc"
        (
            XDG_CACHE_HOME=$PWD/build/fx_cache timeout -k 10 1800 /usr/bin/python3 \
                tests/fx_torch.py --quick --devices "$d" </dev/null >"build/fx_torch.$d.log" 2>&1
            echo $? >"build/fx_torch.$d.rc"
        ) &
        wait_for_slot
    done
    wait
    for d in "${fx_devices[@]}"; do
        fx_log=build/fx_torch.$d.log
        echo "-- tests/fx_torch.py --quick --devices $d"
        cat "$fx_log"
        rc=$(cat "build/fx_torch.$d.rc" 2>/dev/null || echo 1)
        fx_summary=$(tail -n 1 "$fx_log")
        if [[ "$fx_summary" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
            pass "${BASH_REMATCH[1]}"
            [ "${BASH_REMATCH[2]}" -gt 0 ] && fail "tests/fx_torch.py on $d" "${BASH_REMATCH[2]}"
        fi
        if [ "$rc" -ne 0 ] && ! [[ "$fx_summary" =~ \ ([1-9][0-9]*)\ failed$ ]]; then
            echo "FAIL tests/fx_torch.py on $d (exit status $rc)"
            fail "tests/fx_torch.py on $d (exit status $rc)"
        fi
    done
fi

# examples/gpt.c: four iterations in one run, and two plus two resumed from the checkpoint of
# the second, must print the same losses; its PyTorch twin (tools/bench/gpt_torch.py) from the
# same initial weights must print the same losses within 1%.
gpt_check() {
    local dev=$1 dir=build/examples straight resumed twin
    selected examples/gpt.c || return 0
    if [ ! -d /usr/share/games/fortunes ]; then
        echo "skipped gpt: no /usr/share/games/fortunes (Debian package fortunes)"
        return 0
    fi
    straight=$(ASAN_OPTIONS=$asan_opencl LSAN_OPTIONS=$lsan_pocl timeout --foreground -k 10 \
        "$timeout_s" $dir/gpt --iters 4 --eval-every 2 --device "$dev:0" \
        --save-init $dir/gpt_init.safetensors | tail -n 1)
    ASAN_OPTIONS=$asan_opencl LSAN_OPTIONS=$lsan_pocl timeout --foreground -k 10 "$timeout_s" \
        $dir/gpt --iters 2 --eval-every 2 --device "$dev:0" --save $dir/gpt_ckpt.safetensors \
        >/dev/null
    resumed=$(ASAN_OPTIONS=$asan_opencl LSAN_OPTIONS=$lsan_pocl timeout --foreground -k 10 \
        "$timeout_s" $dir/gpt --iters 4 --eval-every 2 --device "$dev:0" \
        --resume $dir/gpt_ckpt.safetensors | tail -n 1)
    echo "straight: $straight"
    echo "resumed:  $resumed"
    if [ -n "$straight" ] &&
        [ "$(echo "$straight" | cut -d, -f1-2)" = "$(echo "$resumed" | cut -d, -f1-2)" ]; then
        echo "ok gpt example on $dev: a resumed run gives the uninterrupted run's losses"
        pass
    else
        echo "FAIL gpt example on $dev: the resumed run differs (or did not run)"
        fail "gpt example on $dev"
    fi
    twin=$(/usr/bin/python3 tools/bench/gpt_torch.py --iters 4 --eval-every 2 \
        --init $dir/gpt_init.safetensors 2>&1 | tail -n 1)
    echo "PyTorch:  $twin"
    if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        echo "skipped the PyTorch twin: no torch"
    elif awk -v a="$straight" -v b="$twin" 'BEGIN {
            split(a, x, "held-out loss "); split(b, y, "held-out loss ");
            u = x[2] + 0; v = y[2] + 0; d = u - v; if (d < 0) d = -d;
            exit !(u > 0 && d <= 0.01 * v) }'; then
        echo "ok gpt example on $dev: held-out loss within 1% of PyTorch's twin"
        pass
    else
        echo "FAIL gpt example on $dev: held-out loss differs from PyTorch's twin"
        fail "gpt example against PyTorch on $dev"
    fi
}
gpt_check "${model_backends[-1]}"

# ---------------------------------------------------------------------------------------------
step "MPI collectives"
# tests/mpi/collectives.c under mpirun on 1, 2 and 3 ranks (Open MPI: openmpi-bin), every rank
# against a serial computation. Built without sanitizers: MPI's own allocations are not ours to
# check. Without mpirun the step says so and runs nothing.
mpi_flags=(--oversubscribe)
if [ "$(id -u)" -eq 0 ]; then
    mpi_flags+=(--allow-run-as-root)
fi
# have_mpich: MPICH's launcher and library are installed (Debian: mpich) beside Open MPI
have_mpich() {
    command -v mpiexec.hydra >/dev/null 2>&1 &&
        ldconfig -p 2>/dev/null | grep 'libmpich\.so\.12' >/dev/null
}
if selected tests/mpi/collectives.c; then
    if ! command -v mpirun >/dev/null 2>&1; then
        echo "SKIPPED: no mpirun here (Debian: openmpi-bin libopenmpi-dev), the MPI collectives did not run"
    else
        mkdir -p build/mpi
        log=build/mpi/build.log
        # shellcheck disable=SC2086
        if $CC -std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -I. tests/mpi/collectives.c \
            -o build/mpi/collectives -ldl -lpthread -lm >"$log" 2>&1; then
            # cpu tensors on 1, 2 and 3 ranks; the other backends' on 2
            for run in 1:cpu:0 2:cpu:0 3:cpu:0 2:native:0 2:opencl:0; do
                n=${run%%:*}
                dev=${run#*:}
                log=build/mpi/collectives.$n.${dev%%:*}.log
                TB_DEVICE=$dev timeout --foreground -k 10 120 mpirun "${mpi_flags[@]}" \
                    -x TB_DEVICE -np "$n" build/mpi/collectives 2>&1 | tee "$log"
                rc=${PIPESTATUS[0]}
                if [ "$rc" -eq 0 ] && [ "$(grep -c "on $dev: .* 0 failed$" "$log")" -eq "$n" ]; then
                    echo "ok MPI collectives on $n rank(s), $dev tensors"
                    pass
                else
                    echo "FAIL MPI collectives on $n rank(s), $dev tensors (exit status $rc)"
                    fail "MPI collectives on $n rank(s), $dev tensors"
                fi
            done
            # MPICH's integer handles, where MPICH is installed too (Debian: mpich): its
            # launcher sets PMI_RANK, and the library opens libmpich.so.12 first then.
            if have_mpich; then
                log=build/mpi/collectives.mpich.log
                timeout --foreground -k 10 120 mpiexec.hydra -np 3 build/mpi/collectives 2>&1 |
                    tee "$log"
                rc=${PIPESTATUS[0]}
                if [ "$rc" -eq 0 ] && [ "$(grep -c ' of 3 on .* 0 failed$' "$log")" -eq 3 ]; then
                    echo "ok MPI collectives on 3 ranks with MPICH"
                    pass
                else
                    echo "FAIL MPI collectives on 3 ranks with MPICH (exit status $rc)"
                    fail "MPI collectives with MPICH"
                fi
            else
                echo "note: MPICH not installed (Debian: mpich): its ABI was not run here"
            fi
        else
            echo "FAIL build: tests/mpi/collectives.c"
            indent <"$log"
            fail "build: tests/mpi/collectives.c"
        fi
    fi
fi

# A rank that dies or stops calling: tests/mpi/rank_dies.c under mpirun. `stall` (the last
# rank sleeps, TB_COLLECTIVE_TIMEOUT=2): every other rank must report the timeout within it and
# a few seconds. `kill` (the last rank raises SIGKILL, TB_COLLECTIVE_TIMEOUT=5): the job must
# end, by the launcher or by the timeout, with no rank reporting a wrong outcome. Either way
# mpirun must end within 30 s; `timeout` stops a hang at 60 s, which fails the test.
if selected tests/mpi/rank_dies.c; then
    if ! command -v mpirun >/dev/null 2>&1; then
        echo "SKIPPED: no mpirun here (Debian: openmpi-bin libopenmpi-dev), the dying-rank test did not run"
    else
        mkdir -p build/mpi
        log=build/mpi/rank_dies.build.log
        # shellcheck disable=SC2086
        if $CC -std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -I. tests/mpi/rank_dies.c \
            -o build/mpi/rank_dies -ldl -lpthread -lm >"$log" 2>&1; then
            for run in stall:2 stall:3 kill:2 kill:3; do
                mode=${run%%:*}
                n=${run#*:}
                limit=2 what="stops calling"
                [ "$mode" = kill ] && limit=5 what="is killed"
                log=build/mpi/rank_dies.$mode.$n.log
                start=$(date +%s)
                TB_COLLECTIVE_TIMEOUT=$limit timeout --foreground -k 10 60 mpirun \
                    "${mpi_flags[@]}" -x TB_COLLECTIVE_TIMEOUT -np "$n" build/mpi/rank_dies \
                    "$mode" >"$log" 2>&1
                rc=$?
                took=$(($(date +%s) - start))
                expected=$(grep -c 'timed out after .* as expected$' "$log")
                wrong=$(grep -cE 'rank_dies: rank [0-9]+: (expected|waited|the next|the first|needs)' "$log")
                if [ "$took" -le 30 ] && [ "$wrong" -eq 0 ] &&
                    { [ "$mode" = kill ] || [ "$expected" -eq $((n - 1)) ]; }; then
                    echo "ok a rank that $what on $n ranks: the job ended in ${took} s (mpirun status $rc, $expected rank(s) reported the timeout)"
                    pass
                else
                    indent <"$log"
                    echo "FAIL a rank that $what on $n ranks (mpirun status $rc after ${took} s, $expected rank(s) reported the timeout)"
                    fail "a rank that $what on $n ranks"
                fi
            done
            # the same stall under MPICH (its integer handles, its nonblocking calls)
            if have_mpich; then
                log=build/mpi/rank_dies.stall.mpich.log
                start=$(date +%s)
                TB_COLLECTIVE_TIMEOUT=2 timeout --foreground -k 10 60 mpiexec.hydra -np 3 \
                    build/mpi/rank_dies stall >"$log" 2>&1
                rc=$?
                took=$(($(date +%s) - start))
                expected=$(grep -c 'timed out after .* as expected$' "$log")
                if [ "$took" -le 30 ] && [ "$expected" -eq 2 ]; then
                    echo "ok a rank that stops calling on 3 ranks with MPICH: the job ended in ${took} s (status $rc)"
                    pass
                else
                    indent <"$log"
                    echo "FAIL a rank that stops calling with MPICH (status $rc after ${took} s, $expected rank(s) reported the timeout)"
                    fail "a rank that stops calling with MPICH"
                fi
            fi
        else
            echo "FAIL build: tests/mpi/rank_dies.c"
            indent <"$log"
            fail "build: tests/mpi/rank_dies.c"
        fi
    fi
fi

# examples/train_mnist.c built once without sanitizers for the data-parallel comparisons below
# (MPI's and PoCL's own allocations are not ours to check): build/train/train_mnist. Returns 1
# after reporting a failed build.
train_mnist_built=0
plain_train_mnist() {
    local log=build/train/build.log
    [ "$train_mnist_built" -eq 1 ] && return 0
    mkdir -p build/train
    # shellcheck disable=SC2086
    if $CC -std=c99 -O2 -I. examples/train_mnist.c -o build/train/train_mnist -ldl -lpthread \
        -lm >"$log" 2>&1; then
        train_mnist_built=1
        return 0
    fi
    echo "FAIL build: examples/train_mnist.c (without sanitizers)"
    indent <"$log"
    fail "build: examples/train_mnist.c (without sanitizers)"
    return 1
}

# same_accuracy WHAT ONE_LOG ONE_RC MANY_LOG MANY_RC: both runs ended well and their last test
# accuracies agree to 0.5% (same seed, same batches, the whole batch's gradient).
same_accuracy() {
    local what=$1 acc1 acc2
    cat "$2" "$4"
    acc1=$(sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$2" | tail -n 1)
    acc2=$(sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$4" | tail -n 1)
    if [ "$3" -eq 0 ] && [ "$5" -eq 0 ] && [ -n "$acc1" ] && [ -n "$acc2" ] &&
        awk -v a="$acc1" -v b="$acc2" 'BEGIN { d = a - b; exit !(d <= 0.005 && d >= -0.005) }'; then
        echo "ok data-parallel training on $what (test accuracy $acc2, alone $acc1)"
        pass
    else
        echo "FAIL data-parallel training on $what (exit status $3/$5, accuracy '$acc1' vs '$acc2')"
        fail "data-parallel training on $what"
    fi
}

fmnist=/usr/share/datasets/fashion-mnist
train_args=(1 --images 2560 --test-images 1000)

# Data-parallel training: examples/train_mnist.c on two ranks (--group mpi) against one process.
if selected tests/mpi/train_mnist_data_parallel; then
    if ! command -v mpirun >/dev/null 2>&1; then
        echo "SKIPPED: no mpirun here (Debian: openmpi-bin libopenmpi-dev), data-parallel training did not run"
    elif [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
        echo "SKIPPED: $fmnist has no Fashion-MNIST (Debian package dataset-fashion-mnist)"
    elif plain_train_mnist; then
        timeout --foreground -k 10 120 build/train/train_mnist "${train_args[@]}" --device cpu:0 \
            >build/train/one_process.log 2>&1
        rc1=$?
        timeout --foreground -k 10 120 mpirun "${mpi_flags[@]}" -np 2 build/train/train_mnist \
            "${train_args[@]}" --device cpu:0 --group mpi >build/train/two_ranks.log 2>&1
        rc2=$?
        same_accuracy "2 ranks" build/train/one_process.log "$rc1" build/train/two_ranks.log "$rc2"
    fi
fi

# Data-parallel training over two devices of one process: examples/train_mnist.c --devices
# opencl:0,opencl:1 (sharded tensors) against opencl:0 alone.
if selected tests/train_mnist_devices; then
    if [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
        echo "SKIPPED: $fmnist has no Fashion-MNIST (Debian package dataset-fashion-mnist)"
    elif plain_train_mnist; then
        timeout --foreground -k 10 300 build/train/train_mnist "${train_args[@]}" \
            --device opencl:0 >build/train/one_device.log 2>&1
        rc1=$?
        timeout --foreground -k 10 300 build/train/train_mnist "${train_args[@]}" \
            --devices opencl:0,opencl:1 >build/train/two_devices.log 2>&1
        rc2=$?
        same_accuracy "opencl:0 and opencl:1" build/train/one_device.log "$rc1" \
            build/train/two_devices.log "$rc2"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "README code blocks"
# Every block is built first, as many at once as there are CPUs (a build of the whole library
# is most of the time), then the programs run one after the other in the README's order.
if selected README.md; then
    rm -rf build/readme
    if ! blocks=$(python3 tools/readme_blocks.py build/readme); then
        fail "README code blocks: none found"
    fi
    # build_readme_block FILE KIND: builds it as C (a program: with the test flags) and checks
    # it as C++; the outcome in FILE.rc, the compilers' output in FILE.log.
    build_readme_block() {
        local src=build/readme/$1 rc=0
        if [ "$2" = program ]; then
            build_program build/tests "$CC" "$test_flags" "$src" "${src%.c}" -ldl -lpthread -lm \
                >"$src.log" 2>&1 || rc=1
        else
            # shellcheck disable=SC2086
            $CC -std=c99 -Wall -Wextra -Werror -pedantic -I. -c "$src" -o "${src%.c}.o" \
                >"$src.log" 2>&1 || rc=1
        fi
        # shellcheck disable=SC2086
        [ "$rc" -eq 0 ] && { $CXX -x c++ -std=c++11 $cxx_warnings -I. -fsyntax-only "$src" \
            >>"$src.log" 2>&1 || rc=1; }
        echo "$rc" >"$src.rc"
    }
    while read -r file kind; do
        [ -n "$file" ] || continue
        build_readme_block "$file" "$kind" &
        wait_for_slot
    done <<<"$blocks"
    wait
    while read -r file kind; do
        [ -n "$file" ] || continue
        src=build/readme/$file
        log=$src.log
        if [ "$kind" = program ]; then
            if [ "$(cat "$src.rc" 2>/dev/null)" = 0 ] &&
                (cd build/readme && ASAN_OPTIONS=$asan_opencl "./${file%.c}" >"${file%.c}.out" 2>&1); then
                echo "ok README: $file (program: built as C and C++, ran)"
                pass
            else
                echo "FAIL README: $file (program)"
                [ -f "${src%.c}.build.cmd" ] && indent <"${src%.c}.build.cmd"
                indent <"$log"
                [ -f "build/readme/${file%.c}.out" ] && indent <"build/readme/${file%.c}.out"
                fail "README block $file"
            fi
        elif [ "$(cat "$src.rc" 2>/dev/null)" = 0 ]; then
            echo "ok README: $file (declarations: compiled as C and C++)"
            pass
        else
            echo "FAIL README: $file (declarations)"
            indent <"$log"
            fail "README block $file"
        fi
    done <<<"$blocks"
fi

# ---------------------------------------------------------------------------------------------
step "build integration"
# The CMake package (find_package, add_subdirectory, FetchContent), tools/install.sh, pkg-config,
# the README's recipe for the implementation compiled once, and every example's build line, each
# built out of tree in a temporary folder (tools/test_integration.sh).
if [ "$side_integration" = 1 ]; then
    log=build/test_integration.log
    side_report "$log"
    n_ok=$(grep -c '^ok ' "$log")
    n_fail=$(grep -c '^FAIL ' "$log")
    if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
        echo "FAIL integration: tools/test_integration.sh stopped with exit status $rc"
        n_fail=1
    fi
    pass "$n_ok"
    if [ "$n_fail" -gt 0 ]; then
        fail "tools/test_integration.sh" "$n_fail"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "fuzz (smoke)"
# Each libFuzzer harness of tests/fuzz/ for 20 seconds from its seeds (tools/fuzz.sh); a crash
# is saved under tests/fuzz/regress/ for tests/test_fuzz_regress.c to replay. Needs clang's
# fuzzer runtime (libclang-rt-14-dev).
if selected tools/fuzz.sh; then
    if [ "$quick" -eq 1 ] || [ "${TB_TEST_NO_FUZZ:-0}" = 1 ]; then
        echo "skipped: --quick or TB_TEST_NO_FUZZ=1"
    else
        log=build/fuzz_smoke.log
        side_report "$log"
        n_ok=$(grep -c '^ok fuzz: ' "$log")
        n_fail=$(grep -c '^FAIL fuzz: ' "$log")
        if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
            echo "FAIL fuzz: tools/fuzz.sh stopped with exit status $rc"
            n_fail=1
        fi
        pass "$n_ok"
        if [ "$n_fail" -gt 0 ]; then
            fail "tools/fuzz.sh --seconds 20" "$n_fail"
        fi
    fi
fi

# ---------------------------------------------------------------------------------------------
step "OpenCL kernels on Oclgrind"
# The op tests of tests/test_opencl.c (tests/backend_suite) on Oclgrind's simulated device (tools/oclgrind.sh): the GPU
# code paths at small shapes against the cpu backend; out-of-bounds accesses, data races,
# barrier divergence and API errors fail. Needs the Debian package oclgrind.
if selected tools/oclgrind.sh; then
    if [ "$quick" -eq 1 ] || [ "${TB_TEST_NO_OCLGRIND:-0}" = 1 ]; then
        echo "skipped: --quick or TB_TEST_NO_OCLGRIND=1"
    else
        log=build/oclgrind.log
        side_report "$log"
        n_ok=$(grep -c '^ok oclgrind: ' "$log")
        n_fail=$(grep -c '^FAIL ' "$log")
        if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
            echo "FAIL oclgrind: tools/oclgrind.sh stopped with exit status $rc"
            n_fail=1
        fi
        pass "$n_ok"
        if [ "$n_fail" -gt 0 ]; then
            fail "tools/oclgrind.sh" "$n_fail"
        fi
    fi
fi

# ---------------------------------------------------------------------------------------------
step "benchmark (quick)"
# Small sizes, one repetition: keeps the benchmark building and checking its results. Timings
# are printed for reading only; nothing here compares them with a threshold.
if selected tools/bench.sh; then
    if [ "$quick" -eq 1 ] || [ "${TB_TEST_NO_BENCH:-0}" = 1 ]; then
        echo "skipped: --quick or TB_TEST_NO_BENCH=1"
    elif timeout --foreground -k 10 "$timeout_s" bash tools/bench.sh --quick --no-install \
        --json build/bench_quick.json >build/bench_quick.log 2>&1; then
        indent <build/bench_quick.log
        echo "ok bench: tools/bench.sh --quick"
        pass
        # the README's table is made from such a file: every row the run wrote must come out
        rows=$(grep -c '"backend"' build/bench_quick.json || true)
        if out=$(python3 tools/bench_table.py build/bench_quick.json 2>&1) &&
            [ "$(grep -c '^| [a-z]' <<<"$out")" -eq "$((rows + 1))" ] && [ "$rows" -gt 0 ]; then
            echo "ok bench: tools/bench_table.py makes the table of its $rows rows"
            pass
        else
            indent <<<"$out"
            echo "FAIL bench: tools/bench_table.py on build/bench_quick.json ($rows rows)"
            fail "tools/bench_table.py"
        fi
    else
        indent <build/bench_quick.log
        echo "FAIL bench: tools/bench.sh --quick"
        fail "tools/bench.sh --quick"
    fi
fi

# ---------------------------------------------------------------------------------------------
step "summary"
echo "time per step (${SECONDS} s in all):"
for t in "${step_times[@]+"${step_times[@]}"}"; do
    echo "    $t"
done
if [ -n "$filter" ]; then
    echo "only the tests whose name contains '$filter'"
fi
for f in "${failures[@]+"${failures[@]}"}"; do
    echo "failed: $f"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
