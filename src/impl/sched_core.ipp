// ---------------------------------------------------------------------------
// SchedulerCore: what one Scheduler's workers share. The count of outstanding tasks and
// the exit protocol's bits, the counts of sleeping and spinning workers, the round robin
// for tasks from outside, the exception handler; and the inline paths every submit and
// wake-up takes (enqueue, after_push, wake_worker).
// Relies on: sched_worker.ipp (Worker), the idle wait's shared part (SchedulerIdle).
//
// The scheduler, overall (its parts are the sched_*.ipp files; src/README.md maps them;
// docs/design.md draws the run loop, the fiber states and the lost-wake-up argument):
//
// Each worker owns a run queue (a TaskQueue under the worker's ready.lock) and a queue
// of tasks pinned to it, one pair per priority level (High, Normal, Low). A worker takes from its
// own queues first, highest level first, then steals from the back of the other workers'
// run queues, the highest level its victim has; pinned queues are never stolen from. While
// any worker has a stealable High task (SchedulerCore::stealable_high), one looking for work
// takes it before its own Normal and Low ones. All Normal, the common case, pays one look at
// an empty level and one load of that shared, rarely written counter. Tasks scheduled inside a
// worker go to its own queue; tasks from other threads go round-robin across the workers.
// Callbacks run in pooled fibers, reset for each task, so their stacks are reused (all of
// the scheduler's stack size: a task with a size of its own gets its fiber in schedule()).
//
// Idle: a worker with nothing to do spins briefly (checking every queue), then sleeps in
// its idle wait (WorkerIdle::wait, idle_epoll.ipp or idle_condvar.ipp), the one place a
// worker blocks, until notified or until the earliest timer is due. New work wakes one
// sleeping worker, and only when no worker is spinning already (a spinner will find it);
// pinned work wakes its own worker. Why no wake-up is lost: above Worker::sleep_until_work
// (sched_run_loop.ipp).
//
// Parking: a task fiber parks by switching out with an after-switch hook (Fiber's
// after_switch_); resume() runs the hook on the worker only after the switch is complete,
// so whoever the hook hands the fiber to may resume it at once: no fiber is ever queued
// while still running on another worker (a fiber resumed twice at once cannot happen).
// schedule(fiber) on a fiber that a user let escape before its Fiber::yield() finished is
// the one case where a fiber can be found Running: claim_or_defer() then marks it
// RunningResumePending and the resumer re-enqueues it after the switch (fiber_state.hpp).
//
// Timers: each worker keeps a heap of the fibers that parked on it with a deadline; it adds
// to it, any worker fires its due timers, and an idle wait ends at the earliest deadline of
// all the workers.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_worker.ipp"

