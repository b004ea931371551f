#!/usr/bin/env bash
# Build integration, tested the way users meet it:   bash tools/test_integration.sh
#
#   1. `cmake --install` (with --prefix, and with DESTDIR) and tools/install.sh give the same
#      files; the .pc names the prefix.
#   2. A small consumer project, configured and built out of tree in a temporary folder, with
#      find_package (against both installs; a 1.0 request must fail), add_subdirectory,
#      FetchContent from SOURCE_DIR and from a file:// URL of an archive (no network), each also
#      linking the implementation compiled once (torch_backend::impl or
#      torch_backend_add_implementation) and building examples/hello.c; every program built
#      is run.
#   3. pkg-config --cflags --libs against both installs (a small program and examples/hello.c).
#   4. The README's recipe for building the implementation once (static and shared library).
#   5. Every example's build line (its "// Build:" and "//    or:" comments) and the README's
#      cc lines for examples/, run as written from a copy of the repository root.
#   6. What the examples built there say: hello's values and its errors on a bad TB_BACKEND or
#      TB_DEVICE (exit status 1, the library's message), devices listing the plugins on
#      TB_BACKEND_PATH (the example plugin built from its build line, and a broken one).
# One line per check, "ok ..." or "FAIL ..." (tools/test.sh counts them); exit 1 on a failure.
# Needs cmake, pkg-config and a C compiler (CC, default cc); C++ lines use c++ as written.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
failures=0

ok() {
    echo "ok $*"
}
fail() {
    echo "FAIL $1"
    [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -n 30 | sed 's/^/    /'
    failures=$((failures + 1))
}
# check NAME COMMAND...: runs the command, its output kept for the failure message.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        ok "$name"
    else
        fail "$name" "$out"
    fi
}

for tool in cmake pkg-config; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FAIL integration: $tool is not installed (Debian: apt-get install $tool)"
        exit 1
    fi
done
cc=${CC:-cc}
work=$(mktemp -d "${TMPDIR:-/tmp}/tb_integration.XXXXXX")
trap 'rm -rf "$work"' EXIT
version=$(sed -n 's/^#define TB_VERSION_STRING "\(.*\)"$/\1/p' torch_backend.h)

# ---- 1. installs -----------------------------------------------------------------------------
check "cmake configure" cmake -S "$repo" -B "$work/build" -DCMAKE_INSTALL_PREFIX="$work/unused"
check "cmake --install --prefix" cmake --install "$work/build" --prefix "$work/prefix_cmake"
check "tools/install.sh PREFIX" bash tools/install.sh "$work/prefix_sh"
check "DESTDIR with cmake --install" env DESTDIR="$work/stage_cmake" \
    cmake --install "$work/build" --prefix /opt/tb
check "DESTDIR with tools/install.sh" env DESTDIR="$work/stage_sh" bash tools/install.sh /opt/tb

expected_files="./include/torch_backend.h
./share/cmake/torch_backend/torch_backend-config-version.cmake
./share/cmake/torch_backend/torch_backend-config.cmake
./share/cmake/torch_backend/torch_backend-functions.cmake
./share/cmake/torch_backend/torch_backend_impl.c
./share/pkgconfig/torch_backend.pc"
for tree in prefix_cmake prefix_sh stage_cmake/opt/tb stage_sh/opt/tb; do
    got=$(cd "$work/$tree" 2>/dev/null && find . -type f | LC_ALL=C sort)
    if [ "$got" = "$expected_files" ]; then
        ok "install layout of $tree"
    else
        fail "install layout of $tree" "$(diff <(echo "$expected_files") <(echo "$got"))"
    fi
done
if diff -r -x torch_backend.pc "$work/prefix_cmake" "$work/prefix_sh" >"$work/diff.txt" 2>&1 &&
    diff <(sed "s|$work/prefix_cmake|PREFIX|" "$work/prefix_cmake/share/pkgconfig/torch_backend.pc") \
        <(sed "s|$work/prefix_sh|PREFIX|" "$work/prefix_sh/share/pkgconfig/torch_backend.pc") \
        >>"$work/diff.txt" 2>&1; then
    ok "cmake --install and tools/install.sh write the same files"
else
    fail "cmake --install and tools/install.sh write the same files" "$(cat "$work/diff.txt")"
