#!/bin/bash
# run_all.sh — runs every headline benchmark once, each alone, and keeps its output in
# bench/results/<name>.txt, the files bench/chart.py draws BENCHMARKS.md's chart from.
#
#   bench/run_all.sh [BUILD_DIR [RESULTS_DIR]]
#
# BUILD_DIR: default build-bench, configured and built here (Release). RESULTS_DIR: default
# bench/results, whose run the chart is drawn from; another (a second host's run) gets the
# outputs and machine.txt only.
# Takes about 15 minutes on 2 cores. Run it on a quiet machine: the figures are the page's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"${root}/build-bench"}
results=${2:-"${root}/bench/results"}
cmake -S "${root}" -B "${build}" -DCMAKE_BUILD_TYPE=Release -DFIBER_SCHED_BUILD_TESTS=OFF \
      -DFIBER_SCHED_BUILD_EXAMPLES=OFF -DFIBER_SCHED_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "${build}" -j2 --target bench_fiber bench_scheduler bench_sync bench_toolbox bench_latency \
      bench_frame bench_http bench_io >/dev/null
mkdir -p "${results}"
run() {  # name, then the command line
    local name=$1
    shift
    echo "== ${name}: $*" >&2
    "$@" >"${results}/${name}.txt.part" 2>&1
    mv "${results}/${name}.txt.part" "${results}/${name}.txt"
}
run bench_fiber "${build}/bench/bench_fiber"
run bench_scheduler "${build}/bench/bench_scheduler"
run bench_sync "${build}/bench/bench_sync"
run bench_toolbox "${build}/bench/bench_toolbox"
run bench_latency "${build}/bench/bench_latency"
run bench_frame "${build}/bench/bench_frame"
run bench_http_100 "${build}/bench/bench_http" --reps 5 --connections 100
run bench_http_1000 "${build}/bench/bench_http" --reps 5 --connections 1000
run bench_io "${build}/bench/bench_io"
{
    echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores; $(uname -sr)"
    echo "compiler: $(c++ --version | head -n 1)"
    echo "header: $(md5sum "${root}/fiber_sched.hpp" | cut -c1-12)"
} >"${results}/machine.txt"
if [ "$(cd "${results}" && pwd)" = "${root}/bench/results" ]; then
    /usr/bin/python3 "${root}/bench/chart.py"  # Debian's, where python3-matplotlib is
fi
