// ---------------------------------------------------------------------------
// Implementation: the scheduler.
//
// Each worker owns a run queue (a TaskQueue under the worker's queue_lock) and a queue
// of tasks pinned to it, one pair per priority level (High, Normal, Low). A worker takes from its
// own queues first, highest level first, then steals from the back of the other workers'
// run queues, the highest level its victim has; pinned queues are never stolen from. While
// any worker has a stealable High task (SchedulerCore::stealable_high), one looking for work
// takes it before its own Normal and Low ones. All Normal, the common case, pays one look at
// an empty level and one load of that shared, rarely written counter. Tasks scheduled inside a
// worker go to its own queue; tasks from other threads go round-robin across the workers.
// Callbacks run in pooled fibers, reset for each task, so their stacks are reused.
//
// Idle: a worker with nothing to do spins briefly (checking every queue), then sleeps in
// its idle wait (WorkerIdle::wait, idle_epoll.ipp or idle_condvar.ipp), the one place a
// worker blocks, until notified or until the earliest timer is due. New work wakes one
// sleeping worker, and only when no worker is spinning already (a spinner will find it);
// pinned work wakes its own worker. Why no wake-up is lost: above Worker::sleep_until_work.

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

// How a queued fiber is to be taken when its task runs.
enum class TaskKind : std::uint8_t {
    Fresh,    // schedule(): claim it, or defer when it is still running or parked
    Woken,    // coming back from a park: Parked, and this task is its wake-up
    Claimed,  // a deferred schedule() taking effect: already Running (claimed) for us
};

// What the queues hold: a scheduled task (from a ScheduleTask, the API's record, once
// checked) or a fiber coming back, and how to take its fiber. `sequence` orders a worker's
// two queues against each other (see Worker::pop).
struct QueuedTask {
    QueuedTask() = default;
    explicit QueuedTask(NewTask&& task) noexcept
        : fiber(std::move(task.fiber)), cb(std::move(task.cb)), worker(task.thread), priority(task.priority) {}

    Fiber::ptr fiber;
    TaskFunction cb;
    int worker = -1;  // the worker it is pinned to; -1: any
    Priority priority = Priority::Normal;  // which level of the queues it waits in
    TaskKind kind = TaskKind::Fresh;
    std::uint64_t sequence = 0;
};

// Where a TaskQueue's deque gets its blocks of tasks: slabs of slab_bytes that the queue maps
// itself, each block carrying its slab's address in the 16 bytes before it. Two things
// came from malloc before. std::deque allocates a block for every few tasks and frees it
// once they are taken; with thieves taking from the back, workers freed each other's
// blocks, some 230,000 of them per skynet run of a million leaves (BENCHMARKS.md, "Skynet:
// the stack pool's decay and the task queues' blocks"). And a burst of tasks queued at once
// (100,000 from outside, say) left its blocks in malloc's heap once drained, pinned there by
// whatever was allocated after them: 9 MB, 92 bytes per task, still resident while the
// burst's fibers were parked (BENCHMARKS.md, "Memory per parked fiber: the Fiber in its
// stack, closures inline, queue slabs"). Here a drained slab
// is kept for the queue's next blocks while the worker is busy, so a queue that fills and
// drains maps nothing, and a burst's slabs go back to the OS, all but one, once the worker
// has slept for queue_trim_delay (Worker::sleep_until_work). Blocks of another size (none
// with libstdc++ or libc++) go to operator new. Under the owning worker's queue_lock, as
// the deque is.
class TaskBlockSlabs {
public:
    TaskBlockSlabs() = default;
    TaskBlockSlabs(const TaskBlockSlabs&) = delete;
    TaskBlockSlabs& operator=(const TaskBlockSlabs&) = delete;
    ~TaskBlockSlabs() {
        // The deque is gone (declared after this), so every block is back and every slab
        // is empty. (A full slab would be in no list; none is.)
        while (partial_) {
            Slab* slab = partial_;
            unlink(slab);
            unmap(slab);
        }
        release_empty(0);
    }

    void* allocate(std::size_t bytes) {
        if (block_bytes_ == 0 && stride_for(bytes) <= slab_bytes - slab_header) block_bytes_ = bytes;
        if (bytes != block_bytes_) return ::operator new(bytes);
        Slab* slab = partial_;
        if (!slab) {
            if (empty_) {
                slab = empty_;
                empty_ = slab->next;
                --empty_count_;
            } else {
                slab = map_slab();
            }
            link(slab);
        }
        char* block;
        if (slab->free) {
            block = slab->free;
            std::memcpy(&slab->free, block, sizeof(char*));
        } else {
            block = reinterpret_cast<char*>(slab) + slab_header + slab->carved * stride_ + 16;
            std::memcpy(block - 16, &slab, sizeof slab);
            ++slab->carved;
        }
        if (++slab->used == capacity_) unlink(slab);  // full: no longer a place to allocate
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(block, bytes);
#endif
        return block;
    }

    void deallocate(void* p, std::size_t bytes) noexcept {
        if (bytes != block_bytes_) return ::operator delete(p);
        char* const block = static_cast<char*>(p);
        Slab* slab;
        std::memcpy(&slab, block - 16, sizeof slab);
        if (slab->used-- == capacity_) link(slab);  // was full: room again
        std::memcpy(block, &slab->free, sizeof(char*));
        slab->free = block;
#if defined(FIBER_SCHED_ASAN)
        __asan_poison_memory_region(block + sizeof(char*), bytes - sizeof(char*));  // a stale task read is caught
#endif
        if (slab->used == 0) {  // kept for the next blocks, until release_empty()
            unlink(slab);
            slab->next = empty_;
            empty_ = slab;
            ++empty_count_;
        }
    }

    // Slabs with no block handed out, kept for the next ones.
    std::size_t empty_slabs() const noexcept { return empty_count_; }
    // Gives all but `keep` of them back to the OS.
    void release_empty(std::size_t keep) noexcept { unmap_detached(detach_empty(keep)); }
    // Takes all but `keep` of them out, still linked through `next`, for unmap_detached(),
    // which needs no lock.
    void* detach_empty(std::size_t keep) noexcept {
        Slab* detached = nullptr;
        Slab** tail = &detached;
        while (empty_count_ > keep) {
            Slab* slab = empty_;
            empty_ = slab->next;
            --empty_count_;
            --mapped_;
            *tail = slab;
            tail = &slab->next;
        }
        *tail = nullptr;
        return detached;
    }
    static void unmap_detached(void* detached) noexcept {
        for (Slab* slab = static_cast<Slab*>(detached); slab;) {
            Slab* const next = slab->next;
            unmap_memory(slab);
            slab = next;
        }
    }
    // Slabs mapped now (tests).
    std::size_t slabs() const noexcept { return mapped_; }

    static constexpr std::size_t slab_bytes = 64 * 1024;

private:
    struct Slab {
        Slab* prev;
        Slab* next;
        char* free;        // freed blocks, each linking the next in its first word
        std::size_t used;  // blocks handed out
        std::size_t carved;  // blocks handed out at least once (the rest never touched)
    };
    static constexpr std::size_t slab_header = (sizeof(Slab) + 15) / 16 * 16;

    static std::size_t stride_for(std::size_t bytes) noexcept { return 16 + (bytes + 15) / 16 * 16; }

    Slab* map_slab() {
        void* memory = os::map_stack_memory(slab_bytes);
        if (!memory) throw std::bad_alloc();
        if (capacity_ == 0) {
            stride_ = stride_for(block_bytes_);
            capacity_ = (slab_bytes - slab_header) / stride_;
        }
        ++mapped_;
        return new (memory) Slab{nullptr, nullptr, nullptr, 0, 0};
    }
    void unmap(Slab* slab) noexcept {
        unmap_memory(slab);
        --mapped_;
    }
    static void unmap_memory(Slab* slab) noexcept {
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(slab, slab_bytes);
#endif
        os::unmap_memory(slab, slab_bytes);
    }
    // The slabs with room (partial_ first) are a doubly linked list.
    void link(Slab* slab) noexcept {
        slab->prev = nullptr;
        slab->next = partial_;
        if (partial_) partial_->prev = slab;
        partial_ = slab;
    }
    void unlink(Slab* slab) noexcept {
        if (slab->prev) {
            slab->prev->next = slab->next;
        } else {
            partial_ = slab->next;
        }
        if (slab->next) slab->next->prev = slab->prev;
        slab->prev = slab->next = nullptr;
    }

