#!/usr/bin/env bash
# Tests of amalgamate.py itself. They run on a copy of the script in a temporary folder with
# stub parts (the real src/ is only read, for its .cl files), so they hold whatever state the
# library's sources are in. Prints one "ok amalgamate: ..." or "FAIL amalgamate: ..." line per
# test; exits 1 if any failed. CC and CXX select the compilers for the round-trip programs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
cc=${CC:-gcc}
cxx=${CXX:-g++}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tb_amalgamate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
ok() {
    echo "ok amalgamate: $1"
    passed=$((passed + 1))
}
fail() {
    echo "FAIL amalgamate: $1"
    shift
    if [ $# -gt 0 ]; then
        printf '%s\n' "$@" | sed 's/^/    /'
    fi
    failed=$((failed + 1))
}

mapfile -t parts < <(python3 amalgamate.py --list)
if [ "${#parts[@]}" -eq 0 ]; then
    fail "--list prints the manifest" "python3 amalgamate.py --list printed nothing"
    exit 1
fi
cl_parts=()
for p in "${parts[@]}"; do
    case "$p" in *.cl) cl_parts+=("$p") ;; esac
done

cl_stem() {
    local name
    name=$(basename "$1")
    name=${name%.*}
    printf '%s' "$name" | sed 's/[^A-Za-z0-9_]/_/g'
}

# The awkward OpenCL C source: quotes, backslashes, a tab, trailing blanks, a would-be trigraph,
# UTF-8 followed by digits, a byte that is not UTF-8, control bytes followed by digits, a CRLF
# line, an empty line, an include that must stay (it is not C of ours), a 5000-byte line, and no
# newline at the very end.
write_awkward_cl() {
    {
        printf '%s\n' '// kernels with "quotes" and a back\slash: "\n" stays two characters'
        printf '\t__kernel void k(__global float *x) { x[0] = 1.0f; }\t\n'
        printf 'trailing blanks   \n'
        printf 'a ??= b ??/ c ??? d\n'
        printf 'caf\303\251 \342\200\224 123 \377 7\n'
        printf 'control \0012 \033[0m \v \f\n'
        printf 'crlf line\r\n'
        printf '\n'
        printf '#include "not_stripped.h"\n'
        head -c 5000 /dev/zero | tr '\0' 'x'
        printf '\n'
        printf 'last line without a newline'
    } >"$1"
}

# make_copy DIR: amalgamate.py and a stub for every part of the manifest.
make_copy() {
    local dir=$1 p stem
    mkdir -p "$dir/src"
    cp amalgamate.py "$dir/"
    for p in "${parts[@]}"; do
        mkdir -p "$dir/$(dirname "$p")"
        case "$p" in
        *.cl) write_awkward_cl "$dir/$p" ;;
        *.c)
            # CRLF line endings and the include forms that must disappear.
            stem=$(cl_stem "$p")
            printf '%s\r\n' "/* stub $p */" '#include "torch_backend.h"' \
                '  #  include   "base.h"  // ours' '#include"x.h"' '#include <stddef.h>' \
                "typedef int tb__stub_${stem}_c;" '' '' >"$dir/$p"
            ;;
        *)
            stem=$(cl_stem "$p")
            printf '%s\n' '' "/* stub $p */" '#include "base.h"' '#include <stdint.h>' \
                "typedef int tb__stub_${stem}_h;" '' >"$dir/$p"
            ;;
        esac
    done
}

hash_of() {
    if [ -e "$1" ]; then sha256sum "$1" | cut -d' ' -f1; else echo absent; fi
}

copy=$tmp/copy
make_copy "$copy"
mkdir -p "$tmp/elsewhere"
out=$copy/torch_backend.h

# 1. It writes the header, finding the parts beside the script whatever the current folder.
if (cd "$tmp/elsewhere" && python3 "$copy/amalgamate.py" >"$tmp/log" 2>&1) && [ -f "$out" ]; then
    ok "writes torch_backend.h from another current folder"
else
    fail "writes torch_backend.h from another current folder" "$(cat "$tmp/log")"
fi

# 2. One banner per part, in manifest order.
expected_banners=$(printf '/* ---- %s ---- */\n' "${parts[@]}")
actual_banners=$(grep '^/\* ---- .* ---- \*/$' "$out" 2>/dev/null)
if [ "$expected_banners" = "$actual_banners" ]; then
    ok "one banner per part, in manifest order"
