// ---------------------------------------------------------------------------
// A Scheduler's life: construction (its idle wait's fds), start() (the worker threads),
// stop() and the exit protocol (SchedulerCore::outstanding), and the stopping thread
// standing in for workers that got no thread.
// Relies on: sched_core.ipp, sched_run_loop.ipp, sched_caller.ipp (run_ready).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"
#include "impl/report.ipp"

namespace fsched {
namespace detail {

void SchedulerCore::open_idle() {
    const char* failed = idle.open();
    for (std::size_t i = 0; !failed && i < workers.size(); ++i) failed = workers[i]->idle.open();
    if (failed) {
        // Out of fds (EMFILE) or kernel memory. The constructor throws, so no destructor runs
        // close_idle(): release the fds here, before building the exception, which may itself
        // need memory (or, under UBSan, a pipe).
        const int error = errno;
        close_idle();
        throw std::system_error(error, std::generic_category(), failed);
    }
    try {
        idle.register_for_cancel();  // only a fully opened scheduler
    } catch (...) {
        close_idle();
        throw;
    }
}

void SchedulerCore::close_idle() noexcept {
    idle.close();  // first: io::cancel() must not find it half closed
    for (auto& w : workers) w->idle.close();
}

void SchedulerCore::launch_threads() {
    // Only workers without a thread: after a failed start (out of threads) a later start()
    // or stop() starts the rest.
    for (std::size_t i = use_caller ? 1 : 0; i < workers.size(); ++i) {
        Worker* worker = workers[i].get();
        if (worker->thread.joinable()) continue;
        if (FIBER_SCHED_FAULT(ThreadStart)) {
            throw std::system_error(EAGAIN, std::generic_category(), "fiber_sched: cannot start a worker thread");
        }
        worker->thread = std::thread([this, worker] {
            os::name_thread(owner.name(), worker->index);
            worker->run_loop();
        });
    }
}

bool SchedulerCore::try_launch_threads() noexcept {
    try {
        launch_threads();
        return true;
    } catch (...) {
        return false;  // std::system_error (no thread to be had) or std::bad_alloc
    }
}

// A worker without a thread is one whose start failed; its queue (pinned tasks above all)
// has no one else to run it, and its parked fibers come back to it. So the stopping thread
// takes each such worker's place in turn, a bounded run_ready() at a time (which also fires
// its due timers, steals and polls IO when it finds nothing), and, while none of them has
// anything to run, tries again to start their threads and otherwise naps a millisecond:
// polling, but only while threads cannot be had. finished() ends it as it ends every run
// loop, and wakes the workers that have threads to leave theirs. With use_caller, worker 0
// is served here too (it never has a thread).
void SchedulerCore::stand_in_until_finished() {
    ThreadState* ts = thread_state();
    Worker* const outer_worker = ts->worker;  // run_ready() restores only the scheduler
    Fiber* const outer_task = ts->task_fiber;
    std::shared_ptr<Fiber>* const outer_ref = ts->task_ref;
    const std::size_t first_threaded = use_caller ? 1 : 0;
    for (;;) {
        std::size_t ran = 0;
        for (std::size_t i = 0; i < workers.size(); ++i) {
            if (i < first_threaded || !workers[i]->thread.joinable()) ran += workers[i]->run_ready(64, TimePoint::max());
        }
        ts->worker = outer_worker;
        ts->task_fiber = outer_task;
        ts->task_ref = outer_ref;
        if (finished()) return;
        if (ran != 0) continue;
        if (try_launch_threads()) {
            if (use_caller) workers[0]->run_loop();
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

}  // namespace detail

Scheduler::Scheduler(std::size_t threads, bool use_caller, std::string name)
    : name_(std::move(name)), thread_count_(threads),
      core_(std::make_unique<detail::SchedulerCore>(*this, threads, use_caller)) {}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
    detail::SchedulerCore& core = *core_;
    // A task calling start() while stop() runs it (stop() holds the mutex meanwhile) must
    // return, not wait for the mutex: stop() has set `started` before running anything.
    if (core.started.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(core.lifecycle_mutex);
    if (core.started.load(std::memory_order_relaxed)) return;
    core.launch_threads();  // may throw std::system_error (no more threads): start() again later
    core.started.store(true, std::memory_order_release);
}

void Scheduler::stop() {
    detail::SchedulerCore& core = *core_;
    FIBER_SCHED_ASSERT(current() != this && "stop(): called from inside one of the scheduler's own tasks");
    FIBER_SCHED_ASSERT((!core.use_caller || (core.caller_fiber ? detail::running_fiber() == core.caller_fiber
                                                               : std::this_thread::get_id() == core.caller_thread)) &&
                       "stop(): with use_caller, call stop() from the thread (or fiber) that constructed the scheduler");
    core.unlink_caller();  // from here on the caller thread blocks (outside stop()) as before
    std::lock_guard<std::mutex> lock(core.lifecycle_mutex);
    if (core.closed()) return;
    // FIBER_SCHED_HANG_REPORT_S: the report, once, if the tasks take that long to finish.
    const detail::HangWatch hang_watch(name_, detail::hang_report_from_environment());
    core.started.store(true, std::memory_order_release);  // start() after stop() does nothing
    core.stopping.store(true, std::memory_order_seq_cst);
    for (;;) {
        // Never throws, unlike start(): with a worker that has no thread (none could be
        // started), this thread runs its tasks (stand_in_until_finished).
        if (core.try_launch_threads()) {
            core.wake_all_workers();
            if (core.use_caller) core.workers[0]->run_loop();
        } else {
            core.wake_all_workers();
            core.stand_in_until_finished();
        }
        for (auto& worker : core.workers) {
            if (worker->thread.joinable()) worker->thread.join();
        }
        // Every worker left on exit_bit; close unless a schedule() came in since. Any
        // submit after this CAS sees closed_bit and is refused.
        std::int64_t idle = detail::SchedulerCore::exit_bit;
        if (core.outstanding.compare_exchange_strong(idle, detail::SchedulerCore::closed_bit,
                                                     std::memory_order_seq_cst)) {
            break;
        }
        // Run what was scheduled while the workers left: the loop starts them again.
        core.outstanding.fetch_sub(detail::SchedulerCore::exit_bit, std::memory_order_seq_cst);
    }
    // A thread that queued one of the last tasks may still be reading this scheduler.
    while (core.outside_enqueues.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

}  // namespace fsched
