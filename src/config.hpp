// ---------------------------------------------------------------------------
// Configuration: version, user-overridable macros, backend selection.
// ---------------------------------------------------------------------------

#pragma once

#define FIBER_SCHED_VERSION_MAJOR 0
#define FIBER_SCHED_VERSION_MINOR 2
#define FIBER_SCHED_VERSION_PATCH 0

#ifndef FIBER_SCHED_DEFAULT_STACK_SIZE
// 256 KiB of address space; only the pages a fiber touches are committed.
#define FIBER_SCHED_DEFAULT_STACK_SIZE (256u * 1024u)
#endif

#ifndef FIBER_SCHED_STACK_POOL_MAX
// How many freed stacks of one size the process keeps for reuse.
#define FIBER_SCHED_STACK_POOL_MAX 4096u
#endif

#ifndef FIBER_SCHED_STACK_TRIM_MS
// How long a Scheduler stays idle before it gives back the memory of the freed stacks
// kept beyond FIBER_SCHED_STACK_POOL_MAX (after a burst of fibers); also how long such
// stacks may sit in the pool unused before they go back with no scheduler idle.
#define FIBER_SCHED_STACK_TRIM_MS 1000
#endif

#ifndef FIBER_SCHED_GUARDED_STACK_LIMIT
// 0: derive the limit from /proc/sys/vm/max_map_count (a quarter of it).
#define FIBER_SCHED_GUARDED_STACK_LIMIT 0
#endif

