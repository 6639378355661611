// ---------------------------------------------------------------------------
// The run-next slot (put_runnext): a woken fiber runs next on its waker's worker; how
// another worker takes a slot stuck behind a busy task, and why no fiber is stranded there.
// Relies on: sched_core.ipp.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

// The run-next slot and the lost wake-up: the slot belongs to a worker that is awake (it
// runs the waker), and that worker takes it before it may spin or sleep (pop_locked, which
// every look at its own queues goes through; the `queued` hint counts it), so the fiber is
// never stranded. What is left is parallelism: a waker that runs on for long without parking
// must not keep the fiber from an idle worker. So a worker going to sleep while some slot is
// in use or was set since its last look sleeps for at most runnext_watch_period (counted in
// runnext_watchers), and each of its looks counts how long a slot has held the same fiber
// (take_stuck_runnext). A set that finds no watcher wakes a sleeper, unless a worker spins
// (it will look, then watch). The set stores runnext_state (seq_cst) and then loads
// `sleepers`; a sleeper stores `sleepers` and then loads every runnext_state
// (runnext_activity): one of the two sees the other, so a slot is never set unseen by every
// sleeper. The set relies on a watcher or a spinner only while it stays idle: one that
// stops (it found another task to run, or the use_caller thread's wait ended) first
// decrements its count (seq_cst) and then loads every runnext_state, and if a slot is in
// use and no one else watches or spins it wakes a sleeper (hand_on_runnext_watch): against
// the set's store-then-load of the counts, one of the two sees the other again. A wrong
// guess either way costs a wake-up or a millisecond, never a fiber.
inline bool Worker::put_runnext(Fiber::ptr& fiber) noexcept {
    bool displaced = false;
    {
        std::lock_guard<SpinLock> lock(ready.lock);
        if (ready.runnext) {
            QueuedTask back;
            back.fiber = std::move(ready.runnext);
            back.kind = TaskKind::Woken;
            try {
                push_locked(std::move(back), false);  // strong guarantee
            } catch (...) {
                ready.runnext = std::move(back.fiber);
                return false;
            }
            displaced = true;
        }
        ready.runnext = std::move(fiber);
        ++ready.runnext_sets;
        ready.runnext_state.store((ready.runnext_sets << 1) | 1, std::memory_order_seq_cst);
        update_hints();
    }
    if (displaced) {
        core.after_push(*this, false, 1);  // a stealable task now, as any wake-up
    } else {
        wake_runnext_looker();
    }
    return true;
}

inline void Worker::wake_runnext_looker() noexcept {
    if (core.sleepers.load(std::memory_order_seq_cst) == 0) return;  // all awake: each looks before it sleeps
    if (core.runnext_watchers.load(std::memory_order_seq_cst) != 0 || core.spinning.load(std::memory_order_seq_cst) != 0) {
        return;  // that one looks, and hands on in turn when it stops
    }
    for (auto& w : core.workers) {
        if (w.get() != this && core.wake_worker(*w)) return;
    }
}

inline bool Worker::take_stuck_runnext(QueuedTask& out) noexcept {
    const std::size_t n = core.workers.size();
    for (std::size_t i = 1; i < n; ++i) {
        const std::size_t v = (static_cast<std::size_t>(index) + i) % n;
        Worker& victim = *core.workers[v];
        RunnextLook& look = runnext_looks[v];
        const std::uint64_t state = victim.ready.runnext_state.load(std::memory_order_relaxed);
        if (!(state & 1) || state != look.state) {
            look.state = state;
            look.looks = 0;
            continue;
        }
        if (++look.looks < runnext_stuck_looks) continue;
        look.looks = 0;
        std::lock_guard<SpinLock> lock(victim.ready.lock);
        if (!victim.ready.runnext || victim.ready.runnext_state.load(std::memory_order_relaxed) != state) continue;
        victim.take_runnext_locked(out);
        victim.ready.runnext_streak = 0;  // not its own run
        core.runnext_stuck_taken.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    return false;
}

inline void Worker::hand_on_runnext_watch() noexcept {
    if (single || core.sleepers.load(std::memory_order_seq_cst) == 0) return;  // the cheap test first
    for (std::size_t v = 0; v < core.workers.size(); ++v) {
        if (v != static_cast<std::size_t>(index) && (core.workers[v]->ready.runnext_state.load(std::memory_order_seq_cst) & 1)) {
            wake_runnext_looker();
            return;
        }
    }
}

inline bool Worker::runnext_activity() noexcept {
    bool active = false;
    for (std::size_t v = 0; v < core.workers.size(); ++v) {
        if (v == static_cast<std::size_t>(index)) continue;
        const std::uint64_t state = core.workers[v]->ready.runnext_state.load(std::memory_order_seq_cst);
        RunnextLook& look = runnext_looks[v];
        active = active || (state & 1) || state != look.at_sleep;
        look.at_sleep = state;
    }
    return active;
}

std::uint64_t runnext_stuck_taken(Scheduler& scheduler) noexcept {
    return SchedulerCore::of(scheduler).runnext_stuck_taken.load(std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace fsched
