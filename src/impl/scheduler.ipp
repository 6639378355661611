// ---------------------------------------------------------------------------
// Implementation: the scheduler.
//
// Each worker owns a run queue (a deque under the worker's own mutex) and a deque of tasks
// pinned to it. A worker takes from its own queues first, then steals from the back of the
// other workers' run queues; pinned deques are never stolen from. Tasks scheduled inside a
// worker go to its own queue; tasks from other threads go round-robin across the workers.
// Callbacks run in pooled fibers, reset for each task, so their stacks are reused.
//
// Idle: a worker with nothing to do spins briefly (checking every queue), then sleeps in
// Worker::wait_for_work(), the one place a worker blocks, until notified or until its
// earliest timer is due. New work wakes one sleeping worker, and only when no worker is
// spinning already (a spinner will find it); pinned work wakes its own worker.
//
// The lost-wake-up argument: a worker going to sleep sets `sleeping`, increments `sleepers`,
// then looks at every queue once more, taking each queue's lock (not trusting the size
// hints). A submitter pushes under the queue's lock, then loads `sleepers`/`spinning`. The
// two lock the same queue in some order: if the submitter's lock comes second, the sleeper's
// increment happens-before the submitter's load, which sees the sleeper and wakes it; if the
// sleeper's lock comes second, the push happens-before its look, which finds the task. So a
// submitter needs no read-modify-write, and on x86 its check is two plain loads. A spinner
// that stops spinning goes to sleep by the same path. `outstanding` reaching zero during
// stop() pairs through seq_cst operations on `outstanding`, `stopping` and `sleeping`.

// Parking: a task fiber parks by switching out with an after-switch hook (Fiber's
// after_switch_); resume() runs the hook on the worker only after the switch is complete,
// so whoever the hook hands the fiber to may resume it at once: no fiber is ever queued
// while still running on another worker (sylar's RUNNING-in-the-queue race cannot happen).
// schedule(fiber) on a fiber that a user let escape before its Fiber::yield() finished is
// the one case where a fiber can be found Running: claim_or_defer() then marks it
// RunningResumePending and the resumer re-enqueues it after the switch (see FiberState).
//
// Timers: each worker keeps a heap of sleeping fibers that parked on it, touched only by
// that worker, and its idle wait ends at the earliest deadline.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

struct Timer {
    std::chrono::steady_clock::time_point deadline;
    std::uint64_t sequence;  // FIFO among equal deadlines
    Fiber::ptr fiber;        // a sleeping fiber, woken at the deadline
    // Or a timed wait: it wakes its fiber only if it wins the race against a notifier.
    std::shared_ptr<WaitState> wait;
    bool operator>(const Timer& other) const noexcept {
        return deadline != other.deadline ? deadline > other.deadline : sequence > other.sequence;
    }
};

// What the queues hold: a ScheduleTask, plus whether its fiber is one of ours coming back
// from a park (then it is certainly Suspended and owned by this task: no claim needed).
struct QueuedTask {
    Fiber::ptr fiber;
    std::function<void()> cb;
    int thread = -1;
    bool woken = false;
};

#if defined(FIBER_SCHED_HAVE_EPOLL)
struct IoWait;
// The fibers waiting for one fd, at most one per direction, and whether the fd is in the
// scheduler's epoll instance. Under SchedulerCore::io_lock.
struct IoFd {
    IoWait* reader = nullptr;
    IoWait* writer = nullptr;
    bool registered = false;
};
#endif

class alignas(64) Worker {
public:
    Worker(SchedulerCore& core_, int index_) : core(core_), index(index_) {}

    SchedulerCore& core;
    const int index;
    std::thread thread;

    SpinLock queue_lock;
    std::deque<QueuedTask> tasks;    // stealable, under queue_lock
    std::deque<QueuedTask> pinned;   // this worker only, under queue_lock
    // tasks.size() + pinned.size() and tasks.size(), updated under queue_lock and read
    // without it as hints: a stale read only costs a needless lock or a later look. The
    // last look before sleeping ignores them and takes every lock (see run_loop).
    std::atomic<std::size_t> queued{0};
    std::atomic<std::size_t> stealable{0};

