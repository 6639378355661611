// ---------------------------------------------------------------------------
// More synchronisation (the toolbox), each on sync.hpp's wait machinery:
//   Semaphore             std::counting_semaphore: acquire, try_acquire(_for/_until), release(n)
//   Latch                 std::latch: count_down, wait, try_wait, arrive_and_wait
//   Barrier               std::barrier: arrive_and_wait, arrive_and_drop, a completion per phase
//   SharedMutex           std::shared_mutex, writer-preferring
//   Event                 marl's Event: auto- or manual-reset
//   ConditionVariableAny  std::condition_variable_any: waits with any lockable
//
// As in sync.hpp: blocking parks a scheduler task fiber and frees its worker, blocks a plain
// thread, and lets a use_caller thread run its scheduler's tasks meanwhile. Each object keeps
// a small spin lock and FIFO lists of waiters that live on the waiters' stacks: no operation
// allocates, but for a timed wait in a scheduler task (its timer's state, allocated before
// any lock is taken; std::bad_alloc then leaves nothing behind). A notifier claims a waiter
// (a CAS on its status) before it hands it anything (a unit, a signal, a lock), and a timeout
// races for that same CAS: a timed wait either got what it waited for or timed out, once.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {

// A counting semaphore (std::counting_semaphore's semantics). Waiters are served oldest
// first: release() hands its units to the longest waiters before any is left in the count,
// so a newcomer never takes a unit from under a waiter.
class Semaphore {
public:
    // Starts with `initial` units; 0 <= initial <= max().
    explicit Semaphore(std::ptrdiff_t initial);
    Semaphore(const Semaphore&) = delete;
    Semaphore& operator=(const Semaphore&) = delete;
    ~Semaphore() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~Semaphore(): fibers or threads still wait on it");
    }

    // The largest count (std::counting_semaphore::max()). (Parenthesised: <windows.h>'s max.)
    static constexpr std::ptrdiff_t(max)() noexcept { return PTRDIFF_MAX; }

    // Takes a unit, blocking (parking a fiber) until one is there.
    void acquire();
    // Takes a unit if one is there now; never blocks.
    bool try_acquire();
    // As acquire(), but gives up once `d` has passed: false then (never earlier). May throw
    // std::bad_alloc in a scheduler task (the timer's state), with nothing taken or queued.
    template <class Rep, class Period>
    bool try_acquire_for(const std::chrono::duration<Rep, Period>& d) {
        return try_acquire_until_steady(detail::deadline_after(d));
    }
    // As try_acquire_for(), until the time `t`.
    template <class Clock, class Duration>
    bool try_acquire_until(const std::chrono::time_point<Clock, Duration>& t) {
        return try_acquire_until_steady(detail::to_steady(t));
    }
    // Adds `n` units (n >= 0, the count stays <= max()), waking up to n waiters, oldest first.
    void release(std::ptrdiff_t n = 1);

private:
    bool try_acquire_until_steady(detail::TimePoint deadline);
    // fiber_report()'s look at the count (WaitOps::describe).
    static void describe_wait(const void* semaphore, char* out, std::size_t size) noexcept;

    detail::SpinLock lock_;      // guards count_ and waiters_
    std::ptrdiff_t count_;       // > 0 only while no one (still waiting) is queued
    detail::WaitList waiters_;
};

// A single-use countdown (std::latch's semantics): wait() blocks until the count is zero.
class Latch {
public:
    // Starts the count at `count` (>= 0).
    explicit Latch(std::ptrdiff_t count);
    Latch(const Latch&) = delete;
    Latch& operator=(const Latch&) = delete;
    ~Latch() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~Latch(): fibers or threads still wait on it");
    }

    // The largest count (std::latch::max()).
    static constexpr std::ptrdiff_t(max)() noexcept { return PTRDIFF_MAX; }

    // Lowers the count by `n` (0 <= n <= the count), waking every waiter when it reaches zero.
    void count_down(std::ptrdiff_t n = 1);
    // True once the count is zero; never blocks.
    bool try_wait() const noexcept;
    // Blocks until the count is zero.
    void wait();
    // count_down(n), then wait(), as one step.
    void arrive_and_wait(std::ptrdiff_t n = 1);

private:
    static void describe_wait(const void* latch, char* out, std::size_t size) noexcept;

    mutable detail::SpinLock lock_;  // guards count_ and waiters_
    std::ptrdiff_t count_;
    detail::WaitList waiters_;
};

