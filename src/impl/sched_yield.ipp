// ---------------------------------------------------------------------------
// this_fiber::yield() inside a scheduler task: the fiber goes back in line
// (requeue_yielded) or, on a scheduler's only worker, into its local ring, and the direct
// yield path hands the worker from one yielder to the next without going round run_loop.
// Relies on: sched_core.ipp, sched_timers.ipp (fire_due_timers), sched_caller.ipp (a
// yield outside a task, on the use_caller thread).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

// Puts the fiber that yielded at the back of its queue and takes the oldest task, under one
// lock; the queue's length does not change, so no one needs waking. Timers come first.
inline void Worker::requeue_yielded(QueuedTask& next) {
    fire_due_timers(*this);
    const ResumeTarget target = FiberAccess::lifecycle(*yielded).resume_target();
    // A single worker's Normal fiber may go to the ring (see local_ring).
    const bool ring = target.priority == Priority::Normal && core.workers.size() == 1 && overflow.empty();
    if (ring && ready.queued.load(std::memory_order_relaxed) == 0 && local_reserve()) {
        // Nothing in the shared queues (by the hint; the common case): no lock, no
        // read-modify-write. The ring's oldest runs next, or this fiber straight away.
        if (local_size != 0) {
            local_push(yielded);
            yielded = local_pop();
        }
        take_claimed(next, std::move(yielded));
        return;
    }
    QueuedTask back;
    back.worker = target.worker;
    back.priority = target.priority;  // a yielding fiber keeps its task's priority
    back.kind = TaskKind::Claimed;  // still Running: this_fiber::yield() parks without leaving it
    back.fiber = std::move(yielded);
    std::lock_guard<SpinLock> lock(ready.lock);
    if (ring && ready.levels[static_cast<int>(Priority::High)].empty() && requeue_behind_ring_locked(back, next)) return;
    requeue_in_line_locked(back, next, ring);
}

// `next` becomes the claimed (yielded) Normal fiber `fiber`.
inline void Worker::take_claimed(QueuedTask& next, Fiber::ptr&& fiber) noexcept {
    next.fiber = std::move(fiber);
    next.worker = FiberAccess::lifecycle(*next.fiber).resume_target().worker;
    next.priority = Priority::Normal;
    next.kind = TaskKind::Claimed;
}

// The ring is older than everything queued, so its oldest runs next and the yielder (in
// `back`) goes behind everything: the ring is not flushed. Once it has run dry, the fibers
// that yielded earlier at the front of the Normal line go (back) into it, oldest first: a
// prefix of the line, so the ring stays the oldest, and with several yielders the shared
// queues empty out for the direct path. Each fiber moves between the ring and the shared
// queues at most twice per round: O(1) per yield. Not while the run-next slot is in use: it
// is behind the ring, not behind the yielded prefix, and would otherwise wait as long as
// fibers keep yielding. False, with `back` intact, when the ring stays empty.
inline bool Worker::requeue_behind_ring_locked(QueuedTask& back, QueuedTask& next) {
    if (local_size == 0 && !ready.runnext) take_yielded_prefix_locked();
    if (local_size == 0) return false;
    take_claimed(next, local_pop());
    if (waiting_locked() == 0 && local_reserve()) {
        local_push(back.fiber);
    } else {
        try {
            push_locked(std::move(back), back.worker >= 0);
        } catch (...) {
            // No room to queue it: put the popped one back in front and run this one.
            local_head = (local_head - 1) & (local_ring.size() - 1);
            local_ring[local_head] = std::move(next.fiber);
            ++local_size;
            next = std::move(back);
        }
    }
    update_hints();
    return true;
}