    // Set by this worker before it sleeps; cleared by whoever claims waking it (a submitter,
    // or the worker itself), and that one decrements core.sleepers. seq_cst: see above.
    std::atomic<bool> sleeping{false};
#if defined(FIBER_SCHED_HAVE_EPOLL)
    // The idle wait is epoll_wait: on this epoll instance, which holds only wake_fd, or, for
    // the worker that holds the poller role, on the scheduler's IO instance (see io.ipp).
    int epoll_fd = -1;
    int wake_fd = -1;
    // Written by this worker before it sets `sleeping`; read by whoever claims the wake-up
    // after its CAS on `sleeping`, which orders the two.
    std::atomic<bool> is_poller{false};
#else
    std::mutex idle_mutex;
    std::condition_variable idle_cv;
    bool notified = false;  // under idle_mutex
#endif

    // Only this worker's thread touches these.
    std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers;
    std::uint64_t timer_sequence = 0;
    std::vector<Fiber::ptr> spare_fibers;
    unsigned steal_start = 0;
    Fiber::ptr yielded;  // set by this_fiber::yield()'s park hook; requeued by run_loop

    // Wakes `fiber` at `deadline`, or, for a timed wait, whoever wins `wait`'s race then.
    void add_timer(std::chrono::steady_clock::time_point deadline, Fiber::ptr fiber,
                   std::shared_ptr<WaitState> wait) {
        timers.push(Timer{deadline, timer_sequence++, std::move(fiber), std::move(wait)});
    }

    // Publishes the queue sizes as hints; call under queue_lock after changing the queues.
    void update_hints() noexcept {
        stealable.store(tasks.size(), std::memory_order_relaxed);
        queued.store(tasks.size() + pinned.size(), std::memory_order_relaxed);
    }

    void push(QueuedTask&& task, bool own_pinned) {
        std::lock_guard<SpinLock> lock(queue_lock);
        (own_pinned ? pinned : tasks).push_back(std::move(task));
        update_hints();
    }

    bool pop(QueuedTask& out, bool trust_hint) {
        if (trust_hint && queued.load(std::memory_order_relaxed) == 0) return false;
        std::lock_guard<SpinLock> lock(queue_lock);
        std::deque<QueuedTask>& from = !pinned.empty() ? pinned : tasks;
        if (from.empty()) return false;
        out = std::move(from.front());
        from.pop_front();
        update_hints();
        return true;
    }

    // Moves up to half of this worker's stealable tasks (at most 32) into `thief`.
    bool steal_into(Worker& thief, QueuedTask& first, bool trust_hint) {
        if (trust_hint && stealable.load(std::memory_order_relaxed) == 0) return false;
        std::vector<QueuedTask> taken;
        {
            std::lock_guard<SpinLock> lock(queue_lock);
            std::size_t n = std::min<std::size_t>((tasks.size() + 1) / 2, 32);
            if (n == 0) return false;
            taken.reserve(n);
            for (std::size_t i = 0; i < n; ++i) {
                taken.push_back(std::move(tasks.back()));
                tasks.pop_back();
            }
            update_hints();
        }
        first = std::move(taken.back());
        taken.pop_back();
        if (!taken.empty()) {
            std::lock_guard<SpinLock> lock(thief.queue_lock);
            // Oldest first, as they stood in the victim's queue.
            for (auto it = taken.rbegin(); it != taken.rend(); ++it) thief.tasks.push_back(std::move(*it));
            thief.update_hints();
        }
        return true;
    }

    // Ends this worker's idle wait (or makes its next one return at once).
    void notify();
    // The idle wait, the one place a worker blocks: until notify(), `deadline`, or (for the
    // poller) an fd becoming ready.
    void wait_for_work(const std::chrono::steady_clock::time_point* deadline);

    void run_loop();
    void requeue_yielded(QueuedTask& next);
    void give_up_poller_role() noexcept;
    unsigned loops_since_io_poll = 0;
    // Looks at the timers, its own queues, then steals. `thorough`: take every queue's
    // lock instead of trusting the size hints (the look before sleeping).
    bool find_task(QueuedTask& out, bool thorough = false);
    void fire_due_timers();
    void run_task(QueuedTask& task);
    Fiber::ptr fiber_for(std::function<void()>&& cb);
};

