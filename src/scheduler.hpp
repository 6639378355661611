// ---------------------------------------------------------------------------
// ScheduleTask and Scheduler: N fibers on M worker threads.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber.hpp"
#include "task_function.hpp"
#include "priority.hpp"

namespace fsched {

// What a Scheduler queues: a fiber to resume, or a callback to run in a pooled fiber.
struct ScheduleTask {
    Fiber::ptr fiber;
    // Any callable void(), move-only ones too (a lambda owning a unique_ptr or a Promise), a
    // std::function included. A task holding a move-only one can be moved, not copied (a
    // FIBER_SCHED_ASSERT); schedule a batch of them through std::make_move_iterator.
    detail::TaskCallback cb;
    int thread = -1;  // worker index to run on; -1: any worker
    // Each worker runs its ready High tasks before Normal ones and Normal before Low ones;
    // the task's fiber keeps it whenever it is woken or yields (see Scheduler::schedule).
    Priority priority = Priority::Normal;
    // Names the task's fiber (Fiber::set_name) while the task runs; empty: no name. A
    // callback's fiber drops it when the task ends.
    std::string name{};
    // Bytes of stack for this callback's fiber (0: the scheduler's, SchedulerOptions::
    // stack_size). Non-zero, the fiber is made by schedule() (which throws std::bad_alloc or
    // std::length_error, with nothing scheduled, when it cannot be), with at least that many
    // bytes usable (Fiber::stack_size()), and freed when the task ends, never pooled.
    // Precondition (FIBER_SCHED_ASSERT): no `fiber` (a fiber has its stack already).
    std::size_t stack_size = 0;
};

// How a Scheduler is made (Scheduler(const SchedulerOptions&)).
struct SchedulerOptions {
    // Workers, at least 1 (and below 65536); with use_caller the constructing thread is
    // worker 0, and threads - 1 threads are started.
    std::size_t threads = 1;
    bool use_caller = true;
    // The scheduler's name(), also its threads' names ("<name>-<worker>").
    std::string name = "Scheduler";
    // Bytes of stack for each callback's fiber, pooled per worker (0:
    // FIBER_SCHED_DEFAULT_STACK_SIZE); non-zero, at least that many are usable
    // (Fiber::stack_size()). ScheduleTask::stack_size overrides it for one task. Above
    // fsched::detail::max_stack_size the constructor throws std::length_error.
    std::size_t stack_size = 0;
    // Run on each worker thread with its worker index: on_thread_start before the thread's
    // first task, on_thread_stop after its last one (when the thread leaves, in stop()).
    // They run outside the scheduler's loop: Scheduler::current() there is what it is on
    // that thread outside the scheduler (nullptr on a worker thread).
    // - With use_caller, worker 0 is the constructing thread: on_thread_start(0) runs at the
    //   end of the constructor, and on_thread_stop(0) at the end of the stop() that stops
    //   the scheduler (the first one; in ~Scheduler if no stop() came before), on the thread
    //   calling it.
    // - stop() starts a worker's thread again when tasks were scheduled while the threads
    //   were leaving (and start() or stop() starts one that could not be started before):
    //   the hooks pair up per thread, so a new thread runs on_thread_start again, and
    //   on_thread_stop when it leaves.
    // - A worker that has no thread (none could be started: out of threads) has its tasks
    //   run by the thread calling stop(), which runs no hook for it.
    // An exception from a hook goes to the exception handler (set_exception_handler(); the
    // default terminates) and the thread runs on, except one from on_thread_start(0) in the
    // constructor, which leaves the constructor (nothing is left of the scheduler).
    std::function<void(int worker)> on_thread_start;
    std::function<void(int worker)> on_thread_stop;
    // Worker i's thread runs only on CPU cpu_affinity[i % size()] (empty: on any CPU). Each
    // entry must be at least 0 and below the CPUs there are (FIBER_SCHED_ASSERT, at
    // construction; on Linux, one past the highest CPU this process may run on). Pinned
    // with pthread_setaffinity_np on Linux and SetThreadAffinityMask on Windows (processor
    // group 0); on macOS and the BSDs, which have no pinning here, the list is checked and
    // otherwise ignored (unchecked: not run here). A thread that cannot be pinned (a CPU the
    // kernel does not allow the process: outside its cgroup's cpuset, or offline; a CPU
    // outside the mask it was started with, by taskset say, is allowed and pinned to) runs
    // unpinned, and a std::system_error saying so goes to the exception handler. The
    // use_caller thread (worker 0 with use_caller) is never pinned: it is the user's thread.
    std::vector<int> cpu_affinity;
    // stop() prints fiber_report() to stderr, once, when it has waited this long for the
    // tasks to finish (0: as FIBER_SCHED_HANG_REPORT_S says, in seconds; unset: never).
    std::chrono::milliseconds hang_report_after{0};
    // How much later than asked the kernel may end a worker's timed wait, to merge wake-ups
    // (Linux: each worker thread's timer slack, PR_SET_TIMERSLACK; nothing elsewhere). The
    // default, 1 us, ends a sleep about when asked, where the kernel's own default lets it
    // run up to 50 us late (sleep_for(100us) p50 22 against 78 us late on a KVM guest). 0
    // leaves the threads' slack as they inherit it; more saves power where timers may run
    // late. Negative: FIBER_SCHED_ASSERT at construction. The use_caller thread is the
    // user's and keeps its own. A thread or process that a task starts inherits its
    // worker's slack (Linux keeps it across clone, fork and exec); so does a scheduler made
    // from a task with 0 here.
    std::chrono::nanoseconds timer_slack{1000};
    // How long before its own next timer an idle worker stops sleeping and spins to it (0,
    // the default: never). A worker asleep until a timer it holds (a fiber's sleep_for or
    // wait_for that parked on it; the use_caller thread's own deadline when it sleeps or
    // waits outside tasks) wakes this much before and spins on the clock, so the fiber runs
    // within microseconds of its deadline, where the OS's wake-up from an idle CPU can take
    // tens of microseconds to milliseconds (a KVM guest: sleep_for(100us) p99 40 us late
    // with 50 us here, 114 us without; BENCHMARKS.md). The cost: up to this much of a core
    // before each timer that comes due while its worker is idle (a timed wait satisfied
    // before then leaves nothing to spin to); so for a game's frame pacing, say 50 us, not
    // for a server whose timeouts expire thousands of times a second. No more than the
    // wake-ups' lateness: on a loaded machine the kernel preempts a long spinner sooner
    // than a thread that has just woken. A task pushed meanwhile, or an earlier timer, ends
    // the spin as it would the sleep; a poller looks at the fds every 10 us while it spins.
    // Without epoll_pwait2 (Linux before 5.11) the wait ends on whole milliseconds and a
    // spin lasts up to 1 ms longer; where the OS's timer is coarser than the spin (Windows'
    // tick, 15.6 ms by default: unchecked) the wait can end after the timer, leaving no
    // spin. SchedulerStats::timer_spins and timer_spin_time count what it spent. Negative:
    // FIBER_SCHED_ASSERT at construction.
    std::chrono::nanoseconds timer_spin{0};
    // Migration checking, for tests: every fiber that is not pinned resumes, after each wait
    // (this_fiber::yield() too), on another worker than the one it waited on, when there is
    // another that runs tasks by itself (the use_caller thread does not count), so code that
    // keeps a thread_local, errno or std::this_thread::get_id() across a wait fails in CI
    // rather than in production. Also on when the implementation's unit defines
    // FIBER_SCHED_DEBUG_MIGRATE, or FIBER_SCHED_DEBUG_MIGRATE=1 is in the environment when
    // the scheduler is made. Each wake then goes through a queue (no run-next slot, no
    // direct yield).
    bool debug_migrate = false;
};

// What a Scheduler's workers have done, since construction (Scheduler::stats()). Each
// worker counts its own; the totals add every worker's. The counts are read without
// stopping anything: a snapshot taken while the scheduler runs may be a few events behind
// here and there, never ahead.
struct SchedulerStats {
    // Runs of a task's fiber: a worker switched to it from its queues, for a new task, a
    // woken fiber or one that yielded (this_fiber::yield()); a task that parks or yields
    // counts once per run.
    std::uint64_t tasks_run = 0;
    // Steals that took something: a worker looking for work took tasks from another
    // worker's queue (or its run-next fiber, stuck there); counted by the thief.
    std::uint64_t steals = 0;
    // Times a task's fiber parked (waited on a Mutex, ConditionVariable, WaitGroup, Channel,
    // a sleep, an io wait); counted by the worker it parked from.
    std::uint64_t parks = 0;
    // Parked fibers resumed after a wake-up (by a task, a plain thread or a timer); counted
    // by the worker that resumed the fiber, so a wake from any thread costs that thread no
    // shared write.
    std::uint64_t wakes = 0;
    // Timers that fired and woke a fiber (a sleep's end, a timed wait that timed out);
    // counted by the worker that fired them, which may be another than the fiber's.
    std::uint64_t timers_fired = 0;
    // Per worker (index: worker): time spent asleep in the idle wait, the sleep going on
    // now included.
    std::vector<std::chrono::nanoseconds> idle_time;
    // Per worker: tasks ready in its queues now (every priority, pinned ones and its
    // run-next fiber; not the fibers a single worker's yields keep aside, nor the one
    // running).
    std::vector<std::size_t> queued;
    // Tasks the steals took (a steal takes up to half its victim's queue, at most 32).
    std::uint64_t tasks_stolen = 0;
    // Times a worker went to sleep in its idle wait (after spinning found nothing).
    std::uint64_t sleeps = 0;
    // Sleeps that ended before their timer and spun the rest (SchedulerOptions::timer_spin),
    // and the wall-clock time those spins took (a spinner preempted meanwhile included; the
    // spin going on not included): what the option costs.
    std::uint64_t timer_spins = 0;
    std::chrono::nanoseconds timer_spin_time{0};
};

namespace detail {
struct SchedulerCore;

// The one stored copy of `name` (Fiber::set_name explains the interning); nullptr for "".
const char* intern_name(const std::string& name);

// A task on its way from schedule() to a worker's queue: ScheduleTask with the callback
// in a TaskFunction.
struct NewTask {
    Fiber::ptr fiber;
    TaskFunction cb;
    int thread = -1;
    Priority priority = Priority::Normal;
};

using TimePoint = std::chrono::steady_clock::time_point;

// steady_clock::now(), or the virtual clock inside testing::simulate() (simulation.ipp):
// every deadline and every look at one reads this.
TimePoint clock_now() noexcept;

// The steady_clock time `d` from now, saturated instead of overflowing for durations like
// hours::max(); a duration of zero or less is now.
template <class Rep, class Period>
TimePoint deadline_after(const std::chrono::duration<Rep, Period>& d) {
    using std::chrono::steady_clock;
    const TimePoint now = clock_now();
    if (d <= d.zero()) return now;
    // (TimePoint::max)(): <windows.h> without NOMINMAX defines a max() macro.
    const std::chrono::duration<double> room = (TimePoint::max)() - now;
    return std::chrono::duration<double>(d) >= room ? (TimePoint::max)()
                                                    : now + std::chrono::duration_cast<steady_clock::duration>(d);
}

// `t` as a steady_clock time: exact for steady_clock (rounded up from a floating or finer
// duration, never early), else measured from Clock::now(). A time far in the past is now
// and one far in the future is TimePoint::max(): `t - now` is taken exactly only once it is
// known to fit (time_point::min() - now overflows), and a steady time of a coarser duration
// (time_point<steady_clock, seconds>::max()) is converted only once it is known to fit.
template <class Clock, class Duration>
TimePoint to_steady(const std::chrono::time_point<Clock, Duration>& t) {
    if constexpr (std::is_same_v<Clock, std::chrono::steady_clock>) {
        using Seconds = std::chrono::duration<long double>;
        const Seconds at = Seconds(t.time_since_epoch());
        if (!(at < Seconds((TimePoint::max)().time_since_epoch()))) return (TimePoint::max)();  // NaN too
        if (!(at > Seconds((TimePoint::min)().time_since_epoch()))) return clock_now();
        return TimePoint(std::chrono::ceil<std::chrono::steady_clock::duration>(t.time_since_epoch()));
    } else {
        using Seconds = std::chrono::duration<double>;
        const auto now = Clock::now();
        const Seconds left = Seconds(t.time_since_epoch()) - Seconds(now.time_since_epoch());
        if (left <= Seconds::zero()) return clock_now();
        if (left > Seconds(100.0 * 365 * 24 * 3600)) return (TimePoint::max)();  // a century: never
        return deadline_after(t - now);
    }
}
}  // namespace detail

class Scheduler {
public:
    // A scheduler of `threads` workers (at least 1). With use_caller the constructing
    // thread is worker 0 and runs tasks inside stop(); threads - 1 threads are started.
    // Made on a thread's own stack (not in a fiber), the use_caller thread also helps
    // outside stop(): whenever it blocks in an fsched wait (the sync primitives,
    // this_fiber::sleep_*, io::wait) it runs this scheduler's ready tasks, as worker 0,
    // until the wait is satisfied, and sleeps in the idle wait like a worker when none is
    // ready; see also run_pending(). A task it runs that blocks parks as usual, and any
    // worker may resume it (unless it is pinned). With several such schedulers on one
    // thread, the one made last (and not yet stopped) is helped.
    explicit Scheduler(std::size_t threads = 1, bool use_caller = true, std::string name = "Scheduler");
    // The same with the options above: stack size, thread hooks, CPU affinity. Throws
    // std::system_error when the idle wait cannot be made (out of fds), std::length_error
    // for a stack_size above the limit, and what on_thread_start(0) throws (use_caller).
    explicit Scheduler(const SchedulerOptions& options);
    // Calls stop() if it has not been called (from the constructing thread with use_caller).
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Starts the worker threads. Calling it again does nothing. Throws std::system_error
    // when a thread cannot be started (out of threads); the workers started stay, and a
    // later start() or stop() starts the rest.
    void start();
    // Waits until every scheduled task has finished (sleeping and blocked ones, and work
    // scheduled meanwhile, from any thread, included), then joins the workers. It takes
    // effect at one instant before it returns; schedule() after that is refused with a
    // FIBER_SCHED_ASSERT. Harmless when called twice. With use_caller: call it from the
    // constructing thread (or fiber), which runs tasks meanwhile; it may be a task of another
    // scheduler, which it is again afterwards. It throws nothing of its own: a worker whose
    // thread cannot be started (out of threads) has its tasks run by the calling thread,
    // so ~Scheduler cannot fail either.
    void stop();

