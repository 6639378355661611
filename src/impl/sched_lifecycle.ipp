// ---------------------------------------------------------------------------
// A Scheduler's life: construction (its options, its idle wait's fds), start() (the worker
// threads, pinned and hooked: run_worker_thread), stop() and the exit protocol
// (SchedulerCore::outstanding), the stopping thread standing in for workers that got no
// thread, and stats().
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

void SchedulerCore::check_options() const {
    // The smallest size make_in_stack adds its own room to stays below the limit.
    if (options.stack_size > max_stack_size - FiberAccess::in_stack_room) {
        throw std::length_error("fiber_sched: Scheduler(): stack_size is above the limit (fsched::detail::max_stack_size)");
    }
    FIBER_SCHED_ASSERT(options.timer_slack.count() >= 0 && "Scheduler(): timer_slack is negative");
    FIBER_SCHED_ASSERT(options.timer_spin.count() >= 0 && "Scheduler(): timer_spin is negative");
    if (options.cpu_affinity.empty()) return;
    const int cpus = os::cpu_limit();
    for (const int cpu : options.cpu_affinity) {
        FIBER_SCHED_ASSERT(cpu >= 0 && cpu < cpus &&
                           "Scheduler(): a cpu_affinity entry is negative or not below the number of CPUs");
    }
}

void SchedulerCore::launch_threads() {
    if (sim) return;  // a simulation's workers take turns on its thread
    // Only workers without a thread: after a failed start (out of threads) a later start()
    // or stop() starts the rest.
    for (std::size_t i = use_caller ? 1 : 0; i < workers.size(); ++i) {
        Worker* worker = workers[i].get();
        if (worker->thread.joinable()) continue;
        if (FIBER_SCHED_FAULT(ThreadStart)) {
            throw std::system_error(EAGAIN, std::generic_category(), "fiber_sched: cannot start a worker thread");
        }
        worker->thread = std::thread([this, worker] { run_worker_thread(*worker); });
    }
}

// on_thread_start after the name, the pin and the timer slack, so that a hook sees the
// thread as its tasks will (and may change them); on_thread_stop once the loop has left for good (exit_bit), before the thread ends.
void SchedulerCore::run_worker_thread(Worker& worker) noexcept {
    os::name_thread(owner.name(), worker.index);
    pin_worker_thread(worker.index);
    if (options.timer_slack.count() > 0) os::set_timer_slack(options.timer_slack);
    run_thread_hook(options.on_thread_start, worker.index);
    worker.run_loop();
    run_thread_hook(options.on_thread_stop, worker.index);
}

void SchedulerCore::run_thread_hook(const std::function<void(int)>& hook, int worker) noexcept {
    if (!hook) return;
    try {
        hook(worker);
    } catch (...) {
        report(std::current_exception(), false);
    }
}