class SchedulerCore {
public:
    SchedulerCore(Scheduler& owner_, std::size_t threads, bool use_caller_)
        : owner(owner_), use_caller(use_caller_), caller_thread(std::this_thread::get_id()) {
        FIBER_SCHED_ASSERT(threads > 0 && "Scheduler(): threads must be at least 1");
        for (std::size_t i = 0; i < threads; ++i) workers.push_back(std::make_unique<Worker>(*this, static_cast<int>(i)));
        open_io();
    }
    ~SchedulerCore() { close_io(); }
    SchedulerCore(const SchedulerCore&) = delete;
    SchedulerCore& operator=(const SchedulerCore&) = delete;

    // Creates / closes the epoll instances and eventfds (io.ipp); no-ops without epoll.
    void open_io();
    void close_io() noexcept;
#if defined(FIBER_SCHED_HAVE_EPOLL)
    int io_epoll_fd = -1;      // every fd a fiber of this scheduler waits for, plus poller_wake_fd
    int poller_wake_fd = -1;   // wakes whichever worker holds the poller role
    // The worker that sleeps in epoll_wait on io_epoll_fd, if any: taken with a CAS by a
    // worker about to sleep, given up when it wakes.
    std::atomic<Worker*> poller{nullptr};
    // Fibers parked in io::wait(); relaxed: a hint that polling is worth a system call.
    std::atomic<int> io_waiters{0};
    SpinLock io_lock;          // guards io_fds and the epoll interest of each fd
    std::unordered_map<int, struct IoFd> io_fds;
    // Harvests ready fds without blocking; true if any fiber was woken.
    bool poll_io() noexcept;
#endif

    Scheduler& owner;
    const bool use_caller;
    const std::thread::id caller_thread;
    std::vector<std::unique_ptr<Worker>> workers;

    std::mutex lifecycle_mutex;  // start() and stop()
    bool started = false;  // under lifecycle_mutex
    // Set once stop() has joined the workers; read by schedule() to refuse new work.
    std::atomic<bool> stopped{false};
    // Set by stop(); workers read it to know they may exit once outstanding is zero.
    std::atomic<bool> stopping{false};
    // Tasks scheduled and not finished: queued, running, parked or sleeping. Incremented
    // before a task is queued, decremented when it finishes; seq_cst pairs with `sleeping`.
    std::atomic<std::int64_t> outstanding{0};
    // Workers spinning for work / asleep; seq_cst, see the lost-wake-up argument.
    std::atomic<int> spinning{0};
    std::atomic<int> sleepers{0};
    // Round-robin target for tasks from threads outside the scheduler; relaxed, a hint.
    std::atomic<unsigned> next_worker{0};

    std::mutex handler_mutex;
    std::function<void(std::exception_ptr)> handler;

    static SchedulerCore& of(Scheduler& s) noexcept { return *s.core_; }

    Worker* current_worker() const noexcept {
        ThreadState* ts = thread_state();
        return ts->scheduler == &owner ? ts->worker : nullptr;
    }

    bool finished() const noexcept {
        return stopping.load(std::memory_order_seq_cst) && outstanding.load(std::memory_order_seq_cst) == 0;
    }

    // Queues a task that is already counted in `outstanding`.
    void enqueue(QueuedTask&& task) {
        Worker* here = current_worker();
        Worker* target;
        if (task.thread >= 0) {
            target = workers[static_cast<std::size_t>(task.thread)].get();
        } else if (here) {
            target = here;
        } else {
            target = workers[next_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()].get();
        }
        const bool pinned = task.thread >= 0;
        target->push(std::move(task), pinned);
        after_push(*target, pinned, 1);
    }

    // Wakes whoever should take newly queued work; `count` tasks went to `target`.
    void after_push(Worker& target, bool pinned, std::size_t count) {
        if (sleepers.load(std::memory_order_seq_cst) == 0) return;  // no one to wake
        if (wake(target)) {
            if (pinned || --count == 0) return;
        } else if (pinned) {
            return;  // its own worker is awake and will see it
        }
        if (spinning.load(std::memory_order_seq_cst) > 0) return;  // a spinner will find it
        for (std::size_t i = 0; count > 0 && i < workers.size(); ++i) {
            if (wake(*workers[i])) --count;
        }
    }

