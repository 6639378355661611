// ---------------------------------------------------------------------------
// Submission: Scheduler::submit() (one task) and submit_batch() (one lock per worker,
// all of a worker's share or none), and the Scheduler's small public calls.
// Relies on: sched_core.ipp (enqueue, after_push, count_new).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

// A batch dealt out to the workers (submit_batch): each worker's pinned tasks, and its share
// of the unpinned ones, indexed by worker.
struct BatchShares {
    std::vector<std::vector<QueuedTask>> pinned, unpinned;
};

// One lock per worker: pinned tasks grouped by worker, the rest dealt out in runs, from
// outside round robin past the use_caller thread's worker 0 (outside_target), from a
// worker all to it. Built before anything is counted, so running out of memory here
// (std::bad_alloc) changes nothing; `tasks` is left moved from only when it returns.
inline BatchShares deal_batch(SchedulerCore& core, const Worker* here, std::vector<NewTask>& tasks) {
    const std::size_t n = core.workers.size();
    BatchShares shares{std::vector<std::vector<QueuedTask>>(n), std::vector<std::vector<QueuedTask>>(n)};
    const std::size_t first = !here && core.use_caller && n > 1 ? 1 : 0;
    const std::size_t slots = n - first;
    std::size_t next = here ? static_cast<std::size_t>(here->index) : core.outside_target();
    std::size_t free_count = 0;
    std::vector<std::size_t> pinned_count(n);
    for (const NewTask& task : tasks) {
        if (task.thread < 0) {
            ++free_count;
        } else {
            ++pinned_count[static_cast<std::size_t>(task.thread)];
        }
    }
    const std::size_t run = here ? free_count : (free_count + slots - 1) / slots;  // a worker's unpinned share, at most
    for (std::size_t i = 0; i < n; ++i) {
        shares.pinned[i].reserve(pinned_count[i]);
        if (!here || i == next) shares.unpinned[i].reserve(run);
    }
    // Reserved above: from here on nothing allocates, so no task is left half moved.
    std::size_t in_run = 0;
    for (NewTask& task : tasks) {
        QueuedTask queued(std::move(task));
        if (queued.worker >= 0) {
            shares.pinned[static_cast<std::size_t>(queued.worker)].push_back(std::move(queued));
            continue;
        }
        shares.unpinned[next].push_back(std::move(queued));
        if (++in_run == run) {
            in_run = 0;
            next = first + (next - first + 1) % slots;
        }
    }
    return shares;
}

// Queues one worker's share under its lock: all of it or none (a failed push_back changed
// nothing, and what was pushed before it is taken back), then publishes the hints.
inline void queue_share(Worker& w, std::vector<QueuedTask>& pinned, std::vector<QueuedTask>& unpinned) {
    std::lock_guard<SpinLock> lock(w.ready.lock);
    Worker::Sizes before;
    w.sizes_locked(before);
    try {
        for (const bool own_pinned : {true, false}) {
            for (QueuedTask& t : own_pinned ? pinned : unpinned) {
                if (FIBER_SCHED_FAULT(TaskQueue)) throw std::bad_alloc();
                w.push_locked(std::move(t), own_pinned);
            }
        }
    } catch (...) {
        w.truncate_locked(before);
        throw;
    }
    w.update_hints();
}

}  // namespace detail



void Scheduler::submit(detail::NewTask task) {
    detail::SchedulerCore& core = *core_;
    core.check_task(task);
    detail::QueuedTask queued(std::move(task));
    core.count_new(1);
    try {
        if (FIBER_SCHED_FAULT(TaskQueue)) throw std::bad_alloc();
        core.enqueue(std::move(queued));
    } catch (...) {
        core.task_finished();  // not queued: not outstanding either
        throw;
    }
}

void Scheduler::submit_batch(std::vector<detail::NewTask>& tasks) {
    detail::SchedulerCore& core = *core_;
    if (tasks.empty()) return;
    for (const detail::NewTask& task : tasks) core.check_task(task);
    if (core.sim) {
        // One at a time into the simulation's ready tasks (no worker queues there). Those
        // queued before a throw run; the rest are dropped, as with the queues.
        for (detail::NewTask& task : tasks) submit(std::move(task));
        return;
    }
    detail::Worker* here = core.current_worker();
    detail::BatchShares shares = detail::deal_batch(core, here, tasks);  // may throw: nothing counted yet
    const auto total = static_cast<std::int64_t>(tasks.size());
    core.count_new(total);
    const detail::SchedulerCore::OutsideEnqueue guard(core.outside_enqueues, here == nullptr);
    std::int64_t queued_count = 0;
    try {
        for (std::size_t i = 0; i < core.workers.size(); ++i) {
            std::vector<detail::QueuedTask>& pinned = shares.pinned[i];
            std::vector<detail::QueuedTask>& unpinned = shares.unpinned[i];
            if (pinned.empty() && unpinned.empty()) continue;
            detail::Worker& w = *core.workers[i];
            detail::queue_share(w, pinned, unpinned);
            queued_count += static_cast<std::int64_t>(pinned.size() + unpinned.size());
            if (!pinned.empty()) core.after_push(w, true, 1);
            if (!unpinned.empty()) core.after_push(w, false, unpinned.size());
        }
    } catch (...) {
        // The workers' shares queued so far run; the rest were not queued and are not counted.
        core.tasks_finished(total - queued_count);
        throw;
    }
}

void Scheduler::give_own_stack(detail::NewTask& task, std::size_t stack_size) {
    FIBER_SCHED_ASSERT(!task.fiber && "schedule(): a ScheduleTask with a fiber cannot have a stack_size (the fiber has its stack)");
    if (!task.cb) return;  // submit() names that misuse
    // Made here, so the worker runs it as any fiber task, and never pools it (run_task):
    // the pool keeps the scheduler's size only.
    task.fiber = detail::FiberAccess::make_in_stack(std::move(task.cb), stack_size);
    task.cb = nullptr;
}

Scheduler* Scheduler::current() noexcept { return detail::thread_state()->scheduler; }

namespace detail {
int worker_number(const Worker* worker) noexcept { return worker ? worker->index : -1; }
}  // namespace detail

int Scheduler::worker_index() noexcept {
    detail::Worker* worker = detail::thread_state()->worker;
    return worker ? worker->index : -1;
}

void Scheduler::set_exception_handler(std::function<void(std::exception_ptr)> handler) {
    auto shared = std::make_shared<const std::function<void(std::exception_ptr)>>(std::move(handler));
    std::lock_guard<std::mutex> lock(core_->handler_mutex);
    core_->handler = std::move(shared);
}

}  // namespace fsched
