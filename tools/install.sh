#!/usr/bin/env bash
# Installs torch_backend.h without CMake:   bash tools/install.sh PREFIX
#
# Writes the same files as `cmake --install BUILD --prefix PREFIX`:
#   PREFIX/include/torch_backend.h
#   PREFIX/share/cmake/torch_backend/   the CMake package (find_package(torch_backend))
#   PREFIX/share/pkgconfig/torch_backend.pc   (pkg-config --cflags --libs torch_backend)
# PREFIX is made absolute (the .pc names it). DESTDIR is honoured as by `make install`: the files
# go under DESTDIR/PREFIX while the .pc still names PREFIX. Needs only sh tools (sed, install).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -eq 1 ] && [ "$1" != "" ] && exit 0
    exit 2
fi
prefix=$1
case "$prefix" in
/*) ;;
*) prefix=$PWD/$prefix ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^#define TB_VERSION_STRING "\([0-9]*\.[0-9]*\.[0-9]*\)".*/\1/p' \
    "$root/torch_backend.h")
if [ -z "$version" ]; then
    echo "install.sh: no TB_VERSION_STRING in $root/torch_backend.h" >&2
    exit 1
fi

# The prefix inside a sed replacement: escape \, & and the | delimiter.
prefix_sed=$(printf '%s' "$prefix" | sed 's/[\\&|]/\\&/g')
dest=${DESTDIR:-}$prefix
cmake_dir=$dest/share/cmake/torch_backend

install -d "$dest/include" "$cmake_dir" "$dest/share/pkgconfig"
install -m 644 "$root/torch_backend.h" "$dest/include/torch_backend.h"
for f in torch_backend-config.cmake torch_backend-functions.cmake torch_backend_impl.c; do
    install -m 644 "$root/cmake/$f" "$cmake_dir/$f"
done
sed "s|@TB_VERSION@|$version|g" "$root/cmake/torch_backend-config-version.cmake.in" \
    >"$cmake_dir/torch_backend-config-version.cmake"
sed -e "s|@TB_PC_PREFIX@|$prefix_sed|g" -e "s|@TB_PC_VERSION@|$version|g" \
    "$root/cmake/torch_backend.pc.in" >"$dest/share/pkgconfig/torch_backend.pc"
chmod 644 "$cmake_dir/torch_backend-config-version.cmake" "$dest/share/pkgconfig/torch_backend.pc"
echo "installed torch_backend $version into ${DESTDIR:+$DESTDIR}$prefix"
