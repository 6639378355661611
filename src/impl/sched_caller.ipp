// ---------------------------------------------------------------------------
// The use_caller thread's help: outside stop(), while it blocks (help_until) or in a game
// loop's run_pending(), it runs worker 0's tasks; how it leaves without taking a wake-up
// meant for others (stop_helping, hand_on_caller_wake).
// Relies on: sched_core.ipp, sched_run_loop.ipp (run_loop, run_task).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

inline std::size_t Worker::run_ready(std::size_t max_tasks, TimePoint until) {
    ThreadState* ts = thread_state();
    Scheduler* const outer_scheduler = ts->scheduler;
    ts->scheduler = &core.owner;
    ts->worker = this;
    caller_helping = true;
    std::size_t ran = 0;
    QueuedTask task;
    while (ran < max_tasks) {
        if (until != TimePoint::max() && std::chrono::steady_clock::now() >= until) break;
        poll_io_now_and_then();
        if (!next_task(task)) break;
        run_task(task);
        ++ran;
    }
    stop_helping();
    ts->scheduler = outer_scheduler;
    ts->worker = nullptr;  // called outside every loop (caller_may_help, run_pending)
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    return ran;
}

inline void Worker::stop_helping() noexcept {
    caller_helping = false;
    if (yielded) {
        // Back in line at its level; enqueue() wakes a sleeper for it unless it is pinned here.
        QueuedTask back;
        const ResumeTarget target = FiberAccess::lifecycle(*yielded).resume_target();
        back.worker = target.worker;
        back.priority = target.priority;
        back.kind = TaskKind::Claimed;
        back.fiber = std::move(yielded);
        core.enqueue_fiber(std::move(back));
    }
    if (local_size != 0) {
        std::lock_guard<SpinLock> lock(ready.lock);
        flush_local_locked();  // a single worker: no one else to wake for them
        update_hints();
    }
    {
        // A fiber a task woke here into the run-next slot: to the stealable queue, so that
        // others may run it (counted below).
        std::lock_guard<SpinLock> lock(ready.lock);
        if (ready.runnext) {
            QueuedTask task;
            take_runnext_locked(task);
            try {
                push_locked(std::move(task), false);
            } catch (...) {
                ready.runnext = std::move(task.fiber);  // out of memory: it waits for the next help
                ready.runnext_state.store((++ready.runnext_sets << 1) | 1, std::memory_order_seq_cst);
            }
            update_hints();
        }
    }
    // Stolen tasks were queued here without waking anyone (the thief was to run them).
    const std::size_t left = ready.stealable.load(std::memory_order_relaxed);
    if (left > 0) core.after_push(*this, false, left);
    // Tasks in `overflow` (a steal that found no memory) wait for the next help or stop().
}

SchedulerCore* caller_may_help() noexcept {
    ThreadState* ts = thread_state();
    SchedulerCore* core = ts->caller_core;
    if (!core || ts->current || ts->worker || core->closed()) return nullptr;
    return core;
}

void help_until(SchedulerCore& core, const std::atomic<bool>* done, const TimePoint* deadline) {
    const CallerWait wait{done, deadline};
    core.workers[0]->run_loop(&wait);
}

void wake_caller(SchedulerCore& core) noexcept { core.wake_worker(*core.workers[0]); }

// A waker that finds the use_caller thread asleep in a wait (help_until) sees worker 0 as
// any sleeper, and may claim it for work that is not worker 0's own: after_push wakes the
// first sleeper for a task queued on a busy worker, add_timer the first sleeper whose
// deadline is later than a new timer's, wake_for_io the first sleeper to take the poller
// role. If the caller's wait ends at that moment, it leaves (run_loop's first step) without
// looking, and the task waited behind the busy worker, the timer fired late, the ready fd
// went unseen, while other workers slept. So on leaving, if any of that may be there, it
// wakes another sleeper, which looks for tasks, serves due timers, sleeps again until the
// earliest deadline and takes the poller role if it is vacant. Each test is a load of what
// the waker itself read; a wrong guess costs one wake-up.
inline void Worker::hand_on_caller_wake() noexcept {
    if (core.workers.size() < 2 || core.sleepers.load(std::memory_order_seq_cst) == 0) return;
    bool wanted = false;
#if defined(FIBER_SCHED_HAVE_EPOLL)
    wanted = core.idle.io_waiters.load(std::memory_order_seq_cst) > 0 &&
             core.idle.poller.load(std::memory_order_seq_cst) == nullptr;
#endif
    std::int64_t earliest_sleeper = no_deadline;
    for (auto& w : core.workers) {
        if (w.get() == this) continue;
        if (w->ready.stealable.load(std::memory_order_relaxed) != 0) wanted = true;
        if (w->sleeping.load(std::memory_order_seq_cst)) {
            earliest_sleeper = std::min(earliest_sleeper, w->sleep_deadline.load(std::memory_order_seq_cst));
        }
    }
    const std::int64_t earliest_timer = earliest_deadline();
    if (earliest_timer != no_deadline && earliest_timer < earliest_sleeper) wanted = true;
    if (!wanted) return;
    for (auto& w : core.workers) {
        if (w.get() != this && core.wake_worker(*w)) return;
    }
}

}  // namespace detail

std::size_t Scheduler::run_pending(std::chrono::microseconds budget) {
    detail::SchedulerCore& core = *core_;
    const detail::ThreadState* ts = detail::thread_state();
    FIBER_SCHED_ASSERT(core.use_caller && "run_pending(): the scheduler has no use_caller thread (made with use_caller = false)");
    FIBER_SCHED_ASSERT(!core.closed() && "run_pending(): the scheduler has stopped");
    FIBER_SCHED_ASSERT(core.caller_linked && std::this_thread::get_id() == core.caller_thread && !ts->current &&
                       !ts->worker &&
                       "run_pending(): call it on the scheduler's use_caller thread, outside its tasks and outside stop()");
    const detail::TimePoint until = budget == std::chrono::microseconds::max() ? detail::TimePoint::max()
                                                                              : detail::deadline_after(budget);
    return core.workers[0]->run_ready(SIZE_MAX, until);
}

}  // namespace fsched
