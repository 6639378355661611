#!/usr/bin/env bash
# tools/fiber_sched_gdb.py in a real gdb session: `info fibers` lists the parked fibers of
# tests/gdb/parked.cpp with their names and waits, `fiber bt ID` prints the backtrace of each
# through the function it parked in, and the program then runs on to its end (the registers
# were given back).
# Usage: check.sh GDB PROGRAM SCRIPT [LAUNCH...]
#   LAUNCH: for a cross build, the emulator and its gdb port (qemu-aarch64 -g PORT): the
#   program is started under it and gdb attaches with `target remote`.
set -uo pipefail
gdb_binary=$1 program=$2 script=$3
shift 3
bt_of='python gdb.execute("fiber bt %d" % int(gdb.parse_and_eval("gdb_%s_fiber" % "KIND")))'
commands=(-ex "set pagination off" -ex "set confirm off")
emulator_pid=
if [ $# -gt 0 ]; then
    port=${FSCHED_GDB_PORT:-23457}
    "$@" -g "${port}" "${program}" > /tmp/fsched-gdb-emulated.$$ 2>&1 &
    emulator_pid=$!
    sleep 1
    commands+=(-ex "target remote localhost:${port}")
    commands+=(-ex "break gdb_fibers_parked" -ex "continue")
else
    commands+=(-ex "break gdb_fibers_parked" -ex "run")
fi
commands+=(-ex "source ${script}" -ex "info fibers"
           -ex "${bt_of/KIND/channel}" -ex "${bt_of/KIND/mutex}"
           -ex "delete" -ex "continue")
out=$(timeout 300 "${gdb_binary}" -batch -nx "${commands[@]}" "${program}" 2>&1)
rc=$?
if [ -n "${emulator_pid}" ]; then
    wait "${emulator_pid}"
    out+=$'\n'$(cat /tmp/fsched-gdb-emulated.$$)
    rm -f /tmp/fsched-gdb-emulated.$$
fi
echo "${out}"
# A machine where gdb may not trace (a container without ptrace, a seccomp profile that
# refuses it) cannot run this check: say so and skip (ctest's SKIP_RETURN_CODE 77).
# It never reached the breakpoint, and gdb said why: that is the machine, not the script.
if ! grep -q 'gdb_fibers_parked ()' <<<"${out}" &&
   grep -qE 'ptrace|Operation not permitted|Cannot create process|Could not attach' <<<"${out}"; then
    echo "check.sh: gdb cannot trace a program on this machine (ptrace refused): skipped" >&2
    exit 77
fi
fail=0
expect() {
    if ! grep -qE -- "$1" <<<"${out}"; then
        echo "check.sh: expected /$1/ in the session" >&2
        fail=1
    fi
}
expect '^fiber [0-9]+ \(channel-reader\): parked on Channel receive 0x'
expect '^fiber [0-9]+ \(mutex-waiter\): parked on Mutex 0x'
expect '^fiber [0-9]+ \(holder\): parked on Channel receive'
expect '^3 live fibers'
expect ' in parked_on_channel \(ch=|parked_on_channel \(ch='
expect 'fsched::Channel<int>::receive'
expect 'parked_on_mutex \(m='
expect 'fsched::Mutex::lock_slow'
expect 'fsched::Fiber::entry'
# The program ran on to its end: gdb saw it exit with 0, and its last line was printed (gdb
# may write "[Thread ... exited]" around it, so not alone on its line).
expect 'exited normally\]'
expect 'done'
[ "${rc}" -eq 0 ] || { echo "check.sh: gdb exited with ${rc}" >&2; fail=1; }
exit "${fail}"