#ifndef FIBER_SCHED_ASSERT
// Stays on with NDEBUG: every use guards API misuse, not an internal invariant. Each use
// reads `FIBER_SCHED_ASSERT(cond && "rule broken")`, so a user's own macro gets the rule
// in its expression text as well.
#define FIBER_SCHED_ASSERT(expr)                                                         \
    (static_cast<bool>(expr) ? static_cast<void>(0)                                      \
                             : ::fsched::detail::assert_failed(#expr, __FILE__, __LINE__))
#endif

// fsched::io and the epoll-based idle wait: Linux only. FIBER_SCHED_NO_EPOLL turns them off
// (the scheduler then idles on a condition variable and fsched::io does not compile).
#if defined(__linux__) && !defined(FIBER_SCHED_NO_EPOLL)
#define FIBER_SCHED_HAVE_EPOLL 1
#endif

// Switch the floating-point control state with each fiber: on x86-64 the MXCSR control
// bits (rounding, flush-to-zero, exception masks) and the x87 control word, on aarch64 FPCR.
// The ABIs make them callee-saved, so a fiber that changes its rounding mode does not change
// its resumer's. Reading MXCSR (stmxcsr) waits for the instructions before it, which makes
// it most of a switch's cost: define 0 when no code run in fibers changes these modes, and
// a switch leaves them as the thread has them (as marl and Go do). docs/performance-notes.md, "The switch".
#if !defined(FIBER_SCHED_SWITCH_FP_CONTROL)
#define FIBER_SCHED_SWITCH_FP_CONTROL 1
#endif

// The Itanium C++ ABI's runtime interface (<cxxabi.h>: libstdc++, libc++abi): the exception
// state switched below, and the demangler the fiber report's backtraces use.
#if !defined(FIBER_SCHED_HAVE_CXXABI)
#if defined(__has_include)
#if __has_include(<cxxabi.h>)
#define FIBER_SCHED_HAVE_CXXABI 1
#endif
#endif
#endif
#if !defined(FIBER_SCHED_HAVE_CXXABI)
#define FIBER_SCHED_HAVE_CXXABI 0
#endif

// Switch the C++ runtime's exception state with each fiber where the runtime exposes it
// (the Itanium C++ ABI's __cxa_get_globals). Define 0 to keep one per thread (as marl and
// Boost.Context do): an exception in flight or caught in a fiber that switches out inside
// its handler is then seen by whatever runs next on the thread.
#if !defined(FIBER_SCHED_SWITCH_EH_STATE)
#define FIBER_SCHED_SWITCH_EH_STATE FIBER_SCHED_HAVE_CXXABI
#endif

// MinGW-w64 g++ keeps thread_local variables in emutls, which frees a thread's variables
// before their destructors run: what a thread's exit needs is kept elsewhere there
// (common.ipp).
#if defined(_WIN32) && defined(__GNUC__) && !defined(__clang__)
#define FIBER_SCHED_EMUTLS 1
#else
#define FIBER_SCHED_EMUTLS 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FIBER_SCHED_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIBER_SCHED_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define FIBER_SCHED_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FIBER_SCHED_TSAN 1
#endif
#endif

// Function attributes, spelled for the compiler at hand (MSVC has no __attribute__).
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#define FIBER_SCHED_ALWAYS_INLINE __forceinline
#define FIBER_SCHED_NOINLINE __declspec(noinline)
// MSVC has no cold-path hint and no branch weights: the code stays as written.
#define FIBER_SCHED_COLD
#define FIBER_SCHED_LIKELY(cond) (cond)
#define FIBER_SCHED_UNLIKELY(cond) (cond)
// MSVC may drop an unreferenced static: there the link check below is best effort.
#define FIBER_SCHED_USED
#else
#define FIBER_SCHED_ALWAYS_INLINE __attribute__((always_inline))
#define FIBER_SCHED_NOINLINE __attribute__((noinline))
#define FIBER_SCHED_USED __attribute__((used))
// Off the hot path: laid out apart from it and optimised for size.
#define FIBER_SCHED_COLD __attribute__((cold))
#define FIBER_SCHED_LIKELY(cond) __builtin_expect(static_cast<bool>(cond), 1)
#define FIBER_SCHED_UNLIKELY(cond) __builtin_expect(static_cast<bool>(cond), 0)
#endif
// Symbol visibility exists on ELF and Mach-O; PE/COFF exports nothing unless asked to.
#if defined(_WIN32)
#define FIBER_SCHED_HIDDEN
#else
#define FIBER_SCHED_HIDDEN __attribute__((visibility("hidden")))
#endif

namespace fsched {

// Names the context-switch backend compiled in: "asm-x86_64-sysv", "asm-aarch64",
// "asm-riscv64", "ucontext", "asm-x86_64-win64", "winfiber".
const char* backend() noexcept;

namespace detail {

// Prints the rule quoted in `expr` (if any), the expression and where, then aborts.
[[noreturn]] void assert_failed(const char* expr, const char* file, int line);

// A pause for spin-wait loops. MSVC has no GNU builtins or inline assembly: its intrinsics.
inline void cpu_relax() noexcept {
#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_IX86))
    _mm_pause();
#elif defined(_MSC_VER) && !defined(__clang__) && defined(_M_ARM64)
    __yield();
#elif defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

// Test-only fault injection (FIBER_SCHED_FAULT_INJECTION): each site where the library
// acquires memory, a stack or an fd can be made to fail, to test that the failure reaches
// the caller or the exception handler with nothing lost or leaked.
enum class FaultSite : int {
    StackMap,      // mapping a fiber stack
    FdOpen,        // an epoll instance or eventfd of a Scheduler
    TaskQueue,     // queueing a scheduled task
    FiberAlloc,    // the fiber a worker makes for a callback
    TimerAlloc,    // room for a sleep's or a timed wait's timer
    WaitAlloc,     // the shared state of a timed wait
    IoAlloc,       // the record of an fd that a fiber waits for
    ThreadStart,   // starting a worker thread
    CpuPin,        // pinning a worker thread to its CPU (SchedulerOptions::cpu_affinity)
    RegistryAlloc, // a chunk of the fiber registry's slots (the fiber goes unlisted)
    TimeoutSyscall,// the idle wait's epoll_pwait2 fails (EINVAL; a kernel without it says ENOSYS):
                   // from then on the process's idle waits use epoll_wait's milliseconds
    EnqueuePause,  // not a failure: a 2 ms pause between queueing a task and waking a
                   // worker, to widen that race in tests
    Count
};
#if defined(FIBER_SCHED_FAULT_INJECTION)
// True when this hit of `site` is to fail.
bool fault_hit(FaultSite site) noexcept;
// Makes hits of `site` fail from the nth next one on (1: the next one); 0 disarms it.
void inject_fault(FaultSite site, long nth) noexcept;
// With FIBER_SCHED_FAULT_INJECTION, FIBER_SCHED_ASSERT's default throws
// std::logic_error(rule) instead of aborting while this is set (to test refusals).
void set_assert_throws(bool on) noexcept;
// Overrides FIBER_SCHED_STACK_TRIM_MS from now on.
void set_stack_trim_delay(std::chrono::milliseconds delay) noexcept;
// The resolution of the idle waits' timeouts now: 1 ns where the kernel takes a timespec
// (epoll_pwait2, the condition variable's wait_until), 1 ms on epoll_wait's fallback.
std::chrono::nanoseconds idle_wait_resolution() noexcept;
// When set, called by a worker in the middle of announcing its sleep (counted in the
// scheduler's sleepers, `sleeping` not yet set) with its index: a test holds it there.
void set_sleep_announce_hook(void (*hook)(int worker)) noexcept;
// When set, called by a worker that announced its sleep and whose last look found nothing,
// just before it would block, with its index: a test queues work from there.
void set_sleep_wait_hook(void (*hook)(int worker)) noexcept;
#define FIBER_SCHED_FAULT(site) (::fsched::detail::fault_hit(::fsched::detail::FaultSite::site))
#else
#define FIBER_SCHED_FAULT(site) false
#endif

// Defined only by the translation unit that defines FIBER_SCHED_IMPLEMENTATION. Every other
// unit references it, so forgetting the macro fails at link time with this name.
int define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file() noexcept;
[[maybe_unused]] FIBER_SCHED_USED static int (*const implementation_link_check)() noexcept =
    &define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file;

}  // namespace detail
}  // namespace fsched
