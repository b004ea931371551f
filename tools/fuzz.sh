#!/usr/bin/env bash
# Builds and runs the libFuzzer harnesses of tests/fuzz/:
#
#     bash tools/fuzz.sh [--seconds N] [TARGET...]
#
# TARGET is npy, parse, dlpack, graph, safetensors, npz or idx (default: all seven, one after the
# other; the last three load model files through a private temporary folder). Each runs for
# N seconds (default 30, a smoke run; 600 for a long run), starting from its seeds in
# tests/fuzz/corpus/TARGET/ and its past crashes in tests/fuzz/regress/TARGET/, and growing a
# working corpus in build/fuzz/corpus/TARGET/ that later runs start from. One line per target
# gives libFuzzer's final figures: executions, coverage (cov: edges, ft: features) and corpus.
# A crash (or leak, timeout, out-of-memory) is copied to tests/fuzz/regress/TARGET/, where
# tests/test_fuzz_regress.c replays it in the normal test suite, and the exit status is 1.
#
# Environment: FUZZ_CC (default clang) must support -fsanitize=fuzzer (Debian:
# libclang-rt-14-dev). The harnesses are one program, built with
#     clang -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -I.
# into build/fuzz/fuzz_harnesses; build/fuzz/fuzz_TARGET, a link to it, runs TARGET's harness
# (as does TB_FUZZ_TARGET=TARGET). Run it under nice on a shared machine; the targets run one
# at a time.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=30
targets=()
all_targets=(npy parse dlpack graph safetensors npz idx)
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds)
        if [ $# -lt 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt 1 ]; then
            echo "fuzz.sh: --seconds needs a positive whole number" >&2
            exit 2
        fi
        seconds=$2
        shift
        ;;
    --seconds=*)
        seconds=${1#--seconds=}
        if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
            echo "fuzz.sh: --seconds needs a positive whole number" >&2
            exit 2
        fi
        ;;
    -h | --help)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "fuzz.sh: unknown option: $1 (see bash tools/fuzz.sh --help)" >&2
        exit 2
        ;;
    *)
        if [[ " ${all_targets[*]} " != *" $1 "* ]]; then
            echo "fuzz.sh: unknown target: $1 (targets: ${all_targets[*]})" >&2
            exit 2
        fi
        targets+=("$1")
        ;;
    esac
    shift
done
[ "${#targets[@]}" -gt 0 ] || targets=("${all_targets[@]}")

cc=${FUZZ_CC:-clang}
flags=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -I.)
out=build/fuzz
mkdir -p "$out"
# intercept_tls_get_addr=0: see asan_default in tools/test.sh (LeakSanitizer's tracer crash)
export ASAN_OPTIONS=${FUZZ_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# One program holds every harness (tests/fuzz/all_harnesses.c: the library, which is most of
# the compile, is compiled once); build/fuzz/fuzz_TARGET is a link to it, whose name picks
# the harness.
prog=$out/fuzz_harnesses
if "$cc" "${flags[@]}" tests/fuzz/all_harnesses.c -o "$prog" >"$prog.build.log" 2>&1; then
    built=1
else
    built=0
fi
for t in "${targets[@]}"; do
    ln -sfn fuzz_harnesses "$out/fuzz_$t"
done
failed=0
for t in "${targets[@]}"; do
    bin=$out/fuzz_$t
    log=$out/fuzz_$t.log
    if [ "$built" != 1 ]; then
        echo "FAIL fuzz: $t (does not build: $cc ${flags[*]} tests/fuzz/all_harnesses.c)"
        sed 's/^/    /' "$prog.build.log"
        failed=1
        continue
    fi
    corpus=$out/corpus/$t
    artifacts=$out/artifacts/$t
    mkdir -p "$corpus" "$artifacts"
    seeds=("tests/fuzz/corpus/$t")
    [ -d "tests/fuzz/regress/$t" ] && seeds+=("tests/fuzz/regress/$t")
    # -timeout: one input may take at most 10 s; -rss_limit_mb also limits single mallocs.
    started=$(date +%s)
    "./$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" >"$log" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - started))
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
    last_line=$(grep -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED|DONE)' "$log" | tail -n 1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    figures=${done_line:-$last_line}
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$figures")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$figures")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$figures")
    summary="${runs:-?} executions in ${elapsed} s (${rate:-?}/s), cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?}"
    if [ "$rc" -eq 0 ]; then
        echo "ok fuzz: $t: $summary"
        echo "    $figures"
    else
        failed=1
        echo "FAIL fuzz: $t (libFuzzer exit status $rc): $summary"
        grep -E 'ERROR: |SUMMARY: |runtime error|invariant broken|Test unit written' "$log" |
            head -n 20 | sed 's/^/    /'
        mkdir -p "tests/fuzz/regress/$t"
        for a in "$artifacts"/*; do
            [ -f "$a" ] || continue
            cp "$a" "tests/fuzz/regress/$t/"
            echo "    saved $a as tests/fuzz/regress/$t/$(basename "$a");" \
                "reproduce: $bin tests/fuzz/regress/$t/$(basename "$a")"
            rm -f "$a"
        done
        echo "    full log: $log"
    fi
done
exit "$failed"
