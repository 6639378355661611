// ---------------------------------------------------------------------------
// A worker: its queues by priority and the tasks pinned to it, the run-next slot, the
// local ring of a single worker's yielded fibers, its timer heap, its idle wait, and the
// operations on its queues that run under their lock (push, pop, steal). Each lock sits in
// a small struct with the fields it guards (ReadyQueues `ready`, TimerHeap `timers`). The steps of its run loop are declared here and defined in
// the parts that own them: sched_find.ipp (where the next task comes from),
// sched_run_loop.ipp (the loop, spinning, sleeping, running a task), sched_yield.ipp,
// sched_timers.ipp, sched_runnext.ipp and sched_caller.ipp.
// Relies on: sched_task_queue.ipp, the idle wait (idle_epoll.ipp or idle_condvar.ipp),
// SpinLock and WaitState (sync.hpp), FiberAccess (common.ipp).
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"
#include "impl/idle.ipp"
#include "impl/sched_task_queue.ipp"

namespace fsched {
namespace detail {

// A steady_clock time point as one integer, so a worker's earliest deadline can be an atomic.
inline std::int64_t to_ticks(TimePoint t) noexcept { return t.time_since_epoch().count(); }
constexpr std::int64_t no_deadline = INT64_MAX;

struct Timer {
    TimePoint deadline;
    std::uint64_t sequence;  // FIFO among equal deadlines
    Fiber::ptr fiber;        // a sleeping fiber, woken at the deadline
    // Or a timed wait: it wakes its fiber only if it wins the race against a notifier.
    std::shared_ptr<WaitState> wait;
    bool operator>(const Timer& other) const noexcept {
        return deadline != other.deadline ? deadline > other.deadline : sequence > other.sequence;
    }
    // A timed wait already satisfied (or given up) by someone else: nothing left to do.
    bool dead() const noexcept { return wait && wait->status.load(std::memory_order_acquire) != WaitStatus::Waiting; }
};

// What the use_caller thread waits for while it helps (help_until): `done` set (seq_cst,
// paired with Worker::sleeping, see sleep_until_work), or `deadline` passed. Either may be
// null.
struct CallerWait {
    const std::atomic<bool>* done;
    const TimePoint* deadline;
    bool satisfied() const noexcept {
        return (done && done->load(std::memory_order_seq_cst)) ||
               (deadline && std::chrono::steady_clock::now() >= *deadline);
    }
};

struct alignas(64) Worker {
    Worker(SchedulerCore& core_, int index_, bool single_, bool migrate_)
        : core(core_), index(index_), single(single_), migrate(migrate_) {
        steal_buffer.reserve(32);  // a whole steal: see steal_into()
        overflow.reserve(32);
        spare_fibers.reserve(spare_fibers_max);  // so that pooling a fiber never allocates
    }

    SchedulerCore& core;
    const int index;
    const bool single;  // the scheduler's only worker (no thief, no other queue)
    // SchedulerCore::migrate or a simulation (SchedulerCore::sim), one load away for
    // this_fiber::yield(): a yield is then a park and a wake (yield_elsewhere).
    const bool migrate;
    std::thread thread;

    // The ready tasks of one priority level: stealable ones, and ones pinned to this worker.
    struct Level {
        TaskQueue tasks;
        TaskQueue pinned;
        bool empty() const noexcept { return tasks.empty() && pinned.empty(); }
    };
    static constexpr int level_count = 3;