    // Queues a Fiber::ptr, a callable `void()` or a ScheduleTask, on worker `thread`
    // (-1: any; -1 .. thread_count()-1). From any thread, also before start() and in stop().
    // A fiber that is still running or parked (someone got its pointer early) is resumed
    // once it has left the scheduler with Fiber::yield(). Throws std::bad_alloc, with
    // nothing scheduled, when the task cannot be queued.
    //
    // Priorities are strict, per worker: a worker takes a Normal task only when it has no
    // ready High one, and a Low one only when it has neither; a thief steals from the
    // highest level its victim has, and a worker looking for work takes another worker's
    // (unpinned) High task before its own Normal ones. A High task that yields in a loop
    // therefore starves the Normal and Low tasks of its worker (not timers, IO polling or
    // other workers); give High to short work. Within a level, tasks run in the order they
    // were queued (stolen ones excepted), but for one: an unpinned Normal fiber that a task
    // wakes (a Channel, Mutex, WaitGroup... hand-off) runs next on the waker's worker, as
    // Go's runnext does, ahead of that worker's queued Normal tasks (at most 16 times in a
    // row while tasks wait there), and another worker takes it only if the waker runs on
    // without parking; a second wake sends the first woken fiber to the back of the queue.
    template <class FiberOrCb>
    void schedule(FiberOrCb fc, int thread = -1) {
        submit(make_task(std::move(fc), thread));
    }
    // The same at `priority` (it replaces a ScheduleTask's own).
    template <class FiberOrCb>
    void schedule(FiberOrCb fc, int thread, Priority priority) {
        detail::NewTask task = make_task(std::move(fc), thread);
        task.priority = priority;
        submit(std::move(task));
    }
    // Queues a batch of FiberOrCb, copied from the range (a std::make_move_iterator range
    // moves them: move-only callbacks); pays each worker queue's synchronisation once.
    template <class InputIt>
    void schedule(InputIt first, InputIt last) {
        std::vector<detail::NewTask> batch;
        for (; first != last; ++first) batch.push_back(make_task(*first, -1));
        submit_batch(batch);
    }