void SchedulerCore::pin_worker_thread(int worker) noexcept {
    const std::vector<int>& cpus = options.cpu_affinity;
    if (cpus.empty()) return;
    const int cpu = cpus[static_cast<std::size_t>(worker) % cpus.size()];
    std::error_code error;
    if (FIBER_SCHED_FAULT(CpuPin)) {
        error = std::make_error_code(std::errc::invalid_argument);
    } else if (os::pin_thread_to_cpu(cpu, error)) {
        return;
    } else if (error == std::errc::not_supported) {
        return;  // no pinning on this system (macOS, the BSDs): documented, not an error
    }
    // The worker runs unpinned; the handler hears why. Building the message may throw
    // std::bad_alloc, which goes to the handler instead.
    try {
        throw std::system_error(error, "fiber_sched: cannot pin worker " + std::to_string(worker) + " of scheduler '" +
                                           owner.name() + "' to CPU " + std::to_string(cpu));
    } catch (...) {
        report(std::current_exception(), false);
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

namespace detail {
inline SchedulerOptions positional_options(std::size_t threads, bool use_caller, std::string&& name) {
    SchedulerOptions options;
    options.threads = threads;
    options.use_caller = use_caller;
    options.name = std::move(name);
    return options;
}
}  // namespace detail

Scheduler::Scheduler(std::size_t threads, bool use_caller, std::string name)
    : Scheduler(detail::positional_options(threads, use_caller, std::move(name))) {}

// A throw from on_thread_start(0) leaves the constructor: no thread was started yet (start()
// does that), and core_'s destructor unlinks the caller and closes the idle wait.
Scheduler::Scheduler(const SchedulerOptions& options)
    : name_(options.name), thread_count_(options.threads),
      core_(std::make_unique<detail::SchedulerCore>(*this, options)) {
    if (core_->use_caller && core_->options.on_thread_start) core_->options.on_thread_start(0);
}

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
    // The use_caller thread's on_thread_stop once the scheduler is closed, by the stop()
    // that closed it, outside the lock (a hook may call stop() again: it returns at once).
    if (core.stop_and_close() && core.use_caller) core.run_thread_hook(core.options.on_thread_stop, 0);
}

namespace detail {

bool SchedulerCore::stop_and_close() {
    if (sim) return sim_stop();
    std::lock_guard<std::mutex> lock(lifecycle_mutex);
    if (closed()) return false;
    // The report, once, if the tasks take as long as the option or FIBER_SCHED_HANG_REPORT_S says.
    const HangWatch hang_watch(owner.name(), options.hang_report_after.count() > 0 ? options.hang_report_after
                                                                                 : hang_report_from_environment());
    started.store(true, std::memory_order_release);  // start() after stop() does nothing
    stopping.store(true, std::memory_order_seq_cst);
    for (;;) {
        // Never throws, unlike start(): with a worker that has no thread (none could be
        // started), this thread runs its tasks (stand_in_until_finished).
        if (try_launch_threads()) {
            wake_all_workers();
            if (use_caller) workers[0]->run_loop();
        } else {
            wake_all_workers();
            stand_in_until_finished();
        }
        for (auto& worker : workers) {
            if (worker->thread.joinable()) worker->thread.join();
        }
        // Every worker left on exit_bit; close unless a schedule() came in since. Any
        // submit after this CAS sees closed_bit and is refused.
        std::int64_t idle = exit_bit;
        if (outstanding.compare_exchange_strong(idle, closed_bit, std::memory_order_seq_cst)) {
            break;
        }
        // Run what was scheduled while the workers left: the loop starts them again.
        outstanding.fetch_sub(exit_bit, std::memory_order_seq_cst);
    }
    // A thread that queued one of the last tasks may still be reading this scheduler.
    while (outside_enqueues.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    return true;
}

}  // namespace detail

SchedulerStats Scheduler::stats() const {
    const detail::SchedulerCore& core = *core_;
    SchedulerStats stats;
    stats.idle_time.reserve(core.workers.size());
    stats.queued.reserve(core.workers.size());
    const detail::TimePoint now = std::chrono::steady_clock::now();
    for (const auto& w : core.workers) {
        const detail::Worker::Counters& c = w->counters;
        stats.tasks_run += c.tasks_run.load(std::memory_order_relaxed);
        stats.steals += c.steals.load(std::memory_order_relaxed);
        stats.tasks_stolen += c.tasks_stolen.load(std::memory_order_relaxed);
        stats.parks += c.parks.load(std::memory_order_relaxed);
        stats.wakes += c.wakes.load(std::memory_order_relaxed);
        stats.timers_fired += c.timers_fired.load(std::memory_order_relaxed);
        stats.sleeps += c.sleeps.load(std::memory_order_relaxed);
        stats.timer_spins += c.timer_spins.load(std::memory_order_relaxed);
        stats.timer_spin_time +=
            std::chrono::nanoseconds(static_cast<std::int64_t>(c.timer_spin_ns.load(std::memory_order_relaxed)));
        stats.idle_time.push_back(w->idle_time(now));
        stats.queued.push_back(w->ready.queued.load(std::memory_order_relaxed));  // the hint: no lock
    }
    return stats;
}

}  // namespace fsched
