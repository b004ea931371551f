#!/usr/bin/env bash
# Builds the plugins the registry tests load:   bash tests/plugins/build.sh OUTDIR
#   OUTDIR/libtb_backend_plugin.so       examples/plugin_backend.c (a working plugin)
#   OUTDIR/libtb_backend_<variant>.so    tests/plugins/bad_plugin.c, one per error path, and
#                                        tests/plugins/seterror_plugin.c, one per variant
# tests/test_registry.c finds them through TB_BACKEND_PATH=OUTDIR. CC picks the compiler
# (default cc; it may hold arguments, e.g. "ccache gcc"). Plain shared objects, without
# sanitizers: they load into sanitized test programs.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash tests/plugins/build.sh OUTDIR" >&2
    exit 2
fi
out=$1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p "$out"
cc=${CC:-cc}
flags="-std=c11 -g -O1 -Wall -Wextra -Werror -shared -fPIC -I."
# shellcheck disable=SC2086
$cc $flags examples/plugin_backend.c -o "$out/libtb_backend_plugin.so"
variants=(badversion nosymbol failinit mismatch entryfail incomplete
    slashname colonname longname nullname emptyname ctrlname longtags)
for variant in "${variants[@]}"; do
    macro=TB_TEST_$(printf '%s' "$variant" | tr '[:lower:]' '[:upper:]')
    # shellcheck disable=SC2086
    $cc $flags -D"$macro" tests/plugins/bad_plugin.c -o "$out/libtb_backend_$variant.so"
done
# Plugins that report errors only through tb_set_error of their own copy of the library.
seterror_variants=(seterror seterrorentry seterrorinit)
for variant in "${seterror_variants[@]}"; do
    macro=TB_TEST_$(printf '%s' "$variant" | tr '[:lower:]' '[:upper:]')
    # shellcheck disable=SC2086
    $cc $flags -D"$macro" tests/plugins/seterror_plugin.c -o "$out/libtb_backend_$variant.so"
done
echo "built $((${#variants[@]} + ${#seterror_variants[@]} + 1)) plugins in $out"