fi
for pc in "$work/prefix_cmake/share/pkgconfig/torch_backend.pc:$work/prefix_cmake" \
    "$work/stage_cmake/opt/tb/share/pkgconfig/torch_backend.pc:/opt/tb" \
    "$work/stage_sh/opt/tb/share/pkgconfig/torch_backend.pc:/opt/tb"; do
    file=${pc%%:*}
    want=${pc#*:}
    if grep -qx "prefix=$want" "$file" && grep -qx "Version: $version" "$file"; then
        ok "the .pc names prefix $want and version $version"
    else
        fail "the .pc names prefix $want and version $version" "$(cat "$file")"
    fi
done

# ---- 2. consumer projects --------------------------------------------------------------------
consumer=$work/consumer
mkdir -p "$consumer"
cat >"$consumer/main.c" <<'EOF'
#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include <stdio.h>

int main(void) {
    const float v[3] = {1, -2, 3};
    tb_shape s = tb_shape_of(TB_F32, 1, 3);
    tb_tensor *x = tb_tensor_from_host(v, &s, NULL);
    tb_tensor *y = tb_relu(x);
    float out[3];
    if (y == NULL || tb_tensor_to_host(y, out, sizeof out) != TB_OK) {
        fprintf(stderr, "%s\n", tb_last_error());
        return 1;
    }
    printf("torch_backend %s: relu gives %g %g %g\n", TB_VERSION_STRING, out[0], out[1], out[2]);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_shutdown();
    return out[0] == 1 && out[1] == 0 && out[2] == 3 ? 0 : 1;
}
EOF
# The same program against the implementation compiled once: no TB_IMPLEMENTATION here.
sed '/#define TB_IMPLEMENTATION/d' "$consumer/main.c" >"$consumer/app.c"

# write_project DIR HOW: a CMakeLists.txt that gets torch_backend HOW and builds main.c (with
# the implementation inside) and app.c (linked to the implementation library).
write_project() {
    local dir=$1 how=$2 impl=torch_backend::impl
    mkdir -p "$dir"
    cp "$consumer/main.c" "$consumer/app.c" "$repo/examples/hello.c" "$dir/"
    {
        echo "cmake_minimum_required(VERSION 3.14)"
        echo "project(consumer C)"
        case "$how" in
        find_package*)
            echo "find_package(torch_backend ${how#find_package } REQUIRED)"
            echo "torch_backend_add_implementation(tb_impl STATIC)"
            impl=tb_impl
            ;;
        add_subdirectory)
            echo "add_subdirectory(\"$repo\" torch_backend)"
            ;;
        fetch_source)
            echo "include(FetchContent)"
            echo "FetchContent_Declare(torch_backend SOURCE_DIR \"$repo\")"
            echo "FetchContent_MakeAvailable(torch_backend)"
            ;;
        fetch_url)
            echo "include(FetchContent)"
            echo "FetchContent_Declare(torch_backend URL \"file://$work/torch_backend.tar.gz\""
            echo "    URL_HASH SHA256=$archive_sha)"
            echo "FetchContent_MakeAvailable(torch_backend)"
            ;;
        esac
        echo "add_executable(consumer main.c)"
        echo "target_link_libraries(consumer PRIVATE torch_backend::torch_backend)"
        echo "add_executable(consumer_lib app.c)"
        echo "target_link_libraries(consumer_lib PRIVATE $impl)"
        echo "add_executable(hello hello.c)"
        echo "target_link_libraries(hello PRIVATE torch_backend::torch_backend)"
    } >"$dir/CMakeLists.txt"
}

# build_and_run NAME DIR [cmake args]: configure, build, run the three programs.
build_and_run() {
    local name=$1 dir=$2 out
    shift 2
    if ! out=$(cmake -S "$dir" -B "$dir/build" "$@" 2>&1); then
        fail "$name: configure" "$out"
        return
    fi
    if ! out=$(cmake --build "$dir/build" 2>&1); then
        fail "$name: build" "$out"
        return
    fi
    for program in consumer consumer_lib; do
        if out=$("$dir/build/$program" 2>&1) && [[ "$out" == *"relu gives 1 0 3"* ]]; then
            ok "$name: $program runs ($out)"
        else
            fail "$name: $program runs" "$out"
        fi
    done
    if out=$(env -u TB_DEVICE TB_BACKEND=cpu "$dir/build/hello" 2>&1) &&
        [[ "$out" == *"backend: cpu, device: cpu:0"* ]]; then
        ok "$name: examples/hello.c runs"
    else
        fail "$name: examples/hello.c runs" "$out"
    fi
}