    // Clears `w.sleeping` if set; whoever succeeds (a waker, or `w` itself when it stops
    // waiting) accounts for it in `sleepers`. True if this call cleared it.
    bool claim_wake(Worker& w) noexcept {
        bool expected = true;
        if (!w.sleeping.compare_exchange_strong(expected, false, std::memory_order_seq_cst)) return false;
        sleepers.fetch_sub(1, std::memory_order_seq_cst);
        return true;
    }

    // Wakes `w` if it sleeps; true if this call claimed that.
    bool wake(Worker& w) {
        if (!claim_wake(w)) return false;
        w.notify();
        return true;
    }

    void wake_all() {
        for (auto& w : workers) wake(*w);
    }

    void task_finished() {
        if (outstanding.fetch_sub(1, std::memory_order_seq_cst) == 1 && stopping.load(std::memory_order_seq_cst)) {
            wake_all();
        }
    }

    void report(std::exception_ptr error) {
        std::function<void(std::exception_ptr)> h;
        {
            std::lock_guard<std::mutex> lock(handler_mutex);
            h = handler;
        }
        if (h) {
            h(error);
            return;
        }
        try {
            std::rethrow_exception(error);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fiber_sched: an exception escaped a task of scheduler '%s': %s\n",
                         owner.name().c_str(), e.what());
        } catch (...) {
            std::fprintf(stderr, "fiber_sched: an exception escaped a task of scheduler '%s'\n",
                         owner.name().c_str());
        }
        std::terminate();
    }

    void check_task(const ScheduleTask& task) const {
        FIBER_SCHED_ASSERT((task.fiber || task.cb) && "schedule(): the task has neither a fiber nor a callback");
        FIBER_SCHED_ASSERT(!(task.fiber && task.cb) && "schedule(): the task has both a fiber and a callback");
        FIBER_SCHED_ASSERT(task.thread >= -1 && task.thread < static_cast<int>(workers.size()) &&
                           "schedule(): thread index out of range");
        FIBER_SCHED_ASSERT((!task.fiber || task.fiber->state() != Fiber::State::Term) &&
                           "schedule(): fiber has terminated");
        FIBER_SCHED_ASSERT(!stopped.load(std::memory_order_acquire) && "schedule(): scheduler has stopped");
    }
};

inline void Worker::run_loop() {
    ThreadState* ts = thread_state();
    ts->scheduler = &core.owner;
    ts->worker = this;
    QueuedTask task;
    for (;;) {
        if (yielded) {
            requeue_yielded(task);
            run_task(task);
            continue;
        }
#if defined(FIBER_SCHED_HAVE_EPOLL)
        // While every worker is busy no one sleeps in epoll_wait: look at ready fds now and
        // then, so fibers waiting for IO are not starved by a busy scheduler.
        if (++loops_since_io_poll >= 32) {
            loops_since_io_poll = 0;
            if (core.io_waiters.load(std::memory_order_relaxed) > 0 &&
                core.poller.load(std::memory_order_relaxed) == nullptr) {
                core.poll_io();
            }
        }
#endif
        if (find_task(task)) {
            run_task(task);
            continue;
        }
#if defined(FIBER_SCHED_HAVE_EPOLL)
        if (core.io_waiters.load(std::memory_order_relaxed) > 0 && core.poll_io()) continue;
#endif
        // Spin a few microseconds before paying for a sleep and a wake-up.
        core.spinning.fetch_add(1, std::memory_order_seq_cst);
        bool found = false;
        for (int i = 0; i < 64 && !found; ++i) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ volatile("yield");
#endif
            found = find_task(task);
        }
        core.spinning.fetch_sub(1, std::memory_order_seq_cst);
        if (found) {
            run_task(task);
            continue;
        }
#if defined(FIBER_SCHED_HAVE_EPOLL)
        // One sleeping worker waits for the fds too (the poller), so IO wakes one worker.
        Worker* no_poller = nullptr;
        if (core.io_waiters.load(std::memory_order_relaxed) > 0 &&
            core.poller.compare_exchange_strong(no_poller, this, std::memory_order_acq_rel)) {
            is_poller.store(true, std::memory_order_relaxed);
        }
#endif
        sleeping.store(true, std::memory_order_seq_cst);
        core.sleepers.fetch_add(1, std::memory_order_seq_cst);
        if (find_task(task, true) || core.finished()) {
            give_up_poller_role();
            // If a submitter claimed the wake-up instead, its notify() only makes a later
            // wait return early.
            core.claim_wake(*this);
            if (task.fiber || task.cb) {
                run_task(task);
                continue;
            }
            break;  // finished
        }
        if (timers.empty()) {
            wait_for_work(nullptr);
        } else {
            const auto deadline = timers.top().deadline;
            wait_for_work(&deadline);
        }
        core.claim_wake(*this);
        give_up_poller_role();
    }
    ts->scheduler = nullptr;
    ts->worker = nullptr;
}

