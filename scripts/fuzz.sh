#!/bin/sh
# scripts/fuzz.sh TARGET SECONDS [libFuzzer args...]
# scripts/fuzz.sh all SECONDS [libFuzzer args...]
#
# Builds the libFuzzer targets in build-fuzz (configuring it with clang and
# -DCART_FUZZ=ON the first time) and runs TARGET (fuzz_gguf, or just gguf)
# for SECONDS with its dictionary and a working corpus under
# build-fuzz/fuzz/<target>/corpus, seeded from tests/fuzz/corpus/<target> (the
# repository's seeds are never written to). Crash, leak and timeout inputs go
# to build-fuzz/fuzz/<target>/; the full libFuzzer log to .../log. Extra
# arguments go to libFuzzer, e.g. -runs=10000000 to stop after that many
# executions.
#
# Prints one summary line per target:
#   fuzz_gguf: 1234567 execs in 60 s, 20576 exec/s, cov 1234 ft 5678, corpus 321, findings 0
# and exits non-zero when any target found something (a crash, a sanitizer
# report, a leak or a timeout) or failed to build. `all` runs every target in
# turn. A target with nothing to fuzz here (fuzz_tokenizer without its
# vocabulary files) is reported as skipped and does not fail the run.
#
# Environment: FUZZ_FRESH=1 starts from the seeds only (drops the working
# corpus); JOBS sets the build's parallelism (default: nproc); FUZZ_JOBS how
# many targets run at once (default: nproc, one core each); CART_ISA the
# kernels' level (default: scalar, the only one the fuzz build instruments).
set -eu
cd "$(dirname "$0")/.."

TARGETS="fuzz_gguf fuzz_model fuzz_safetensors fuzz_cartridge fuzz_tokenizer fuzz_http fuzz_request fuzz_template fuzz_json fuzz_kvspill fuzz_grammar fuzz_fleet fuzz_torchpt"
BUILD=build-fuzz

usage() {
    echo "usage: scripts/fuzz.sh TARGET|all SECONDS [libFuzzer args...]" >&2
    echo "targets: $TARGETS" >&2
    exit 2
}

[ $# -ge 2 ] || usage
what=$1
seconds=$2
shift 2
case $seconds in '' | *[!0-9]*) usage ;; esac

max_len() {
    case $1 in
    fuzz_gguf | fuzz_model) echo 16384 ;;
    fuzz_safetensors | fuzz_cartridge | fuzz_kvspill | fuzz_fleet | fuzz_torchpt) echo 8192 ;;
    fuzz_http | fuzz_request | fuzz_grammar) echo 4096 ;;
    *) echo 2048 ;;
    esac
}

build() {
    if ! grep -qs '^CART_FUZZ:BOOL=ON' "$BUILD/CMakeCache.txt"; then
        cmake -S . -B "$BUILD" -DCART_FUZZ=ON -DCMAKE_C_COMPILER="${CC:-clang}" \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCART_BUILD_HOST=OFF -DCART_BUILD_TESTS=OFF -DCART_MPI=OFF >/dev/null
    fi
    cmake --build "$BUILD" -j"${JOBS:-$(nproc)}" --target "$@" >"$BUILD/fuzz-build.log" 2>&1 || {
        tail -n 40 "$BUILD/fuzz-build.log" >&2
        echo "fuzz.sh: the build failed (full log: $BUILD/fuzz-build.log)" >&2
        exit 1
    }
}

# The value after "key" in the last line of $1 that has it.
last_field() {
    grep -Eo "$2 *[0-9]+" "$1" | tail -n 1 | grep -Eo '[0-9]+$' || echo 0
}