else
    fail "one banner per part, in manifest order" "$(diff <(echo "$expected_banners") <(echo "$actual_banners") | head -n 20)"
fi

# 3. Our own includes are gone, system includes stay.
if grep -Eq '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$out"; then
    fail 'drops #include "..." lines' "$(grep -En '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$out" | head -n 5)"
elif ! grep -q '^#include <stddef.h>$' "$out" || ! grep -q '^#include <stdint.h>$' "$out"; then
    fail 'keeps #include <...> lines'
else
    ok 'drops #include "..." lines, keeps #include <...>'
fi

# 4. LF only, one final newline, one blank line between parts, no absolute path.
problems=()
grep -q $'\r' "$out" && problems+=("carriage return in the output")
[ "$(tail -c 1 "$out" | od -An -c | tr -d ' ')" = '\n' ] || problems+=("does not end with a newline")
[ "$(tail -c 2 "$out" | od -An -c | tr -d ' ')" = '\n\n' ] && problems+=("ends with a blank line")
grep -qF "$tmp" "$out" && problems+=("contains the absolute path $tmp")
grep -qF "$repo" "$out" && problems+=("contains the absolute path $repo")
blank_runs=$(awk 'NF == 0 { n++; next } { if (n > 1) bad++; n = 0 } END { print bad + 0 }' "$out")
[ "$blank_runs" -eq 0 ] || problems+=("$blank_runs place(s) with more than one blank line in a row")
if [ "${#problems[@]}" -eq 0 ]; then
    ok "LF line endings, one final newline, no absolute paths"
else
    fail "LF line endings, one final newline, no absolute paths" "${problems[@]}"
fi

# 5. Deterministic: two more runs, one from another folder, give the same bytes.
python3 "$copy/amalgamate.py" --output "$tmp/again.h" >/dev/null 2>&1
(cd / && python3 "$copy/amalgamate.py" --output "$tmp/again2.h" >/dev/null 2>&1)
if cmp -s "$out" "$tmp/again.h" && cmp -s "$out" "$tmp/again2.h"; then
    ok "two runs give byte-identical output"
else
    fail "two runs give byte-identical output" "$(cmp "$out" "$tmp/again.h" 2>&1; cmp "$out" "$tmp/again2.h" 2>&1)"
fi

# 6. --check on a fresh header.
if python3 "$copy/amalgamate.py" --check >"$tmp/stdout" 2>"$tmp/stderr" &&
    grep -q 'torch_backend.h is up to date' "$tmp/stdout"; then
    ok "--check passes on a fresh header"
else
    fail "--check passes on a fresh header" "$(cat "$tmp/stdout" "$tmp/stderr")"
fi

# 7. --check on a header with one changed line names that line and changes nothing.
sed -i '5s/$/ edited/' "$out"
before=$(hash_of "$out")
python3 "$copy/amalgamate.py" --check >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ "$rc" -eq 1 ] && grep -q 'torch_backend.h is stale: first difference at line 5$' "$tmp/stderr" &&
    grep -q 'edited' "$tmp/stderr" && [ "$(hash_of "$out")" = "$before" ]; then
    ok "--check exits 1 on a stale header and names the line"
else
    fail "--check exits 1 on a stale header and names the line" "exit status $rc" "$(cat "$tmp/stdout" "$tmp/stderr")"
fi

# 8. --check when the header does not exist.
python3 "$copy/amalgamate.py" --check --output "$tmp/none.h" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ "$rc" -eq 1 ] && [ ! -e "$tmp/none.h" ]; then
    ok "--check exits 1 when the header is missing"
else
    fail "--check exits 1 when the header is missing" "exit status $rc" "$(cat "$tmp/stdout" "$tmp/stderr")"
fi