// Puts the fiber that yielded at the back of its queue and takes the front task, under one
// lock; the queue's length does not change, so no one needs waking. Timers come first.
inline void Worker::requeue_yielded(QueuedTask& next) {
    fire_due_timers();
    QueuedTask back;
    back.thread = FiberAccess::resume_thread(*yielded);
    back.woken = true;
    back.fiber = std::move(yielded);
    const bool own_pinned = back.thread >= 0;
    std::lock_guard<SpinLock> lock(queue_lock);
    if (pinned.empty() && tasks.empty()) {
        next = std::move(back);  // nothing else to run: straight back to it
        return;
    }
    (own_pinned ? pinned : tasks).push_back(std::move(back));
    std::deque<QueuedTask>& from = !pinned.empty() ? pinned : tasks;
    next = std::move(from.front());
    from.pop_front();
    update_hints();
}

#if !defined(FIBER_SCHED_HAVE_EPOLL)
// Without epoll the idle wait is a condition variable (and there is no fsched::io).
inline void Worker::notify() {
    {
        std::lock_guard<std::mutex> lock(idle_mutex);
        notified = true;
    }
    idle_cv.notify_one();
}

inline void Worker::wait_for_work(const std::chrono::steady_clock::time_point* deadline) {
    std::unique_lock<std::mutex> lock(idle_mutex);
    if (deadline) {
        idle_cv.wait_until(lock, *deadline, [this] { return notified; });
    } else {
        idle_cv.wait(lock, [this] { return notified; });
    }
    notified = false;
}

void SchedulerCore::open_io() {}
void SchedulerCore::close_io() noexcept {}
#endif

inline void Worker::give_up_poller_role() noexcept {
#if defined(FIBER_SCHED_HAVE_EPOLL)
    if (is_poller.load(std::memory_order_relaxed)) {
        is_poller.store(false, std::memory_order_relaxed);
        core.poller.store(nullptr, std::memory_order_release);
    }
#endif
}

inline void Worker::fire_due_timers() {
    if (timers.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    while (!timers.empty() && timers.top().deadline <= now) {
        Timer& top = const_cast<Timer&>(timers.top());  // popped right below
        Fiber::ptr fiber = std::move(top.fiber);
        std::shared_ptr<WaitState> wait = std::move(top.wait);
        timers.pop();
        if (wait) {
            int expected = waiting;
            if (!wait->status.compare_exchange_strong(expected, timed_out, std::memory_order_acq_rel)) continue;
            fiber = std::move(wait->fiber);
        }
        wake(std::move(fiber));
    }
}

inline bool Worker::find_task(QueuedTask& out, bool thorough) {
    fire_due_timers();
    if (pop(out, !thorough)) return true;
    const std::size_t n = core.workers.size();
    // Every other worker once, starting somewhere new each time a steal succeeds.
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const std::size_t offset = 1 + (steal_start + i) % (n - 1);
        Worker& victim = *core.workers[(static_cast<std::size_t>(index) + offset) % n];
        if (victim.steal_into(*this, out, !thorough)) {
            ++steal_start;
            return true;
        }
    }
    return false;
}

inline Fiber::ptr Worker::fiber_for(std::function<void()>&& cb) {
    if (!spare_fibers.empty()) {
        Fiber::ptr fiber = std::move(spare_fibers.back());
        spare_fibers.pop_back();
        FiberAccess::reuse(*fiber, std::move(cb));
        return fiber;
    }
    return std::make_shared<Fiber>(std::move(cb));
}

