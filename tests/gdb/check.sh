#!/usr/bin/env bash
# tools/fiber_sched_gdb.py in a real gdb session: `info fibers` lists the parked fibers of
# tests/gdb/parked.cpp with their names and waits, `fiber bt ID` prints the backtrace of each
# through the function it parked in, and the program then runs on to its end (the registers
# were given back). gdb detaches before the program goes on: a gdb still tracing while the
# program's threads exit can fail with "Couldn't get registers: No such process" (its own
# race, seen on a loaded machine), so the program's end is its "done" line, printed once its
# fibers were woken and its scheduler stopped, and under an emulator also its exit status.
# Usage: check.sh GDB PROGRAM SCRIPT [LAUNCH...]
#   LAUNCH: for a cross build, the emulator and its gdb port (qemu-aarch64 -g PORT): the
#   program is started under it and gdb attaches with `target remote`.
set -uo pipefail
gdb_binary=$1 program=$2 script=$3
shift 3
bt_of='python gdb.execute("fiber bt %d" % int(gdb.parse_and_eval("gdb_%s_fiber" % "KIND")))'
commands=(-ex "set pagination off" -ex "set confirm off")
# The program's own output goes to a file of its own, apart from gdb's messages.
program_out=$(mktemp)
trap 'rm -f "${program_out}"' EXIT
emulator_pid=
if [ $# -gt 0 ]; then
    port=${FSCHED_GDB_PORT:-23457}
    "$@" -g "${port}" "${program}" > "${program_out}" 2>&1 &
    emulator_pid=$!
    sleep 1
    commands+=(-ex "target remote localhost:${port}")
    commands+=(-ex "break gdb_fibers_parked" -ex "continue")
else
    commands+=(-ex "break gdb_fibers_parked" -ex "run > ${program_out} 2>&1")
fi
commands+=(-ex "source ${script}" -ex "info fibers"
           -ex "${bt_of/KIND/channel}" -ex "${bt_of/KIND/mutex}"
           -ex "delete" -ex 'python print("check.sh: inferior pid %d" % gdb.selected_inferior().pid)'
           -ex "detach")
out=$(timeout 300 "${gdb_binary}" -batch -nx "${commands[@]}" "${program}" 2>&1)
rc=$?
emulator_rc=0
if [ -n "${emulator_pid}" ]; then
    wait "${emulator_pid}"
    emulator_rc=$?
else
    # The detached program is not this shell's child: wait for it to be gone (at most 300 s).
    pid=$(sed -n 's/^check.sh: inferior pid \([0-9][0-9]*\)$/\1/p' <<<"${out}")
    for _ in $(seq 3000); do
        [ -n "${pid}" ] && kill -0 "${pid}" 2>/dev/null || break
        sleep 0.1
    done
fi
out+=$'\n'$(cat "${program_out}")
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
# gdb let the program go, and the program ran on to its end: its last line was printed.
expect '\[Inferior 1 \(.*\) detached\]'
expect '^done$'
[ "${rc}" -eq 0 ] || { echo "check.sh: gdb exited with ${rc}" >&2; fail=1; }
[ "${emulator_rc}" -eq 0 ] || { echo "check.sh: the emulated program exited with ${emulator_rc}" >&2; fail=1; }
# What the session ended with, where the failure digest shows it.
[ "${fail}" -eq 0 ] || { echo "check.sh: the session's last lines:" >&2; tail -n 8 <<<"${out}" | cut -c1-200 >&2; }
exit "${fail}"
