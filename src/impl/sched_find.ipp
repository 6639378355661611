// ---------------------------------------------------------------------------
// Where a worker's next task comes from, in one place: next_task() is the run loop's one
// choice of what runs next (a task a steal could not queue, the fiber that yielded, the
// local ring, then find_task), and find_task() its order of looks (due timers, a High task
// anywhere, its own queues, other workers' due timers, stealing, a stuck run-next slot).
// A different policy (a seeded choice for simulation, say) replaces these two functions.
// Relies on: sched_core.ipp (Worker, SchedulerCore).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

inline bool Worker::next_task(QueuedTask& task) {
    if (!overflow.empty()) {
        task = std::move(overflow.back());
        overflow.pop_back();
        return true;
    }
    if (yielded) {
        requeue_yielded(task);
        return true;
    }
    if (local_size != 0 && take_local(task)) return true;
    if (find_task(task)) return true;
    return core.idle.poll_io(false) && find_task(task);
}

inline void Worker::high_moved(long delta) noexcept {
    core.stealable_high.fetch_add(delta, std::memory_order_relaxed);
}

inline bool Worker::take_high(QueuedTask& out) {
    {
        std::lock_guard<SpinLock> lock(ready.lock);
        if (!ready.levels[static_cast<int>(Priority::High)].empty()) return pop_locked(out);
    }
    const std::size_t n = core.workers.size();
    for (std::size_t i = 1; i < n; ++i) {
        if (core.workers[(static_cast<std::size_t>(index) + i) % n]->steal_into(*this, out, true, true)) return true;
    }
    return false;
}

inline bool Worker::find_task(QueuedTask& out, bool thorough) {
    fire_due_timers(*this);
    // A High task anywhere goes before this worker's own Normal and Low ones.
    if (core.stealable_high.load(std::memory_order_relaxed) > 0 && take_high(out)) return true;
    if (pop(out, !thorough)) return true;
    const std::size_t n = core.workers.size();
    // Nothing of our own: serve other workers' due timers (a busy worker cannot), then
    // look again; a woken unpinned fiber comes to this worker's queue.
    bool fired = false;
    for (std::size_t i = 1; i < n; ++i) {
        fired = core.workers[(static_cast<std::size_t>(index) + i) % n]->fire_due_timers(*this) || fired;
    }
    if (fired && pop(out, false)) return true;
    // Every other worker once, starting somewhere new each time a steal succeeds.
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const std::size_t offset = 1 + (steal_start + i) % (n - 1);
        Worker& victim = *core.workers[(static_cast<std::size_t>(index) + offset) % n];
        if (victim.steal_into(*this, out, !thorough)) {
            ++steal_start;
            return true;
        }
    }
    if (n > 1 && take_stuck_runnext(out)) {
        count(counters.steals);
        count(counters.tasks_stolen);
        return true;
    }
    return false;
}

}  // namespace detail
}  // namespace fsched