inline void Worker::run_task(QueuedTask& task) {
    const bool pooled = !task.fiber;
    Fiber::ptr fiber = pooled ? fiber_for(std::move(task.cb)) : std::move(task.fiber);
    const int thread = task.thread;
    const bool woken = task.woken;
    task = QueuedTask{};
    if (woken) {
        FiberAccess::claim_woken(*fiber);
    } else if (!FiberAccess::claim_or_defer(*fiber, core.owner, thread)) {
        return;
    }
    ThreadState* ts = thread_state();
    ts->task_fiber = fiber.get();
    ts->task_ref = &fiber;  // a park hook may take this reference (take_task_ref)
    SwitchOutcome outcome;
    try {
        outcome = FiberAccess::run(*fiber);
    } catch (...) {
        outcome = SwitchOutcome::Returned;
        ts->task_fiber = nullptr;
        core.report(std::current_exception());
    }
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    if (outcome == SwitchOutcome::Parked) return;  // still outstanding; wake() queues it again
    // Returned, or left the scheduler through Fiber::yield(): the task is done.
    if (outcome == SwitchOutcome::Returned && pooled && fiber.use_count() == 1 && spare_fibers.size() < 64) {
        spare_fibers.push_back(std::move(fiber));
    }
    fiber.reset();
    core.task_finished();
}

void resume_deferred(Fiber& fiber) {
    Scheduler* scheduler = FiberAccess::resume_scheduler(fiber);
    QueuedTask task;
    task.woken = true;  // Suspended now, and this task is its only way back
    task.fiber = fiber.shared_from_this();
    task.thread = FiberAccess::resume_thread(fiber);
    SchedulerCore::of(*scheduler).enqueue(std::move(task));
}

Fiber::ptr take_task_ref() noexcept {
    // Moves the worker's own reference instead of counting a new one: no atomic add/sub.
    return std::move(*thread_state()->task_ref);
}

void park(void (*on_parked)(Fiber*, void*), void* arg) {
    FIBER_SCHED_ASSERT(in_scheduler_task() && "park(): only a scheduler task fiber can park");
    FiberAccess::park_current(on_parked, arg);
}

void wake(Fiber::ptr fiber) {
    Scheduler* scheduler = FiberAccess::resume_scheduler(*fiber);
    QueuedTask task;
    task.woken = true;
    task.thread = FiberAccess::resume_thread(*fiber);
    task.fiber = std::move(fiber);
    SchedulerCore::of(*scheduler).enqueue(std::move(task));
}

bool in_scheduler_task() noexcept {
    ThreadState* ts = thread_state();
    return ts->task_fiber && ts->current == ts->task_fiber;
}

void sleep_until_steady(std::chrono::steady_clock::time_point deadline) {
    if (!in_scheduler_task()) {
        std::this_thread::sleep_until(deadline);
        return;
    }
    park([](Fiber*, void* arg) {
        // On the worker the fiber parked from; only that worker touches its heap.
        thread_state()->worker->add_timer(*static_cast<std::chrono::steady_clock::time_point*>(arg),
                                          take_task_ref(), nullptr);
    }, &deadline);
}

}  // namespace detail

Scheduler::Scheduler(std::size_t threads, bool use_caller, std::string name)
    : name_(std::move(name)), thread_count_(threads),
      core_(std::make_unique<detail::SchedulerCore>(*this, threads, use_caller)) {}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
    detail::SchedulerCore& core = *core_;
    std::lock_guard<std::mutex> lock(core.lifecycle_mutex);
    if (core.started) return;
    core.started = true;
    for (std::size_t i = core.use_caller ? 1 : 0; i < core.workers.size(); ++i) {
        detail::Worker* worker = core.workers[i].get();
        worker->thread = std::thread([this, worker] {
#if defined(__linux__)
            std::string thread_name = name_.substr(0, 11) + "-" + std::to_string(worker->index);
            pthread_setname_np(pthread_self(), thread_name.substr(0, 15).c_str());
#endif
            worker->run_loop();
        });
    }
}