    // The name given at construction.
    const std::string& name() const noexcept { return name_; }
    // Workers, the caller included when use_caller.
    std::size_t thread_count() const noexcept { return thread_count_; }

    // The scheduler whose worker runs this code, else nullptr.
    static Scheduler* current() noexcept;
    // This thread's worker index in current(), else -1.
    static int worker_index() noexcept;

    // On the use_caller thread, outside its tasks and outside stop(): runs ready tasks, as
    // worker 0 (tasks pinned to worker 0 first, then its own queue, then stolen ones), until
    // none is ready or `budget` has passed (checked before each task), and returns how many
    // ran. A task that parks counts as run; one that yields is ready again at once, so a
    // task yielding in a loop keeps run_pending() busy until the budget is spent.
    // Precondition (FIBER_SCHED_ASSERT): called on the use_caller thread, outside tasks.
    std::size_t run_pending(std::chrono::microseconds budget = std::chrono::microseconds::max());

    // Receives every exception that escapes a task, std::bad_alloc for a task whose fiber
    // could not be made, what a thread hook throws and a failed CPU pin's std::system_error
    // (SchedulerOptions). Default: print it and std::terminate(). A handler that throws
    // terminates the program too.
    void set_exception_handler(std::function<void(std::exception_ptr)> handler);

