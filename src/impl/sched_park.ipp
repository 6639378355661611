// ---------------------------------------------------------------------------
// Parking and waking, the interface every primitive uses (scheduler.hpp): park(),
// wake_fiber() (into the waker's run-next slot, else a queue), a deferred resume, and the
// worker an ended IO wait wakes (wake_for_io).
// Relies on: sched_core.ipp, sched_runnext.ipp (put_runnext).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

// A fiber a failed testing::simulate() run abandoned, woken by a primitive that outlived
// the run: says so on stderr (simulation.ipp).
void drop_abandoned_wake(Fiber& fiber) noexcept;

#if defined(FIBER_SCHED_HAVE_EPOLL)
void wake_for_io(SchedulerIdle& idle) noexcept {
    SchedulerCore& core = *idle.core;
    for (auto& w : core.workers) {
        if (core.wake_worker(*w)) return;
    }
}
#endif

namespace {
// SchedulerOptions::debug_migrate: an unpinned fiber's next run goes to another worker than
// the one it waited on, as a task pinned there for this run only (no one steals it back);
// the fiber itself stays unpinned.
FIBER_SCHED_NOINLINE void pin_elsewhere(SchedulerCore& core, QueuedTask& task) noexcept {
    if (Worker* w = core.migration_target(FiberAccess::last_worker(*task.fiber))) task.worker = w->index;
}
}  // namespace

void resume_deferred(Fiber& fiber) {
    // The fiber has left the scheduler and is still claimed (Running) for this resume.
    const ResumeTarget target = FiberAccess::lifecycle(fiber).take_deferred();
    QueuedTask task;
    task.kind = TaskKind::Claimed;
    task.fiber = fiber.shared_from_this();
    task.worker = target.worker;
    task.priority = target.priority;
    SchedulerCore& core = SchedulerCore::of(*target.scheduler);
    if (FIBER_SCHED_UNLIKELY(core.migrate) && target.worker < 0) pin_elsewhere(core, task);
    core.enqueue_fiber(std::move(task));
}

Fiber::ptr take_task_ref() noexcept {
    // Moves the worker's own reference instead of counting a new one: no atomic add/sub.
    return std::move(*thread_state()->task_ref);
}

void park(void (*on_parked)(Fiber*, void*), void* arg) {
    FIBER_SCHED_ASSERT(in_scheduler_task() && "park(): only a scheduler task fiber can park");
    FiberAccess::park_current(on_parked, arg, false);
}

void wake_fiber(Fiber::ptr fiber) noexcept {
    // The report shows it runnable from here on, not parked on a wait that is over.
    FiberAccess::woken(*fiber).store(true, std::memory_order_relaxed);
    if (observing()) observe_wake(*fiber);
    const ResumeTarget target = FiberAccess::lifecycle(*fiber).resume_target();
    if (FIBER_SCHED_UNLIKELY(!target.scheduler)) {
        drop_abandoned_wake(*fiber);  // the kept list holds it still: this drops a reference only
        return;
    }
    SchedulerCore& core = SchedulerCore::of(*target.scheduler);
    const bool migrate = FIBER_SCHED_UNLIKELY(core.migrate) && target.worker < 0;
    if (target.worker < 0 && target.priority == Priority::Normal && !migrate && !core.sim) {
        // Woken by a task of its scheduler: into the waker's run-next slot.
        ThreadState* ts = thread_state();
        if (ts->scheduler == target.scheduler && ts->worker && ts->task_fiber && ts->worker->put_runnext(fiber)) return;
    }
    QueuedTask task;
    task.kind = TaskKind::Woken;
    task.worker = target.worker;
    task.priority = target.priority;  // a woken fiber keeps its task's priority
    task.fiber = std::move(fiber);
    if (migrate) pin_elsewhere(core, task);
    core.enqueue_fiber(std::move(task));
}

bool in_scheduler_task() noexcept {
    ThreadState* ts = thread_state();
    return ts->task_fiber && ts->current == ts->task_fiber;
}

}  // namespace detail

namespace this_fiber {

std::uint64_t id() {
    Fiber* fiber = detail::running_fiber();
    return fiber ? fiber->id() : 0;
}

}  // namespace this_fiber
}  // namespace fsched
