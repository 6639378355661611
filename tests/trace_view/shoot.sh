#!/usr/bin/env bash
# Opens a trace in speedscope's web app with headless Chromium and saves a screenshot.
# Usage: tests/trace_view/shoot.sh TRACE.json OUT.png [WIDTHxHEIGHT]   (default 1200x700)
# Installs nothing. Needs python3, Chromium (chromium, chromium-browser or google-chrome;
# or $CHROMIUM) and the npm package speedscope, whose static web app
# (node_modules/speedscope/dist/release) it finds at $SPEEDSCOPE_DIR, under
# $SPEEDSCOPE_NODE_MODULES, the current directory's node_modules or npm's global root.
# Without one of them it says which and exits 77 (ctest's SKIP_RETURN_CODE).
# How: the app and the trace are served from a scratch directory on 127.0.0.1 (serve.py),
# and the page is opened at index.html#profileURL=<the trace>, which speedscope loads.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
trace=$1
out=$2
size=${3:-1200x700}
[ -f "${trace}" ] || { echo "shoot.sh: no trace at ${trace}" >&2; exit 2; }

browser=${CHROMIUM:-}
if [ -z "${browser}" ]; then
    for candidate in chromium chromium-browser google-chrome; do
        if command -v "${candidate}" >/dev/null 2>&1; then browser=${candidate}; break; fi
    done
fi
if [ -z "${browser}" ]; then echo "shoot.sh: skipped: no chromium (set CHROMIUM)"; exit 77; fi
command -v python3 >/dev/null 2>&1 || { echo "shoot.sh: skipped: no python3"; exit 77; }

app=${SPEEDSCOPE_DIR:-}
if [ -z "${app}" ]; then
    roots=("${SPEEDSCOPE_NODE_MODULES:-}" "${PWD}/node_modules")
    if command -v npm >/dev/null 2>&1; then roots+=("$(npm root -g 2>/dev/null || true)"); fi
    for root in "${roots[@]}"; do
        if [ -n "${root}" ] && [ -f "${root}/speedscope/dist/release/index.html" ]; then
            app="${root}/speedscope/dist/release"
            break
        fi
    done
fi
if [ -z "${app}" ] || [ ! -f "${app}/index.html" ]; then
    echo "shoot.sh: skipped: no speedscope web app (npm install speedscope; set SPEEDSCOPE_DIR or SPEEDSCOPE_NODE_MODULES)"
    exit 77
fi

scratch=$(mktemp -d)
server=""
cleanup() {
    if [ -n "${server}" ]; then kill "${server}" 2>/dev/null || true; wait "${server}" 2>/dev/null || true; fi
    rm -rf "${scratch}"
}
trap cleanup EXIT
mkdir "${scratch}/site" "${scratch}/profile"
cp -R "${app}/." "${scratch}/site/"
cp "${trace}" "${scratch}/site/trace.json"
python3 "${here}/serve.py" "${scratch}/site" "${scratch}/port" &
server=$!
for _ in $(seq 100); do [ -s "${scratch}/port" ] && break; sleep 0.1; done
[ -s "${scratch}/port" ] || { echo "shoot.sh: the local server did not start" >&2; exit 1; }
port=$(cat "${scratch}/port")
url="http://127.0.0.1:${port}/index.html#profileURL=http://127.0.0.1:${port}/trace.json"

# --no-sandbox: Chromium refuses to run as root without it (containers, CI). speedscope
# draws with WebGL: SwiftShader gives headless Chromium one without a GPU.
# --virtual-time-budget: the page has fetched and drawn the trace before the screenshot.
flags=(--headless --disable-gpu --use-angle=swiftshader --enable-unsafe-swiftshader --hide-scrollbars
       --user-data-dir="${scratch}/profile" --window-size="${size/x/,}" --virtual-time-budget=10000)
[ "$(id -u)" = 0 ] && flags+=(--no-sandbox)
rm -f "${out}"
timeout 60 "${browser}" "${flags[@]}" --screenshot="$(cd "$(dirname "${out}")" && pwd)/$(basename "${out}")" \
    "${url}" >"${scratch}/browser.log" 2>&1 || true
if [ ! -s "${out}" ]; then
    echo "shoot.sh: no screenshot written; the browser said:" >&2
    tail -20 "${scratch}/browser.log" >&2
    exit 1
fi
# The same page's DOM: speedscope shows its error page when it cannot import or draw.
timeout 60 "${browser}" "${flags[@]}" --dump-dom "${url}" >"${scratch}/dom.html" 2>"${scratch}/browser.log" || true
if grep -q "Something went wrong" "${scratch}/dom.html"; then
    echo "shoot.sh: speedscope could not show ${trace} (its error page is in ${out})" >&2
    exit 1
fi
if ! grep -q "<canvas" "${scratch}/dom.html"; then
    echo "shoot.sh: speedscope drew nothing for ${trace} (see ${out})" >&2
    exit 1
fi
echo "shoot.sh: ${out} (${size}) of ${trace}"