// A reusable barrier for a fixed number of participants (std::barrier's semantics), phase
// after phase. When the last participant of a phase arrives, it runs `completion` (if any)
// and only then are the phase's waiters released; the next phase starts with them.
//
// A completion that throws (std::barrier would terminate): the phase still completes (every
// waiter is released and the next phase begins, so nothing hangs) and the exception
// propagates out of the last arriver's arrive_and_wait() or arrive_and_drop(); the other
// participants return normally.
class Barrier {
public:
    // `count` participants (>= 0); `completion` is run once per phase, by the last arriver.
    explicit Barrier(std::ptrdiff_t count, std::function<void()> completion = {});
    Barrier(const Barrier&) = delete;
    Barrier& operator=(const Barrier&) = delete;
    ~Barrier() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~Barrier(): fibers or threads still wait on it");
    }

    static constexpr std::ptrdiff_t(max)() noexcept { return PTRDIFF_MAX; }

    // Arrives at the current phase and blocks until it completes. Precondition: no more
    // arrivals in a phase than participants.
    void arrive_and_wait();
    // Arrives at the current phase without waiting and leaves: later phases expect one
    // participant fewer.
    void arrive_and_drop();

private:
    // The caller arrives (`drop`: and leaves); a waiting arrival parks until the phase
    // completes, the last one completes it.
    void arrive(bool drop);
    // The last arrival, with lock_ held: starts the next phase, releases lock_, runs the
    // completion, wakes the phase's waiters, and then rethrows what the completion threw.
    void complete_phase();
    static void describe_wait(const void* barrier, char* out, std::size_t size) noexcept;

    detail::SpinLock lock_;           // guards everything below
    std::ptrdiff_t expected_;         // participants of the coming phases
    std::ptrdiff_t remaining_;        // arrivals the current phase still waits for
    std::uint64_t phase_ = 0;         // phases completed (for the report)
    std::function<void()> completion_;
    detail::WaitList waiters_;
};

// A reader-writer lock (std::shared_mutex's members), usable with std::unique_lock,
// std::lock_guard and std::shared_lock. Writer preference: once a writer waits, new readers
// queue behind it, so a stream of readers cannot starve a writer; and an unlock() releases
// every reader queued behind the writer before the next writer, so writers do not starve
// readers either. A released waiter owns what it waited for (a hand-off: no newcomer can
// take it first). Neither lock is recursive.
class SharedMutex {
public:
    SharedMutex() = default;
    // Precondition: not locked.
    ~SharedMutex();
    SharedMutex(const SharedMutex&) = delete;
    SharedMutex& operator=(const SharedMutex&) = delete;

    // Takes the lock exclusively, blocking until no one holds it.
    void lock();
    // Takes it exclusively if no one holds it and no writer waits; never blocks.
    bool try_lock();
    // Releases the exclusive lock. Precondition: held exclusively by the caller.
    void unlock();
    // Takes it shared, blocking while a writer holds it or waits for it.
    void lock_shared();
    // Takes it shared if no writer holds it or waits; never blocks.
    bool try_lock_shared();
    // Releases a shared lock. Precondition: the caller holds one.
    void unlock_shared();

private:
    static void describe_wait(const void* mutex, char* out, std::size_t size) noexcept;
    static std::uint64_t holder_of(const void* mutex) noexcept;

    detail::SpinLock lock_;            // guards everything below but owner_
    bool writer_ = false;              // held exclusively
    std::ptrdiff_t readers_ = 0;       // shared holders
    detail::WaitList writers_;         // waiting for the exclusive lock
    detail::WaitList readers_queue_;   // waiting for a shared lock
    // The exclusive holder's caller_identity() (0: none); relaxed, it only checks misuse
    // and tells the report.
    std::atomic<std::uint64_t> owner_{0};
};

// marl's Event. Auto: signal() wakes one waiter, and the event stays clear; with no waiter it
// stays set until one wait (or test()) consumes it. Manual: signal() sets it and wakes every
// waiter; it stays set, and waits return at once, until clear().
class Event {
public:
    enum class Mode { Auto, Manual };

    explicit Event(Mode mode = Mode::Auto, bool initially_set = false);
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    ~Event() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~Event(): fibers or threads still wait on it");
    }

    // Sets the event (Auto: or hands it to the longest waiter).
    void signal();
    // Clears it.
    void clear();
    // Blocks until the event is set (Auto: and consumes it).
    void wait();
    // As wait(), but gives up once `d` has passed: false then (never earlier). May throw
    // std::bad_alloc in a scheduler task, with nothing consumed or queued.
    template <class Rep, class Period>
    bool wait_for(const std::chrono::duration<Rep, Period>& d) {
        return wait_until_steady(detail::deadline_after(d));
    }
    // As wait_for(), until the time `t`.
    template <class Clock, class Duration>
    bool wait_until(const std::chrono::time_point<Clock, Duration>& t) {
        return wait_until_steady(detail::to_steady(t));
    }
    // True if the event is set; as marl's, an Auto event's test() consumes the signal (it
    // is a wait that never blocks). Never blocks.
    bool test();
    // True if the event is set, consuming nothing (marl's isSignalled()).
    bool is_set() const;

