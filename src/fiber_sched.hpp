/*
fiber_sched: stackful fibers and an N:M fiber scheduler for C++17, in one header.

    Fiber              a coroutine with its own stack: resume() / yield()
    Scheduler          runs fibers and callbacks on a pool of threads (per-worker
                       queues, work stealing, pinned tasks, blocking idle)
    SchedulerOptions   stack sizes, thread start/stop hooks, CPU affinity per worker;
                       Scheduler::stats() counts what the workers did
    this_fiber         yield, sleep_for, sleep_until: park the fiber, free the thread
    Mutex, ConditionVariable, WaitGroup, Channel<T>
                       park a fiber (and block a plain thread) while they wait
    Semaphore, Latch, Barrier, SharedMutex, Event, ConditionVariableAny: likewise
    select             one ready Channel case of several (Go's), or a default, or a timeout
    Future, Promise, async, when_all, parallel_for, parallel_for_chunks
                       results and exceptions across tasks; an index range over the workers
    FiberLocal<T>      a value per fiber, wherever the fiber runs (per thread outside fibers)
    testing::simulate  fn under a seeded, deterministic schedule on this thread, in virtual
                       time; explore(fn, n) returns the first failing seed (a throw, an
                       assert, a deadlock, a runaway), which simulate() replays exactly
    set_hooks          profiler hooks (create, destroy, switch in/out, wake); fibers
                       and tasks carry names (Fiber::set_name, ScheduleTask::name)
    fiber_report       every live fiber: state, what a parked one waits for and since when,
                       its stack use and backtrace (build -fno-omit-frame-pointer, link
                       -rdynamic); dump_fibers(FILE*), install_fiber_dump_handler(SIGQUIT);
                       lock-order deadlocks and hung stop()s (FIBER_SCHED_HANG_REPORT_S,
                       seconds) are reported on stderr by themselves; tools/fiber_sched_gdb.py
                       adds `info fibers` and `fiber bt ID` to gdb
    trace::start/stop  a trace of every fiber slice, park and wake-up per thread, as
                       Chrome Trace Event JSON (Perfetto, chrome://tracing, speedscope);
                       trace::start_ring/dump keep the newest n events per thread
                       (FIBER_SCHED_TRACE_MAX_EVENTS, an environment variable, caps a
                       recording's events per thread; default 1,000,000)

USING IT
    In exactly one .cpp of your program:
        #define FIBER_SCHED_IMPLEMENTATION
        #include "fiber_sched.hpp"
    Everywhere else just #include "fiber_sched.hpp". Link with -pthread. Forgetting the
    macro fails at link time naming define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file().
    On Windows, a translation unit that includes <windows.h> before this header should
    define NOMINMAX first.

EXAMPLE
    #define FIBER_SCHED_IMPLEMENTATION
    #include "fiber_sched.hpp"
    #include <cstdio>

    int main() {
        fsched::Scheduler scheduler(4, false);      // 4 worker threads
        fsched::Channel<int> results;
        scheduler.start();
        for (int i = 1; i <= 3; ++i)
            scheduler.schedule([&results, i] {
                fsched::this_fiber::sleep_for(std::chrono::milliseconds(10 * i));
                results.send(i * i);                // parks until main() receives
            });
        for (int i = 0; i < 3; ++i) std::printf("%d\n", *results.receive());
        scheduler.stop();                           // waits for every task
    }

CONFIGURATION (define before including, the same in every translation unit)
    FIBER_SCHED_IMPLEMENTATION       emit the implementation in this translation unit
    FIBER_SCHED_USE_UCONTEXT         use the portable ucontext backend (default: assembly)
    FIBER_SCHED_USE_WINFIBER         on Windows, use the Win32 fiber API (default: assembly,
                                     or the fiber API with MSVC's cl.exe)
    FIBER_SCHED_DEFAULT_STACK_SIZE   bytes of stack for a size of 0 (default 262144)
    FIBER_SCHED_STACK_POOL_MAX       freed stacks kept per size for reuse (default 4096);
                                     a burst may leave up to twice as many until a
                                     scheduler has been idle FIBER_SCHED_STACK_TRIM_MS
    FIBER_SCHED_STACK_TRIM_MS        idle time before the surplus goes back (default 1000)
    FIBER_SCHED_GUARDED_STACK_LIMIT  stacks that get a guard page (default 0: a quarter of
                                     vm.max_map_count; stacks past it are unguarded)
    FIBER_SCHED_NO_EPOLL             on Linux, idle on a condition variable instead of
                                     epoll; fsched::io is then left out (as on other
                                     POSIX systems, where it does not exist)
    FIBER_SCHED_SWITCH_FP_CONTROL    0: switches leave the FP modes (MXCSR and x87 control
                                     word, FPCR, frm) as the thread has them (default 1:
                                     each fiber keeps its own; MXCSR's status flags stay
                                     the thread's either way on x86-64)
    FIBER_SCHED_SWITCH_EH_STATE      0: one C++ exception state per thread (default 1 where
                                     <cxxabi.h> is: each fiber has its own)
    FIBER_SCHED_DEBUG_MIGRATE        (read where the implementation is built) every
                                     Scheduler resumes each unpinned fiber on another
                                     worker after each wait, to catch thread_locals kept
                                     across waits (default off: SchedulerOptions::
                                     debug_migrate, or the environment variable of that name)
    FIBER_SCHED_ASSERT(expr)         the check for API misuse (default: print the rule
                                     broken, the expression and where, then abort; stays
                                     on with NDEBUG)

PLATFORMS
    x86-64 Linux/BSD/macOS (System V)   asm-x86_64-sysv
    aarch64 Linux/BSD, arm64 macOS      asm-aarch64
    riscv64 Linux/BSD (LP64D)           asm-riscv64
    any other POSIX target              ucontext
    x86-64 Windows, MinGW-w64 / clang   asm-x86_64-win64 (no fsched::io)
    Windows, MSVC cl.exe (or forced)    winfiber (no fsched::io)
    fsched::backend() names the backend compiled in. Tested (the whole suite run): Linux
    x86-64, aarch64 and riscv64 (the last two under qemu), Windows x64 under wine. macOS
    and cl.exe: compiled or preprocessed in CI, never run. BSDs: unchecked.

CAVEATS
    - Under a Scheduler a fiber may continue on another thread after it yields, sleeps or
      blocks: do not keep the address of a thread_local, or a value read from one, across
      such a call (a FiberLocal<T> stays the fiber's).
    - Fiber::yield() inside a task leaves the scheduler until schedule(fiber) puts it back;
      this_fiber::yield() is the one that comes back by itself.
    - Destroying a Suspended fiber frees its stack without running its frames' destructors.
    - Only stacks with a guard page detect overflow (see stack_stats()).
    - macOS (x86-64, Apple silicon): compiled and linked, never run yet; no fsched::io.
    - Windows: no fsched::io. With asm-x86_64-win64 a fiber is not an OS fiber: inside it
      GetCurrentFiber() and fiber-local storage are the thread's. winfiber makes an OS
      fiber per run of a Fiber (slower to create; see README.md).

VERSION 0.2.0 (FIBER_SCHED_VERSION_MAJOR/MINOR/PATCH)
*/