void Scheduler::stop() {
    detail::SchedulerCore& core = *core_;
    FIBER_SCHED_ASSERT(current() != this && "stop(): called from inside one of the scheduler's own tasks");
    FIBER_SCHED_ASSERT((!core.use_caller || std::this_thread::get_id() == core.caller_thread) &&
                       "stop(): with use_caller, call stop() from the thread that constructed the scheduler");
    start();
    std::lock_guard<std::mutex> lock(core.lifecycle_mutex);
    if (core.stopped.load(std::memory_order_relaxed)) return;
    core.stopping.store(true, std::memory_order_seq_cst);
    core.wake_all();
    if (core.use_caller) core.workers[0]->run_loop();
    for (auto& worker : core.workers) {
        if (worker->thread.joinable()) worker->thread.join();
    }
    core.stopped.store(true, std::memory_order_release);
}

void Scheduler::submit(ScheduleTask task) {
    detail::SchedulerCore& core = *core_;
    core.check_task(task);
    core.outstanding.fetch_add(1, std::memory_order_seq_cst);
    core.enqueue(detail::QueuedTask{std::move(task.fiber), std::move(task.cb), task.thread, false});
}

void Scheduler::submit_batch(std::vector<ScheduleTask>& tasks) {
    detail::SchedulerCore& core = *core_;
    if (tasks.empty()) return;
    for (const ScheduleTask& task : tasks) core.check_task(task);
    core.outstanding.fetch_add(static_cast<std::int64_t>(tasks.size()), std::memory_order_seq_cst);
    // One lock per worker: group pinned tasks by worker, deal the rest out in runs.
    const std::size_t n = core.workers.size();
    std::vector<std::vector<detail::QueuedTask>> pinned(n), unpinned(n);
    detail::Worker* here = core.current_worker();
    std::size_t next = here ? static_cast<std::size_t>(here->index)
                            : core.next_worker.fetch_add(1, std::memory_order_relaxed) % n;
    std::size_t free_count = 0;
    for (const ScheduleTask& task : tasks) free_count += task.thread < 0;
    const std::size_t run = here ? free_count : (free_count + n - 1) / n;
    std::size_t in_run = 0;
    for (ScheduleTask& task : tasks) {
        detail::QueuedTask queued{std::move(task.fiber), std::move(task.cb), task.thread, false};
        if (queued.thread >= 0) {
            pinned[static_cast<std::size_t>(queued.thread)].push_back(std::move(queued));
            continue;
        }
        unpinned[next].push_back(std::move(queued));
        if (++in_run == run) {
            in_run = 0;
            next = (next + 1) % n;
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        detail::Worker& w = *core.workers[i];
        if (pinned[i].empty() && unpinned[i].empty()) continue;
        {
            std::lock_guard<detail::SpinLock> lock(w.queue_lock);
            for (detail::QueuedTask& t : pinned[i]) w.pinned.push_back(std::move(t));
            for (detail::QueuedTask& t : unpinned[i]) w.tasks.push_back(std::move(t));
            w.update_hints();
        }
        if (!pinned[i].empty()) core.after_push(w, true, 1);
        if (!unpinned[i].empty()) core.after_push(w, false, unpinned[i].size());
    }
}

Scheduler* Scheduler::current() noexcept { return detail::thread_state()->scheduler; }

int Scheduler::worker_index() noexcept {
    detail::Worker* worker = detail::thread_state()->worker;
    return worker ? worker->index : -1;
}

void Scheduler::set_exception_handler(std::function<void(std::exception_ptr)> handler) {
    std::lock_guard<std::mutex> lock(core_->handler_mutex);
    core_->handler = std::move(handler);
}

namespace this_fiber {

void yield() {
    if (!detail::in_scheduler_task()) {
        std::this_thread::yield();
        return;
    }
    // The worker puts the fiber back and takes the next task under one lock (run_loop).
    detail::park([](Fiber*, void*) { detail::thread_state()->worker->yielded = detail::take_task_ref(); }, nullptr);
}

std::uint64_t id() {
    Fiber* fiber = Fiber::current();
    return fiber ? fiber->id() : 0;
}

}  // namespace this_fiber
}  // namespace fsched