private:
    bool wait_until_steady(detail::TimePoint deadline);
    // Under lock_: takes the signal if it is set (Auto: consumes it).
    bool take_locked() noexcept;
    static void describe_wait(const void* event, char* out, std::size_t size) noexcept;

    mutable detail::SpinLock lock_;  // guards set_ and waiters_
    const Mode mode_;
    bool set_;
    detail::WaitList waiters_;
};

// std::condition_variable_any: ConditionVariable's members for any BasicLockable (lock() and
// unlock()): std::unique_lock<Mutex>, std::shared_lock<SharedMutex>, SharedMutex itself, a
// std::mutex, a user's lock. The lock's unlock() must not block on this condition variable.
//
// No lost wake-up (ConditionVariable's argument): the waiter joins the list under the
// condition variable's spin lock and only then unlocks the user's lock, so a notifier, which
// changed the condition under the user's lock and then takes the spin lock, finds it listed.
class ConditionVariableAny {
public:
    ConditionVariableAny() = default;
    ConditionVariableAny(const ConditionVariableAny&) = delete;
    ConditionVariableAny& operator=(const ConditionVariableAny&) = delete;
    ~ConditionVariableAny() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~ConditionVariableAny(): fibers or threads still wait on it");
    }

    // Wakes the longest waiter, if any.
    void notify_one();
    // Wakes every waiter.
    void notify_all();

    // Unlocks `lock`, waits for a notify, relocks. Precondition: the caller holds `lock`.
    template <class Lock>
    void wait(Lock& lock) {
        detail::Waiter self;
        join_then_unlock(lock, self);
        note_wait(nullptr);
        detail::block(lock_, waiters_, self, nullptr);
        lock.lock();
    }
    // Waits until pred() holds.
    template <class Lock, class Predicate>
    void wait(Lock& lock, Predicate pred) {
        while (!pred()) wait(lock);
    }
    // As wait(), but gives up at `t`: std::cv_status::timeout then (never earlier). May
    // throw std::bad_alloc in a scheduler task, with `lock` still held.
    template <class Lock, class Clock, class Duration>
    std::cv_status wait_until(Lock& lock, const std::chrono::time_point<Clock, Duration>& t) {
        return wait_until_steady(lock, detail::to_steady(t));
    }
    // Waits until pred() holds or `t` passes; returns pred().
    template <class Lock, class Clock, class Duration, class Predicate>
    bool wait_until(Lock& lock, const std::chrono::time_point<Clock, Duration>& t, Predicate pred) {
        const detail::TimePoint deadline = detail::to_steady(t);
        while (!pred()) {
            if (wait_until_steady(lock, deadline) == std::cv_status::timeout) return pred();
        }
        return true;
    }
    // wait_until(lock, now + d).
    template <class Lock, class Rep, class Period>
    std::cv_status wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& d) {
        return wait_until_steady(lock, detail::deadline_after(d));
    }
    template <class Lock, class Rep, class Period, class Predicate>
    bool wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& d, Predicate pred) {
        return wait_until(lock, detail::deadline_after(d), std::move(pred));
    }

private:
    // `self` joins the waiters, then `lock` is unlocked: a notify from then on finds it.
    // Returns with lock_ held (block() releases it). When lock.unlock() throws (a
    // std::unique_lock that owns no mutex, say), `self` leaves the list and lock_ is
    // released before the exception goes on to the caller, as from
    // std::condition_variable_any; before, both stayed, and the next notify spun for good.
    template <class Lock>
    void join_then_unlock(Lock& lock, detail::Waiter& self) {
        lock_.lock();
        waiters_.push_back(&self);
        try {
            lock.unlock();
        } catch (...) {
            waiters_.remove(&self);
            lock_.unlock();
            throw;
        }
    }
    template <class Lock>
    std::cv_status wait_until_steady(Lock& lock, detail::TimePoint deadline) {
        detail::Waiter self;
        detail::prepare_timed_wait(self);  // may throw, with `lock` still held
        join_then_unlock(lock, self);
        note_wait(&deadline);
        const bool woken = detail::block(lock_, waiters_, self, &deadline);
        lock.lock();
        return woken ? std::cv_status::no_timeout : std::cv_status::timeout;
    }
    // detail::note_wait() for this object (out of line: the report's ops live in the .ipp).
    void note_wait(const detail::TimePoint* deadline) noexcept;
    static void describe_wait(const void* cv, char* out, std::size_t size) noexcept;

    detail::SpinLock lock_;  // guards waiters_
    detail::WaitList waiters_;
};

}  // namespace fsched