namespace fsched {
namespace detail {

// testing::simulate()'s side of a simulated scheduler (simulation.ipp).
void sim_attach(Simulation& sim, SchedulerCore& core);
void sim_detach(Simulation& sim, SchedulerCore& core) noexcept;
void sim_enqueue(Simulation& sim, SchedulerCore& core, QueuedTask&& task);
void sim_record_error(Simulation& sim, std::exception_ptr error) noexcept;
// Says `rule` on stderr and aborts: a misuse inside a simulation that cannot be undone.
[[noreturn]] void sim_fatal(const char* rule) noexcept;

struct SchedulerCore {
    SchedulerCore(Scheduler& owner_, const SchedulerOptions& options_)
        : owner(owner_), options(options_), use_caller(options_.use_caller),
          migrate(migration_checked(options_)), sim(thread_state()->simulation),
          caller_thread(std::this_thread::get_id()), caller_fiber(running_fiber()) {
        const std::size_t threads = options.threads;
        check_options();  // before anything is opened: it may throw
        // Before this scheduler can start a thread or link itself as its caller's: the fork
        // handlers exist by then, and so does everything they guard (build_process_state).
        build_process_state();
#if defined(FIBER_SCHED_HAVE_EPOLL)
        idle.core = this;
#endif
        FIBER_SCHED_ASSERT(threads > 0 && "Scheduler(): threads must be at least 1");
        FIBER_SCHED_ASSERT(threads < 65536 && "Scheduler(): threads must be below 65536");
        for (std::size_t i = 0; i < threads; ++i) {
            workers.push_back(std::make_unique<Worker>(*this, static_cast<int>(i), threads == 1, migrate || sim));
        }
        for (auto& w : workers) w->runnext_looks.resize(threads);
        open_idle();  // releases what it opened before it throws
        if (sim) {
            try {
                sim_attach(*sim, *this);
            } catch (...) {
                close_idle();
                throw;
            }
        }
        if (use_caller && !caller_fiber) {
            // Constructed on a thread's own stack: that thread helps while it blocks.
            ThreadState* ts = thread_state();
            previous_caller_core = ts->caller_core;
            ts->caller_core = this;
            caller_linked = true;
        }
    }
    // Takes this scheduler out of its caller thread's ThreadState::caller_core chain (on
    // that thread; stop() asserts it is). Harmless when not linked.
    void unlink_caller() noexcept {
        if (!caller_linked) return;
        SchedulerCore** at = &thread_state()->caller_core;
        while (*at && *at != this) at = &(*at)->previous_caller_core;
        if (*at) *at = previous_caller_core;
        caller_linked = false;
    }
    // The caller thread's chain of helped schedulers (ThreadState::caller_core), and
    // whether this one is in it; only that thread touches them.
    SchedulerCore* previous_caller_core = nullptr;
    bool caller_linked = false;
    ~SchedulerCore() {
        if (sim) sim_detach(*sim, *this);
        unlink_caller();
        close_idle();
    }
    SchedulerCore(const SchedulerCore&) = delete;
    SchedulerCore& operator=(const SchedulerCore&) = delete;

    // Opens / closes the idle wait's fds (none on the condition-variable backend).
    void open_idle();
    void close_idle() noexcept;
    // The idle wait's part shared by the workers; with epoll also what fsched::io keeps.
    SchedulerIdle idle;

    Scheduler& owner;
    // As constructed; read-only from then on, by any thread.
    const SchedulerOptions options;
    const bool use_caller;
    // SchedulerOptions::debug_migrate, or its macro or environment variable.
    const bool migrate;
    static bool migration_checked(const SchedulerOptions& o) noexcept {
#if defined(FIBER_SCHED_DEBUG_MIGRATE)
        (void)o;
        return true;
#else
        const char* env = std::getenv("FIBER_SCHED_DEBUG_MIGRATE");
        return o.debug_migrate || (env && env[0] == '1' && env[1] == 0);
#endif
    }
    // With `migrate`: the worker a fiber that waited on `from` resumes on, another one that
    // runs tasks by itself (taking turns among them); nullptr if there is none.
    Worker* migration_target(const Worker* from) noexcept {
        const std::size_t n = workers.size();
        const std::size_t first = use_caller ? 1 : 0;
        if (n <= first) return nullptr;
        const std::size_t start = migration_turn.fetch_add(1, std::memory_order_relaxed);
        for (std::size_t k = 0; k < n; ++k) {
            Worker* w = workers[first + (start + k) % (n - first)].get();
            if (w != from) return w;
        }
        return nullptr;
    }
    std::atomic<std::size_t> migration_turn{0};
    // The testing::simulate() this scheduler was made in (on its thread), or nullptr: its
    // tasks then queue into the simulation, and start() starts no thread (simulation.ipp).
    // Cleared when the simulation ends with this scheduler abandoned in it.
    Simulation* sim;
    // Where stop() must be called from with use_caller: the constructing thread, or the
    // constructing fiber when the scheduler was made inside one (it may change threads).
    const std::thread::id caller_thread;
    Fiber* const caller_fiber;
    std::vector<std::unique_ptr<Worker>> workers;