    // The ready queues and the run-next slot. `lock` guards every field; the three hints
    // (`queued`, `stealable`, `runnext_state`) are written under it and read without it.
    struct ReadyQueues {
        SpinLock lock;
        Level levels[level_count];        // indexed by Priority
        std::size_t stealable_count = 0;  // tasks in every level's `tasks`
        std::size_t pinned_count = 0;     // and in every `pinned`
        // Orders a level's two queues (pop_locked): push_locked counts up from here, and
        // push_front_locked down.
        std::uint64_t next_sequence = std::uint64_t{1} << 62;
        std::uint64_t front_sequence = std::uint64_t{1} << 62;
        // The two counts above as hints (waiting_locked() and stealable_count): a stale read
        // only costs a needless lock or a later look. The last look before sleeping ignores
        // them and takes every lock (see run_loop).
        std::atomic<std::size_t> queued{0};
        std::atomic<std::size_t> stealable{0};
        // The run-next slot (Go's runnext): an unpinned Normal fiber that a task on this
        // worker woke (put_runnext), which this worker runs next, ahead of its Normal queue,
        // before it looks anywhere else; the woken fiber finds the waker's caches warm, and a
        // pair that hands work to each other (a channel ping-pong, a mutex handed over) stays
        // on one worker instead of crossing by steal at every message. A second wake puts the
        // first fiber at the back of the Normal queue. Not stealable: another worker takes it
        // only when it has sat there unchanged for runnext_stuck_looks of that worker's looks
        // (a task that woke it and runs on without parking; see take_stuck_runnext).
        Fiber::ptr runnext;
        std::uint64_t runnext_sets = 0;
        // (runnext_sets << 1) | occupied, read by other workers as a hint; seq_cst when set,
        // paired with `sleepers` (see put_runnext).
        std::atomic<std::uint64_t> runnext_state{0};
        // Runnext taken in a row while the Normal queue has tasks: at runnext_streak_max the
        // queue's oldest goes first, so a pair waking each other cannot starve it.
        unsigned runnext_streak = 0;
    };
    ReadyQueues ready;
    // Set while the use_caller thread runs this worker (0) outside stop(): it takes pinned
    // tasks before unpinned ones of the same level. Only the thread running the worker
    // reads or writes it.
    bool caller_helping = false;
    static constexpr unsigned runnext_streak_max = 16;
    static constexpr unsigned runnext_stuck_looks = 16;

    // Set by this worker before it sleeps; cleared by whoever claims waking it (a submitter,
    // or the worker itself), and that one decrements core.sleepers. seq_cst: see
    // sleep_until_work().
    std::atomic<bool> sleeping{false};
    // The deadline this worker's idle wait ends at (no_deadline: none, or awake). Written
    // after `sleeping` is set and reset after waking; add_timer() reads it (see there).
    std::atomic<std::int64_t> sleep_deadline{no_deadline};
    // The idle wait (idle_epoll.ipp or idle_condvar.ipp); its part shared by the workers
    // is SchedulerCore::idle.
    WorkerIdle idle;

    // Timers of fibers that parked on this worker: a min-heap. This worker adds to it; any
    // worker may fire its due timers (an idle worker serves a busy one's). On a cache line
    // of their own: other workers read `earliest` whenever they look for work, and must not
    // pull the line of the hot queue lock across to do it. `lock` guards every field but
    // `earliest`, which is written under it and read without it.
    struct TimerHeap {
        SpinLock lock;
        std::vector<Timer> heap;
        std::uint64_t sequence = 0;
        std::size_t after_sweep = 0;  // the heap's size after the last sweep (add_timer)
        // The earliest deadline in `heap` (no_deadline: none); seq_cst, paired with
        // `sleeping` (see add_timer).
        std::atomic<std::int64_t> earliest{no_deadline};

        // Under `lock`: takes the earliest timer out and publishes the next one's deadline.
        Timer pop_front() noexcept {
            std::pop_heap(heap.begin(), heap.end(), std::greater<Timer>());
            Timer front = std::move(heap.back());
            heap.pop_back();
            earliest.store(heap.empty() ? no_deadline : to_ticks(heap.front().deadline), std::memory_order_seq_cst);
            return front;
        }
    };
    alignas(64) TimerHeap timers;

    // Only this worker's thread touches these.
    alignas(64) std::vector<Fiber::ptr> spare_fibers;  // finished callback fibers, for the next callbacks
    static constexpr std::size_t spare_fibers_max = 64;
    unsigned steal_start = 0;
    Fiber::ptr yielded;  // the fiber that this_fiber::yield()ed, when run_task leaves it to run_loop
    // Set by this_fiber::yield()'s park hook on this worker; run_task clears it.
    bool yield_pending = false;
    // Set while run_loop (not run_ready) runs this worker: run_task may then take the
    // direct yield path (run_task), checking `loop_wait` as run_loop would.
    bool direct_yield = false;
    const CallerWait* loop_wait = nullptr;
    unsigned tasks_since_io_poll = 0;

