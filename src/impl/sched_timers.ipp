// ---------------------------------------------------------------------------
// Timers: each worker's heap of the fibers that parked on it with a deadline, added to only
// by that worker, fired by any (an idle worker serves a busy one's), with the earliest
// deadline published for idle waits; and sleep_until_steady(), the fiber-aware sleep.
// Relies on: sched_core.ipp, sched_park.ipp (wake_fiber, park).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

inline void Worker::reserve_timer() {
    std::lock_guard<SpinLock> lock(timers.lock);
    if (FIBER_SCHED_FAULT(TimerAlloc)) throw std::bad_alloc();
    std::vector<Timer>& heap = timers.heap;
    if (heap.size() == heap.capacity()) heap.reserve(std::max<std::size_t>(16, 2 * heap.capacity()));
}

inline void Worker::add_timer(TimePoint deadline, Fiber::ptr fiber, std::shared_ptr<WaitState> wait) noexcept {
    const std::int64_t ticks = to_ticks(deadline);
    bool earliest;
    {
        std::lock_guard<SpinLock> lock(timers.lock);
        // Satisfied timed waits leave their timers behind (a notifier cannot reach into
        // this heap); sweep them out whenever the heap has doubled, so memory follows the
        // live timers, not every wait ever made. Amortised O(1) per timer.
        if (timers.heap.size() >= 64 && timers.heap.size() >= 2 * timers.after_sweep) {
            std::vector<Timer>& heap = timers.heap;
            heap.erase(std::remove_if(heap.begin(), heap.end(), [](const Timer& t) { return t.dead(); }), heap.end());
            std::make_heap(timers.heap.begin(), timers.heap.end(), std::greater<Timer>());
            timers.after_sweep = timers.heap.size();
        }
        // reserve_timer() made room (the sweep only shrinks): push_back does not allocate.
        timers.heap.push_back(Timer{deadline, timers.sequence++, std::move(fiber), std::move(wait)});
        std::push_heap(timers.heap.begin(), timers.heap.end(), std::greater<Timer>());
        earliest = timers.heap.front().sequence == timers.sequence - 1;
        // Republished whenever the front changed: by this timer, or by the sweep (a swept
        // front left behind would be a deadline in the past, and the idle wait would spin).
        const std::int64_t front = to_ticks(timers.heap.front().deadline);
        if (timers.earliest.load(std::memory_order_relaxed) != front) {
            timers.earliest.store(front, std::memory_order_seq_cst);
        }
    }
    // A worker asleep until a later deadline would miss this one while this worker is busy:
    // wake it to sleep again until this one. Its `sleeping` is set before it reads the
    // deadlines (seq_cst both sides), so either it saw timers.earliest or we see it asleep.
    if (!earliest || core.sleepers.load(std::memory_order_seq_cst) == 0) return;
    for (auto& w : core.workers) {
        if (w.get() == this || !w->sleeping.load(std::memory_order_seq_cst)) continue;
        if (ticks < w->sleep_deadline.load(std::memory_order_seq_cst)) {
            core.wake_worker(*w);
            return;
        }
    }
}

inline bool Worker::fire_due_timers(Worker& firer) {
    // No clock read while there are no timers: the yield and spawn paths pass here.
    const std::int64_t earliest = timers.earliest.load(std::memory_order_relaxed);
    if (earliest == no_deadline) return false;
    const TimePoint now = clock_now();
    if (earliest > to_ticks(now)) return false;
    bool any = false;
    for (;;) {
        Timer due;
        {
            std::lock_guard<SpinLock> lock(timers.lock);
            if (timers.heap.empty() || timers.heap.front().deadline > now) return any;
            due = timers.pop_front();
        }
        Fiber::ptr fiber = std::move(due.fiber);
        if (due.wait) {
            WaitStatus expected = WaitStatus::Waiting;
            if (!due.wait->status.compare_exchange_strong(expected, WaitStatus::TimedOut, std::memory_order_acq_rel)) continue;
            fiber = std::move(due.wait->fiber);
        }
        wake_fiber(std::move(fiber));  // to its pinned worker, if any
        count(firer.counters.timers_fired);
        any = true;
    }
}

// A timed wait that was satisfied leaves its timer in the heap (add_timer sweeps them out
// only as the heap doubles). Dropped from the front before this worker sleeps, so that no
// idle wait ends, and no worker spins (timer_spin), for a wait that is over. Only this
// worker adds to its heap, and it is idle here; firers take the lock.
inline void Worker::drop_dead_timers() noexcept {
    if (timers.earliest.load(std::memory_order_relaxed) == no_deadline) return;
    std::lock_guard<SpinLock> lock(timers.lock);
    while (!timers.heap.empty() && timers.heap.front().dead()) timers.pop_front();
}

inline std::int64_t Worker::earliest_deadline() const noexcept {
    std::int64_t earliest = no_deadline;
    for (auto& w : core.workers) earliest = std::min(earliest, w->timers.earliest.load(std::memory_order_seq_cst));
    return earliest;
}

void reserve_timer() { thread_state()->worker->reserve_timer(); }

std::size_t pending_timers(Scheduler& scheduler) noexcept {
    std::size_t n = 0;
    for (auto& w : SchedulerCore::of(scheduler).workers) {
        std::lock_guard<SpinLock> lock(w->timers.lock);
        n += w->timers.heap.size();
    }
    return n;
}

void sleep_until_steady(std::chrono::steady_clock::time_point deadline) {
    if (!in_scheduler_task()) {
        FIBER_SCHED_ASSERT(!thread_state()->simulation &&
                           "testing::simulate(): a Fiber resumed by hand (not a scheduler task) slept; inside a "
                           "simulation only tasks can sleep: schedule() the fiber instead");
        if (SchedulerCore* core = caller_may_help()) {
            help_until(*core, nullptr, &deadline);
        } else {
            // A loop: libstdc++'s sleep_until() on a steady clock sleeps once, and MinGW's
            // sleep rounds down to whole milliseconds, so it can return before the deadline.
            while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_until(deadline);
        }
        return;
    }
    reserve_timer();  // may throw std::bad_alloc, here in the fiber, before it parks
    note_wait(WaitReason::Sleep, nullptr, nullptr, &deadline);
    park([](Fiber*, void* arg) {
        // On the worker the fiber parked from, whose timer heap has room (reserve_timer).
        thread_state()->worker->add_timer(*static_cast<std::chrono::steady_clock::time_point*>(arg),
                                          take_task_ref(), nullptr);
    }, &deadline);
}

}  // namespace detail
}  // namespace fsched