    std::mutex lifecycle_mutex;  // start() and stop()
    // Written under lifecycle_mutex; read without it by start()'s first look (release /
    // acquire: a start() that sees it set returns at once, as one from a task must while
    // stop() holds the mutex and runs that task).
    std::atomic<bool> started{false};
    // Set by stop(); workers read it to know they may exit once outstanding is zero.
    std::atomic<bool> stopping{false};
    // Tasks scheduled and not finished: queued, running, parked or sleeping. Incremented
    // before a task is queued, decremented when it finishes; seq_cst pairs with `sleeping`.
    // Two high bits end a stop(): a worker that finds nothing outstanding while stopping
    // sets exit_bit with a CAS from 0, and every worker leaves once it sees the bit (all of
    // them, so no task can be queued on a worker that has gone while the others sleep).
    // stop() then joins them and sets closed_bit with a CAS from exactly exit_bit; a task
    // counted meanwhile fails that CAS, and stop() clears exit_bit and starts the workers
    // again. A submit whose increment finds closed_bit is refused: every accepted task was
    // counted before the close, and the close waits for it.
    static constexpr std::int64_t exit_bit = std::int64_t{1} << 61;
    static constexpr std::int64_t closed_bit = std::int64_t{1} << 62;
    std::atomic<std::int64_t> outstanding{0};
    // Threads outside this scheduler's workers inside enqueue() (a wake-up or a submit from
    // elsewhere): the task they push may run and finish, and stop() return, before they
    // are done touching this scheduler, so stop() waits for this to drop to zero.
    std::atomic<int> outside_enqueues{0};
    // Counts the calling thread in outside_enqueues while it lives, when `outside`.
    class OutsideEnqueue {
    public:
        OutsideEnqueue(std::atomic<int>& count, bool outside) noexcept : count_(outside ? &count : nullptr) {
            if (count_) count_->fetch_add(1, std::memory_order_seq_cst);  // before the push
        }
        ~OutsideEnqueue() {
            if (count_) count_->fetch_sub(1, std::memory_order_release);  // after the last read
        }
        OutsideEnqueue(const OutsideEnqueue&) = delete;
        OutsideEnqueue& operator=(const OutsideEnqueue&) = delete;

    private:
        std::atomic<int>* count_;
    };
    // Workers spinning for work / asleep; seq_cst, see the lost-wake-up argument
    // (sleep_until_work).
    std::atomic<int> spinning{0};
    std::atomic<int> sleepers{0};
    // Workers asleep for at most runnext_watch_period because some worker's run-next slot
    // is in use (sleep_until_work): while there is one, put_runnext wakes no one. seq_cst.
    std::atomic<int> runnext_watchers{0};
    std::atomic<std::uint64_t> runnext_stuck_taken{0};  // for the tests; written only when it happens
    static constexpr std::chrono::milliseconds runnext_watch_period{1};
    // Round-robin target for tasks from threads outside the scheduler; relaxed, a hint.
    std::atomic<unsigned> next_worker{0};
    // Stealable High tasks in all the workers' queues, changed under the queue lock of the
    // worker they are in and read without it: while it is not zero a worker looking for
    // work takes a High task from anywhere before a Normal one of its own (find_task), so an
    // urgent task does not wait behind the bulk of another worker's queue. A hint: a stale
    // read costs a needless look or leaves that task to the strict per-worker order. On a
    // line of its own, written only when High tasks move.
    alignas(64) std::atomic<long> stealable_high{0};

    std::mutex handler_mutex;
    // Shared so report() takes it without copying a std::function (which could throw).
    std::shared_ptr<const std::function<void(std::exception_ptr)>> handler;

    static SchedulerCore& of(Scheduler& s) noexcept { return *s.core_; }

    Worker* current_worker() const noexcept {
        ThreadState* ts = thread_state();
        return ts->scheduler == &owner ? ts->worker : nullptr;
    }