    // What this worker has done, for Scheduler::stats(). Written only by the thread running
    // this worker, one at a time (its own thread; the use_caller thread as worker 0; the
    // stopping thread standing in for a worker without a thread; each one's writes
    // happen-before the next one's through a thread start, a join or lifecycle_mutex), as a
    // relaxed load and a relaxed store (count()): a plain add on the hot paths, no locked
    // one. stats() loads them relaxed from any thread, so it may miss the latest few. Events
    // on other threads are counted where this worker sees them (a wake when it resumes the
    // woken fiber, a timer by the worker that fires it), never with a shared counter.
    struct Counters {
        std::atomic<std::uint64_t> tasks_run{0};
        std::atomic<std::uint64_t> steals{0};
        std::atomic<std::uint64_t> tasks_stolen{0};
        std::atomic<std::uint64_t> parks{0};
        std::atomic<std::uint64_t> wakes{0};
        std::atomic<std::uint64_t> timers_fired{0};
        std::atomic<std::uint64_t> sleeps{0};
        std::atomic<std::uint64_t> timer_spins{0};
        std::atomic<std::uint64_t> timer_spin_ns{0};
        // The idle wait's time, in steady_clock nanoseconds, as one word so that a reader
        // gets the finished sleeps and the one going on from a single load: awake, 2 * the
        // total of finished sleeps (even); asleep since S, 2 * (total - S) + 1 (odd), and
        // the reader adds its own now(). Same single writer; relaxed: one variable.
        std::atomic<std::int64_t> idle_clock{0};
    } counters;
    static void count(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept {
        counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
    static std::int64_t steady_ns(TimePoint t) noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    }
    // Around the idle wait (sleep_announced), on this worker's thread.
    void idle_clock_asleep(TimePoint since) noexcept {
        const std::int64_t total = counters.idle_clock.load(std::memory_order_relaxed) / 2;
        counters.idle_clock.store(2 * (total - steady_ns(since)) + 1, std::memory_order_relaxed);
    }
    void idle_clock_awake(TimePoint now) noexcept {
        const std::int64_t word = counters.idle_clock.load(std::memory_order_relaxed);
        counters.idle_clock.store(2 * ((word - 1) / 2 + steady_ns(now)), std::memory_order_relaxed);
    }
    // The idle wait's time so far, as of `now`; any thread.
    std::chrono::nanoseconds idle_time(TimePoint now) const noexcept {
        const std::int64_t word = counters.idle_clock.load(std::memory_order_relaxed);
        const std::int64_t ns = (word & 1) ? (word - 1) / 2 + steady_ns(now) : word / 2;
        return std::chrono::nanoseconds(ns > 0 ? ns : 0);  // a reader's now() just before the sleep began
    }
    // A scheduler of one worker (no thief can want them): Normal fibers that yielded wait
    // in this ring, the owner's alone, with no lock and no atomic read-modify-write, while
    // the shared queues are empty by their hint. A fiber enters it only when the shared
    // queues are empty, or from the front of the shared Normal line when the ring is empty
    // (a yielded prefix, requeue_yielded), so its fibers are older than anything queued
    // there. Once anything is queued, the worker takes the ring's oldest next and queues a
    // yielding Normal fiber behind the rest (requeue_yielded), or, for a High task waiting
    // and when no fiber yielded (take_local), moves the ring to the front of the shared
    // queues, behind the lock and in order. So the order of arrival is kept, and a yielding
    // loop starves nothing that others queue. While the shared queues stay empty, run_task
    // hands the worker from one yielder to the ring's oldest directly (direct_yield_next).
    // Capacity: 0 or a power of two.
    std::vector<Fiber::ptr> local_ring;
    std::size_t local_head = 0, local_size = 0;

    // What this worker, as a thief, last saw of each worker's runnext_state: for
    // take_stuck_runnext (`looks`: how many looks it has been unchanged) and for the watch
    // before sleeping (`at_sleep`). Only this worker's thread touches it.
    struct RunnextLook {
        std::uint64_t state = 0;
        unsigned looks = 0;
        std::uint64_t at_sleep = 0;
    };
    std::vector<RunnextLook> runnext_looks;  // one per worker, sized by SchedulerCore

    // Makes room for one more timer, so that add_timer() in a park hook cannot fail.
    // Called by the fiber about to park on this worker; may throw std::bad_alloc.
    void reserve_timer();
    // Wakes `fiber` at `deadline`, or, for a timed wait, whoever wins `wait`'s race then.
    // Only on this worker's thread, after reserve_timer(); never throws.
    void add_timer(TimePoint deadline, Fiber::ptr fiber, std::shared_ptr<WaitState> wait) noexcept;
    // Fires this worker's due timers; any worker may call it, as `firer` (the worker it
    // runs, which counts them). True if any woke a fiber.
    bool fire_due_timers(Worker& firer);

    // Publishes the queue sizes as hints; call under ready.lock after changing the queues.
    void update_hints() noexcept {
        ready.stealable.store(ready.stealable_count, std::memory_order_relaxed);
        ready.queued.store(waiting_locked(), std::memory_order_relaxed);
    }
    // Every task this worker holds for itself to run: queued ones and the run-next slot.
    std::size_t waiting_locked() const noexcept { return ready.stealable_count + ready.pinned_count + (ready.runnext ? 1 : 0); }

    // Appends at the task's level under ready.lock (held). Strong guarantee: on
    // std::bad_alloc nothing changed.
    FIBER_SCHED_ALWAYS_INLINE void push_locked(QueuedTask&& task, bool own_pinned) {
        task.sequence = ready.next_sequence;
        const bool stealable_high = !own_pinned && task.priority == Priority::High;
        Level& level = ready.levels[static_cast<int>(task.priority)];
        (own_pinned ? level.pinned : level.tasks).push_back(std::move(task));
        ++ready.next_sequence;
        ++(own_pinned ? ready.pinned_count : ready.stealable_count);
        if (stealable_high) high_moved(1);
    }

    // Puts a Normal task at the front of its queue, as if it had come before everything
    // there (flush_local_locked), under ready.lock (held). Strong guarantee.
    void push_front_locked(QueuedTask&& task, bool own_pinned) {
        task.sequence = --ready.front_sequence;
        Level& level = ready.levels[static_cast<int>(Priority::Normal)];
        (own_pinned ? level.pinned : level.tasks).push_front(std::move(task));
        ++(own_pinned ? ready.pinned_count : ready.stealable_count);
    }

    // Keeps SchedulerCore::stealable_high (defined below) in step with this worker's
    // stealable High tasks; under ready.lock. Only High tasks pay for it.
    void high_moved(long delta) noexcept;

    // The queues' sizes, and taking them back to such sizes (undoing push_locked calls),
    // under ready.lock (held).
    using Sizes = std::size_t[level_count][2];
    void sizes_locked(Sizes& out) const noexcept {
        for (int i = 0; i < level_count; ++i) {
            out[i][0] = ready.levels[i].tasks.size();
            out[i][1] = ready.levels[i].pinned.size();
        }
    }
    void truncate_locked(const Sizes& sizes) noexcept {
        for (int i = 0; i < level_count; ++i) {
            TaskQueue& t = ready.levels[i].tasks;
            TaskQueue& p = ready.levels[i].pinned;
            ready.stealable_count -= t.size() - sizes[i][0];
            ready.pinned_count -= p.size() - sizes[i][1];
            if (i == static_cast<int>(Priority::High) && t.size() != sizes[i][0]) {
                high_moved(-static_cast<long>(t.size() - sizes[i][0]));
            }
            t.truncate(sizes[i][0]);
            p.truncate(sizes[i][1]);
        }
    }

    void push(QueuedTask&& task, bool own_pinned) {
        std::lock_guard<SpinLock> lock(ready.lock);
        push_locked(std::move(task), own_pinned);
        update_hints();
    }

    // Takes a task of the highest level that has one, under ready.lock (held): the oldest
    // of that level's two queue fronts, so that pinned and unpinned tasks are served in the
    // order they arrived and neither kind can starve the other; while the use_caller thread
    // helps, its pinned tasks first (they have no one else to run them).
    FIBER_SCHED_ALWAYS_INLINE bool pop_locked(QueuedTask& out) {
        // All Normal, the common case, costs one look at the empty High level.
        Level* level = &ready.levels[static_cast<int>(Priority::Normal)];
        if (!ready.levels[static_cast<int>(Priority::High)].empty()) {
            level = &ready.levels[static_cast<int>(Priority::High)];
        } else if (ready.runnext && (ready.runnext_streak < runnext_streak_max || level->empty())) {
            take_runnext_locked(out);
            return true;
        } else if (level->empty()) {
            level = &ready.levels[static_cast<int>(Priority::Low)];
            if (level->empty()) return false;
        }
        bool from_pinned;
        if (level->pinned.empty()) {
            from_pinned = false;
        } else if (level->tasks.empty() || caller_helping) {
            from_pinned = true;
        } else {
            from_pinned = level->pinned.front().sequence < level->tasks.front().sequence;
        }
        TaskQueue& from = from_pinned ? level->pinned : level->tasks;
        out = std::move(from.front());
        from.pop_front();
        ready.runnext_streak = 0;
        --(from_pinned ? ready.pinned_count : ready.stealable_count);
        if (!from_pinned && out.priority == Priority::High) high_moved(-1);
        update_hints();
        return true;
    }

    // Moves the run-next fiber into `out` (a wake-up), under ready.lock (held).
    void take_runnext_locked(QueuedTask& out) noexcept {
        out.fiber = std::move(ready.runnext);
        out.cb = nullptr;
        out.worker = -1;
        out.priority = Priority::Normal;
        out.kind = TaskKind::Woken;
        ++ready.runnext_streak;
        ready.runnext_state.store(ready.runnext_sets << 1, std::memory_order_relaxed);
        update_hints();
    }

    // From a task running on this worker: `fiber` (parked, unpinned, Normal) is woken into
    // the run-next slot. False, with `fiber` intact, when there is no memory to queue the
    // fiber it displaces: the caller queues `fiber` as any wake-up.
    bool put_runnext(Fiber::ptr& fiber) noexcept;
    // Another worker's run-next fiber that has sat unchanged for runnext_stuck_looks of this
    // worker's looks; true with it in `out`.
    bool take_stuck_runnext(QueuedTask& out) noexcept;
    // Whether another worker's run-next slot is occupied or was set since this worker last
    // asked: the worker then sleeps for at most runnext_watch_period (sleep_until_work).
    bool runnext_activity() noexcept;
    // This worker stops being idle (it spun, or slept, perhaps as a watcher, and now runs a
    // task or leaves its loop): put_runnext may have counted on it to look at a slot, so if
    // one is in use and no one else watches or spins, wake a sleeper in its place.
    void hand_on_runnext_watch() noexcept;
    // The use_caller thread leaves its help (its wait is satisfied): pass on a wake-up that
    // it may have been given for work elsewhere (see the definition).
    void hand_on_caller_wake() noexcept;
    // A slot is in use: unless a watcher or a spinner will look at it, or no one sleeps,
    // wake a sleeping worker other than this one to look (put_runnext, hand_on_runnext_watch).
    void wake_runnext_looker() noexcept;

    bool pop(QueuedTask& out, bool trust_hint) {
        if (trust_hint && ready.queued.load(std::memory_order_relaxed) == 0) return false;
        std::lock_guard<SpinLock> lock(ready.lock);
        return pop_locked(out);
    }

    // Moves up to half (at most 32) of this worker's stealable tasks of the highest level
    // it has into `thief`, where they keep their level. `high_only`: High tasks or nothing.
    bool steal_into(Worker& thief, QueuedTask& first, bool trust_hint, bool high_only = false) {
        if (trust_hint && ready.stealable.load(std::memory_order_relaxed) == 0) return false;
        std::vector<QueuedTask>& taken = thief.steal_buffer;  // reserved: no allocation here
        {
            std::lock_guard<SpinLock> lock(ready.lock);
            if (ready.stealable_count == 0) return false;
            int level = 0;
            while (ready.levels[level].tasks.empty()) ++level;  // one is not empty
            if (high_only && level != static_cast<int>(Priority::High)) return false;
            TaskQueue& tasks = ready.levels[level].tasks;
            const std::size_t n = std::min<std::size_t>((tasks.size() + 1) / 2, 32);
            for (std::size_t i = 0; i < n; ++i) {
                taken.push_back(std::move(tasks.back()));
                tasks.pop_back();
            }
            ready.stealable_count -= n;
            if (level == static_cast<int>(Priority::High)) high_moved(-static_cast<long>(n));
            update_hints();
        }
        count(thief.counters.steals);  // the thief runs this
        count(thief.counters.tasks_stolen, taken.size());
        // The back of `taken` is the oldest: run it first, queue the rest oldest first.
        first = std::move(taken.back());
        taken.pop_back();
        if (!taken.empty()) {
            std::lock_guard<SpinLock> lock(thief.ready.lock);
            try {
                while (!taken.empty()) {
                    thief.push_locked(std::move(taken.back()), false);  // strong guarantee
                    taken.pop_back();
                }
            } catch (...) {
                // Out of memory: keep the rest aside, in the same order (the back is the
                // oldest). `overflow` was reserved for a whole steal.
                for (QueuedTask& t : taken) thief.overflow.push_back(std::move(t));
            }
            thief.update_hints();
        }
        taken.clear();
        return true;
    }

    std::vector<QueuedTask> steal_buffer;  // this worker's, as a thief; capacity 32
    // Tasks a thief stole but could not queue for lack of memory (see steal_into), run
    // before anything else, oldest (the back) first. Only this worker's thread touches it;
    // its capacity is reserved at construction, so pushing a steal's worth never allocates.
    std::vector<QueuedTask> overflow;

    // Ends this worker's idle wait (or makes its next one return at once).
    void notify();

    // The run loop and its steps, in the order run_loop() takes them. With `wait`, the
    // use_caller thread helps as worker 0 outside stop() and leaves once `wait` is satisfied.
    void run_loop(const CallerWait* wait = nullptr);
    bool next_task(QueuedTask& task);        // yielded fiber, then own queues, timers, steal
    void poll_io_now_and_then();             // ready fds, every 32 tasks, however busy
    bool spin_for_work(QueuedTask& task);    // a few microseconds before sleeping
    bool sleep_until_work(QueuedTask& task, bool& finished, const CallerWait* wait);
    void sleep_announced(const CallerWait* wait);  // the sleep, after the last look
    void spin_to_timer(TimePoint timer) noexcept;  // its end, with SchedulerOptions::timer_spin
    // When the sleep gives back what a burst left: stacks beyond the pool's keep, this
    // worker's surplus queue slabs (TimePoint::max(): nothing to give back).
    struct IdleTrim {
        TimePoint stacks_at = TimePoint::max();
        TimePoint queues_at = TimePoint::max();
    };
    IdleTrim plan_idle_trim() noexcept;
    void idle_trim(const IdleTrim& trim) noexcept;
    // Whether this worker's queues keep more than one empty slab each (a burst's), and
    // giving those back: after queue_trim_delay asleep.
    bool has_surplus_slabs() noexcept;
    void release_surplus_slabs() noexcept;
    static constexpr std::chrono::milliseconds queue_trim_delay{10};
    // The use_caller thread outside stop(), as worker 0: runs up to `max_tasks` ready tasks
    // while `until` has not passed, never sleeping; returns how many ran.
    std::size_t run_ready(std::size_t max_tasks, TimePoint until);
    // The use_caller thread stops helping: a fiber it left yielded, and stolen tasks it
    // queued here, go where others can run them.
    void stop_helping() noexcept;
    void requeue_yielded(QueuedTask& next);
    // requeue_yielded()'s steps, under ready.lock: behind the local ring (false when it
    // stays empty), or in line at the back of the yielder's level; `next` as a claimed fiber.
    bool requeue_behind_ring_locked(QueuedTask& back, QueuedTask& next);
    void requeue_in_line_locked(QueuedTask& back, QueuedTask& next, bool ring);
    static void take_claimed(QueuedTask& next, Fiber::ptr&& fiber) noexcept;
    // The local ring (single-worker schedulers): make room, push, pop, and take the next task when the ring holds any: its oldest fiber while the shared queues
    // are empty, else the ring moved behind the lock and the next task from there.
    bool local_reserve() noexcept;          // room for one more; false out of memory
    void local_push(Fiber::ptr& fiber) noexcept;  // after local_reserve()
    Fiber::ptr local_pop() noexcept;
    bool take_local(QueuedTask& next);
    void flush_local_locked() noexcept;  // under ready.lock
    // Under ready.lock: moves the claimed (yielded) fibers at the front of the Normal level
    // to the back of the ring; returns how many.
    std::size_t take_yielded_prefix_locked() noexcept;
    // Looks at the timers, its own queues, then steals. `thorough`: take every queue's
    // lock instead of trusting the size hints (the look before sleeping).
    bool find_task(QueuedTask& out, bool thorough = false);
    // Its own High task, else one stolen from another worker (find_task, while
    // SchedulerCore::stealable_high says there are some).
    bool take_high(QueuedTask& out);
    // The earliest timer deadline of any worker (no_deadline: none).
    std::int64_t earliest_deadline() const noexcept;
    void drop_dead_timers() noexcept;  // satisfied waits' timers at the front of this heap
    void run_task(QueuedTask& task);
    // run_task()'s steps: the task's fiber (a pooled one for a callback) claimed for this
    // worker (false: it cannot run now, and nothing is left to do), run until it parks or
    // is done (the direct yield path included), and, done, pooled or released.
    bool claim_task_fiber(QueuedTask& task, Fiber::ptr& fiber);
    void requeue_busy(Fiber::ptr fiber, int worker, Priority priority);
    SwitchOutcome run_task_fiber(Fiber::ptr& fiber, bool& pooled);
    void retire_task_fiber(Fiber::ptr& fiber, bool poolable) noexcept;
    bool direct_yield_next(Fiber::ptr& fiber);
    Fiber::ptr fiber_for(TaskFunction&& cb);
};

}  // namespace detail
}  // namespace fsched