    // The workers' counts so far (SchedulerStats). From any thread, at any time, before
    // start() and after stop() too; it takes no lock and disturbs no worker.
    SchedulerStats stats() const;

private:
    friend struct detail::SchedulerCore;

    // A callable goes straight into the task's TaskFunction (no std::function on the way,
    // so a small closure is never copied to the heap); a ScheduleTask's is moved over.
    template <class FiberOrCb>
    static detail::NewTask make_task(FiberOrCb&& fc, int thread) {
        using T = std::decay_t<FiberOrCb>;
        detail::NewTask task;
        if constexpr (std::is_same_v<T, ScheduleTask>) {
            ScheduleTask given = std::forward<FiberOrCb>(fc);
            task.fiber = std::move(given.fiber);
            task.cb = std::move(given.cb);
            task.thread = thread != -1 ? thread : given.thread;
            task.priority = given.priority;
            if (!given.name.empty()) name_task(task, given.name);
            if (given.stack_size != 0) give_own_stack(task, given.stack_size);
        } else if constexpr (std::is_convertible_v<T, Fiber::ptr> && !std::is_same_v<T, std::nullptr_t>) {
            task.fiber = std::forward<FiberOrCb>(fc);
            task.thread = thread;
        } else {
            static_assert(std::is_invocable_v<T&> && !std::is_same_v<T, std::nullptr_t>,
                          "schedule(): expects a Fiber::ptr, a callable void() or a ScheduleTask");
            task.cb = std::forward<FiberOrCb>(fc);
            task.thread = thread;
        }
        return task;
    }