    Slab* partial_ = nullptr;  // slabs with blocks handed out and room for more
    Slab* empty_ = nullptr;    // slabs with none, linked through `next`
    std::size_t empty_count_ = 0;
    std::size_t block_bytes_ = 0;  // the deque's block size, set by its first block
    std::size_t stride_ = 0;
    std::size_t capacity_ = 0;  // blocks per slab
    std::size_t mapped_ = 0;
};

// std::deque's allocator for a TaskQueue: its blocks of tasks come from the queue's
// TaskBlockSlabs; anything else (the deque's map of blocks) straight from operator new.
template <class T>
struct TaskBlockAllocator {
    using value_type = T;
    TaskBlockSlabs* cache;
    explicit TaskBlockAllocator(TaskBlockSlabs* c) noexcept : cache(c) {}
    template <class U>
    TaskBlockAllocator(const TaskBlockAllocator<U>& other) noexcept : cache(other.cache) {}
    T* allocate(std::size_t n) {
        if constexpr (std::is_same<T, QueuedTask>::value) return static_cast<T*>(cache->allocate(n * sizeof(T)));
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if constexpr (std::is_same<T, QueuedTask>::value) return cache->deallocate(p, n * sizeof(T));
        ::operator delete(p);
    }
    template <class U>
    bool operator==(const TaskBlockAllocator<U>& other) const noexcept { return cache == other.cache; }
    template <class U>
    bool operator!=(const TaskBlockAllocator<U>& other) const noexcept { return cache != other.cache; }
};

// A worker's queue of one kind (stealable or pinned) at one level: a deque whose freed
// blocks come from slabs of its own (TaskBlockSlabs). Under the owning worker's queue_lock.
class TaskQueue {
public:
    TaskQueue() : tasks_(TaskBlockAllocator<QueuedTask>(&cache_)) {}
    TaskQueue(const TaskQueue&) = delete;
    TaskQueue& operator=(const TaskQueue&) = delete;

    bool empty() const noexcept { return tasks_.empty(); }
    std::size_t size() const noexcept { return tasks_.size(); }
    QueuedTask& front() noexcept { return tasks_.front(); }
    QueuedTask& back() noexcept { return tasks_.back(); }
    // Strong guarantee: on std::bad_alloc nothing changed.
    void push_back(QueuedTask&& task) {
        tasks_.push_back(std::move(task));
        grown();
    }
    void push_front(QueuedTask&& task) {
        tasks_.push_front(std::move(task));
        grown();
    }
    void pop_front() noexcept {
        tasks_.pop_front();
        if (tasks_.empty()) drained();
    }
    void pop_back() noexcept {
        tasks_.pop_back();
        if (tasks_.empty()) drained();
    }
    // Drops the tasks after the first `n` (undoing push_back calls).
    void truncate(std::size_t n) noexcept { tasks_.erase(tasks_.begin() + static_cast<std::ptrdiff_t>(n), tasks_.end()); }

    // Slabs of blocks mapped now (tests), and how many of them hold no task.
    std::size_t slabs() const noexcept { return cache_.slabs(); }
    std::size_t empty_slabs() const noexcept { return cache_.empty_slabs(); }
    // Takes out all but one of the empty slabs, for TaskBlockSlabs::unmap_detached() (an
    // idle worker's trim, which unmaps them without holding the queue lock).
    void* detach_empty_slabs() noexcept { return cache_.detach_empty(1); }

    // A deque's map of blocks never shrinks by itself: after a burst of 100,000 tasks it
    // kept 256 KiB. Once a queue that held this many drains, it starts again small.
    static constexpr std::size_t shrink_after = 8192;

private:
    void grown() noexcept {
        if (tasks_.size() > high_water_) high_water_ = tasks_.size();
    }
    void drained() noexcept {
        if (high_water_ < shrink_after) return;
        high_water_ = 0;
        try {
            tasks_.shrink_to_fit();
        } catch (...) {  // no memory for the small one: keep the large one
        }
    }

    TaskBlockSlabs cache_;  // before tasks_: built first, destroyed last
    std::deque<QueuedTask, TaskBlockAllocator<QueuedTask>> tasks_;
    std::size_t high_water_ = 0;  // the most tasks held since it last started small
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
    Worker(SchedulerCore& core_, int index_, bool single_) : core(core_), index(index_), single(single_) {
        steal_buffer.reserve(32);  // a whole steal: see steal_into()
        overflow.reserve(32);
    }

    SchedulerCore& core;
    const int index;
    const bool single;  // the scheduler's only worker (no thief, no other queue)
    std::thread thread;

    SpinLock queue_lock;
    // The ready tasks of one priority level: stealable ones, and ones pinned to this worker.
    struct Level {
        TaskQueue tasks;
        TaskQueue pinned;
        bool empty() const noexcept { return tasks.empty() && pinned.empty(); }
    };
    static constexpr int level_count = 3;
    Level levels[level_count];           // indexed by Priority; under queue_lock
    std::size_t stealable_count = 0;     // tasks in every level's `tasks`; under queue_lock
    std::size_t pinned_count = 0;        // and in every `pinned`; under queue_lock
    // Orders a level's two queues (pop_locked): push_locked counts up from here, and
    // push_front_locked down; under queue_lock.
    std::uint64_t next_sequence = std::uint64_t{1} << 62;
    std::uint64_t front_sequence = std::uint64_t{1} << 62;
    // Set while the use_caller thread runs this worker (0) outside stop(): it takes pinned
    // tasks before unpinned ones of the same level. Only the thread running the worker
    // reads or writes it.
    bool caller_helping = false;
    // The two counts above, published under queue_lock and read without it as hints: a
    // stale read only costs a needless lock or a later look. The last look before
    // sleeping ignores them and takes every lock (see run_loop).
    std::atomic<std::size_t> queued{0};
    std::atomic<std::size_t> stealable{0};

    // The run-next slot (Go's runnext): an unpinned Normal fiber that a task on this worker
    // woke (put_runnext), which this worker runs next, ahead of its Normal queue, before it
    // looks anywhere else; the woken fiber finds the waker's caches warm, and a pair that
    // hands work to each other (a channel ping-pong, a mutex handed over) stays on one
    // worker instead of crossing by steal at every message. A second wake puts the first
    // fiber at the back of the Normal queue. Not stealable: another worker takes it only
    // when it has sat there unchanged for runnext_stuck_looks of that worker's looks (a task
    // that woke it and runs on without parking; see take_stuck_runnext). Under queue_lock.
    Fiber::ptr runnext;
    std::uint64_t runnext_sets = 0;  // under queue_lock
    // (runnext_sets << 1) | occupied, stored under queue_lock, read without it by other
    // workers as a hint; seq_cst when set, paired with `sleepers` (see put_runnext).
    std::atomic<std::uint64_t> runnext_state{0};
    // Runnext taken in a row while the Normal queue has tasks: at runnext_streak_max the
    // queue's oldest goes first, so a pair waking each other cannot starve it. Under queue_lock.
    unsigned runnext_streak = 0;
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

    // Timers of fibers that parked on this worker: a min-heap under timer_lock. This worker
    // adds to it; any worker may fire its due timers (an idle worker serves a busy one's).
    // On a cache line of their own: other workers read timer_earliest whenever they look
    // for work, and must not pull the line of the hot queue lock across to do it.
    alignas(64) SpinLock timer_lock;
    std::vector<Timer> timers;          // under timer_lock
    std::uint64_t timer_sequence = 0;   // under timer_lock
    std::size_t timers_after_sweep = 0; // under timer_lock
    // The earliest deadline in `timers` (no_deadline: none), for other workers to read
    // without the lock; seq_cst, paired with `sleeping` (see add_timer).
    std::atomic<std::int64_t> timer_earliest{no_deadline};

