#!/bin/sh
# render.sh — draws docs/diagrams/*.dot into the .svg files beside them (Graphviz `dot`;
# Debian: graphviz). `render.sh --check` draws them into a scratch directory instead and
# fails when a committed .svg is not what its .dot draws (the test docs.diagrams), or
# exits 77 (skipped) without `dot`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
command -v dot >/dev/null 2>&1 || { echo "render.sh: dot not found (Debian: graphviz)" >&2; exit 77; }
check=0
[ "${1:-}" = "--check" ] && check=1
out=$here
if [ $check -eq 1 ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
status=0
for src in "$here"/*.dot; do
    name=$(basename "$src" .dot)
    dot -Tsvg "$src" -o "$out/$name.svg"
    if [ $check -eq 1 ] && ! cmp -s "$out/$name.svg" "$here/$name.svg"; then
        echo "render.sh: docs/diagrams/$name.svg is not what $name.dot draws: run docs/diagrams/render.sh" >&2
        status=1
    fi
done
exit $status
