// ---------------------------------------------------------------------------
// fork() and the process-wide state: what a forked child's only thread forgets
// (forget_schedulers_in_child), and build_process_state(), which makes the stack pool, the
// io registry and their fork handlers exist before any thread of the library does.
// Relies on: the stack pool (stack.ipp), the io registry (io_registry.ipp, declared in
// idle_epoll.ipp), the OS layer's fork hooks.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"
#include "impl/stack.ipp"
#include "impl/stack_overflow.ipp"
#include "impl/hooks.ipp"
#include "impl/trace.ipp"
#include "impl/registry.ipp"
#include "impl/report.ipp"

namespace fsched {
namespace detail {

// fork() (POSIX): the child has one thread, the one that forked, and none of the parent's
// workers. Whatever that thread was in the parent (a use_caller thread, a worker in the
// middle of a task), in the child it is a plain thread: a sleep, a wait or an io call there
// that went on helping or parking would run a worker loop of a scheduler that is not there,
// on copies of its queues and on the epoll instance and eventfds the child shares with the
// parent, taking the parent's events. So the child forgets every scheduler this thread
// worked for or helped, and in_scheduler_task() and caller_may_help() are false there. Its
// current fiber, if any, stays current: the thread is on that fiber's stack and goes on
// running its code, as a plain thread's fiber. A task that forked must not end or yield to
// its worker in the child (Worker::run_task asserts so): the worker is gone.
void forget_schedulers_in_child() noexcept {
    ThreadState* ts = thread_state();
    ts->scheduler = nullptr;
    ts->worker = nullptr;
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    ts->caller_core = nullptr;  // the parent's use_caller schedulers, none of them here
}

// Why before any thread of the library exists. The stack pool and the io registry are
// function-local statics, built on first use (so that a Scheduler made by another
// translation unit's global constructor finds them), and they register their own fork
// handlers. A thread inside such a constructor when another thread forks leaves the
// static's guard taken in the child for good: the child's first Fiber then hung in
// __cxa_guard_acquire (a worker used to build the pool on its first idle look at it). And
// a lock whose handlers are registered only after some thread could hold it may be
// inherited held. Built here, the objects exist before a Scheduler starts its first thread
// (its constructor calls this), and before main() (below) for a plain thread's first Fiber
// or io wait; each fork handler is registered before anyone can take its lock.
void build_process_state() {
    static const bool built = [] {
        (void)stack_pool();  // registers its handlers (stack.ipp)
        build_registry();    // and the fiber registry's (registry.ipp)
        // Before the report's: the watch thread dumps the flight recorder with its lock
        // held, and fork's prepare handlers run in the reverse order (watch, then trace).
        build_trace_fork_handlers();  // the trace's (trace.ipp)
        // The thread-end hook for FiberLocal values made after a thread's exit clean-up.
        os::make_thread_end_hook(clear_late_fiber_locals);
        build_report_state();  // the watch and dump threads' (report.ipp)
        build_name_table();    // the fiber names' (hooks.ipp)
#if defined(FIBER_SCHED_HAVE_EPOLL)
        build_io_registry();  // and its (io_registry.ipp)
#endif
        // install_stack_overflow_handler()'s lock, which it takes only after calling this.
        (void)overflow_install_mutex();
#if FIBER_SCHED_SWITCH_EH_STATE && FIBER_SCHED_EMUTLS
        (void)eh_exit_key();  // before the C++ runtime's key for thread_local destructors (common.ipp)
#endif
        os::at_fork([] { overflow_install_mutex().lock(); }, [] { overflow_install_mutex().unlock(); },
                    [] {
                        overflow_install_mutex().unlock();
                        forget_schedulers_in_child();
                    });
        return true;
    }();
    (void)built;
}

namespace {
// A dynamic initialiser of the implementation's translation unit: before main() unless
// another unit's global constructor starts threads first. Out of memory here, the first
// Scheduler tries again (a Fiber or an io wait meanwhile builds what it needs itself).
struct BuildProcessStateAtStart {
    BuildProcessStateAtStart() noexcept {
        try {
            build_process_state();
        } catch (...) {
        }
    }
} build_process_state_at_start;
}  // namespace

}  // namespace detail
}  // namespace fsched
