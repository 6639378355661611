#!/bin/sh
# callgrind_per_op.sh — instructions per operation of one benchmark case, under callgrind.
#
#   bench/callgrind_per_op.sh <benchmark-exe> <filter> [N1 N2]
#   e.g. bench/callgrind_per_op.sh ./build/bench/bench_fiber 'round trip/fsched'
#
# Runs the case twice with fixed iteration counts (--iters N1, then N2; one repetition, no
# warm-up or calibration) and prints (Ir(N2) - Ir(N1)) / (N2 - N1): setup, teardown and
# program start cancel out, leaving the instructions executed per operation.
set -eu
exe=$1
filter=$2
n1=${3:-100000}
n2=${4:-200000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

instructions() {
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out.$1" \
        "$exe" --filter "$filter" --reps 1 --iters "$1" >/dev/null 2>"$tmp/log.$1" || {
        cat "$tmp/log.$1" >&2
        exit 1
    }
    # The totals line of callgrind's output: "summary: <Ir>" (older) or "totals: <Ir>".
    sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$tmp/out.$1" | head -n 1
}

ir1=$(instructions "$n1")
ir2=$(instructions "$n2")
per_op=$(awk "BEGIN { printf \"%.1f\", ($ir2 - $ir1) / ($n2 - $n1) }")
echo "$filter: Ir($n1) = $ir1, Ir($n2) = $ir2, instructions per op = $per_op"
