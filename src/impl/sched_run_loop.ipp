// ---------------------------------------------------------------------------
// The run loop and its steps: run_loop(), IO polled now and then, the spin, the sleep with
// the lost-wake-up argument (and its end spun to a timer: timer_spin), giving back a burst's
// queue slabs, and running one task (run_task: a pooled fiber for a callback, the claim,
// the switch, and what happens after).
// Relies on: sched_core.ipp, sched_find.ipp (next_task), the idle wait.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/sched_core.ipp"
#include "impl/stack.ipp"

namespace fsched {
namespace detail {

// The run loop: each pass takes one step of a fixed policy.
// A fiber that yielded goes back in line first; ready fds are harvested every 32 tasks
// however the tasks arrive; then the worker's own queues and due timers (its own, then
// any other worker's), then stealing; then a short spin; then the sleep, whose last look
// at the queues is what the lost-wake-up argument (at sleep_until_work) is about.
inline void Worker::run_loop(const CallerWait* wait) {
    ThreadState* ts = thread_state();
    // Saved and restored: a use_caller scheduler may run inside a task of another one.
    Scheduler* const outer_scheduler = ts->scheduler;
    Worker* const outer_worker = ts->worker;
    Fiber* const outer_task = ts->task_fiber;
    std::shared_ptr<Fiber>* const outer_ref = ts->task_ref;
    ts->scheduler = &core.owner;
    ts->worker = this;
    caller_helping = wait != nullptr;
    direct_yield = true;
    loop_wait = wait;
    QueuedTask task;
    bool finished = false;
    bool was_idle = false;  // spun or slept since the last task (see hand_on_runnext_watch)
    bool first_pass = true;
    while (!finished) {
        if (wait && wait->satisfied()) {
            // A wait whose deadline had passed before it began (wait_for(0) in a polling
            // loop) still runs one ready task: on a scheduler whose only worker is this
            // thread, nothing else would ever run the task that the loop polls for.
            if (first_pass && !(wait->done && wait->done->load(std::memory_order_seq_cst))) {
                poll_io_now_and_then();
                if (next_task(task)) run_task(task);
            }
            break;
        }
        first_pass = false;
        poll_io_now_and_then();
        bool found = next_task(task);
        if (!found) {
            was_idle = true;
            found = spin_for_work(task) || sleep_until_work(task, finished, wait);
        }
        if (!found) continue;
        if (was_idle) {
            was_idle = false;
            hand_on_runnext_watch();
        }
        run_task(task);
    }
    if (was_idle) hand_on_runnext_watch();
    direct_yield = false;
    loop_wait = nullptr;
    if (wait) {
        stop_helping();
        hand_on_caller_wake();
    }
    ts->scheduler = outer_scheduler;
    ts->worker = outer_worker;
    ts->task_fiber = outer_task;
    ts->task_ref = outer_ref;
}

inline void Worker::poll_io_now_and_then() {
    // While every worker is busy no one sleeps in epoll_wait: look at ready fds now and
    // then, so fibers waiting for IO are not starved by a busy scheduler, nor by a task
    // that yields in a loop.
    if (++tasks_since_io_poll >= 32) {
        tasks_since_io_poll = 0;
        core.idle.poll_io(true);
        // A busy scheduler never idles long enough to trim the stack pool: decay it instead.
        decay_stack_pool();
    }
}

inline bool Worker::spin_for_work(QueuedTask& task) {
    // Spin a few microseconds before paying for a sleep and a wake-up.
    core.spinning.fetch_add(1, std::memory_order_seq_cst);
    bool found = false;
    for (int i = 0; i < 64 && !found; ++i) {
        cpu_relax();
        found = find_task(task);
    }
    core.spinning.fetch_sub(1, std::memory_order_seq_cst);
    return found;
}

// Sleeps until there may be work; true with a task to run; `finished` once stop() may end.
//
// The lost-wake-up argument (drawn in docs/diagrams/lost_wakeup.dot, the run loop's steps
// in run_loop.dot; both in docs/design.md): a worker going to sleep increments `sleepers`,
// sets `sleeping`, then looks at every queue once more, taking each queue's lock (not
// trusting the size hints). A submitter pushes under the queue's lock, then loads `sleepers`/`spinning`
// (SchedulerCore::after_push). The two lock the same queue in some order: if the
// submitter's lock comes second, the sleeper's increment happens-before the submitter's
// load, which sees the sleeper and wakes it; if the sleeper's lock comes second, the push
// happens-before its look, which finds the task. So a submitter needs no read-modify-write,
// and on x86 its check is two plain loads. A spinner that stops spinning goes to sleep by
// the same path. `outstanding` reaching zero during stop() pairs through seq_cst operations
// on `outstanding`, `stopping` and `sleeping`; a timer added meanwhile through
// `timers.earliest` and `sleep_deadline` (Worker::add_timer). The use_caller thread helping
// in a wait (help_until) is worker 0 sleeping by the same path, and its wait's end pairs
// the same way: the notifier stores `done` (seq_cst) and then claims `sleeping`
// (wake_caller); the sleeper stores `sleeping` and then loads `done` (CallerWait); one of
// the two sees the other. Its own deadline is folded into the idle wait's deadline. The
// fibers in a single worker's local ring (requeue_yielded) are invisible to everyone else
// and need no wake-up: next_task() takes from the ring before the worker may spin or sleep,
// so a worker with fibers there never sleeps; and a task pushed meanwhile is seen through
// the `queued` hint at the next yield, or by the thorough look if the ring ran dry first.
// The direct yield path (run_task, direct_yield_next) keeps the worker inside run_task
// while its fibers yield, never near a sleep, and reads the same `queued` hint at every
// yield (a relaxed load of what the pusher stores under the lock, as requeue_yielded's
// unlocked branch does: it sees the store once the hardware makes it visible), so a task
// pushed meanwhile is taken as before; every 32nd pass still goes through run_loop, which
// polls IO.
// Stealable High tasks (stealable_high) are a hint on top, never needed for a wake-up:
// their push wakes workers as any push does.
// The count. A submitter that loads `sleepers` == 0 wakes no one, so the count must never
// be below the number of workers asleep (`sleeping` set). It is incremented by the worker
// before it sets `sleeping`, and decremented once per successful claim of that flag, after
// the claim's CAS (claim_worker_wake): every decrement follows the increment it matches,
// so the count is at least the number of flags set and not yet claimed. In the other order
// a waker could claim the flag between the worker's store and its increment and decrement
// first: the count read 0 for a moment while another worker slept, and a push pinned to that
// worker in that moment woke no one (a pinned io::read stayed parked with its byte queued,
// every worker idle; tests/test_faults.cpp holds a worker in that window). Counting first
// costs at most one needless look at the flags of a worker about to sleep.
inline bool Worker::sleep_until_work(QueuedTask& task, bool& finished, const CallerWait* wait) {
    idle.begin_sleep(core.idle);  // may take the poller role: before `sleeping` is set
    // Counted before `sleeping` is set, never after: see "The count" above.
    core.sleepers.fetch_add(1, std::memory_order_seq_cst);
#if defined(FIBER_SCHED_FAULT_INJECTION)
    if (auto hook = sleep_announce_hook.load(std::memory_order_relaxed)) hook(index);
#endif
    sleeping.store(true, std::memory_order_seq_cst);
    // The look that pairs with every submitter (see the lost-wake-up argument).
    if (find_task(task, true) || core.finished() || (wait && wait->satisfied())) {
        // If a submitter claimed the wake-up instead, its notify() only makes a later
        // wait return early. Claimed before end_sleep(), as after a sleep: handing the
        // poller role on, end_sleep() wakes a sleeping worker, which must not be this one.
        core.claim_worker_wake(*this);
        idle.end_sleep(core.idle);
        finished = !(task.fiber || task.cb);
        return !finished;
    }
    if (idle.poller_wanted(core.idle)) {
        // Fibers wait for IO and no one polls: go round the loop again and take the role
        // (side (b) of the argument at SchedulerIdle::poller).
        core.claim_worker_wake(*this);
        return false;
    }
    sleep_announced(wait);
    return false;
}

// The sleep itself, once announced and the last look found nothing: until a wake-up, the
// earliest timer of any worker, the caller's deadline, the end of a run-next watch, or the
// time to give back what a burst left (IdleTrim).
inline void Worker::sleep_announced(const CallerWait* wait) {
    drop_dead_timers();
    // Read after `sleeping` is set: a timer added since is seen here, or its adder sees us
    // asleep and wakes us (add_timer).
    std::int64_t deadline_ticks = earliest_deadline();
    if (wait && wait->deadline) deadline_ticks = std::min(deadline_ticks, to_ticks(*wait->deadline));
    const std::int64_t timer_ticks = deadline_ticks;  // what a fiber waits for, to the tick
    // Loaded after `sleepers` is stored: see the run-next argument at put_runnext.
    const bool watch = !single && runnext_activity();
    if (watch) {
        core.runnext_watchers.fetch_add(1, std::memory_order_seq_cst);
        deadline_ticks = std::min(deadline_ticks, to_ticks(deadline_after(SchedulerCore::runnext_watch_period)));
    }
    sleep_deadline.store(deadline_ticks, std::memory_order_seq_cst);
    const IdleTrim trim = plan_idle_trim();
    // no_deadline is TimePoint::max()'s count: the minimum is max() only with nothing due.
    const TimePoint deadline =
        std::min({TimePoint{std::chrono::steady_clock::duration(deadline_ticks)}, trim.stacks_at, trim.queues_at});
#if defined(FIBER_SCHED_FAULT_INJECTION)
    if (auto hook = sleep_wait_hook.load(std::memory_order_relaxed)) hook(index);
#endif
    const TimePoint now = std::chrono::steady_clock::now();
    count(counters.sleeps);
    idle_clock_asleep(now);
    // With timer_spin, a wait that this worker's own timer (or the caller's deadline) ends
    // stops that much early, and the worker spins the rest (spin_to_timer); the others
    // sleep to it, and the first awake fires it, as without.
    const TimePoint timer{std::chrono::steady_clock::duration(timer_ticks)};
    const std::chrono::nanoseconds spin = core.options.timer_spin;
    const bool spins = spin.count() > 0 && timer_ticks != no_deadline && timer == deadline &&
                       (timer_ticks == timers.earliest.load(std::memory_order_seq_cst) ||
                        (wait && wait->deadline && timer_ticks == to_ticks(*wait->deadline)));
    // The wait ends up to its resolution after the time asked (a whole millisecond without
    // epoll_pwait2): end it that much sooner, so that it ends before the timer. Saturated:
    // timer_spin may be nanoseconds::max() (spin the whole sleep).
    const std::chrono::nanoseconds resolution = idle_wait_resolution();
    const std::chrono::nanoseconds early =
        spin > std::chrono::nanoseconds::max() - resolution ? std::chrono::nanoseconds::max() : spin + resolution;
    const TimePoint wait_until = !spins ? deadline : timer - now <= early ? now : timer - early;
    // Not if its wake-up was claimed since it announced the sleep: by a waker, whose
    // notify() would only end the wait at once, or by this worker itself, which sends none
    // (SchedulerCore::wake_worker: it queued a task during its last look, for another worker
    // perhaps, then found nothing to take).
    if (now < wait_until && sleeping.load(std::memory_order_seq_cst)) {
        idle.wait(core.idle, wait_until == TimePoint::max() ? nullptr : &wait_until);
    }
    const TimePoint woke = std::chrono::steady_clock::now();
    idle_clock_awake(woke);
    if (spins && woke >= wait_until && sleeping.load(std::memory_order_seq_cst)) spin_to_timer(timer);
    if (watch) core.runnext_watchers.fetch_sub(1, std::memory_order_seq_cst);
    core.claim_worker_wake(*this);
    sleep_deadline.store(no_deadline, std::memory_order_seq_cst);
    idle.end_sleep(core.idle);
    idle_trim(trim);
}

// The end of a sleep that a timer ends, with SchedulerOptions::timer_spin: a kernel's
// wake-up is late by tens of microseconds to milliseconds on a loaded or virtual machine
// (the vCPU halted), a spin by the time a clock read takes. Still announced as asleep, so
// a task pushed meanwhile, or an earlier timer, claims `sleeping` as it would a sleeper's
// (its notify() only makes a later wait return early), and the spin ends at once. The
// poller looks at the fds every 10 us meanwhile: a fiber it wakes is queued here, which
// claims this worker's wake-up and ends the spin.
inline void Worker::spin_to_timer(TimePoint timer) noexcept {
    const TimePoint start = std::chrono::steady_clock::now();
    if (start >= timer) return;  // the wait ended late: nothing left to spin
    count(counters.timer_spins);
    TimePoint now = start;
    TimePoint poll_at = start + std::chrono::microseconds(10);
    while (now < timer && sleeping.load(std::memory_order_seq_cst)) {
        cpu_relax();
        now = std::chrono::steady_clock::now();
        if (now >= poll_at) {
            idle.poll_while_spinning(core.idle);
            poll_at = now + std::chrono::microseconds(10);
        }
    }
    count(counters.timer_spin_ns, static_cast<std::uint64_t>(steady_ns(now) - steady_ns(start)));
}

inline Worker::IdleTrim Worker::plan_idle_trim() noexcept {
    IdleTrim trim;
    // A burst of fibers left more freed stacks than the pool keeps (stack.ipp): give their
    // memory back once the scheduler has been idle a while, not while it is busy.
    if (stack_pool_has_surplus()) {
        trim.stacks_at = deadline_after(std::chrono::milliseconds(stack_trim_delay_ms.load(std::memory_order_relaxed)));
    }
    // Likewise the slabs a burst of tasks left in this worker's queues (TaskBlockSlabs),
    // sooner: they cost a page fault per 4 KiB to take again, not a stack's worth.
    if (has_surplus_slabs()) trim.queues_at = deadline_after(queue_trim_delay);
    return trim;
}

inline void Worker::idle_trim(const IdleTrim& trim) noexcept {
    if (trim.stacks_at == TimePoint::max() && trim.queues_at == TimePoint::max()) return;
    const TimePoint now = std::chrono::steady_clock::now();
    if (now >= trim.stacks_at) trim_stack_pool();
    if (now >= trim.queues_at) release_surplus_slabs();
}

inline bool Worker::has_surplus_slabs() noexcept {
    std::lock_guard<SpinLock> lock(ready.lock);
    for (const Level& level : ready.levels) {
        if (level.tasks.empty_slabs() > 1 || level.pinned.empty_slabs() > 1) return true;
    }
    return false;
}

inline void Worker::release_surplus_slabs() noexcept {
    void* detached[2 * level_count];
    {
        std::lock_guard<SpinLock> lock(ready.lock);
        for (int i = 0; i < level_count; ++i) {
            detached[2 * i] = ready.levels[i].tasks.detach_empty_slabs();
            detached[2 * i + 1] = ready.levels[i].pinned.detach_empty_slabs();
        }
    }
    for (void* slabs : detached) TaskBlockSlabs::unmap_detached(slabs);  // a system call each
}

inline void Worker::notify() { idle.notify(core.idle); }

inline Fiber::ptr Worker::fiber_for(TaskFunction&& cb) {
    if (FIBER_SCHED_FAULT(FiberAlloc)) throw std::bad_alloc();
    if (!spare_fibers.empty()) {
        Fiber::ptr fiber = std::move(spare_fibers.back());
        spare_fibers.pop_back();
        FiberAccess::reuse(*fiber, std::move(cb));
        return fiber;
    }
    // Every pooled fiber has the scheduler's stack size (a task's own size is made in
    // schedule() and never pooled: run_task).
    return FiberAccess::make_in_stack(std::move(cb), core.options.stack_size);
}

inline void Worker::run_task(QueuedTask& task) {
    bool pooled = !task.fiber;
    Fiber::ptr fiber;
    if (!claim_task_fiber(task, fiber)) return;
    const SwitchOutcome outcome = run_task_fiber(fiber, pooled);
    if (outcome == SwitchOutcome::Parked) return;  // still outstanding; wake_fiber() queues it again
    // Returned, or left the scheduler through Fiber::yield(): the task is done.
    retire_task_fiber(fiber, pooled && outcome == SwitchOutcome::Returned);
}

// A schedule()d fiber that some thread is running by hand (Claim::Busy): its task, still
// counted, waits for the fiber to switch out. A helper task (counted too, so stop() waits
// for both) sleeps meanwhile, 20 us, then twice as long each time up to 1 ms, and queues
// the task again. Queued again at once instead, it spun a worker for as long as the hand
// run lasted, and at High priority kept every Normal task waiting. Without memory for the
// helper it is queued again at once after all.
FIBER_SCHED_NOINLINE FIBER_SCHED_COLD inline void Worker::requeue_busy(Fiber::ptr fiber, int worker,
                                                                       Priority priority) {
    QueuedTask task;
    task.kind = TaskKind::Fresh;
    task.fiber = std::move(fiber);
    task.worker = worker;
    task.priority = priority;
    std::shared_ptr<QueuedTask> waiting;
    try {
        waiting = std::make_shared<QueuedTask>(std::move(task));  // (no memory: task intact)
        SchedulerCore* const scheduler = &core;
        core.owner.schedule([scheduler, waiting] {
            auto pause = std::chrono::microseconds(20);
            while (FiberAccess::lifecycle(*waiting->fiber).running_by_hand()) {
                this_fiber::sleep_for(pause);
                pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
            }
            scheduler->enqueue_fiber(std::move(*waiting));
        });
        return;
    } catch (...) {
    }
    core.enqueue_fiber(std::move(waiting ? *waiting : task));
    std::this_thread::yield();
}

FIBER_SCHED_ALWAYS_INLINE inline bool Worker::claim_task_fiber(QueuedTask& task, Fiber::ptr& fiber) {
    const int worker = task.worker;
    const Priority priority = task.priority;
    const TaskKind kind = task.kind;
    if (!task.fiber) {
        try {
            fiber = fiber_for(std::move(task.cb));
        } catch (...) {
            // No memory or no stack for the callback's fiber: the task cannot run. Its
            // failure goes to the exception handler like one it threw; the rest run on.
            task = QueuedTask{};
            core.report(std::current_exception());
            core.task_finished();
            return false;
        }
    } else {
        fiber = std::move(task.fiber);
    }
    task = QueuedTask{};
    switch (kind) {
    case TaskKind::Fresh:
        switch (FiberAccess::lifecycle(*fiber).claim_or_defer(ResumeTarget{&core.owner, worker, priority})) {
        case Claim::Claimed:
            return true;
        case Claim::Deferred:  // it runs when it has left the worker it is still running on
            return false;
        case Claim::Busy:
            requeue_busy(std::move(fiber), worker, priority);
            return false;
        }
        return false;
    case TaskKind::Woken:
        FiberAccess::lifecycle(*fiber).claim_woken();
        FiberAccess::wait_while_inspected(*fiber);
        count(counters.wakes);  // here, not at the wake: the waker may be any thread
        return true;
    case TaskKind::Claimed:
        return true;
    }
    return true;
}

FIBER_SCHED_ALWAYS_INLINE inline SwitchOutcome Worker::run_task_fiber(Fiber::ptr& fiber, bool& pooled) {
    ThreadState* ts = thread_state();
    SwitchOutcome outcome;
    // Counted here and stored once the loop leaves (the direct yield path leaves at least
    // every 32 passes): one register increment per yield, not a load and a store.
    std::uint64_t runs = 0;
    for (;;) {
        ++runs;
        ts->task_fiber = fiber.get();
        ts->task_ref = &fiber;  // a park hook may take this reference (take_task_ref)
        FiberAccess::last_worker(*fiber) = this;
        try {
            outcome = FiberAccess::run(*fiber);
        } catch (...) {
            outcome = SwitchOutcome::Returned;
            ts->task_fiber = nullptr;
            core.report(std::current_exception());
        }
        // Back on this worker's stack: in the child of a fork() made inside the task, this
        // thread is no worker (forget_schedulers_in_child), and this loop's scheduler is not
        // there. One load of a line this thread has just used.
        FIBER_SCHED_ASSERT(ts->worker == this &&
                           "fork(): a child forked inside a scheduler task must _exit() or exec before the task "
                           "ends or yields to its worker (the child has no workers)");
        if (outcome != SwitchOutcome::Parked) break;
        if (!yield_pending) {
            count(counters.parks);
            break;
        }
        // this_fiber::yield(): the fiber is still claimed (Running) and `fiber` still holds it.
        yield_pending = false;
        if (!direct_yield_next(fiber)) {
            yielded = std::move(fiber);  // run_loop puts it back in line (requeue_yielded)
            break;
        }
        pooled = false;  // the fiber now in hand may be a user's: never pool it
    }
    count(counters.tasks_run, runs);
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    return outcome;
}

// A fiber goes back to the pool only when nothing but this worker's reference can reach
// it: use_count() == 1 rules out another shared_ptr, and a weak_ptr (from which one could
// still be locked after that read) can only have come from a Fiber* that Fiber::current()
// gave out, which marked the fiber handed out (fiber_switch.hpp). A fiber not pooled
// loses this worker's reference below; it goes, and every weak_ptr to it expires, with
// the last shared_ptr user code kept (at once when it kept none), and until then it is
// this task's fiber: a weak_ptr never locks onto a later task's.
FIBER_SCHED_ALWAYS_INLINE inline void Worker::retire_task_fiber(Fiber::ptr& fiber, bool poolable) noexcept {
    if (poolable && fiber.use_count() == 1 && !FiberAccess::handed_out(*fiber) && spare_fibers.size() < spare_fibers_max) {
        FiberAccess::retire(*fiber);
        spare_fibers.push_back(std::move(fiber));  // reserved: never allocates
    }
    fiber.reset();
    core.task_finished();
}

std::size_t queue_slabs(Scheduler& scheduler) noexcept {
    std::size_t n = 0;
    for (auto& w : SchedulerCore::of(scheduler).workers) {
        std::lock_guard<SpinLock> lock(w->ready.lock);
        for (const Worker::Level& level : w->ready.levels) n += level.tasks.slabs() + level.pinned.slabs();
    }
    return n;
}

}  // namespace detail
}  // namespace fsched