    // Only this worker's thread touches these.
    alignas(64) std::vector<Fiber::ptr> spare_fibers;
    unsigned steal_start = 0;
    Fiber::ptr yielded;  // the fiber that this_fiber::yield()ed, when run_task leaves it to run_loop
    // Set by this_fiber::yield()'s park hook on this worker; run_task clears it.
    bool yield_pending = false;
    // Set while run_loop (not run_ready) runs this worker: run_task may then take the
    // direct yield path (run_task), checking `loop_wait` as run_loop would.
    bool direct_yield = false;
    const CallerWait* loop_wait = nullptr;
    unsigned tasks_since_io_poll = 0;
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
    // Fires this worker's due timers; any worker may call it. True if any woke a fiber.
    bool fire_due_timers();

    // Publishes the queue sizes as hints; call under queue_lock after changing the queues.
    void update_hints() noexcept {
        stealable.store(stealable_count, std::memory_order_relaxed);
        queued.store(waiting_locked(), std::memory_order_relaxed);
    }
    // Every task this worker holds for itself to run: queued ones and the run-next slot.
    std::size_t waiting_locked() const noexcept { return stealable_count + pinned_count + (runnext ? 1 : 0); }

    // Appends at the task's level under queue_lock (held). Strong guarantee: on
    // std::bad_alloc nothing changed.
    FIBER_SCHED_ALWAYS_INLINE void push_locked(QueuedTask&& task, bool own_pinned) {
        task.sequence = next_sequence;
        const bool stealable_high = !own_pinned && task.priority == Priority::High;
        Level& level = levels[static_cast<int>(task.priority)];
        (own_pinned ? level.pinned : level.tasks).push_back(std::move(task));
        ++next_sequence;
        ++(own_pinned ? pinned_count : stealable_count);
        if (stealable_high) high_moved(1);
    }

    // Puts a Normal task at the front of its queue, as if it had come before everything
    // there (flush_local_locked), under queue_lock (held). Strong guarantee.
    void push_front_locked(QueuedTask&& task, bool own_pinned) {
        task.sequence = --front_sequence;
        Level& level = levels[static_cast<int>(Priority::Normal)];
        (own_pinned ? level.pinned : level.tasks).push_front(std::move(task));
        ++(own_pinned ? pinned_count : stealable_count);
    }

    // Keeps SchedulerCore::stealable_high (defined below) in step with this worker's
    // stealable High tasks; under queue_lock. Only High tasks pay for it.
    void high_moved(long delta) noexcept;

    // The queues' sizes, and taking them back to such sizes (undoing push_locked calls),
    // under queue_lock (held).
    using Sizes = std::size_t[level_count][2];
    void sizes_locked(Sizes& out) const noexcept {
        for (int i = 0; i < level_count; ++i) {
            out[i][0] = levels[i].tasks.size();
            out[i][1] = levels[i].pinned.size();
        }
    }
    void truncate_locked(const Sizes& sizes) noexcept {
        for (int i = 0; i < level_count; ++i) {
            TaskQueue& t = levels[i].tasks;
            TaskQueue& p = levels[i].pinned;
            stealable_count -= t.size() - sizes[i][0];
            pinned_count -= p.size() - sizes[i][1];
            if (i == static_cast<int>(Priority::High) && t.size() != sizes[i][0]) {
                high_moved(-static_cast<long>(t.size() - sizes[i][0]));
            }
            t.truncate(sizes[i][0]);
            p.truncate(sizes[i][1]);
        }
    }

    void push(QueuedTask&& task, bool own_pinned) {
        std::lock_guard<SpinLock> lock(queue_lock);
        push_locked(std::move(task), own_pinned);
        update_hints();
    }

