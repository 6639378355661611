// ---------------------------------------------------------------------------
// Implementation: the OS interface.
//
// What the library asks of the operating system, besides the context switch (context_*)
// and the scheduler's idle wait: stack memory, the fault handler, thread names and CPU
// pinning, fork.
// One file per OS defines these functions (impl/os_posix.ipp; a Windows port adds
// impl/os_win32.ipp), chosen once in fiber_sched.hpp; the stack pool (stack.ipp) and the
// overflow report (stack_overflow.ipp) above them are the same on every OS. cpu_relax(),
// the pause in spin loops, is an instruction, not a system call: it stays in config.hpp,
// where the public inline SpinLock needs it.
//
// Memory comes as four primitives: map a slab, map a guarded stack, unmap, discard (mmap /
// VirtualAlloc reserve+commit; mmap+mprotect / VirtualAlloc reserve, commit the top;
// munmap / VirtualFree; madvise / MEM_RESET), and the policy (slabs past the budget, when
// pages go back) is written once, in stack.ipp, where the tests of fork, RLIMIT_AS and the
// budget exercise it. A guarded stack is one primitive because Windows grows it itself.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {
namespace detail {

// The portable half of the fault handler, in stack_overflow.ipp; the OS's handler calls it
// first. When `fault_address` lies in the guard page of the fiber running on this thread,
// writes which fiber overflowed and aborts; otherwise returns. Async-signal-safe.
void report_if_stack_overflow(const void* fault_address) noexcept;

namespace os {

// The size of a memory page in bytes, the unit of every range below.
std::size_t page_size() noexcept;
// How many stacks may get a guard page before what a guard costs the OS runs short (Linux:
// mappings); the stack pool carves the rest without one. Called once.
std::size_t guarded_stack_budget() noexcept;

// Bytes of guard below each guarded stack, whole pages: one page on POSIX, where the fault
// handler runs on an alternate stack; more on Windows, where it runs on the faulting one.
std::size_t guard_size() noexcept;

// Maps `bytes` (whole pages) of private read/write memory whose pages are committed when
// first touched; nullptr when the OS refuses (address space, RLIMIT_AS, mapping count).
void* map_stack_memory(std::size_t bytes) noexcept;
// Maps a guarded stack: `bytes` (whole pages) whose lowest `guard` (guard_size()) bytes are
// the guard, a touch of whose top faults; nullptr when the OS refuses the memory or the
// guard (the budget is an estimate). POSIX: map_stack_memory() with its bottom no-access.
// Windows: a reservation whose top page alone is committed, a PAGE_GUARD page below it, and
// the rest committed as the stack grows (os_win32.ipp).
void* map_guarded_stack(std::size_t bytes, std::size_t guard) noexcept;
// Unmaps [base, base + bytes), exactly a range one map_stack_memory() call returned (Windows
// releases only whole reservations).
void unmap_memory(void* base, std::size_t bytes) noexcept;
// Gives the pages of [lo, lo + bytes), whole pages inside one mapping, back to the OS and
// keeps the range mapped; its contents are dead (they may read as zero or as before).
void discard_memory(void* lo, std::size_t bytes) noexcept;

// Has prepare() run before each fork() and parent() / child() after it, in the process
// each names; nothing where there is no fork. Errors (out of memory) are ignored.
void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept;

// Names the calling thread "<base>-<index>" for debuggers and top; where the OS limits the
// length (Linux: 15 characters) base is cut to make room for the index (whole below 1000
// workers).
void name_thread(const std::string& base, int index) noexcept;

// One past the highest CPU index a thread may be pinned to here (pin_thread_to_cpu), at
// least 1: Linux, the highest CPU in the process's affinity mask, plus one; Windows, the
// processors of group 0 (at most 64); elsewhere, the CPUs online.
int cpu_limit() noexcept;
// Pins the calling thread to CPU `cpu` (0 .. cpu_limit() - 1). False, with the reason in
// `error`, when the OS refuses (a CPU outside the process's cpuset, or offline) or cannot pin at
// all: macOS (thread affinity there is a hint by tag, not a CPU) and the BSDs (not written
// yet) always return false with ENOTSUP.
bool pin_thread_to_cpu(int cpu, std::error_code& error) noexcept;

// A hook at thread end for what a thread makes after its thread_local destructors began
// (POSIX: one thread-specific key, whose destructor runs after the C++ thread_local
// destructors, and again for a value set anew meanwhile). make_thread_end_hook() once per
// process, before any thread uses it; arm_thread_end_hook(arg) then has `fn(arg)` called
// when the calling thread ends. False where there is no such hook (Windows) or it failed.
bool make_thread_end_hook(void (*fn)(void*)) noexcept;
bool arm_thread_end_hook(void* arg) noexcept;

// The calling thread's stack, [lo, hi), when it is one the thread library mapped and may
// hand to a later thread (a thread that has exited, or every thread but the forking one in
// a fork()ed child): Linux and macOS, for every thread but the process's main one. False
// elsewhere, and for the main thread, whose stack no other thread ever gets.
bool reusable_thread_stack(const char*& lo, const char*& hi) noexcept;

// Lets the kernel end the calling thread's timed waits up to `slack` late, no more
// (Linux: PR_SET_TIMERSLACK); nothing elsewhere. Errors are ignored: the slack stays.
void set_timer_slack(std::chrono::nanoseconds slack) noexcept;

// Ends the process as abort() does, after the overflow report (on Windows from within the
// little stack an overflow leaves; on POSIX abort() itself).
[[noreturn]] void abort_after_report() noexcept;

// Writes `text` to standard error, unbuffered, retrying short writes; async-signal-safe,
// errors ignored.
void write_stderr(const char* text, std::size_t bytes) noexcept;

// Installs the process-wide handler for memory faults: it calls report_if_stack_overflow()
// and passes every other fault on to the handler installed before it. Call once, under a
// lock; throws std::system_error when the OS refuses.
void install_fault_handler();
// Gives the calling thread a `bytes`-byte stack for the fault handler to run on (a fiber in
// its guard page has no room left on its own). Returns the memory it mapped, for
// remove_fault_stack() at thread exit; nullptr when the thread already has one of at least
// half that size (someone else's) or none can be made (an overflow there then faults
// unreported).
void* install_fault_stack(std::size_t bytes) noexcept;
// Takes the stack install_fault_stack() returned away from the calling thread and frees it.
void remove_fault_stack(void* stack, std::size_t bytes) noexcept;

}  // namespace os
}  // namespace detail
}  // namespace fsched
