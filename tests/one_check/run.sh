#!/usr/bin/env bash
# tests/one builds one test file: every test case the executable it builds lists is one of
# that file's or of global_scheduler.cpp (built into every test executable), as doctest's
# --list-test-cases says, and that file has at least one there.
# Usage: run.sh <build directory>
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export FIBER_SCHED_ONE_BUILD_DIR="$1"
listed=$("${here}/../one" test_context asm-O2 --list-test-cases --no-version 2>&1 |
         sed -n '/^=\{20,\}$/,/^=\{20,\}$/p' | grep -v '^=' || true)
count=$(printf '%s\n' "${listed}" | grep -c . || true)
if [ "${count}" -eq 0 ]; then
    echo "tests/one test_context listed no test case" >&2
    exit 1
fi
while IFS= read -r name; do
    [ -z "${name}" ] && continue
    if grep -qF "\"${name}\"" "${here}/../test_context.cpp"; then
        ours=$((${ours:-0} + 1))
    elif ! grep -qF "\"${name}\"" "${here}/../global_scheduler.cpp"; then
        echo "tests/one test_context built a case from another file: ${name}" >&2
        exit 1
    fi
done <<<"${listed}"
if [ "${ours:-0}" -eq 0 ]; then
    echo "tests/one test_context built none of test_context.cpp's cases" >&2
    exit 1
fi
echo "tests/one test_context: ${count} test cases, ${ours} of them test_context.cpp's, the rest global_scheduler.cpp's"
