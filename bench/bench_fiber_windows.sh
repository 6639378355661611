#!/usr/bin/env bash
# bench_fiber on both Windows backends, cross-compiled with MinGW-w64 and run under wine,
# alternately, several rounds; prints each round's figures and the ratio of the medians
# (winfiber / asm-x86_64-win64) per row. Wine's figures are indicative only: its Win32
# fibers and its thread start are not Windows' (see BENCHMARKS.md).
#
# Usage: bench/bench_fiber_windows.sh [ROUNDS] [bench_fiber options...]   (default 5 rounds)
# Needs x86_64-w64-mingw32-g++-posix and wine64 (Debian: g++-mingw-w64-x86-64-posix, wine64).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds=${1:-5}
shift || true
cxx=$(command -v x86_64-w64-mingw32-g++-posix || command -v x86_64-w64-mingw32-g++ || true)
wine=$(command -v wine64 || true)
[ -n "${wine}" ] || { [ -x /usr/lib/wine/wine64 ] && wine=/usr/lib/wine/wine64; }
[ -n "${cxx}" ] && [ -n "${wine}" ] || { echo "needs x86_64-w64-mingw32-g++ and wine64" >&2; exit 2; }

out=${BENCH_WINDOWS_DIR:-$(mktemp -d /tmp/bench-fiber-windows.XXXXXX)}
mkdir -p "${out}"
export WINEPREFIX=${WINEPREFIX:-${out}/wineprefix} WINEDEBUG=-all
python3 amalgamate.py --output "${out}/include/fiber_sched.hpp" >/dev/null
for backend in asm winfiber; do
    defs=()
    [ "${backend}" = winfiber ] && defs=(-DFIBER_SCHED_USE_WINFIBER)
    "${cxx}" -std=c++17 -O2 -DNDEBUG "${defs[@]}" -I "${out}/include" -I bench bench/bench_fiber.cpp \
        -o "${out}/bench_fiber-${backend}.exe" -static
done

for ((round = 1; round <= rounds; ++round)); do
    for backend in asm winfiber; do
        echo "=== round ${round}, ${backend}"
        "${wine}" "${out}/bench_fiber-${backend}.exe" "$@" | tee "${out}/round-${round}-${backend}.txt"
    done
done

# Each row's median over the rounds (the table's second figure is a round's median), both
# backends side by side, and their ratio.
python3 - "${out}" "${rounds}" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for backend in ("asm", "winfiber"):
    for r in range(1, rounds + 1):
        group = ""
        for line in open(f"{out}/round-{r}-{backend}.txt", encoding="utf-8", errors="replace"):
            if not line.startswith(" ") and line.strip() and "|" not in line:
                group = line.strip()
            m = re.match(r"\s*(\S.*?)\s{2,}([0-9.]+)\s+([0-9.]+)", line)
            if m:
                rows.setdefault((group, m.group(1)), {}).setdefault(backend, []).append(float(m.group(3)))
print(f"\nmedians over {rounds} alternated rounds (ns; the median of each round's medians)")
print(f"{'case':60} {'asm-x86_64-win64':>17} {'winfiber':>10} {'winfiber/asm':>13}")
for (group, name), by in rows.items():
    if "asm" in by and "winfiber" in by:
        a, w = statistics.median(by["asm"]), statistics.median(by["winfiber"])
        print(f"{(group[:30] + ': ' + name)[:60]:60} {a:17.1f} {w:10.1f} {w / a:13.2f}")
PY
