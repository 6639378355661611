#!/bin/bash
# bench_http_perf.sh — server CPU and system calls per request under wrk, for two builds of
# bench_http and the Go twin, alternated round by round (BENCHMARKS.md, "HTTP keep-alive
# under wrk"). Each server runs alone, pinned to CPU 0; wrk (-t1 -c100) is pinned to CPU 1:
# a 1 s warm-up, then `perf stat -p` over a 4 s run.
#
# Usage: bench/bench_http_perf.sh ROUNDS BEFORE_BENCH_HTTP AFTER_BENCH_HTTP [GO_TWINS]
# Needs wrk, perf (the raw_syscalls and syscalls tracepoints), taskset, python3.
set -u
rounds=$1
before=$2
after=$3
go_twins=${4:-}
port=${PORT:-18431}

serve() {  # prints the server's pid
    case $1 in
    before) taskset -c 0 "$before" --serve fsched --port "$port" >/dev/null 2>&1 & ;;
    after) taskset -c 0 "$after" --serve fsched --port "$port" >/dev/null 2>&1 & ;;
    go)  # the Go twin takes its listening socket as fd 3
        python3 - "$port" "$go_twins" >/dev/null 2>&1 <<'PY' &
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1024)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.execvp("taskset", ["taskset", "-c", "0", sys.argv[2], "http", "-procs", "1"])
PY
        ;;
    esac
    echo $!
}

sides="before after"
[ -n "$go_twins" ] && sides="$sides go"
stat=$(mktemp)
for r in $(seq 1 "$rounds"); do
    for side in $sides; do
        pid=$(serve "$side")
        for _ in $(seq 50); do
            (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
            sleep 0.1
        done
        taskset -c 1 wrk -t1 -c100 -d1s "http://127.0.0.1:$port/" >/dev/null 2>&1
        perf stat -x, -e task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_newfstatat -p "$pid" -o "$stat" &
        perf_pid=$!
        sleep 0.1
        out=$(taskset -c 1 wrk -t1 -c100 -d4s "http://127.0.0.1:$port/" 2>&1)
        kill -INT "$perf_pid"
        wait "$perf_pid" 2>/dev/null
        kill "$pid"
        wait "$pid" 2>/dev/null
        requests=$(echo "$out" | awk '/requests in/ {print $1}')
        rate=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
        cpu_ms=$(awk -F, '/task-clock/ {print $1}' "$stat")
        calls=$(awk -F, '/raw_syscalls/ {print $1}' "$stat")
        fstats=$(awk -F, '/newfstatat/ {print $1}' "$stat")
        python3 -c "print('round %d %-6s req/s %9s  cpu us/req %6.2f  syscalls/req %5.2f  fstat/req %5.2f' % \
            ($r, '$side', '$rate', $cpu_ms * 1000 / $requests, $calls / $requests, $fstats / $requests))"
    done
done
rm -f "$stat"