# An archive of the repository's files (what a release or a forge's tarball holds).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -z | tar --null -T - --transform 's|^|torch_backend/|' \
        -czf "$work/torch_backend.tar.gz"
else
    tar --exclude=./build -czf "$work/torch_backend.tar.gz" --transform 's|^\./|torch_backend/|' .
fi
archive_sha=$(sha256sum "$work/torch_backend.tar.gz" | cut -d' ' -f1)

write_project "$work/p_find" "find_package 0.1"
build_and_run "find_package after cmake --install" "$work/p_find" \
    -DCMAKE_PREFIX_PATH="$work/prefix_cmake"
write_project "$work/p_find_sh" "find_package $version"
build_and_run "find_package after tools/install.sh" "$work/p_find_sh" \
    -DCMAKE_PREFIX_PATH="$work/prefix_sh"
write_project "$work/p_find_new" "find_package 1.0"
if out=$(cmake -S "$work/p_find_new" -B "$work/p_find_new/build" \
    -DCMAKE_PREFIX_PATH="$work/prefix_cmake" 2>&1); then
    fail "find_package(torch_backend 1.0) is refused" "$out"
elif [[ "$out" == *"torch_backend-config.cmake, version: $version"* ]]; then
    ok "find_package(torch_backend 1.0) is refused (version $version found, not compatible)"
else
    fail "find_package(torch_backend 1.0) is refused for its version" "$out"
fi
write_project "$work/p_subdir" add_subdirectory
build_and_run "add_subdirectory" "$work/p_subdir"
write_project "$work/p_fetch_dir" fetch_source
build_and_run "FetchContent SOURCE_DIR" "$work/p_fetch_dir"
write_project "$work/p_fetch_url" fetch_url
build_and_run "FetchContent URL file://...tar.gz" "$work/p_fetch_url"

# ---- 3. pkg-config ---------------------------------------------------------------------------
for tree in prefix_cmake prefix_sh; do
    export PKG_CONFIG_PATH="$work/$tree/share/pkgconfig"
    flags=$(pkg-config --cflags --libs torch_backend 2>&1)
    got_version=$(pkg-config --modversion torch_backend 2>&1)
    # shellcheck disable=SC2086
    if [ "$got_version" = "$version" ] &&
        out=$($cc "$consumer/main.c" $flags -o "$work/pc_$tree" 2>&1) &&
        out=$("$work/pc_$tree" 2>&1); then
        ok "pkg-config --cflags --libs torch_backend ($tree: $flags): $out"
    else
        fail "pkg-config --cflags --libs torch_backend ($tree)" "$flags / $got_version / $out"
    fi
    # an example, built out of tree with nothing but what pkg-config gives
    # shellcheck disable=SC2086
    if out=$(cd "$work" && $cc -std=c99 "$repo/examples/hello.c" $flags -o "$work/pc_hello_$tree" 2>&1) &&
        out=$(env -u TB_DEVICE TB_BACKEND=cpu "$work/pc_hello_$tree" 2>&1) &&
        [[ "$out" == *"backend: cpu, device: cpu:0"* ]]; then
        ok "pkg-config: examples/hello.c builds and runs ($tree)"
    else
        fail "pkg-config: examples/hello.c builds and runs ($tree)" "$out"
    fi
    unset PKG_CONFIG_PATH
done

# ---- 4. the README's recipe for the implementation compiled once -----------------------------
recipe=$(awk '/^# build the implementation once/ { on = 1; next } on && /^```/ { exit } on' README.md)
if [ -z "$recipe" ]; then
    fail "README recipe: no block starting '# build the implementation once'"
else
    mkdir -p "$work/recipe"
    cp torch_backend.h "$consumer/app.c" "$work/recipe/"
    if out=$(cd "$work/recipe" && bash -e -c "$recipe" 2>&1) &&
        out=$("$work/recipe/app_static" 2>&1) && out=$("$work/recipe/app_shared" 2>&1); then
        ok "README recipe: static and shared library built once, both programs run"
    else
        fail "README recipe" "$out"
    fi
fi

