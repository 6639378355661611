#!/usr/bin/env bash
# The ctest trace-view: records a trace with examples/trace.cpp's program (a producer, two
# consumers and a ticker on two workers) and opens it in speedscope with shoot.sh, which
# exits 77 (skipped) where Chromium or speedscope is missing.
# Usage: tests/trace_view/run.sh RECORDER OUT_DIR   (writes OUT_DIR/trace.json and trace.png)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
recorder=$1
out=$2
mkdir -p "${out}"
"${recorder}" "${out}/trace.json"
exec "${here}/shoot.sh" "${out}/trace.json" "${out}/trace.png"