    // A named task: a fiber is named now; a callback is wrapped in one that names its fiber
    // when it starts (the name's pointer rides in the closure, so an unnamed task's queue
    // entry stays as small as before; the pooled fiber drops the name when the task ends).
    static void name_task(detail::NewTask& task, const std::string& name);
    // A callback with a ScheduleTask::stack_size: its fiber, made now with that stack (a
    // task with a fiber already is a FIBER_SCHED_ASSERT; an empty callback is left to
    // submit()'s check). May throw std::bad_alloc or std::length_error.
    static void give_own_stack(detail::NewTask& task, std::size_t stack_size);
    void submit(detail::NewTask task);
    void submit_batch(std::vector<detail::NewTask>& tasks);

    std::string name_;
    std::size_t thread_count_;
    std::unique_ptr<detail::SchedulerCore> core_;
};

namespace detail {
// Parks the running scheduler task fiber. Once it has fully switched out, on_parked(fiber,
// arg) runs on the worker; the fiber runs again after someone passes it to wake_fiber().
// Precondition: in_scheduler_task().
void park(void (*on_parked)(Fiber*, void*), void* arg);
// Inside a park hook only: the worker's reference to the fiber that just parked.
Fiber::ptr take_task_ref() noexcept;
// Makes a parked fiber runnable again, on the worker it is pinned to, if any. Any thread.
void wake_fiber(Fiber::ptr fiber) noexcept;
// The use_caller scheduler of this thread when the thread may help it while it blocks: it
// is that scheduler's caller thread, on its own stack (not in a fiber, not in one of the
// scheduler's loops), and the scheduler has not stopped. Else nullptr.
SchedulerCore* caller_may_help() noexcept;
// On that thread: runs the scheduler's ready tasks as worker 0, sleeping in its idle wait
// when none is ready, until `*done` (seq_cst; may be null) is true or `deadline` (may be
// null) has passed. Whoever sets `*done` calls wake_caller() afterwards.
void help_until(SchedulerCore& core, const std::atomic<bool>* done, const TimePoint* deadline);
// Ends a help_until() sleep: call after setting its `done`. Any thread.
void wake_caller(SchedulerCore& core) noexcept;
// True inside a fiber that a Scheduler resumed as a task (not in fibers it resumed itself).
bool in_scheduler_task() noexcept;
// In a scheduler task, before a park whose hook adds a timer: makes room for it on this
// worker, so the hook cannot fail. Throws std::bad_alloc.
void reserve_timer();
void sleep_until_steady(std::chrono::steady_clock::time_point deadline);
// Timers held by the scheduler's workers now, satisfied-but-unswept ones included (tests).
std::size_t pending_timers(Scheduler& scheduler) noexcept;
// Slabs the workers' queues have mapped for their blocks of tasks (TaskBlockSlabs; tests).
std::size_t queue_slabs(Scheduler& scheduler) noexcept;
// Run-next fibers another worker took because they sat too long (take_stuck_runnext; tests).
std::uint64_t runnext_stuck_taken(Scheduler& scheduler) noexcept;
}  // namespace detail

namespace this_fiber {

// In a scheduler task: go to the back of the queue (of its priority) and run again soon.
// On a use_caller thread outside its tasks and stop(): run at most one ready task of that
// scheduler. Elsewhere: std::this_thread::yield().
void yield();

// In a scheduler task: park for `d`, freeing the worker. On a use_caller thread outside
// its tasks and stop(): run ready tasks meanwhile. Elsewhere: sleep the thread.
template <class Rep, class Period>
void sleep_for(const std::chrono::duration<Rep, Period>& d) {
    detail::sleep_until_steady(detail::deadline_after(d));
}

// sleep_for(t - Clock::now()).
template <class Clock, class Duration>
void sleep_until(const std::chrono::time_point<Clock, Duration>& t) {
    detail::sleep_until_steady(detail::to_steady(t));
}

// The running fiber's id, as Fiber::current()->id(), but a callback's fiber stays poolable
// (see Fiber::current()); 0 outside fibers.
std::uint64_t id();

// Fiber::set_name() of the running fiber (in a callback task: the task's name, dropped when
// it ends). Precondition (FIBER_SCHED_ASSERT): inside a fiber.
void set_name(std::string name);

}  // namespace this_fiber
}  // namespace fsched