# 9. A missing part: exit 2, the part named on stderr, nothing written or left behind.
victim=${parts[$((${#parts[@]} / 2))]}
mv "$copy/$victim" "$tmp/victim"
before=$(hash_of "$out")
python3 "$copy/amalgamate.py" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
python3 "$copy/amalgamate.py" --output "$tmp/new.h" >>"$tmp/stdout" 2>>"$tmp/stderr"
rc2=$?
leftovers=$(find "$copy" "$tmp" -maxdepth 1 -name '*.tmp')
if [ "$rc" -eq 2 ] && [ "$rc2" -eq 2 ] && grep -qF "$victim" "$tmp/stderr" &&
    [ "$(hash_of "$out")" = "$before" ] && [ ! -e "$tmp/new.h" ] && [ -z "$leftovers" ] &&
    [ ! -s "$tmp/stdout" ]; then
    ok "a missing part: exit 2, named on stderr, output untouched"
else
    fail "a missing part: exit 2, named on stderr, output untouched" "exit status $rc and $rc2" \
        "$(cat "$tmp/stdout" "$tmp/stderr")" "leftover temporary files: ${leftovers:-none}"
fi

# 10. An unreadable part (a folder where the file should be): the same.
mkdir "$copy/$victim"
python3 "$copy/amalgamate.py" --output "$tmp/new.h" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF "$victim" "$tmp/stderr" && [ ! -e "$tmp/new.h" ]; then
    ok "an unreadable part: exit 2, named on stderr, nothing written"
else
    fail "an unreadable part: exit 2, named on stderr, nothing written" "exit status $rc" "$(cat "$tmp/stdout" "$tmp/stderr")"
fi
rmdir "$copy/$victim"
mv "$tmp/victim" "$copy/$victim"

# 11. A part listed twice is an error.
dup=$tmp/dup
mkdir -p "$dup"
cp -r "$copy/src" "$dup/"
sed "s|^IMPLEMENTATION_PARTS = \[|IMPLEMENTATION_PARTS = [\"${parts[0]}\",|" amalgamate.py >"$dup/amalgamate.py"
python3 "$dup/amalgamate.py" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ "$rc" -eq 2 ] && grep -q 'twice' "$tmp/stderr" && [ ! -e "$dup/torch_backend.h" ]; then
    ok "a part listed twice is rejected"
else
    fail "a part listed twice is rejected" "exit status $rc" "$(cat "$tmp/stdout" "$tmp/stderr")"
fi

# 12. Each .cl part round-trips: a C (and C++) program printing the joined chunks reproduces
# the file byte for byte, the count matches, and -pedantic accepts the literals.
# round_trip NAME HEADER CL_FILE STEM
round_trip() {
    local name=$1 header=$2 cl=$3 stem=$4 prog=$tmp/round_trip_$4.c
    cat >"$prog" <<C
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "$header"

int main(void) {
    size_t i = 0;
    for (; tb__cl_$stem[i] != 0; i++) {
        fwrite(tb__cl_$stem[i], 1, strlen(tb__cl_$stem[i]), stdout);
    }
    if (i != tb__cl_${stem}_count) {
        fprintf(stderr, "%lu chunks but tb__cl_${stem}_count is %lu\n", (unsigned long)i,
                (unsigned long)tb__cl_${stem}_count);
        return 1;
    }
    return 0;
}
C
    local compiler lang log=$tmp/round_trip.log
    for lang in c c++; do
        if [ "$lang" = c ]; then
            compiler=("$cc" -std=c99)
        else
            compiler=("$cxx" -x c++ -std=c++11)
        fi
        if ! "${compiler[@]}" -Wall -Wextra -Werror -pedantic "$prog" -o "$tmp/round_trip" >"$log" 2>&1; then
            fail "$name round-trips ($lang)" "${compiler[*]} failed:" "$(head -n 30 "$log")"
        elif ! "$tmp/round_trip" >"$tmp/round_trip.out" 2>"$log"; then
            fail "$name round-trips ($lang)" "$(cat "$log")"
        elif ! cmp -s "$tmp/round_trip.out" "$cl"; then
            fail "$name round-trips ($lang)" "$(cmp "$tmp/round_trip.out" "$cl" 2>&1)"
        else
            ok "$name round-trips ($lang)"
        fi
    done
}

if [ "${#cl_parts[@]}" -eq 0 ]; then
    echo "skip amalgamate: the manifest has no .cl part to round-trip"
fi
for p in "${cl_parts[@]+"${cl_parts[@]}"}"; do
    stem=$(cl_stem "$p")
    python3 "$copy/amalgamate.py" >/dev/null 2>&1
    round_trip "awkward $p" "$out" "$copy/$p" "$stem"
    if [ -f "$repo/$p" ]; then
        real=$tmp/real
        rm -rf "$real"
        make_copy "$real"
        cp "$repo/$p" "$real/$p"
        if python3 "$real/amalgamate.py" >"$tmp/log" 2>&1; then
            round_trip "$p" "$real/torch_backend.h" "$real/$p" "$stem"
        else
            fail "$p round-trips" "$(cat "$tmp/log")"
        fi
    fi
done

echo "amalgamate tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