    // Takes a task of the highest level that has one, under queue_lock (held): the oldest
    // of that level's two queue fronts, so that pinned and unpinned tasks are served in the
    // order they arrived and neither kind can starve the other; while the use_caller thread
    // helps, its pinned tasks first (they have no one else to run them).
    FIBER_SCHED_ALWAYS_INLINE bool pop_locked(QueuedTask& out) {
        // All Normal, the common case, costs one look at the empty High level.
        Level* level = &levels[static_cast<int>(Priority::Normal)];
        if (!levels[static_cast<int>(Priority::High)].empty()) {
            level = &levels[static_cast<int>(Priority::High)];
        } else if (runnext && (runnext_streak < runnext_streak_max || level->empty())) {
            take_runnext_locked(out);
            return true;
        } else if (level->empty()) {
            level = &levels[static_cast<int>(Priority::Low)];
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
        runnext_streak = 0;
        --(from_pinned ? pinned_count : stealable_count);
        if (!from_pinned && out.priority == Priority::High) high_moved(-1);
        update_hints();
        return true;
    }

    // Moves the run-next fiber into `out` (a wake-up), under queue_lock (held).
    void take_runnext_locked(QueuedTask& out) noexcept {
        out.fiber = std::move(runnext);
        out.cb = nullptr;
        out.worker = -1;
        out.priority = Priority::Normal;
        out.kind = TaskKind::Woken;
        ++runnext_streak;
        runnext_state.store(runnext_sets << 1, std::memory_order_relaxed);
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
        if (trust_hint && queued.load(std::memory_order_relaxed) == 0) return false;
        std::lock_guard<SpinLock> lock(queue_lock);
        return pop_locked(out);
    }

    // Moves up to half (at most 32) of this worker's stealable tasks of the highest level
    // it has into `thief`, where they keep their level. `high_only`: High tasks or nothing.
    bool steal_into(Worker& thief, QueuedTask& first, bool trust_hint, bool high_only = false) {
        if (trust_hint && stealable.load(std::memory_order_relaxed) == 0) return false;
        std::vector<QueuedTask>& taken = thief.steal_buffer;  // reserved: no allocation here
        {
            std::lock_guard<SpinLock> lock(queue_lock);
            if (stealable_count == 0) return false;
            int level = 0;
            while (levels[level].tasks.empty()) ++level;  // one is not empty
            if (high_only && level != static_cast<int>(Priority::High)) return false;
            TaskQueue& tasks = levels[level].tasks;
            const std::size_t n = std::min<std::size_t>((tasks.size() + 1) / 2, 32);
            for (std::size_t i = 0; i < n; ++i) {
                taken.push_back(std::move(tasks.back()));
                tasks.pop_back();
            }
            stealable_count -= n;
            if (level == static_cast<int>(Priority::High)) high_moved(-static_cast<long>(n));
            update_hints();
        }
        // The back of `taken` is the oldest: run it first, queue the rest oldest first.
        first = std::move(taken.back());
        taken.pop_back();
        if (!taken.empty()) {
            std::lock_guard<SpinLock> lock(thief.queue_lock);
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
    // The local ring (single-worker schedulers): make room, push, pop, and take the next task when the ring holds any: its oldest fiber while the shared queues
    // are empty, else the ring moved behind the lock and the next task from there.
    bool local_reserve() noexcept;          // room for one more; false out of memory
    void local_push(Fiber::ptr& fiber) noexcept;  // after local_reserve()
    Fiber::ptr local_pop() noexcept;
    bool take_local(QueuedTask& next);
    void flush_local_locked() noexcept;  // under queue_lock
    // Under queue_lock: moves the claimed (yielded) fibers at the front of the Normal level
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
    void run_task(QueuedTask& task);
    bool direct_yield_next(Fiber::ptr& fiber);
    Fiber::ptr fiber_for(TaskFunction&& cb);
};

struct SchedulerCore {
    SchedulerCore(Scheduler& owner_, std::size_t threads, bool use_caller_)
        : owner(owner_), use_caller(use_caller_), caller_thread(std::this_thread::get_id()),
          caller_fiber(running_fiber()) {
        // Before this scheduler can start a thread or link itself as its caller's: the fork
        // handlers exist by then, and so does everything they guard (build_process_state).
        build_process_state();
#if defined(FIBER_SCHED_HAVE_EPOLL)
        idle.core = this;
#endif
        FIBER_SCHED_ASSERT(threads > 0 && "Scheduler(): threads must be at least 1");
        FIBER_SCHED_ASSERT(threads < 65536 && "Scheduler(): threads must be below 65536");
        for (std::size_t i = 0; i < threads; ++i) workers.push_back(std::make_unique<Worker>(*this, static_cast<int>(i), threads == 1));
        for (auto& w : workers) w->runnext_looks.resize(threads);
        open_idle();  // releases what it opened before it throws
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
    const bool use_caller;
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

    // Starts the worker threads (all but worker 0 with use_caller). Under lifecycle_mutex.
    void launch_threads();
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

    // Wakes `w` if it sleeps; true if this call claimed that.
    bool wake_worker(Worker& w) noexcept {
        if (!claim_worker_wake(w)) return false;
        w.notify();
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

    void report(std::exception_ptr error) noexcept {
        std::shared_ptr<const std::function<void(std::exception_ptr)>> h;
        {
            std::lock_guard<std::mutex> lock(handler_mutex);
            h = handler;
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
            FIBER_SCHED_ASSERT(thread_state()->worker &&
                               "fork(): a child forked inside an exception handler must _exit() or exec before "
                               "the handler returns (the child has no workers)");
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
    while (!finished) {
        if (wait && wait->satisfied()) break;
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

inline bool Worker::next_task(QueuedTask& task) {
    if (!overflow.empty()) {
        task = std::move(overflow.back());
        overflow.pop_back();
        return true;
    }
    if (yielded) {
        requeue_yielded(task);
        return true;
    }
    if (local_size != 0 && take_local(task)) return true;
    if (find_task(task)) return true;
    return core.idle.poll_io(false) && find_task(task);
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
// The lost-wake-up argument: a worker going to sleep increments `sleepers`, sets `sleeping`,
// then looks at every queue once more, taking each queue's lock (not trusting the size
// hints). A submitter pushes under the queue's lock, then loads `sleepers`/`spinning`
// (SchedulerCore::after_push). The two lock the same queue in some order: if the
// submitter's lock comes second, the sleeper's increment happens-before the submitter's
// load, which sees the sleeper and wakes it; if the sleeper's lock comes second, the push
// happens-before its look, which finds the task. So a submitter needs no read-modify-write,
// and on x86 its check is two plain loads. A spinner that stops spinning goes to sleep by
// the same path. `outstanding` reaching zero during stop() pairs through seq_cst operations
// on `outstanding`, `stopping` and `sleeping`; a timer added meanwhile through
// `timer_earliest` and `sleep_deadline` (Worker::add_timer). The use_caller thread helping
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
        idle.end_sleep(core.idle);
        // If a submitter claimed the wake-up instead, its notify() only makes a later
        // wait return early.
        core.claim_worker_wake(*this);
        finished = !(task.fiber || task.cb);
        return !finished;
    }
    if (idle.poller_wanted(core.idle)) {
        // Fibers wait for IO and no one polls: go round the loop again and take the role
        // (side (b) of the argument at SchedulerIdle::poller).
        core.claim_worker_wake(*this);
        return false;
    }
    // Read after `sleeping` is set: a timer added since is seen here, or its adder sees us
    // asleep and wakes us (add_timer).
    std::int64_t deadline_ticks = earliest_deadline();
    if (wait && wait->deadline) deadline_ticks = std::min(deadline_ticks, to_ticks(*wait->deadline));
    // Loaded after `sleepers` is stored: see the run-next argument at put_runnext.
    const bool watch = !single && runnext_activity();
    if (watch) {
        core.runnext_watchers.fetch_add(1, std::memory_order_seq_cst);
        deadline_ticks = std::min(deadline_ticks, to_ticks(deadline_after(SchedulerCore::runnext_watch_period)));
    }
    sleep_deadline.store(deadline_ticks, std::memory_order_seq_cst);
    // A burst of fibers left more freed stacks than the pool keeps (stack.ipp): give their
    // memory back once the scheduler has been idle a while, not while it is busy.
    const bool trim_stacks = stack_pool_has_surplus();
    const TimePoint trim_at =
        trim_stacks ? deadline_after(std::chrono::milliseconds(stack_trim_delay_ms.load(std::memory_order_relaxed)))
                    : TimePoint::max();
    // Likewise the slabs a burst of tasks left in this worker's queues (TaskBlockSlabs),
    // sooner: they cost a page fault per 4 KiB to take again, not a stack's worth.
    const bool trim_queues = has_surplus_slabs();
    const TimePoint queue_trim_at = trim_queues ? deadline_after(queue_trim_delay) : TimePoint::max();
    if (deadline_ticks == no_deadline && !trim_stacks && !trim_queues) {
        idle.wait(core.idle, nullptr);
    } else {
        const TimePoint deadline =
            std::min({TimePoint{std::chrono::steady_clock::duration(deadline_ticks)}, trim_at, queue_trim_at});
        idle.wait(core.idle, &deadline);
    }
    if (watch) core.runnext_watchers.fetch_sub(1, std::memory_order_seq_cst);
    core.claim_worker_wake(*this);
    sleep_deadline.store(no_deadline, std::memory_order_seq_cst);
    idle.end_sleep(core.idle);
    const TimePoint now = trim_stacks || trim_queues ? std::chrono::steady_clock::now() : TimePoint{};
    if (trim_stacks && now >= trim_at) trim_stack_pool();
    if (trim_queues && now >= queue_trim_at) release_surplus_slabs();
    return false;
}

inline bool Worker::has_surplus_slabs() noexcept {
    std::lock_guard<SpinLock> lock(queue_lock);
    for (const Level& level : levels) {
        if (level.tasks.empty_slabs() > 1 || level.pinned.empty_slabs() > 1) return true;
    }
    return false;
}

inline void Worker::release_surplus_slabs() noexcept {
    void* detached[2 * level_count];
    {
        std::lock_guard<SpinLock> lock(queue_lock);
        for (int i = 0; i < level_count; ++i) {
            detached[2 * i] = levels[i].tasks.detach_empty_slabs();
            detached[2 * i + 1] = levels[i].pinned.detach_empty_slabs();
        }
    }
    for (void* slabs : detached) TaskBlockSlabs::unmap_detached(slabs);  // a system call each
}

// Puts the fiber that yielded at the back of its queue and takes the oldest task, under one
// lock; the queue's length does not change, so no one needs waking. Timers come first.
inline void Worker::requeue_yielded(QueuedTask& next) {
    fire_due_timers();
    const ResumeTarget target = FiberAccess::lifecycle(*yielded).resume_target();
    // A single worker's Normal fiber may go to the ring (see local_ring).
    const bool ring = target.priority == Priority::Normal && core.workers.size() == 1 && overflow.empty();
    if (ring && queued.load(std::memory_order_relaxed) == 0 && local_reserve()) {
        // Nothing in the shared queues (by the hint; the common case): no lock, no
        // read-modify-write. The ring's oldest runs next, or this fiber straight away.
        if (local_size != 0) {
            local_push(yielded);
            yielded = local_pop();
        }
        next.fiber = std::move(yielded);
        next.worker = FiberAccess::lifecycle(*next.fiber).resume_target().worker;
        next.priority = Priority::Normal;
        next.kind = TaskKind::Claimed;
        return;
    }
    QueuedTask back;
    back.worker = target.worker;
    back.priority = target.priority;  // a yielding fiber keeps its task's priority
    back.kind = TaskKind::Claimed;  // still Running: this_fiber::yield() parks without leaving it
    back.fiber = std::move(yielded);
    const bool own_pinned = back.worker >= 0;
    std::lock_guard<SpinLock> lock(queue_lock);
    if (ring && levels[static_cast<int>(Priority::High)].empty()) {
        // The ring is older than everything queued, so its oldest runs next and this fiber
        // goes behind everything: the ring is not flushed. Once it has run dry, the fibers
        // that yielded earlier at the front of the Normal line go (back) into it, oldest
        // first: a prefix of the line, so the ring stays the oldest, and with several
        // yielders the shared queues empty out for the direct path. Each fiber moves between
        // the ring and the shared queues at most twice per round: O(1) per yield.
        // Not while the run-next slot is in use: it is behind the ring, not behind the
        // yielded prefix, and would otherwise wait as long as fibers keep yielding.
        if (local_size == 0 && !runnext) take_yielded_prefix_locked();
        if (local_size != 0) {
            next.fiber = local_pop();
            next.worker = FiberAccess::lifecycle(*next.fiber).resume_target().worker;
            next.priority = Priority::Normal;
            next.kind = TaskKind::Claimed;
            if (waiting_locked() == 0 && local_reserve()) {
                local_push(back.fiber);
            } else {
                try {
                    push_locked(std::move(back), own_pinned);
                } catch (...) {
                    // No room to queue it: put the popped one back in front and run this one.
                    local_head = (local_head - 1) & (local_ring.size() - 1);
                    local_ring[local_head] = std::move(next.fiber);
                    ++local_size;
                    next = std::move(back);
                }
            }
            update_hints();
            return;
        }
    }
    if (local_size != 0) flush_local_locked();  // to the front: they yielded before the rest came
    const std::size_t waiting = waiting_locked();
    if (waiting == 0) {
        next = std::move(back);  // nothing else to run: straight back to it
        return;
    }
    if (ring && waiting == 1 && levels[static_cast<int>(Priority::Low)].empty() && local_reserve()) {
        // The last one, High or Normal (a Low one waits while this Normal fiber is ready, as
        // two of them would): the shared queues empty out, so this fiber may wait in the ring
        // (which only ever holds fibers older than everything queued there). Growing the
        // ring here, under the lock, happens only until it fits the yielding fibers.
        pop_locked(next);
        local_push(back.fiber);  // reserved: cannot fail
        return;
    }
    try {
        push_locked(std::move(back), own_pinned);
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
    Level& level = levels[static_cast<int>(Priority::Normal)];
    const bool from_pinned = level.tasks.empty();
    if (!from_pinned && !level.pinned.empty()) return 0;
    TaskQueue& from = from_pinned ? level.pinned : level.tasks;
    std::size_t moved = 0;
    while (!from.empty() && from.front().kind == TaskKind::Claimed && local_reserve()) {
        local_push(from.front().fiber);
        from.pop_front();
        ++moved;
    }
    (from_pinned ? pinned_count : stealable_count) -= moved;
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
    fire_due_timers();
    if (queued.load(std::memory_order_relaxed) == 0) {
        next.fiber = local_pop();
        next.worker = FiberAccess::lifecycle(*next.fiber).resume_target().worker;
        next.priority = Priority::Normal;
        next.kind = TaskKind::Claimed;
        return true;
    }
    std::lock_guard<SpinLock> lock(queue_lock);
    flush_local_locked();
    if (pop_locked(next)) return true;
    // Out of memory with the queues empty: run the ring's oldest from there.
    if (local_size == 0) return false;
    next.fiber = local_pop();
    next.worker = FiberAccess::lifecycle(*next.fiber).resume_target().worker;
    next.priority = Priority::Normal;
    next.kind = TaskKind::Claimed;
    return true;
}

inline std::size_t Worker::run_ready(std::size_t max_tasks, TimePoint until) {
    ThreadState* ts = thread_state();
    Scheduler* const outer_scheduler = ts->scheduler;
    ts->scheduler = &core.owner;
    ts->worker = this;
    caller_helping = true;
    std::size_t ran = 0;
    QueuedTask task;
    while (ran < max_tasks) {
        if (until != TimePoint::max() && std::chrono::steady_clock::now() >= until) break;
        poll_io_now_and_then();
        if (!next_task(task)) break;
        run_task(task);
        ++ran;
    }
    stop_helping();
    ts->scheduler = outer_scheduler;
    ts->worker = nullptr;  // called outside every loop (caller_may_help, run_pending)
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    return ran;
}

inline void Worker::stop_helping() noexcept {
    caller_helping = false;
    if (yielded) {
        // Back in line at its level; enqueue() wakes a sleeper for it unless it is pinned here.
        QueuedTask back;
        const ResumeTarget target = FiberAccess::lifecycle(*yielded).resume_target();
        back.worker = target.worker;
        back.priority = target.priority;
        back.kind = TaskKind::Claimed;
        back.fiber = std::move(yielded);
        core.enqueue_fiber(std::move(back));
    }
    if (local_size != 0) {
        std::lock_guard<SpinLock> lock(queue_lock);
        flush_local_locked();  // a single worker: no one else to wake for them
        update_hints();
    }
    {
        // A fiber a task woke here into the run-next slot: to the stealable queue, so that
        // others may run it (counted below).
        std::lock_guard<SpinLock> lock(queue_lock);
        if (runnext) {
            QueuedTask task;
            take_runnext_locked(task);
            try {
                push_locked(std::move(task), false);
            } catch (...) {
                runnext = std::move(task.fiber);  // out of memory: it waits for the next help
                runnext_state.store((++runnext_sets << 1) | 1, std::memory_order_seq_cst);
            }
            update_hints();
        }
    }
    // Stolen tasks were queued here without waking anyone (the thief was to run them).
    const std::size_t left = stealable.load(std::memory_order_relaxed);
    if (left > 0) core.after_push(*this, false, left);
    // Tasks in `overflow` (a steal that found no memory) wait for the next help or stop().
}

SchedulerCore* caller_may_help() noexcept {
    ThreadState* ts = thread_state();
    SchedulerCore* core = ts->caller_core;
    if (!core || ts->current || ts->worker || core->closed()) return nullptr;
    return core;
}

void help_until(SchedulerCore& core, const std::atomic<bool>* done, const TimePoint* deadline) {
    const CallerWait wait{done, deadline};
    core.workers[0]->run_loop(&wait);
}

void wake_caller(SchedulerCore& core) noexcept { core.wake_worker(*core.workers[0]); }

inline void Worker::notify() { idle.notify(core.idle); }

#if defined(FIBER_SCHED_HAVE_EPOLL)
void wake_for_io(SchedulerIdle& idle) noexcept {
    SchedulerCore& core = *idle.core;
    for (auto& w : core.workers) {
        if (core.wake_worker(*w)) return;
    }
}
#endif

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

inline void Worker::reserve_timer() {
    std::lock_guard<SpinLock> lock(timer_lock);
    if (FIBER_SCHED_FAULT(TimerAlloc)) throw std::bad_alloc();
    if (timers.size() == timers.capacity()) timers.reserve(std::max<std::size_t>(16, 2 * timers.capacity()));
}

inline void Worker::add_timer(TimePoint deadline, Fiber::ptr fiber, std::shared_ptr<WaitState> wait) noexcept {
    const std::int64_t ticks = to_ticks(deadline);
    bool earliest;
    {
        std::lock_guard<SpinLock> lock(timer_lock);
        // Satisfied timed waits leave their timers behind (a notifier cannot reach into
        // this heap); sweep them out whenever the heap has doubled, so memory follows the
        // live timers, not every wait ever made. Amortised O(1) per timer.
        if (timers.size() >= 64 && timers.size() >= 2 * timers_after_sweep) {
            timers.erase(std::remove_if(timers.begin(), timers.end(), [](const Timer& t) { return t.dead(); }),
                         timers.end());
            std::make_heap(timers.begin(), timers.end(), std::greater<Timer>());
            timers_after_sweep = timers.size();
        }
        // reserve_timer() made room (the sweep only shrinks): push_back does not allocate.
        timers.push_back(Timer{deadline, timer_sequence++, std::move(fiber), std::move(wait)});
        std::push_heap(timers.begin(), timers.end(), std::greater<Timer>());
        earliest = timers.front().sequence == timer_sequence - 1;
        // Republished whenever the front changed: by this timer, or by the sweep (a swept
        // front left behind would be a deadline in the past, and the idle wait would spin).
        const std::int64_t front = to_ticks(timers.front().deadline);
        if (timer_earliest.load(std::memory_order_relaxed) != front) {
            timer_earliest.store(front, std::memory_order_seq_cst);
        }
    }
    // A worker asleep until a later deadline would miss this one while this worker is busy:
    // wake it to sleep again until this one. Its `sleeping` is set before it reads the
    // deadlines (seq_cst both sides), so either it saw timer_earliest or we see it asleep.
    if (!earliest || core.sleepers.load(std::memory_order_seq_cst) == 0) return;
    for (auto& w : core.workers) {
        if (w.get() == this || !w->sleeping.load(std::memory_order_seq_cst)) continue;
        if (ticks < w->sleep_deadline.load(std::memory_order_seq_cst)) {
            core.wake_worker(*w);
            return;
        }
    }
}

inline bool Worker::fire_due_timers() {
    // No clock read while there are no timers: the yield and spawn paths pass here.
    const std::int64_t earliest = timer_earliest.load(std::memory_order_relaxed);
    if (earliest == no_deadline) return false;
    const TimePoint now = std::chrono::steady_clock::now();
    if (earliest > to_ticks(now)) return false;
    bool any = false;
    for (;;) {
        Timer due;
        {
            std::lock_guard<SpinLock> lock(timer_lock);
            if (timers.empty() || timers.front().deadline > now) return any;
            std::pop_heap(timers.begin(), timers.end(), std::greater<Timer>());
            due = std::move(timers.back());
            timers.pop_back();
            timer_earliest.store(timers.empty() ? no_deadline : to_ticks(timers.front().deadline),
                                 std::memory_order_seq_cst);
        }
        Fiber::ptr fiber = std::move(due.fiber);
        if (due.wait) {
            WaitStatus expected = WaitStatus::Waiting;
            if (!due.wait->status.compare_exchange_strong(expected, WaitStatus::TimedOut, std::memory_order_acq_rel)) continue;
            fiber = std::move(due.wait->fiber);
        }
        wake_fiber(std::move(fiber));  // to its pinned worker, if any
        any = true;
    }
}

inline std::int64_t Worker::earliest_deadline() const noexcept {
    std::int64_t earliest = no_deadline;
    for (auto& w : core.workers) earliest = std::min(earliest, w->timer_earliest.load(std::memory_order_seq_cst));
    return earliest;
}

inline void Worker::high_moved(long delta) noexcept {
    core.stealable_high.fetch_add(delta, std::memory_order_relaxed);
}

inline bool Worker::take_high(QueuedTask& out) {
    {
        std::lock_guard<SpinLock> lock(queue_lock);
        if (!levels[static_cast<int>(Priority::High)].empty()) return pop_locked(out);
    }
    const std::size_t n = core.workers.size();
    for (std::size_t i = 1; i < n; ++i) {
        if (core.workers[(static_cast<std::size_t>(index) + i) % n]->steal_into(*this, out, true, true)) return true;
    }
    return false;
}

inline bool Worker::find_task(QueuedTask& out, bool thorough) {
    fire_due_timers();
    // A High task anywhere goes before this worker's own Normal and Low ones.
    if (core.stealable_high.load(std::memory_order_relaxed) > 0 && take_high(out)) return true;
    if (pop(out, !thorough)) return true;
    const std::size_t n = core.workers.size();
    // Nothing of our own: serve other workers' due timers (a busy worker cannot), then
    // look again; a woken unpinned fiber comes to this worker's queue.
    bool fired = false;
    for (std::size_t i = 1; i < n; ++i) {
        fired = core.workers[(static_cast<std::size_t>(index) + i) % n]->fire_due_timers() || fired;
    }
    if (fired && pop(out, false)) return true;
    // Every other worker once, starting somewhere new each time a steal succeeds.
    for (std::size_t i = 0; i + 1 < n; ++i) {
        const std::size_t offset = 1 + (steal_start + i) % (n - 1);
        Worker& victim = *core.workers[(static_cast<std::size_t>(index) + offset) % n];
        if (victim.steal_into(*this, out, !thorough)) {
            ++steal_start;
            return true;
        }
    }
    return n > 1 && take_stuck_runnext(out);
}

inline Fiber::ptr Worker::fiber_for(TaskFunction&& cb) {
    if (FIBER_SCHED_FAULT(FiberAlloc)) throw std::bad_alloc();
    if (!spare_fibers.empty()) {
        Fiber::ptr fiber = std::move(spare_fibers.back());
        spare_fibers.pop_back();
        FiberAccess::reuse(*fiber, std::move(cb));
        return fiber;
    }
    return FiberAccess::make_in_stack(std::move(cb));
}

inline void Worker::run_task(QueuedTask& task) {
    bool pooled = !task.fiber;
    const int worker = task.worker;
    const Priority priority = task.priority;
    const TaskKind kind = task.kind;
    Fiber::ptr fiber;
    if (pooled) {
        try {
            fiber = fiber_for(std::move(task.cb));
        } catch (...) {
            // No memory or no stack for the callback's fiber: the task cannot run. Its
            // failure goes to the exception handler like one it threw; the rest run on.
            task = QueuedTask{};
            core.report(std::current_exception());
            core.task_finished();
            return;
        }
    } else {
        fiber = std::move(task.fiber);
    }
    task = QueuedTask{};
    switch (kind) {
    case TaskKind::Fresh:
        if (!FiberAccess::lifecycle(*fiber).claim_or_defer(ResumeTarget{&core.owner, worker, priority})) return;  // runs when it has left
        break;
    case TaskKind::Woken:
        FiberAccess::lifecycle(*fiber).claim_woken();
        break;
    case TaskKind::Claimed:
        break;
    }
    ThreadState* ts = thread_state();
    SwitchOutcome outcome;
    for (;;) {
        ts->task_fiber = fiber.get();
        ts->task_ref = &fiber;  // a park hook may take this reference (take_task_ref)
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
        if (outcome != SwitchOutcome::Parked || !yield_pending) break;
        // this_fiber::yield(): the fiber is still claimed (Running) and `fiber` still holds it.
        yield_pending = false;
        if (!direct_yield_next(fiber)) {
            yielded = std::move(fiber);  // run_loop puts it back in line (requeue_yielded)
            break;
        }
        pooled = false;  // the fiber now in hand may be a user's: never pool it
    }
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    if (outcome == SwitchOutcome::Parked) return;  // still outstanding; wake_fiber() queues it again
    // Returned, or left the scheduler through Fiber::yield(): the task is done.
    // A fiber goes back to the pool only when nothing but this worker's reference can reach
    // it: use_count() == 1 rules out another shared_ptr, and a weak_ptr (from which one could
    // still be locked after that read) can only have come from a Fiber* that Fiber::current()
    // gave out, which marked the fiber handed out (fiber_switch.hpp). A fiber not pooled
    // loses this worker's reference below; it goes, and every weak_ptr to it expires, with
    // the last shared_ptr user code kept (at once when it kept none), and until then it is
    // this task's fiber: a weak_ptr never locks onto a later task's.
    if (outcome == SwitchOutcome::Returned && pooled && fiber.use_count() == 1 && !FiberAccess::handed_out(*fiber) &&
        spare_fibers.size() < 64) {
        spare_fibers.push_back(std::move(fiber));
    }
    fiber.reset();
    core.task_finished();
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
    if (timer_earliest.load(std::memory_order_relaxed) != no_deadline) fire_due_timers();
    if (queued.load(std::memory_order_relaxed) != 0) return false;
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

// The run-next slot and the lost wake-up: the slot belongs to a worker that is awake (it
// runs the waker), and that worker takes it before it may spin or sleep (pop_locked, which
// every look at its own queues goes through; the `queued` hint counts it), so the fiber is
// never stranded. What is left is parallelism: a waker that runs on for long without parking
// must not keep the fiber from an idle worker. So a worker going to sleep while some slot is
// in use or was set since its last look sleeps for at most runnext_watch_period (counted in
// runnext_watchers), and each of its looks counts how long a slot has held the same fiber
// (take_stuck_runnext). A set that finds no watcher wakes a sleeper, unless a worker spins
// (it will look, then watch). The set stores runnext_state (seq_cst) and then loads
// `sleepers`; a sleeper stores `sleepers` and then loads every runnext_state
// (runnext_activity): one of the two sees the other, so a slot is never set unseen by every
// sleeper. The set relies on a watcher or a spinner only while it stays idle: one that
// stops (it found another task to run, or the use_caller thread's wait ended) first
// decrements its count (seq_cst) and then loads every runnext_state, and if a slot is in
// use and no one else watches or spins it wakes a sleeper (hand_on_runnext_watch): against
// the set's store-then-load of the counts, one of the two sees the other again. A wrong
// guess either way costs a wake-up or a millisecond, never a fiber.
inline bool Worker::put_runnext(Fiber::ptr& fiber) noexcept {
    bool displaced = false;
    {
        std::lock_guard<SpinLock> lock(queue_lock);
        if (runnext) {
            QueuedTask back;
            back.fiber = std::move(runnext);
            back.kind = TaskKind::Woken;
            try {
                push_locked(std::move(back), false);  // strong guarantee
            } catch (...) {
                runnext = std::move(back.fiber);
                return false;
            }
            displaced = true;
        }
        runnext = std::move(fiber);
        ++runnext_sets;
        runnext_state.store((runnext_sets << 1) | 1, std::memory_order_seq_cst);
        update_hints();
    }
    if (displaced) {
        core.after_push(*this, false, 1);  // a stealable task now, as any wake-up
    } else {
        wake_runnext_looker();
    }
    return true;
}

inline void Worker::wake_runnext_looker() noexcept {
    if (core.sleepers.load(std::memory_order_seq_cst) == 0) return;  // all awake: each looks before it sleeps
    if (core.runnext_watchers.load(std::memory_order_seq_cst) != 0 || core.spinning.load(std::memory_order_seq_cst) != 0) {
        return;  // that one looks, and hands on in turn when it stops
    }
    for (auto& w : core.workers) {
        if (w.get() != this && core.wake_worker(*w)) return;
    }
}

inline bool Worker::take_stuck_runnext(QueuedTask& out) noexcept {
    const std::size_t n = core.workers.size();
    for (std::size_t i = 1; i < n; ++i) {
        const std::size_t v = (static_cast<std::size_t>(index) + i) % n;
        Worker& victim = *core.workers[v];
        RunnextLook& look = runnext_looks[v];
        const std::uint64_t state = victim.runnext_state.load(std::memory_order_relaxed);
        if (!(state & 1) || state != look.state) {
            look.state = state;
            look.looks = 0;
            continue;
        }
        if (++look.looks < runnext_stuck_looks) continue;
        look.looks = 0;
        std::lock_guard<SpinLock> lock(victim.queue_lock);
        if (!victim.runnext || victim.runnext_state.load(std::memory_order_relaxed) != state) continue;
        victim.take_runnext_locked(out);
        victim.runnext_streak = 0;  // not its own run
        core.runnext_stuck_taken.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    return false;
}

inline void Worker::hand_on_runnext_watch() noexcept {
    if (single || core.sleepers.load(std::memory_order_seq_cst) == 0) return;  // the cheap test first
    for (std::size_t v = 0; v < core.workers.size(); ++v) {
        if (v != static_cast<std::size_t>(index) && (core.workers[v]->runnext_state.load(std::memory_order_seq_cst) & 1)) {
            wake_runnext_looker();
            return;
        }
    }
}

// A waker that finds the use_caller thread asleep in a wait (help_until) sees worker 0 as
// any sleeper, and may claim it for work that is not worker 0's own: after_push wakes the
// first sleeper for a task queued on a busy worker, add_timer the first sleeper whose
// deadline is later than a new timer's, wake_for_io the first sleeper to take the poller
// role. If the caller's wait ends at that moment, it leaves (run_loop's first step) without
// looking, and the task waited behind the busy worker, the timer fired late, the ready fd
// went unseen, while other workers slept. So on leaving, if any of that may be there, it
// wakes another sleeper, which looks for tasks, serves due timers, sleeps again until the
// earliest deadline and takes the poller role if it is vacant. Each test is a load of what
// the waker itself read; a wrong guess costs one wake-up.
inline void Worker::hand_on_caller_wake() noexcept {
    if (core.workers.size() < 2 || core.sleepers.load(std::memory_order_seq_cst) == 0) return;
    bool wanted = false;
#if defined(FIBER_SCHED_HAVE_EPOLL)
    wanted = core.idle.io_waiters.load(std::memory_order_seq_cst) > 0 &&
             core.idle.poller.load(std::memory_order_seq_cst) == nullptr;
#endif
    std::int64_t earliest_sleeper = no_deadline;
    for (auto& w : core.workers) {
        if (w.get() == this) continue;
        if (w->stealable.load(std::memory_order_relaxed) != 0) wanted = true;
        if (w->sleeping.load(std::memory_order_seq_cst)) {
            earliest_sleeper = std::min(earliest_sleeper, w->sleep_deadline.load(std::memory_order_seq_cst));
        }
    }
    const std::int64_t earliest_timer = earliest_deadline();
    if (earliest_timer != no_deadline && earliest_timer < earliest_sleeper) wanted = true;
    if (!wanted) return;
    for (auto& w : core.workers) {
        if (w.get() != this && core.wake_worker(*w)) return;
    }
}

inline bool Worker::runnext_activity() noexcept {
    bool active = false;
    for (std::size_t v = 0; v < core.workers.size(); ++v) {
        if (v == static_cast<std::size_t>(index)) continue;
        const std::uint64_t state = core.workers[v]->runnext_state.load(std::memory_order_seq_cst);
        RunnextLook& look = runnext_looks[v];
        active = active || (state & 1) || state != look.at_sleep;
        look.at_sleep = state;
    }
    return active;
}

void resume_deferred(Fiber& fiber) {
    // The fiber has left the scheduler and is still claimed (Running) for this resume.
    const ResumeTarget target = FiberAccess::lifecycle(fiber).take_deferred();
    QueuedTask task;
    task.kind = TaskKind::Claimed;
    task.fiber = fiber.shared_from_this();
    task.worker = target.worker;
    task.priority = target.priority;
    SchedulerCore::of(*target.scheduler).enqueue_fiber(std::move(task));
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
    const ResumeTarget target = FiberAccess::lifecycle(*fiber).resume_target();
    if (target.worker < 0 && target.priority == Priority::Normal) {
        // Woken by a task of its scheduler: into the waker's run-next slot.
        ThreadState* ts = thread_state();
        if (ts->scheduler == target.scheduler && ts->worker && ts->task_fiber && ts->worker->put_runnext(fiber)) return;
    }
    QueuedTask task;
    task.kind = TaskKind::Woken;
    task.worker = target.worker;
    task.priority = target.priority;  // a woken fiber keeps its task's priority
    task.fiber = std::move(fiber);
    SchedulerCore::of(*target.scheduler).enqueue_fiber(std::move(task));
}

bool in_scheduler_task() noexcept {
    ThreadState* ts = thread_state();
    return ts->task_fiber && ts->current == ts->task_fiber;
}

void reserve_timer() { thread_state()->worker->reserve_timer(); }

std::size_t pending_timers(Scheduler& scheduler) noexcept {
    std::size_t n = 0;
    for (auto& w : SchedulerCore::of(scheduler).workers) {
        std::lock_guard<SpinLock> lock(w->timer_lock);
        n += w->timers.size();
    }
    return n;
}

std::size_t queue_slabs(Scheduler& scheduler) noexcept {
    std::size_t n = 0;
    for (auto& w : SchedulerCore::of(scheduler).workers) {
        std::lock_guard<SpinLock> lock(w->queue_lock);
        for (const Worker::Level& level : w->levels) n += level.tasks.slabs() + level.pinned.slabs();
    }
    return n;
}

std::uint64_t runnext_stuck_taken(Scheduler& scheduler) noexcept {
    return SchedulerCore::of(scheduler).runnext_stuck_taken.load(std::memory_order_relaxed);
}

void sleep_until_steady(std::chrono::steady_clock::time_point deadline) {
    if (!in_scheduler_task()) {
        if (SchedulerCore* core = caller_may_help()) {
            help_until(*core, nullptr, &deadline);
        } else {
            // A loop: libstdc++'s sleep_until() on a steady clock sleeps once, and MinGW's
            // sleep rounds down to whole milliseconds, so it can return before the deadline.
            while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_until(deadline);
        }
        return;
    }
    reserve_timer();  // may throw std::bad_alloc, here in the fiber, before it parks
    park([](Fiber*, void* arg) {
        // On the worker the fiber parked from, whose timer heap has room (reserve_timer).
        thread_state()->worker->add_timer(*static_cast<std::chrono::steady_clock::time_point*>(arg),
                                          take_task_ref(), nullptr);
    }, &deadline);
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

// fork() (POSIX): the child has one thread, the one that forked, and none of the parent's
// workers. Whatever that thread was in the parent (a use_caller thread, a worker in the
// middle of a task), in the child it is a plain thread: a sleep, a wait or an io call there
// that went on helping or parking would run a worker loop of a scheduler that is not there,
// on copies of its queues and on the epoll instance and eventfds the child shares with the
// parent, taking the parent's events. So the child forgets every scheduler this thread
// worked for or helped, and in_scheduler_task() and caller_may_help() are false there. Its
// current fiber, if any, stays current: the thread is on that fiber's stack and goes on
// running its code, as a plain thread's fiber. A task that forked must not end or yield to
// its worker in the child (Worker::run_task asserts so): the worker is gone.
void forget_schedulers_in_child() noexcept {
    ThreadState* ts = thread_state();
    ts->scheduler = nullptr;
    ts->worker = nullptr;
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    ts->caller_core = nullptr;  // the parent's use_caller schedulers, none of them here
}

// Why before any thread of the library exists. The stack pool and the io registry are
// function-local statics, built on first use (so that a Scheduler made by another
// translation unit's global constructor finds them), and they register their own fork
// handlers. A thread inside such a constructor when another thread forks leaves the
// static's guard taken in the child for good: the child's first Fiber then hung in
// __cxa_guard_acquire (a worker used to build the pool on its first idle look at it). And
// a lock whose handlers are registered only after some thread could hold it may be
// inherited held. Built here, the objects exist before a Scheduler starts its first thread
// (its constructor calls this), and before main() (below) for a plain thread's first Fiber
// or io wait; each fork handler is registered before anyone can take its lock.
void build_process_state() {
    static const bool built = [] {
        (void)stack_pool();  // registers its handlers (stack.ipp)
#if defined(FIBER_SCHED_HAVE_EPOLL)
        build_io_registry();  // and its (io.ipp)
#endif
        // install_stack_overflow_handler()'s lock, which it takes only after calling this.
        (void)overflow_install_mutex();
        os::at_fork([] { overflow_install_mutex().lock(); }, [] { overflow_install_mutex().unlock(); },
                    [] {
                        overflow_install_mutex().unlock();
                        forget_schedulers_in_child();
                    });
        return true;
    }();
    (void)built;
}

namespace {
// A dynamic initialiser of the implementation's translation unit: before main() unless
// another unit's global constructor starts threads first. Out of memory here, the first
// Scheduler tries again (a Fiber or an io wait meanwhile builds what it needs itself).
struct BuildProcessStateAtStart {
    BuildProcessStateAtStart() noexcept {
        try {
            build_process_state();
        } catch (...) {
        }
    }
} build_process_state_at_start;
}  // namespace

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
    // One lock per worker: group pinned tasks by worker, deal the rest out in runs. Built
    // before anything is counted, so running out of memory here changes nothing.
    const std::size_t n = core.workers.size();
    std::vector<std::vector<detail::QueuedTask>> pinned(n), unpinned(n);
    detail::Worker* here = core.current_worker();
    // From outside, dealt round robin past the use_caller thread's worker 0 (outside_target).
    const std::size_t first = !here && core.use_caller && n > 1 ? 1 : 0;
    const std::size_t slots = n - first;
    std::size_t next = here ? static_cast<std::size_t>(here->index) : core.outside_target();
    std::size_t free_count = 0;
    std::vector<std::size_t> pinned_count(n);
    for (const detail::NewTask& task : tasks) {
        if (task.thread < 0) {
            ++free_count;
        } else {
            ++pinned_count[static_cast<std::size_t>(task.thread)];
        }
    }
    const std::size_t run = here ? free_count : (free_count + slots - 1) / slots;  // a worker's unpinned share, at most
    for (std::size_t i = 0; i < n; ++i) {
        pinned[i].reserve(pinned_count[i]);
        if (!here || i == next) unpinned[i].reserve(run);
    }
    std::size_t in_run = 0;
    for (detail::NewTask& task : tasks) {
        detail::QueuedTask queued(std::move(task));
        if (queued.worker >= 0) {
            pinned[static_cast<std::size_t>(queued.worker)].push_back(std::move(queued));
            continue;
        }
        unpinned[next].push_back(std::move(queued));
        if (++in_run == run) {
            in_run = 0;
            next = first + (next - first + 1) % slots;
        }
    }
    const auto total = static_cast<std::int64_t>(tasks.size());
    core.count_new(total);
    const detail::SchedulerCore::OutsideEnqueue guard(core.outside_enqueues, here == nullptr);
    std::int64_t queued_count = 0;
    try {
        for (std::size_t i = 0; i < n; ++i) {
            detail::Worker& w = *core.workers[i];
            if (pinned[i].empty() && unpinned[i].empty()) continue;
            {
                std::lock_guard<detail::SpinLock> lock(w.queue_lock);
                // All of this worker's share or none of it: a failed push_back changed nothing,
                // and what this loop pushed before is taken back.
                detail::Worker::Sizes before;
                w.sizes_locked(before);
                try {
                    for (const bool own_pinned : {true, false}) {
                        for (detail::QueuedTask& t : own_pinned ? pinned[i] : unpinned[i]) {
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
            queued_count += static_cast<std::int64_t>(pinned[i].size() + unpinned[i].size());
            if (!pinned[i].empty()) core.after_push(w, true, 1);
            if (!unpinned[i].empty()) core.after_push(w, false, unpinned[i].size());
        }
    } catch (...) {
        // The workers' shares queued so far run; the rest were not queued and are not counted.
        core.tasks_finished(total - queued_count);
        throw;
    }
}

std::size_t Scheduler::run_pending(std::chrono::microseconds budget) {
    detail::SchedulerCore& core = *core_;
    const detail::ThreadState* ts = detail::thread_state();
    FIBER_SCHED_ASSERT(core.use_caller && "run_pending(): the scheduler has no use_caller thread (made with use_caller = false)");
    FIBER_SCHED_ASSERT(!core.closed() && "run_pending(): the scheduler has stopped");
    FIBER_SCHED_ASSERT(core.caller_linked && std::this_thread::get_id() == core.caller_thread && !ts->current &&
                       !ts->worker &&
                       "run_pending(): call it on the scheduler's use_caller thread, outside its tasks and outside stop()");
    const detail::TimePoint until = budget == std::chrono::microseconds::max() ? detail::TimePoint::max()
                                                                              : detail::deadline_after(budget);
    return core.workers[0]->run_ready(SIZE_MAX, until);
}

Scheduler* Scheduler::current() noexcept { return detail::thread_state()->scheduler; }

int Scheduler::worker_index() noexcept {
    detail::Worker* worker = detail::thread_state()->worker;
    return worker ? worker->index : -1;
}

void Scheduler::set_exception_handler(std::function<void(std::exception_ptr)> handler) {
    auto shared = std::make_shared<const std::function<void(std::exception_ptr)>>(std::move(handler));
    std::lock_guard<std::mutex> lock(core_->handler_mutex);
    core_->handler = std::move(shared);
}

namespace this_fiber {

namespace {
// yield() outside a scheduler task, out of line so that the task's path stays short.
FIBER_SCHED_NOINLINE FIBER_SCHED_COLD void yield_outside_task() {
    detail::SchedulerCore* core = detail::caller_may_help();
    // The use_caller thread runs one ready task instead, if there is one.
    if (!core || core->workers[0]->run_ready(1, detail::TimePoint::max()) == 0) std::this_thread::yield();
}
}  // namespace

void yield() {
    detail::ThreadState* ts = detail::thread_state();
    if (!ts->task_fiber || ts->current != ts->task_fiber) {
        yield_outside_task();
        return;
    }
    // The worker takes the next fiber directly (Worker::direct_yield_next), or puts this one
    // back and takes the next task under one lock (run_loop); the fiber stays claimed
    // meanwhile (fiber_state.hpp). The hook runs on that worker once the switch is done.
    detail::FiberAccess::park_current(
        ts->current, [](Fiber*, void* worker) { static_cast<detail::Worker*>(worker)->yield_pending = true; },
        ts->worker, true);
}

std::uint64_t id() {
    Fiber* fiber = detail::running_fiber();
    return fiber ? fiber->id() : 0;
}

}  // namespace this_fiber
}  // namespace fsched