    // The options' misuse (FIBER_SCHED_ASSERT) and limits (throws std::length_error).
    void check_options() const;
    // Starts the worker threads (all but worker 0 with use_caller). Under lifecycle_mutex.
    void launch_threads();
    // A worker's thread: pinned and hooked around its run loop.
    void run_worker_thread(Worker& worker) noexcept;
    // Runs an on_thread_start/on_thread_stop hook (if set), sending what it throws to
    // report(), outside any run loop.
    void run_thread_hook(const std::function<void(int)>& hook, int worker) noexcept;
    // Pins the calling thread to worker `worker`'s CPU in options.cpu_affinity (if any);
    // a failure goes to report() as a std::system_error.
    void pin_worker_thread(int worker) noexcept;
    // stop()'s work under lifecycle_mutex: false when the scheduler had stopped already.
    bool stop_and_close();
    // stop_and_close() in a simulation: its tasks run on (the caller waits parked, in
    // virtual time) until none is outstanding (simulation.ipp).
    bool sim_stop();
    // launch_threads() for stop(), which must not throw (it runs in ~Scheduler): true if
    // every worker that needs a thread has one now.
    bool try_launch_threads() noexcept;
    // stop() without a thread for some worker (out of threads: RLIMIT_NPROC, no memory):
    // the stopping thread runs those workers' tasks itself until none is outstanding.
    void stand_in_until_finished();

    bool closed() const noexcept { return (outstanding.load(std::memory_order_acquire) & closed_bit) != 0; }

    // True once this worker may leave its loop: stop() runs and nothing is outstanding.
    bool finished() noexcept {
        std::int64_t n = outstanding.load(std::memory_order_seq_cst);
        if (n & exit_bit) return true;
        if (n != 0 || !stopping.load(std::memory_order_seq_cst)) return false;
        if (outstanding.compare_exchange_strong(n, exit_bit, std::memory_order_seq_cst) || (n & exit_bit)) {
            wake_all_workers();  // the others leave too; a sleeper set `sleeping` before it looked
            return true;
        }
        return false;
    }

    // Counts `n` new tasks; refuses them once stop() has closed the scheduler.
    void count_new(std::int64_t n) {
        if (outstanding.fetch_add(n, std::memory_order_seq_cst) & closed_bit) {
            outstanding.fetch_sub(n, std::memory_order_seq_cst);
            FIBER_SCHED_ASSERT(false && "schedule(): scheduler has stopped (stop() has returned)");
        }
    }

    // The worker an unpinned task from outside the scheduler goes to: round robin, past the
    // use_caller thread's worker 0, which runs only while that thread helps or stops (a
    // task queued there would wait for that, or for a worker idle enough to steal it).
    std::size_t outside_target() noexcept {
        const std::size_t n = workers.size();
        const std::size_t turn = next_worker.fetch_add(1, std::memory_order_relaxed);
        return use_caller && n > 1 ? 1 + turn % (n - 1) : turn % n;
    }