// The yielder (in `back`) goes to the back of its level and the oldest task runs next,
// under ready.lock (held).
inline void Worker::requeue_in_line_locked(QueuedTask& back, QueuedTask& next, bool ring) {
    if (local_size != 0) flush_local_locked();  // to the front: they yielded before the rest came
    const std::size_t waiting = waiting_locked();
    if (waiting == 0) {
        next = std::move(back);  // nothing else to run: straight back to it
        return;
    }
    if (ring && waiting == 1 && ready.levels[static_cast<int>(Priority::Low)].empty() && local_reserve()) {
        // The last one, High or Normal (a Low one waits while this Normal fiber is ready, as
        // two of them would): the shared queues empty out, so this fiber may wait in the ring
        // (which only ever holds fibers older than everything queued there). Growing the
        // ring here, under the lock, happens only until it fits the yielding fibers.
        pop_locked(next);
        local_push(back.fiber);  // reserved: cannot fail
        return;
    }
    try {
        push_locked(std::move(back), back.worker >= 0);
    } catch (...) {
        next = std::move(back);  // no room to queue it: run it now rather than lose it
        return;
    }
    pop_locked(next);
}

inline bool Worker::local_reserve() noexcept {
    if (local_size < local_ring.size()) return true;
    // Grow to twice the size, oldest first; out of memory, the caller takes the locked path.
    std::vector<Fiber::ptr> grown;
    try {
        grown.resize(std::max<std::size_t>(8, 2 * local_ring.size()));
    } catch (...) {
        return false;
    }
    for (std::size_t i = 0; i < local_size; ++i) grown[i] = std::move(local_ring[(local_head + i) & (local_ring.size() - 1)]);
    local_ring.swap(grown);
    local_head = 0;
    return true;
}

inline void Worker::local_push(Fiber::ptr& fiber) noexcept {
    local_ring[(local_head + local_size) & (local_ring.size() - 1)] = std::move(fiber);
    ++local_size;
}

inline Fiber::ptr Worker::local_pop() noexcept {
    Fiber::ptr fiber = std::move(local_ring[local_head]);
    local_head = (local_head + 1) & (local_ring.size() - 1);
    --local_size;
    return fiber;
}

inline std::size_t Worker::take_yielded_prefix_locked() noexcept {
    // From one queue of the Normal level only while the other is empty: otherwise the two
    // are interleaved by sequence and a prefix of one is not a prefix of the line.
    Level& level = ready.levels[static_cast<int>(Priority::Normal)];
    const bool from_pinned = level.tasks.empty();
    if (!from_pinned && !level.pinned.empty()) return 0;
    TaskQueue& from = from_pinned ? level.pinned : level.tasks;
    std::size_t moved = 0;
    while (!from.empty() && from.front().kind == TaskKind::Claimed && local_reserve()) {
        local_push(from.front().fiber);
        from.pop_front();
        ++moved;
    }
    (from_pinned ? ready.pinned_count : ready.stealable_count) -= moved;
    if (moved != 0) update_hints();
    return moved;
}

inline void Worker::flush_local_locked() noexcept {
    // Newest first, each to the front: the ring's fibers are older than anything queued.
    while (local_size != 0) {
        const std::size_t newest = (local_head + local_size - 1) & (local_ring.size() - 1);
        QueuedTask task;
        task.fiber = std::move(local_ring[newest]);
        task.worker = FiberAccess::lifecycle(*task.fiber).resume_target().worker;
        task.kind = TaskKind::Claimed;
        try {
            push_front_locked(std::move(task), task.worker >= 0);
        } catch (...) {
            local_ring[newest] = std::move(task.fiber);  // push_front's strong guarantee: intact
            return;  // out of memory: the older rest stay in the ring and run from there
        }
        --local_size;
    }
}

inline bool Worker::take_local(QueuedTask& next) {
    fire_due_timers(*this);
    if (ready.queued.load(std::memory_order_relaxed) == 0) {
        take_claimed(next, local_pop());
        return true;
    }
    std::lock_guard<SpinLock> lock(ready.lock);
    flush_local_locked();
    if (pop_locked(next)) return true;
    // Out of memory with the queues empty: run the ring's oldest from there.
    if (local_size == 0) return false;
    take_claimed(next, local_pop());
    return true;
}

