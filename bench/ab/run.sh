#!/usr/bin/env bash
# A/B of fiber_sched builds in one process (see driver.cpp): the header of each git commit
# given, then the working tree's; four runs.
# Usage: bench/ab/run.sh [COMMIT...]      e.g. bench/ab/run.sh e4ef1a5
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
cxx=${CXX:-g++}
libs=()
build() {  # build NAME HEADER_DIR
    "${cxx}" -std=c++17 -O2 -DNDEBUG -fPIC -shared -pthread -I"$2" "${here}/create_lib.cpp" -o "${work}/$1.so"
    libs+=("${work}/$1.so")
}
for commit in "$@"; do
    mkdir -p "${work}/${commit}"
    git -C "${root}" show "${commit}:fiber_sched.hpp" > "${work}/${commit}/fiber_sched.hpp"
    build "${commit}" "${work}/${commit}"
done
build "working-tree" "${root}"
"${cxx}" -std=c++17 -O2 "${here}/driver.cpp" -o "${work}/driver" -ldl
for run in 1 2 3 4; do "${work}/driver" "${libs[@]}"; done