    // Queues a task that is already counted in `outstanding`. Strong guarantee.
    void enqueue(QueuedTask&& task) {
        if (FIBER_SCHED_UNLIKELY(sim != nullptr)) {
            sim_enqueue(*sim, *this, std::move(task));
            return;
        }
        Worker* here = current_worker();
        const OutsideEnqueue guard(outside_enqueues, here == nullptr);
        Worker& target = task.worker >= 0 ? *workers[static_cast<std::size_t>(task.worker)]
                         : here          ? *here
                                         : *workers[outside_target()];
        const bool pinned = task.worker >= 0;
        target.push(std::move(task), pinned);
        if (FIBER_SCHED_FAULT(EnqueuePause)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        after_push(target, pinned, 1);
    }

    // Queues a fiber coming back from a park (or a deferred schedule): it is counted and
    // has no other way back, so it must not be dropped. Out of memory, wait for some.
    void enqueue_fiber(QueuedTask&& task) noexcept {
        for (;;) {
            try {
                enqueue(std::move(task));
                return;
            } catch (...) {
                std::this_thread::yield();  // push_back's strong guarantee: task is intact
            }
        }
    }

    // Wakes whoever should take newly queued work; `count` tasks went to `target`.
    void after_push(Worker& target, bool pinned, std::size_t count) {
        if (sleepers.load(std::memory_order_seq_cst) == 0) return;  // no one to wake
        if (wake_worker(target)) {
            if (pinned || --count == 0) return;
        } else if (pinned) {
            return;  // its own worker is awake and will see it
        }
        if (spinning.load(std::memory_order_seq_cst) > 0) return;  // a spinner will find it
        for (std::size_t i = 0; count > 0 && i < workers.size(); ++i) {
            if (wake_worker(*workers[i])) --count;
        }
    }

    // Clears `w.sleeping` if set; whoever succeeds (a waker, or `w` itself when it stops
    // waiting) accounts for it in `sleepers`. True if this call cleared it.
    bool claim_worker_wake(Worker& w) noexcept {
        bool expected = true;
        if (!w.sleeping.compare_exchange_strong(expected, false, std::memory_order_seq_cst)) return false;
        sleepers.fetch_sub(1, std::memory_order_seq_cst);
        return true;
    }

    // Wakes `w` if it sleeps; true if this call claimed that. A worker that wakes itself
    // (between announcing its sleep and sleeping, or as the poller dispatching what it
    // waited for, it queued a task) is awake: the claim is all it needs, and a signal would
    // only make its next sleep end at once (a write, a wasted epoll return and two reads of
    // the eventfd per sleep of a one-worker server).
    bool wake_worker(Worker& w) noexcept {
        if (!claim_worker_wake(w)) return false;
        if (thread_state()->worker != &w) w.notify();
        return true;
    }

    void wake_all_workers() noexcept {
        for (auto& w : workers) wake_worker(*w);
    }

    // `n` counted tasks are done (or were never queued after all).
    void tasks_finished(std::int64_t n) noexcept {
        if (outstanding.fetch_sub(n, std::memory_order_seq_cst) == n && stopping.load(std::memory_order_seq_cst)) {
            wake_all_workers();
        }
    }
    void task_finished() noexcept { tasks_finished(1); }

    static const char* what_failed(bool in_loop) noexcept {
        return in_loop ? "an exception escaped a task" : "an exception came from a thread hook or CPU pin";
    }
    // `in_loop`: called from a worker's loop (a task, a fiber that could not be made), not
    // from a thread hook or a pin outside it.
    void report(std::exception_ptr error, bool in_loop = true) noexcept {
        std::shared_ptr<const std::function<void(std::exception_ptr)>> h;
        {
            std::lock_guard<std::mutex> lock(handler_mutex);
            h = handler;
        }
        if (!(h && *h) && sim) {
            sim_record_error(*sim, std::move(error));  // a simulation's failure, not the process's
            return;
        }
        if (h && *h) {
            try {
                (*h)(error);
            } catch (...) {
                std::fprintf(stderr, "fiber_sched: the exception handler of scheduler '%s' threw; terminating\n",
                             owner.name().c_str());
                std::fflush(stderr);
                std::terminate();
            }
            // As after a task (Worker::run_task): a child forked inside the handler must not
            // go on with the worker loop that called it.
            FIBER_SCHED_ASSERT((!in_loop || thread_state()->worker) &&
                               "fork(): a child forked inside an exception handler must _exit() or exec before "
                               "the handler returns (the child has no workers)");
            return;
        }
        try {
            std::rethrow_exception(error);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fiber_sched: %s of scheduler '%s': %s\n", what_failed(in_loop), owner.name().c_str(),
                         e.what());
        } catch (...) {
            std::fprintf(stderr, "fiber_sched: %s of scheduler '%s'\n", what_failed(in_loop), owner.name().c_str());
        }
        std::fflush(stderr);
        std::terminate();
    }

    void check_task(const NewTask& task) const {
        FIBER_SCHED_ASSERT((task.fiber || task.cb) && "schedule(): the task has neither a fiber nor a callback");
        FIBER_SCHED_ASSERT(!(task.fiber && task.cb) && "schedule(): the task has both a fiber and a callback");
        FIBER_SCHED_ASSERT(task.thread >= -1 && task.thread < static_cast<int>(workers.size()) &&
                           "schedule(): thread index out of range");
        FIBER_SCHED_ASSERT((!task.fiber || task.fiber->state() != Fiber::State::Term) &&
                           "schedule(): fiber has terminated");
        FIBER_SCHED_ASSERT(!closed() && "schedule(): scheduler has stopped (stop() has returned)");
    }
};

}  // namespace detail
}  // namespace fsched