// The direct yield path: on a scheduler's only worker, inside run_loop, `fiber` has just
// yielded and nothing waits in the shared queues (by their hint). What run_loop's next
// pass would do, without a QueuedTask: count the pass for IO polling (but leave the 32nd to
// run_loop, which polls), end a caller's wait when it is satisfied, fire due timers (which
// queue what they wake, so the check of the queues comes after), and then swap `fiber`
// for the ring's oldest (requeue_yielded's unlocked branch, whose rules the ring keeps:
// see local_ring), or run it again when it is alone. False: leave it to run_loop.
inline bool Worker::direct_yield_next(Fiber::ptr& fiber) {
    if (!single || !direct_yield || tasks_since_io_poll + 1 >= 32) return false;
    if (FiberAccess::lifecycle(*fiber).resume_target().priority != Priority::Normal) return false;
    if (loop_wait && loop_wait->satisfied()) return false;
    if (timers.earliest.load(std::memory_order_relaxed) != no_deadline) fire_due_timers(*this);
    if (ready.queued.load(std::memory_order_relaxed) != 0) return false;
    ++tasks_since_io_poll;
    if (local_size != 0) {
        // Pop the oldest, then push `fiber` behind the rest: the slot freed by the pop
        // leaves room, so the ring never grows here. Two swaps, through the free slot
        // behind the newest: no reference count is touched, nothing to release.
        const std::size_t mask = local_ring.size() - 1;
        Fiber::ptr& oldest = local_ring[local_head];
        fiber.swap(oldest);
        oldest.swap(local_ring[(local_head + local_size) & mask]);  // that slot is empty or `oldest` itself
        local_head = (local_head + 1) & mask;
    }
    return true;
}

}  // namespace detail

namespace this_fiber {

namespace {
// yield() outside a scheduler task, out of line so that the task's path stays short.
FIBER_SCHED_NOINLINE FIBER_SCHED_COLD void yield_outside_task() {
    detail::SchedulerCore* core = detail::caller_may_help();
    // The use_caller thread runs one ready task instead, if there is one.
    if (!core || core->workers[0]->run_ready(1, detail::TimePoint::max()) == 0) std::this_thread::yield();
}
}  // namespace

namespace {
// SchedulerOptions::debug_migrate: the yield is a park whose hook wakes the fiber at once,
// so that wake_fiber() sends it to another worker (or back in line here, when there is none).
// In a simulation, the same: the woken fiber goes to the simulation's ready tasks.
FIBER_SCHED_NOINLINE FIBER_SCHED_COLD void yield_elsewhere() {
    // A whole record: the report reads every field of a parked fiber's.
    detail::note_wait(detail::WaitReason::Yield, nullptr);
    detail::park([](Fiber*, void*) { detail::wake_fiber(detail::take_task_ref()); }, nullptr);
}
}  // namespace

void yield() {
    detail::ThreadState* ts = detail::thread_state();
    if (!ts->task_fiber || ts->current != ts->task_fiber) {
        yield_outside_task();
        return;
    }
    if (FIBER_SCHED_UNLIKELY(ts->worker->migrate) &&
        (detail::FiberAccess::lifecycle(*ts->current).resume_target().worker < 0 || ts->worker->core.sim)) {
        yield_elsewhere();
        return;
    }
    // The worker takes the next fiber directly (Worker::direct_yield_next), or puts this one
    // back and takes the next task under one lock (run_loop); the fiber stays claimed
    // meanwhile (fiber_state.hpp). The hook runs on that worker once the switch is done.
    // One store: the report shows it runnable after a yield (park_current clears it).
    detail::FiberAccess::wait(*ts->current).kind.store(detail::WaitReason::Yield, std::memory_order_relaxed);
    detail::FiberAccess::park_current(
        ts->current, [](Fiber*, void* worker) { static_cast<detail::Worker*>(worker)->yield_pending = true; },
        ts->worker, true);
}

}  // namespace this_fiber
}  // namespace fsched