#ifndef FIBER_SCHED_HPP_INCLUDED
#define FIBER_SCHED_HPP_INCLUDED

// MSVC keeps __cplusplus at 199711L unless /Zc:__cplusplus; _MSVC_LANG has its /std.
#if defined(_MSVC_LANG) && _MSVC_LANG > __cplusplus
#if _MSVC_LANG < 201703L
#error "fiber_sched.hpp needs C++17 or later: compile with /std:c++17"
#endif
#elif __cplusplus < 201703L
#error "fiber_sched.hpp needs C++17 or later: compile with -std=c++17 (or a Meson project's cpp_std=c++17)"
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"

#if defined(FIBER_SCHED_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif
#if defined(FIBER_SCHED_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#include "context.hpp"
#include "task_function.hpp"
#include "priority.hpp"
#include "stack.hpp"
#include "fiber_state.hpp"
#include "observe.hpp"
#include "wait_record.hpp"
#include "fiber.hpp"
#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "sync.hpp"
#include "sync_extra.hpp"
#include "select.hpp"
#include "future.hpp"
#include "parallel.hpp"
#include "fiber_local.hpp"
#include "io.hpp"
#include "inspect.hpp"
#include "trace.hpp"
#include "testing.hpp"

#endif  // FIBER_SCHED_HPP_INCLUDED

