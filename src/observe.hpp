// ---------------------------------------------------------------------------
// Seeing inside: the profiler hooks (Hooks, set_hooks) and the one flag word the switch paths test before they call any of it (the hooks' bit, the trace's bit).
//
// Hooks are off unless set: the switch paths test one relaxed load of
// observe_flags, a branch the CPU predicts, and call out of line only when a bit is set.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {

class Fiber;

// Callbacks for a profiler (Tracy, a custom one). Each may be null. Called on the thread
// concerned, synchronously, from inside the scheduler: keep them short, and do not block,
// switch fibers or call back into the scheduler from them. A callback task's name
// (ScheduleTask::name) is given to its fiber as the task starts, inside the fiber: that
// fiber's on_create and its first on_switch_in see it unnamed (name_c_str() null). Name a
// Fiber before it is scheduled to have the name from its first hook.
struct Hooks {
    // A fiber has been made (also: a pooled callback fiber is given to a new task, which
    // makes it a new fiber with a new id). On the creating thread.
    void (*on_create)(Fiber&) = nullptr;
    // A fiber is going away (also: a callback fiber's task has ended). Its last hook.
    void (*on_destroy)(Fiber&) = nullptr;
    // The fiber starts or resumes running on this thread; `worker` is the scheduler worker
    // index of the thread (Scheduler::worker_index()), -1 on a plain thread.
    void (*on_switch_in)(Fiber&, int worker) = nullptr;
    // The fiber stops running on this thread (it parked, yielded or returned). Every
    // on_switch_in is followed, on the same thread, by one on_switch_out of the same fiber
    // before any other on_switch_in there: a fiber that resumes another by hand is switched
    // out first and back in when that one comes back, so the calls never nest.
    void (*on_switch_out)(Fiber&, int worker) = nullptr;
    // `woken` has been made runnable by `by` (the running fiber, or nullptr: a plain thread,
    // a timer or an IO event). On the waking thread; `woken` may already run elsewhere once
    // it returns.
    void (*on_wake)(Fiber& woken, Fiber* by) = nullptr;
};

// Installs `hooks` for every fiber in the process (a copy is kept). Call it before the
// fibers and schedulers it should see are started: a hook set while fibers run may miss the
// on_switch_in of a fiber already running, and see its on_switch_out. Hooks{} turns them off.
void set_hooks(const Hooks& hooks);

namespace detail {

// Bits of observe_flags: which observers are on.
constexpr unsigned observe_hooks = 1;  // set_hooks() installed at least one hook
constexpr unsigned observe_trace = 2;  // trace::start() or start_ring() is recording
// Read (relaxed) on every switch, wake, create and destroy; written by set_hooks() and the
// trace's start and stop. It orders nothing: each hook is an atomic pointer of its own, read
// relaxed where it is called, and each trace buffer has its own lock (impl/trace.ipp).
extern std::atomic<unsigned> observe_flags;
FIBER_SCHED_ALWAYS_INLINE inline bool observing() noexcept {
    return FIBER_SCHED_UNLIKELY(observe_flags.load(std::memory_order_relaxed) != 0);
}

// The observers' entry points, out of line (impl/hooks.ipp); call them only when observing().
// `resumer`: the fiber that resumes `fiber` by hand on this thread (nullptr: a worker's or a
// plain thread's own stack), switched out around it so that hooks never nest.
FIBER_SCHED_NOINLINE void observe_switch_in(Fiber& fiber, Fiber* resumer) noexcept;
FIBER_SCHED_NOINLINE void observe_switch_out(Fiber& fiber, Fiber* resumer) noexcept;
FIBER_SCHED_NOINLINE void observe_wake(Fiber& woken) noexcept;
FIBER_SCHED_NOINLINE void observe_create(Fiber& fiber) noexcept;
FIBER_SCHED_NOINLINE void observe_destroy(Fiber& fiber) noexcept;

}  // namespace detail
}  // namespace fsched
