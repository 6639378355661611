// ---------------------------------------------------------------------------
// Seeing inside: the report of every live fiber (fiber_report, dump_fibers), printed on a
// signal (install_fiber_dump_handler), when stop() hangs, and on a lock-order deadlock.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

#if defined(_WIN32)
#define FIBER_SCHED_DUMP_SIGNAL SIGBREAK  // Ctrl+Break in a console
#else
#define FIBER_SCHED_DUMP_SIGNAL SIGQUIT   // Ctrl+\ in a terminal, kill -QUIT
#endif

namespace fsched {

// Every live fiber, one line each, oldest first: its id, name, state (running, runnable
// after a yield, parked, suspended by Fiber::yield, ready), and for a parked one what it
// waits for (the primitive's word, its address and what it holds now: a Mutex's owner, a
// Channel's length and capacity, a WaitGroup's count, a sleep's or timed wait's time left,
// an io wait's fd and direction), for how long, on which worker of which scheduler it last
// ran, and its stack's size and the bytes of it touched (resident pages; a pooled stack
// also counts what the fibers before it touched). Finished fibers that are still around
// (kept for reuse, or not yet destroyed) are counted, not listed. Each parked fiber's
// backtrace follows its line: it is read from the context it saved, by following frame
// pointers, so build with -fno-omit-frame-pointer (frames of code built without them, and
// of foreign code, end it early or are missing), and link with -rdynamic for function
// names (else each frame shows its module and the address `addr2line -f -C -e MODULE`
// takes). Then each lock-order deadlock among the fibers, if any.
// From any thread, at any time, while schedulers run: a fiber woken meanwhile waits until
// the report has read it (microseconds), and a fiber destroyed meanwhile until the report
// has read every fiber; no fiber is disturbed otherwise. Not from a signal handler.
std::string fiber_report();
// fiber_report() written to `out`.
void dump_fibers(std::FILE* out = stderr);
// Prints the report to stderr each time the process gets `signo` (SIGQUIT by default;
// SIGBREAK on Windows), and the program goes on: the handler only writes a byte to a pipe,
// and a thread of its own ("fsched-dump") makes and prints the report. Replaces that
// signal's handler; calling it again for the same signal does nothing. Throws
// std::system_error when the pipe, the thread or the handler cannot be set up.
void install_fiber_dump_handler(int signo = FIBER_SCHED_DUMP_SIGNAL);

namespace detail {
// Where the automatic reports (lock-order deadlocks, hung stop()s) go; default: stderr.
// For tests; an empty function restores stderr.
void set_report_sink(std::function<void(const std::string&)> sink);
// How often the watch thread looks, and how long each fiber of a lock cycle must have
// waited before the cycle is reported (defaults: 1 s and 1 s). For tests.
void set_watch_timing(std::chrono::milliseconds period, std::chrono::milliseconds deadlock_after);
// Ends the watch thread, if one runs, and returns once it has ended; the next Mutex wait or
// hang-reporting stop() starts another. For tests that fork under emulators or count threads.
void quiesce_watch() noexcept;
// Reports the dump handler's thread has printed (tests).
std::uint64_t dump_handler_reports() noexcept;
}  // namespace detail
}  // namespace fsched
