#!/usr/bin/python3
"""Draw BENCHMARKS.md's chart from the benchmarks' own output.

    python3 bench/chart.py            read bench/results/*.txt, write docs/benchmarks.svg
    python3 bench/chart.py --table    also print the headline table as Markdown rows
    python3 bench/chart.py --results DIR --output FILE.svg
    python3 bench/chart.py --check    fail unless docs/benchmarks.svg is what the results draw
                                      (the test docs.chart; exit 77, skipped, without matplotlib)

bench/run_all.sh runs every benchmark and keeps its output in bench/results/; this reads
the tables those outputs print (every benchmark prints bench_util.hpp's TextTable: a title,
a header, a rule, then rows), takes the headline rows of HEADLINES below, and draws one bar
per headline: fiber_sched's figure over the peer's, from the same run, on a log scale
(below 1: fiber_sched is faster or smaller). A headline whose benchmark did not run, or whose
rows are missing (no Go, no Boost), is left out and said on stderr. Needs matplotlib
(Debian: python3-matplotlib).
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUTPUT = ROOT / "docs" / "benchmarks.svg"

# (label, results file, group title contains, our row contains, peer row contains, column,
#  peer's name for the legend). The ratio is our cell over the peer's, in that column.
HEADLINES = [
    ("resume + yield round trip", "bench_fiber", "round trip", "fsched::Fiber", "boost::context::fiber",
     "min ns/op", "Boost"),
    ("create + run + destroy", "bench_fiber", "create + run", "fsched::Fiber", "boost pooled_fixedsize",
     "min ns/op", "Boost"),
    # spawn is a rate (M tasks/s): the ratio is inverted below, so that < 1 is faster here too.
    ("spawn 1M tasks, 2 workers (time: rate inverted)", "bench_scheduler", "spawn", "fsched, from a task", "Go,",
     "best M/s", "Go"),
    ("skynet 1M, 2 workers", "bench_scheduler", "skynet", "fsched,", "Go,", "best ms", "Go"),
    ("yield, two fibers, 1 worker", "bench_scheduler", "yield", "fsched", "Boost.Fiber", "best ns", "Boost"),
    ("yield, two fibers, 1 worker", "bench_scheduler", "yield", "fsched", "Go", "best ns", "Go"),
    ("channel ping-pong, 2 workers", "bench_sync", "channel ping-pong, unbuffered, 2 threads", "fsched::", "Go",
     "min ns/op", "Go"),
    ("channel ping-pong, 2 workers", "bench_sync", "channel ping-pong, unbuffered, 2 threads", "fsched::", "boost",
     "min ns/op", "Boost"),
    ("Mutex, uncontended", "bench_sync", "mutex, 4 fibers, 1 thread (uncontended)", "fsched::", "boost",
     "min ns/op", "Boost"),
    ("Semaphore hand-off, 2 workers", "bench_toolbox", "semaphore hand-off, 2 threads", "fsched::", "boost",
     "min ns/op", "Boost"),
    ("async(fn).get(), 1 worker", "bench_toolbox", "future round trip, 1 thread", "fsched::", "boost",
     "min ns/op", "Boost"),
    ("select over two channels, 2 workers", "bench_toolbox", "select over two channels, 2 threads", "fsched::",
     "Go", "min ns/op", "Go"),
    ("parallel_for, 1.5 us items, 2 workers", "bench_toolbox", "heavy items", "fsched::", "tbb::", "min ns/op",
     "TBB"),
    ("sleep_for(100us) lateness p99, idle", "bench_latency", "lateness, idle", "fiber_sched", "Go", "p99 us", "Go"),
    ("sleep_for(100us) lateness p99, idle", "bench_latency", "lateness, idle", "fiber_sched", "std::this_thread",
     "p99 us", "std::thread"),
    ("sleep_for(100us) lateness p99, idle, timer_spin 50us", "bench_latency", "lateness, idle",
     "fiber_sched sleep_for, timer_spin", "std::this_thread", "p99 us", "std::thread"),
    ("schedule() from outside p99, ping-pong", "bench_latency", "1 worker beside a Channel", "fiber_sched",
     "std::thread pool", "p99 us", "std::thread"),
    ("HTTP CPU per request, 100 conns", "bench_http_100", "requests/s", "fsched", "Go, goroutine", "median cpu",
     "Go"),
    ("HTTP CPU per request, 1000 conns", "bench_http_1000", "requests/s", "fsched", "Go, goroutine", "median cpu",
     "Go"),
    ("echo server CPU per round trip, 100 conns", "bench_io", "per round trip", "fsched, fiber", "Go,",
     "server us", "Go"),
    ("echo server CPU per round trip, 100 conns", "bench_io", "per round trip", "fsched, fiber",
     "thread per connection", "server us", "std::thread"),
    ("game frame p50, 2 workers", "bench_frame", "small jobs", "fiber_sched", "std::thread pool", "p50 ms",
     "std::thread"),
    ("game frame p50, 2 workers", "bench_frame", "small jobs", "fiber_sched", "Boost.Fiber", "p50 ms", "Boost"),
]
# Columns that are rates (higher is better): their ratio is peer / ours.
RATES = {"best M/s", "best req/s", "median req/s"}

NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$")


def parse_tables(text):
    """{group title: {row name: {column: cell}}} of every TextTable in `text`."""
    lines = text.splitlines()
    groups = {}
    for i in range(1, len(lines) - 2):
        header, rule = lines[i], lines[i + 1]
        if not header.startswith("  implementation") or not rule.strip().startswith("---"):
            continue
        title = lines[i - 1].strip()
        # The header's labels are right-aligned at their columns' ends; the first column
        # (the implementation) is as wide as the space before the first label.
        labels = [(m.group(0), m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", header)][1:]
        if not labels:
            continue
        # A name is left-aligned, a cell right-aligned: the names end before the first label's
        # two separating spaces, and each cell ends where its column's label ends.
        name_end = labels[0][1] - 2
        columns = []
        start = name_end
        for label, _, end in labels:
            columns.append((label, start, end))
            start = end
        rows = {}
        for row in lines[i + 2:]:
            if not row.startswith("  ") or not row.strip():
                break
            name = row[2:name_end].strip()
            if not name:
                break
            cells = {label: row[a:b].strip() for label, a, b in columns}
            rows[name] = cells
        groups[title] = rows
    return groups


def find(groups, title_part, row_part, column):
    for title, rows in groups.items():
        if title_part not in title:
            continue
        for name, cells in rows.items():
            if name.startswith(row_part):
                cell = cells.get(column, "")
                if NUMBER.match(cell):
                    return float(cell)
    return None


def headlines():
    found = []
    parsed = {}
    for label, source, title, ours, peer, column, peer_name in HEADLINES:
        path = RESULTS / f"{source}.txt"
        if source not in parsed:
            parsed[source] = parse_tables(path.read_text(encoding="utf-8")) if path.exists() else None
        groups = parsed[source]
        if groups is None:
            print(f"chart.py: no {path}: '{label}' left out", file=sys.stderr)
            continue
        a, b = find(groups, title, ours, column), find(groups, title, peer, column)
        if a is None or b is None or a == 0 or b == 0:
            print(f"chart.py: {source}: no '{ours}' or '{peer}' row with '{column}' under '{title}': "
                  f"'{label}' vs {peer_name} left out", file=sys.stderr)
            continue
        found.append((label, peer_name, a, b, b / a if column in RATES else a / b))
    return found


def draw(rows):
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "fiber_sched"  # the same drawing for the same figures
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    colours = {"Boost": "#4c72b0", "Go": "#55a868", "std::thread": "#c44e52", "TBB": "#8172b2"}
    labels = [f"{label}  vs {peer}" for label, peer, _, _, _ in rows]
    ratios = [r for *_, r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.34 * len(rows) + 1.2))
    y = list(range(len(rows)))[::-1]
    ax.barh(y, ratios, color=[colours.get(peer, "#777777") for _, peer, *_ in rows], height=0.6)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("fiber_sched / peer, same run (log scale; < 1: fiber_sched is faster)", fontsize=8)
    for yi, r in zip(y, ratios):
        ax.text(r * (1.04 if r >= 1 else 0.96), yi, f"{r:.2f}×", va="center", ha="left" if r >= 1 else "right",
                fontsize=7)
    lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
    ax.set_xlim(lo / 2.2, hi * 2.2)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUTPUT, format="svg", metadata={"Date": None})
    plt.close(fig)


def main():
    global RESULTS, OUTPUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the headlines as Markdown rows")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="the outputs' directory")
    parser.add_argument("--output", type=pathlib.Path, default=OUTPUT, help="the SVG to write")
    parser.add_argument("--check", action="store_true",
                        help="draw into a scratch file and fail unless it is the --output file")
    args = parser.parse_args()
    RESULTS, OUTPUT = args.results.resolve(), args.output.resolve()
    rows = headlines()
    if not rows:
        raise SystemExit("chart.py: no headline found in bench/results/ (run bench/run_all.sh)")
    if args.check:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("chart.py: matplotlib not found (Debian: python3-matplotlib): check skipped", file=sys.stderr)
            sys.exit(77)
        import tempfile
        committed = OUTPUT
        with tempfile.TemporaryDirectory() as scratch:
            OUTPUT = pathlib.Path(scratch) / "benchmarks.svg"
            draw(rows)
            drawn = OUTPUT.read_bytes()
        if not committed.exists() or committed.read_bytes() != drawn:
            raise SystemExit(f"chart.py: {committed} is not what bench/results/ draws: run bench/chart.py")
        print(f"{committed} is what bench/results/ draws ({len(rows)} bars)")
        return
    draw(rows)
    print(f"wrote {OUTPUT} ({len(rows)} bars)")
    if args.table:
        for label, peer, a, b, r in rows:
            print(f"| {label} | {a:g} | {peer}: {b:g} | {r:.2f}× |")


if __name__ == "__main__":
    main()
