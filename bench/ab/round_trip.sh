#!/usr/bin/env bash
# A/B of the resume + yield round trip in one process, beside Boost.Context (see
# round_trip_driver.cpp): the header of each git commit given, then the working tree's, then
# the working tree's once more for each set of definitions after `--`; three runs. x86-64
# System V only (it renames the switch routine's symbols); needs libboost-context-dev.
# Usage: bench/ab/round_trip.sh [COMMIT...] [-- 'DEFINES'...]
#   bench/ab/round_trip.sh HEAD~1 -- '-DFIBER_SCHED_SWITCH_FP_CONTROL=0'
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
cxx=${CXX:-g++}
objects=()
unit() {  # unit NAME HEADER_DIR [DEFINES...]: one build, its symbols renamed apart
    local name=$1 dir=$2 id=b${#objects[@]}
    shift 2
    # shellcheck disable=SC2068  # the definitions are split on purpose
    "${cxx}" -std=c++17 -O2 -DNDEBUG -pthread -DAB_NAME="\"${name}\"" -Dfsched="fsched_${id}" -I"${dir}" $@ \
        -c "${here}/round_trip_unit.cpp" -o "${work}/${id}.o"
    objcopy --redefine-sym "fsched_switch_context=fsched_switch_context_${id}" \
            --redefine-sym "fsched_switch_context_fp=fsched_switch_context_fp_${id}" \
            --redefine-sym "fsched_trampoline_x86_64_sysv=fsched_trampoline_${id}" "${work}/${id}.o"
    objects+=("${work}/${id}.o")
}
commits=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do commits+=("$1"); shift; done
[ $# -gt 0 ] && shift
for commit in "${commits[@]}"; do
    mkdir -p "${work}/${commit}"
    git -C "${root}" show "${commit}:fiber_sched.hpp" > "${work}/${commit}/fiber_sched.hpp"
    unit "${commit}" "${work}/${commit}"
done
unit "working tree" "${root}"
for defines in "$@"; do unit "working tree ${defines}" "${root}" "${defines}"; done
"${cxx}" -std=c++17 -O2 -c "${here}/round_trip_boost.cpp" -o "${work}/boost.o"
"${cxx}" -std=c++17 -O2 "${here}/round_trip_driver.cpp" "${work}/boost.o" "${objects[@]}" -o "${work}/driver" \
    -lboost_context -pthread
for run in 1 2 3; do "${work}/driver"; done