# ---- 5. every build line of the examples and the README, from the repository root -----------
root_copy=$work/root
mkdir -p "$root_copy"
cp -r torch_backend.h examples "$root_copy/"
mkdir -p "$root_copy/plugins"
lines=()
for src in examples/*.c; do
    while IFS= read -r line; do
        lines+=("$src: $line")
    done < <(head -n 12 "$src" | sed -n 's/^\/\/ \{1,\}\(Build\|or\): \{1,\}\(.*\)$/\2/p')
    if ! head -n 12 "$src" | grep -q '^// Build: '; then
        fail "$src has no '// Build: ' line in its first 12 lines"
    fi
done
while IFS= read -r line; do
    lines+=("README.md: $line")
done < <(awk '/^```sh/ { on = 1; next } /^```/ { on = 0 } on' README.md |
    grep -E '^(cc|c\+\+) .*examples/')
# a command given twice (an example's build line that the README repeats) runs once: the
# second report names the first
declare -A ran_by=()
for entry in "${lines[@]}"; do
    command=${entry#*: }
    if [ -n "${ran_by[$command]+set}" ]; then
        if [ "${ran_by[$command]}" = ok ]; then
            ok "build line of ${entry%%: *}: $command (as above)"
        else
            fail "build line of ${entry%%: *}: $command (as above)"
        fi
        continue
    fi
    if out=$(cd "$root_copy" && bash -e -c "$command" 2>&1); then
        ran_by[$command]=ok
        ok "build line of ${entry%%: *}: $command"
    else
        ran_by[$command]=failed
        fail "build line of ${entry%%: *}: $command" "$out"
    fi
done

# ---- 6. what the examples built above say -------------------------------------------------
# expect NAME WANT_STATUS NEEDLE... -- COMMAND...: COMMAND (run in the root copy) exits with
# WANT_STATUS and its output (stdout and stderr) holds each NEEDLE.
expect() {
    local name=$1 want=$2 out rc needle missing=""
    shift 2
    local needles=()
    while [ "$1" != "--" ]; do
        needles+=("$1")
        shift
    done
    shift
    out=$(cd "$root_copy" && "$@" 2>&1)
    rc=$?
    for needle in "${needles[@]}"; do
        [[ "$out" == *"$needle"* ]] || missing+=" '$needle'"
    done
    if [ "$rc" -eq "$want" ] && [ -z "$missing" ]; then
        ok "$name"
    else
        fail "$name (exit status $rc, want $want; missing:${missing:- nothing})" "$out"
    fi
}
if [ -x "$root_copy/hello" ] && [ -x "$root_copy/devices" ] &&
    [ -f "$root_copy/libtb_backend_plugin.so" ]; then
    # hello checks each status it prints: a bad switch ends it with the library's message, in
    # the same words for TB_BACKEND and TB_DEVICE
    expect "examples/hello.c on cpu prints its values" 0 "backend: cpu, device: cpu:0" \
        $'4 4 4\n5 6 7' -- env -u TB_DEVICE TB_BACKEND=cpu ./hello
    expect "examples/hello.c stops on a bad TB_BACKEND" 1 \
        "hello: tb_get_backend: TB_BACKEND='no_such_backend' is not a usable backend: unknown backend 'no_such_backend'; available: " \
        -- env -u TB_DEVICE TB_BACKEND=no_such_backend ./hello
    expect "examples/hello.c stops on a bad TB_DEVICE" 1 \
        "hello: tb_current_device: TB_DEVICE='cpu:9' is not a usable device: device ordinal 9 out of range" \
        -- env -u TB_BACKEND TB_DEVICE=cpu:9 ./hello
    # devices lists the plugins on TB_BACKEND_PATH with the built-in backends, and says why a
    # plugin does not load
    mkdir -p "$work/broken_plugins"
    : >"$work/broken_plugins/libtb_backend_broken.so"
    expect "examples/devices.c lists the plugin backends" 0 "cpu"$'\n'"  cpu:0 (CPU)" \
        $'\nplugin [example]\n  plugin:0 (ACCELERATOR)\n    name:             plugin device' \
        "plugin broken does not load: tb_backend_lookup: cannot load plugin $work/broken_plugins/libtb_backend_broken.so" \
        -- env -u TB_BACKEND -u TB_DEVICE TB_BACKEND_PATH="$root_copy:$work/broken_plugins" ./devices
else
    fail "examples: hello, devices or libtb_backend_plugin.so was not built from its build line"
fi

echo "integration: $failures failed"
[ "$failures" -eq 0 ]