#if defined(FIBER_SCHED_IMPLEMENTATION) && !defined(FIBER_SCHED_IMPLEMENTATION_INCLUDED)
#define FIBER_SCHED_IMPLEMENTATION_INCLUDED

#include <algorithm>
#include <cerrno>
#if FIBER_SCHED_HAVE_CXXABI
#include <cxxabi.h>
#endif
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <queue>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(_WIN32)
// NOMINMAX: the implementation calls std::min, std::max and numeric max() functions.
#if !defined(NOMINMAX)
#define NOMINMAX
#endif
#if !defined(WIN32_LEAN_AND_MEAN)
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr (the winfiber backend)
#if FIBER_SCHED_EMUTLS
#include <pthread.h>  // MinGW-w64 g++: winpthreads' keys, run at thread exit (common.ipp)
#endif
#else
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#endif
#if defined(FIBER_SCHED_HAVE_EPOLL)
#include <netinet/in.h>  // IPPROTO_TCP
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>  // FIONREAD
#include <sys/stat.h>
#endif

#include "impl/common.ipp"
// The OS layer (its interface and this system's implementation) and the context-switch
// backend (the one cascade that picks it).
#include "impl/os_layer.ipp"
#include "impl/context_backend.ipp"
#include "impl/stack.ipp"
#include "impl/stack_overflow.ipp"
#include "impl/fiber.ipp"
// The trace recorder, then fiber names and the profiler hooks that feed it.
#include "impl/trace.ipp"
#include "impl/hooks.ipp"
// The registry of live fibers, and the report made from it (and its OS calls).
#include "impl/inspect_os.ipp"
#include "impl/registry.ipp"
#include "impl/report.ipp"
// The idle wait: epoll on Linux, else a condition variable.
#include "impl/idle.ipp"
// The scheduler, one concept per part: the queues, a worker, what the workers share, then
// the parts that define the workers' steps (each file's top comment says what it owns).
#include "impl/sched_task_queue.ipp"
#include "impl/sched_worker.ipp"
#include "impl/sched_core.ipp"
#include "impl/sched_find.ipp"
#include "impl/sched_run_loop.ipp"
#include "impl/sched_yield.ipp"
#include "impl/sched_timers.ipp"
#include "impl/sched_runnext.ipp"
#include "impl/sched_park.ipp"
#include "impl/sched_caller.ipp"
#include "impl/sched_lifecycle.ipp"
#include "impl/sched_submit.ipp"
#include "impl/sched_fork.ipp"
#include "impl/sync.ipp"
#include "impl/sync_extra.ipp"
#include "impl/select.ipp"
#include "impl/future.ipp"
#include "impl/parallel.ipp"
#include "impl/fiber_local.ipp"
#include "impl/simulation.ipp"
// fsched::io (Linux; each part is empty without epoll): the registry and a wait's record,
// the fd table, one wait, the sweep, the calls.
#include "impl/io_registry.ipp"
#include "impl/io_fd_table.ipp"
#include "impl/io_wait.ipp"
#include "impl/io_sweep.ipp"
#include "impl/io_calls.ipp"

#endif  // FIBER_SCHED_IMPLEMENTATION

/*
LICENCE
    MIT License. Copyright (c) 2026 the fiber_sched authors.
    Permission is hereby granted, free of charge, to any person obtaining a copy of this
    software and associated documentation files (the "Software"), to deal in the Software
    without restriction, including without limitation the rights to use, copy, modify,
    merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
    permit persons to whom the Software is furnished to do so, subject to the following
    conditions: The above copyright notice and this permission notice shall be included in
    all copies or substantial portions of the Software.
    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
    INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A
    PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT
    HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
    CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE
    OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