# run_one TARGET: runs it, prints its summary line; returns 1 on findings.
run_one() {
    t=$1
    shift
    work=$BUILD/fuzz/$t
    [ "${FUZZ_FRESH:-0}" = 1 ] && rm -rf "$work/corpus"
    mkdir -p "$work/corpus"
    rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*
    cp -p tests/fuzz/corpus/"$t"/* "$work/corpus/" 2>/dev/null || true
    log=$work/log
    set -- "$BUILD/tests/fuzz/$t" "$work/corpus" -dict="tests/fuzz/$t.dict" -max_len="$(max_len "$t")" \
        -max_total_time="$seconds" -timeout=25 -print_final_stats=1 -artifact_prefix="$work/" "$@"
    echo "fuzz.sh: $*" >"$log"
    started=$(date +%s)
    rc=0
    CART_ISA=${CART_ISA:-scalar} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} "$@" >>"$log" 2>&1 || rc=$?
    elapsed=$(( $(date +%s) - started ))
    if grep -q "^$t: SKIP" "$log"; then
        echo "$t: skipped ($(grep "^$t: SKIP" "$log" | sed "s/^$t: SKIP: //"))"
        return 0
    fi
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
    [ -n "$execs" ] || execs=$(grep -Eo '^#[0-9]+' "$log" | tail -n 1 | tr -d '#' || echo 0)
    [ -n "$execs" ] || execs=0
    rate=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
    [ -n "$rate" ] || rate=$(last_field "$log" 'exec/s:')
    findings=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
        -o -name 'oom-*' \) | wc -l)
    # stopped by SIGINT (libFuzzer's own exit status 72) with nothing found:
    # a shortened run, not a finding
    stopped=""
    if [ "$rc" -eq 72 ] && [ "$findings" -eq 0 ] && grep -q 'libFuzzer: run interrupted' "$log"; then
        rc=0 stopped=" (interrupted)"
    fi
    [ "$rc" -ne 0 ] && [ "$findings" -eq 0 ] && findings=1
    echo "$t: $execs execs in $elapsed s, $rate exec/s, cov $(last_field "$log" 'cov:') ft $(last_field "$log" 'ft:'), corpus $(last_field "$log" 'corp:'), findings $findings$stopped"
    if [ "$findings" -ne 0 ]; then
        echo "---- $t (exit status $rc); the end of $log:" >&2
        grep -v '^#[0-9]' "$log" | tail -n 60 >&2
        find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) \
            -exec echo "reproducer: {} (run: $BUILD/tests/fuzz/$t {})" \; >&2
        return 1
    fi
    return 0
}

case $what in
all) list=$TARGETS ;;
fuzz_*) list=$what ;;
*) list=fuzz_$what ;;
esac
for t in $list; do
    case " $TARGETS " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t'" >&2; usage ;; esac
done

# fuzz_tokenizer reads the real vocabularies in ../shared; without them, a
# byte-level BPE with learned merges that the project makes itself (the tiny
# reader's, recipes/pretrain.lua) when the main build is there
case " $list " in
*" fuzz_tokenizer "*)
    if [ -z "${CART_FUZZ_MODEL:-}" ] && [ ! -f ../shared/reference/qwen3-tiny-realvocab-f16.gguf ] \
        && [ -x build/cartridge ]; then
        mkdir -p "$BUILD/fuzz"
        if build/cartridge run recipes/pretrain.lua --preset tiny --steps 1 --eval 0 --save-every 0 --threads 1 \
            --out "$BUILD/fuzz/bpe-vocab.gguf" >"$BUILD/fuzz/bpe-vocab.log" 2>&1; then
            CART_FUZZ_MODEL=$BUILD/fuzz/bpe-vocab.gguf
            export CART_FUZZ_MODEL
            echo "fuzz.sh: ../shared is absent; fuzz_tokenizer reads the BPE vocabulary of $CART_FUZZ_MODEL"
        fi
    fi
    ;;
esac

# shellcheck disable=SC2086 # one argument per target
build $list
# FUZZ_JOBS targets at a time (default: nproc; libFuzzer uses one core per
# target), each summary printed in the order of the list once its batch ends
jobs=${FUZZ_JOBS:-$(nproc)}
case $jobs in '' | *[!0-9]* | 0) echo "fuzz.sh: FUZZ_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
failed=""
batch=""
flush() {
    wait
    for b in $batch; do
        cat "$BUILD/fuzz/$b/summary"
        if [ -s "$BUILD/fuzz/$b/findings" ]; then
            cat "$BUILD/fuzz/$b/findings" >&2
            failed="$failed $b"
        fi
    done
    batch=""
}
n=0
for t in $list; do
    mkdir -p "$BUILD/fuzz/$t"
    (run_one "$t" "$@" >"$BUILD/fuzz/$t/summary" 2>"$BUILD/fuzz/$t/findings" ||
        echo "$t: the run ended with findings or a non-zero status" >>"$BUILD/fuzz/$t/findings") &
    batch="$batch $t"
    n=$((n + 1))
    if [ $((n % jobs)) -eq 0 ]; then flush; fi
done
flush
if [ -n "$failed" ]; then
    echo "fuzz.sh: findings in:$failed" >&2
    exit 1
fi
