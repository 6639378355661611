// ---------------------------------------------------------------------------
// Fiber-aware synchronisation: Mutex, ConditionVariable, WaitGroup, Channel<T>.
//
// Blocking parks a scheduler task fiber and frees its worker; anywhere else (a plain
// thread, a hand-resumed fiber) it blocks the thread; a use_caller thread outside its
// scheduler's tasks runs that scheduler's ready tasks meanwhile (Scheduler(), help_until).
// Each object keeps its waiters in a FIFO list under a small spin lock. A fiber adds itself
// to the list and parks; the spin lock is released by the park's after-switch hook, on the
// worker, so a notifier (who must take that lock) can only wake a fiber that has fully
// switched out. A waiter is woken once: notifier and timeout race on its status with a CAS.
// ---------------------------------------------------------------------------

#pragma once

#include "scheduler.hpp"
#include "fiber_switch.hpp"

namespace fsched {
namespace detail {

// A lock for a few instructions of bookkeeping; never held across a park or a syscall
// (the park hook releases it after the switch).
//
// Bounded waiting. A plain test-and-set lock lets a thread that takes it in a loop (a
// worker running a channel ping-pong takes its queue lock at every message) retake it
// within nanoseconds of each unlock, before a waiter that sees it free can: a plain
// thread's schedule() waited 23 ms for a worker's queue lock, and a waiter on a lock held
// for 20 us in every 20 us waited 46 s. So a waiter that has spun and then yielded
// `heir_after` times claims the heir token (one at a time): while it is claimed, lock()'s
// fast path is closed and only the heir may take the lock once it is free; it gives the
// token back when it has the lock. A locker that read the token clear just before the heir
// claimed it may still get in first, once: its next lock() sees the token. So a waiter
// waits for the holder, at most one more critical section per other thread, and its own
// yields, never indefinitely. The heir spins rather than yields between its looks (a
// yielded heir would leave the lock free and closed while it waits for a CPU), yielding
// only every `spin_limit` looks. A token whose heir is gone (a thread cancelled or
// longjmp()ed out of lock(), or not in a fork() child) must not close the lock for good: a
// waiter that has found the lock free and closed `token_lease` times takes it anyway and
// clears the token (an heir that was only slow then competes as before: fairness is lost
// for a turn, never exclusion). Uncontended cost: one relaxed load of the token beside the
// exchange (same cache line).
class SpinLock {
public:
    void lock() noexcept {
        // Acquire pairs with unlock()'s release: the list and counters it guards.
        if (!heir_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire)) return;
        lock_contended();
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }
    // Takes the lock if it is free now (the report's look at a primitive: never waits).
    bool try_lock() noexcept {
        return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
    }
#if defined(FIBER_SCHED_FAULT_INJECTION)
    // Claims the heir token for no waiter, as a waiter that vanished would leave it.
    void abandon_heir_token_for_test() noexcept { heir_.store(true, std::memory_order_relaxed); }
    // Clears the token, as a waiter that took the lock after the lease does.
    void break_heir_lease_for_test() noexcept { heir_.store(false, std::memory_order_relaxed); }
    bool heir_token_claimed_for_test() const noexcept { return heir_.load(std::memory_order_relaxed); }
#endif

private:
    static constexpr int spin_limit = 64;     // cpu_relax() rounds before a yield
    static constexpr int heir_after = 16;     // yields before a waiter claims the heir token
    static constexpr int token_lease = 128;  // looks at a free, closed lock before it is taken anyway
    // (mostly yields: a loaded machine gives each a time slice, so 1024 stalled a waiter
    // for seconds behind an heir that was waiting for a CPU)

    FIBER_SCHED_NOINLINE void lock_contended() noexcept {
        bool heir = false;       // this waiter holds the token
        int closed_looks = 0;    // looks that found the lock free and the token another's
        for (int rounds = 0;; ++rounds) {
            // A waiter that found the lock free and closed `token_lease` times (this heir had
            // lost its CPU) took it and cleared the token: claim it again, or this lock()
            // would compete as a plain spinner, never favoured, for the rest of its wait.
            if (heir && !heir_.load(std::memory_order_relaxed)) heir = claim_heir_token();
            if (!locked_.load(std::memory_order_relaxed)) {
                const bool closed = !heir && heir_.load(std::memory_order_relaxed);
                if ((!closed || ++closed_looks >= token_lease) && !locked_.exchange(true, std::memory_order_acquire)) {
                    // Relaxed: the token only steers who tries; the lock itself orders the data.
                    if (heir || closed) heir_.store(false, std::memory_order_relaxed);
                    return;
                }
            }
            if (rounds < spin_limit || (heir && rounds % spin_limit != 0)) {
                cpu_relax();
                continue;
            }
            if (!heir && rounds >= spin_limit + heir_after) heir = claim_heir_token();
            std::this_thread::yield();
        }
    }
    bool claim_heir_token() noexcept {
        bool free_token = false;
        return heir_.compare_exchange_strong(free_token, true, std::memory_order_relaxed);
    }

    std::atomic<bool> locked_{false};
    std::atomic<bool> heir_{false};  // a waiter has claimed the next turn (see above)
};

enum class WaitStatus : std::uint8_t { Waiting, Notified, TimedOut };

struct Waiter;

// How one blocked fiber or thread is woken.
struct WaitState {
    // Waiting -> Notified (a notifier's CAS) or Waiting -> TimedOut (the timer's or the
    // waiting thread's CAS); acq_rel: the winner's writes (a handed-over value) are seen.
    std::atomic<WaitStatus> status{WaitStatus::Waiting};
    Fiber::ptr fiber;          // a parked fiber; moved out by whoever wins the CAS
    struct ThreadSignal* thread = nullptr;  // or a blocked thread's signal
    // The Waiter whose claim() won: a select() publishes one Waiter per case, all sharing
    // this state, and learns here which case ran. Written by the winner under the lock of
    // the list that Waiter was in; read by the woken waiter after it has taken that lock.
    Waiter* claimed_by = nullptr;
};

// A blocked thread sleeps on this, on its own stack.
struct ThreadSignal {
    std::mutex mutex;
    std::condition_variable cv;
    bool set = false;
    // A use_caller thread that runs tasks while it waits (help_until) waits for `done`
    // instead, which the notifier sets and then wakes `helper`'s worker 0, both under
    // `mutex`: the waiter takes `mutex` before it returns, so it cannot destroy the signal
    // (or leave and stop the scheduler) while the notifier still uses them.
    SchedulerCore* helper = nullptr;
    std::atomic<bool> done{false};
};

// A node in a wait list, on the waiter's stack.
struct Waiter {
    Waiter() noexcept : state(&local) {}
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;

    Waiter* prev = nullptr;
    Waiter* next = nullptr;
    bool linked = false;               // in a list; under the owning object's lock
    WaitState* state;                  // the stack's own `local`, or a shared one (timed waits)
    WaitState local;
    std::shared_ptr<WaitState> shared; // keeps a timed fiber wait's state alive for its timer
    std::uint64_t owner = 0;           // Mutex: who will own it after a hand-off
    void* slot = nullptr;              // Channel: where the value comes from or goes to
    bool ok = false;                   // Channel: the transfer happened (false: closed);
                                       // Mutex: the lock was handed over
    bool retry = false;                // Channel: claimed, but moving the value threw in
                                       // the other side's call: nothing moved, try again
};

// FIFO of waiters; the owning object's lock guards it.
class WaitList {
public:
    bool empty() const noexcept { return head_ == nullptr; }
    Waiter* front() const noexcept { return head_; }
    void push_front(Waiter* w) noexcept {
        w->prev = nullptr;
        w->next = head_;
        (head_ ? head_->prev : tail_) = w;
        head_ = w;
        w->linked = true;
    }
    void push_back(Waiter* w) noexcept {
        w->prev = tail_;
        w->next = nullptr;
        (tail_ ? tail_->next : head_) = w;
        tail_ = w;
        w->linked = true;
    }
    Waiter* pop_front() noexcept {
        Waiter* w = head_;
        if (w) remove(w);
        return w;
    }
    void remove(Waiter* w) noexcept {
        (w->prev ? w->prev->next : head_) = w->next;
        (w->next ? w->next->prev : tail_) = w->prev;
        w->prev = w->next = nullptr;
        w->linked = false;
    }

private:
    Waiter* head_ = nullptr;
    Waiter* tail_ = nullptr;
};

// For a primitive's destructor: true when no fiber or thread waits on it (a waiter lives on
// its waiter's stack, and would be woken through freed memory). Takes the primitive's lock
// once, so that a notifier on another thread has let go of the primitive first.
inline bool no_waiters_left(SpinLock& lock, const WaitList& a, const WaitList* b = nullptr) noexcept {
    lock.lock();
    const bool idle = a.empty() && (!b || b->empty());
    lock.unlock();
    return idle;
}

// Blocks the caller, whose Waiter `w` is already published where notifiers find it, under
// `lock` (held), until it is notified (true) or `deadline` passes (false; then, under the
// lock, unlink(context, w) takes it out of wherever it was published). Releases `lock`.
using Unlink = void (*)(void* context, Waiter& w);
// The same with the waiter published under `count` locks (all held; select() publishes a
// Waiter sharing w.state in each of its channels): releases them all once a notifier may
// wake the caller, and returns with none held, without unlinking anything. In a scheduler
// task a timed wait must have been prepared (prepare_timed_wait) before the locks were taken.
bool block_all(SpinLock* const* locks, std::size_t count, Waiter& w, const TimePoint* deadline);
bool block(SpinLock& lock, Waiter& w, const TimePoint* deadline, Unlink unlink,
           void* context);
// The same for a Waiter in a WaitList.
inline bool block(SpinLock& lock, WaitList& list, Waiter& w, const TimePoint* deadline) {
    return block(lock, w, deadline, [](void* l, Waiter& waiter) {
        if (waiter.linked) static_cast<WaitList*>(l)->remove(&waiter);
    }, &list);
}
// Claims a waiter taken off its list; false if it already timed out. Call under the lock.
inline bool claim(Waiter& w) noexcept {
    WaitStatus expected = WaitStatus::Waiting;
    if (!w.state->status.compare_exchange_strong(expected, WaitStatus::Notified, std::memory_order_acq_rel)) {
        return false;
    }
    w.state->claimed_by = &w;
    return true;
}
// Takes the longest waiter of `list` that can still be claimed (skipping timed-out ones);
// nullptr if none. Call under the lock.
inline Waiter* pop_claimed(WaitList& list) noexcept {
    while (Waiter* w = list.pop_front()) {
        if (claim(*w)) return w;
    }
    return nullptr;
}
// Takes and claims every waiter of `list` into `woken` (the same links: no allocation, so
// nothing can fail between claiming a waiter and waking it). Call under the lock.
inline void pop_all_claimed(WaitList& list, WaitList& woken) noexcept {
    while (Waiter* w = pop_claimed(list)) woken.push_back(w);
}
// The first waiter of `list` that can still be claimed, left in the list; timed-out ones
// are dropped on the way (they unlink themselves only if still linked). Call under the lock.
inline Waiter* front_waiting(WaitList& list) noexcept {
    while (Waiter* w = list.front()) {
        if (w->state->status.load(std::memory_order_acquire) == WaitStatus::Waiting) return w;
        list.remove(w);
    }
    return nullptr;
}
// Wakes a claimed waiter. Call after releasing the lock; `w` may be gone right after.
void wake_waiter(Waiter& w) noexcept;
// Wakes every waiter of `woken` (from pop_all_claimed). Call after releasing the lock.
inline void wake_waiters(WaitList& woken) noexcept {
    while (Waiter* w = woken.pop_front()) wake_waiter(*w);
}
// For a timed wait in a scheduler task: allocates the state its timer shares and makes room
// for the timer, before any lock is taken. Throws std::bad_alloc; a no-op elsewhere.
void prepare_timed_wait(Waiter& w);
// A timed wait that gives up without blocking (its deadline had passed): on a use_caller
// thread outside its tasks, runs one ready task of its scheduler first, as the wait would
// have had it blocked (Worker::run_loop), so that a loop of wait_for(0)s on the only thread
// of a scheduler lets the task it polls for run. Elsewhere a no-op. Call with no lock held.
void give_way_to_one_task();

// A number unique among threads and fibers for the calling thread.
std::uint64_t thread_identity() noexcept;

// Who is asking: the running fiber's id, or the thread's token (drawn from the same counter).
inline std::uint64_t caller_identity() noexcept {
    if (Fiber* f = running_fiber()) return f->id();
    return thread_identity();
}

// A Mutex or SharedMutex wait, counted for the deadlock watch while this lives
// (mutex_waiters: see watch_loop), which it starts; not inside testing::simulate(), which
// finds its own deadlocks.
class WatchedMutexWait {
public:
    WatchedMutexWait() noexcept : watched_(!thread_state()->simulation) {
        if (!watched_) return;
        mutex_waiters.fetch_add(1, std::memory_order_seq_cst);
        ensure_watchdog();
    }
    ~WatchedMutexWait() {
        if (watched_) mutex_waiters.fetch_sub(1, std::memory_order_relaxed);
    }
    WatchedMutexWait(const WatchedMutexWait&) = delete;
    WatchedMutexWait& operator=(const WatchedMutexWait&) = delete;

private:
    const bool watched_;
};

}  // namespace detail

// A mutual-exclusion lock for fibers and threads; works with std::lock_guard/unique_lock.
// Uncontended: one compare-and-swap, no system call, no switch. Waiters queue in arrival
// order and are woken in that order. A woken waiter competes with newcomers (which keeps
// the lock busy instead of idle while the waiter's fiber gets going), and a waiter kept
// waiting over 1 ms switches the mutex to hand-off: each unlock then passes it to the
// longest waiter, so no waiter starves (Go's sync.Mutex does the same).
class Mutex {
public:
    Mutex() = default;
    // Precondition: not locked.
    ~Mutex();
    Mutex(const Mutex&) = delete;
    Mutex& operator=(const Mutex&) = delete;

    // Blocks (parks a fiber) until the lock is acquired. Not recursive.
    void lock();
    // Acquires the lock if it is free; never blocks.
    bool try_lock();
    // As lock(), but gives up once `d` has passed: false then (never earlier). A timed wait
    // in a scheduler task allocates its timer's state and may throw std::bad_alloc (with
    // nothing held or queued). Not recursive.
    template <class Rep, class Period>
    bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
        return try_lock_until_steady(detail::deadline_after(d));
    }
    // As try_lock_for(), until the time `t`.
    template <class Clock, class Duration>
    bool try_lock_until(const std::chrono::time_point<Clock, Duration>& t) {
        return try_lock_until_steady(detail::to_steady(t));
    }
    // Releases the lock. Precondition: held by the calling fiber (or thread).
    void unlock();

private:
    static constexpr std::uint32_t locked_bit = 1;
    static constexpr std::uint32_t starving_bit = 2;  // hand-off mode
    static constexpr std::uint32_t waiter_unit = 4;   // the rest counts queued waiters
    // Waits for the lock; with a deadline, false once it passed without the lock.
    bool lock_slow(std::uint64_t me, const detail::TimePoint* deadline);
    bool try_lock_until_steady(detail::TimePoint deadline);
    // block()'s Unlink for a timed-out waiter: off the list and out of the count (REQUIRES lock_).
    static void leave_timed_out(void* mutex, detail::Waiter& w) noexcept;
    void unlock_slow();
    // fiber_report()'s look at who holds it (WaitOps::holder).
    static std::uint64_t holder_of(const void* mutex) noexcept;

    // locked / starving / waiters. Acquire on taking the lock and release on giving it up
    // order the protected data; waiters are counted only under lock_, together with
    // joining waiters_, and only while the lock is held, so an unlock that sees no waiters
    // cannot strand one.
    std::atomic<std::uint32_t> state_{0};
    // The holder's detail::caller_identity() (0: none); relaxed, it only checks misuse.
    std::atomic<std::uint64_t> owner_{0};
    detail::SpinLock lock_;  // guards waiters_
    detail::WaitList waiters_;
};

// A condition variable over std::unique_lock<Mutex>, like std::condition_variable.
class ConditionVariable {
public:
    ConditionVariable() = default;
    ~ConditionVariable() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~ConditionVariable(): fibers or threads still wait on it");
    }
    ConditionVariable(const ConditionVariable&) = delete;
    ConditionVariable& operator=(const ConditionVariable&) = delete;

    // Wakes the longest waiter, if any.
    void notify_one();
    // Wakes every waiter.
    void notify_all();

    // Unlocks `lock`, waits for a notify, relocks. Precondition: lock owns its mutex.
    void wait(std::unique_lock<Mutex>& lock);
    // Waits until pred() holds.
    template <class Predicate>
    void wait(std::unique_lock<Mutex>& lock, Predicate pred) {
        while (!pred()) wait(lock);
    }
    // As wait(), but gives up at `t`: std::cv_status::timeout then.
    template <class Clock, class Duration>
    std::cv_status wait_until(std::unique_lock<Mutex>& lock, const std::chrono::time_point<Clock, Duration>& t) {
        return wait_until_steady(lock, detail::to_steady(t));
    }
    // Waits until pred() holds or `t` passes; returns pred().
    template <class Clock, class Duration, class Predicate>
    bool wait_until(std::unique_lock<Mutex>& lock, const std::chrono::time_point<Clock, Duration>& t, Predicate pred) {
        while (!pred()) {
            if (wait_until(lock, t) == std::cv_status::timeout) return pred();
        }
        return true;
    }
    // wait_until(lock, now + d).
    template <class Rep, class Period>
    std::cv_status wait_for(std::unique_lock<Mutex>& lock, const std::chrono::duration<Rep, Period>& d) {
        return wait_until_steady(lock, detail::deadline_after(d));
    }
    template <class Rep, class Period, class Predicate>
    bool wait_for(std::unique_lock<Mutex>& lock, const std::chrono::duration<Rep, Period>& d, Predicate pred) {
        return wait_until(lock, detail::deadline_after(d), std::move(pred));
    }

private:
    std::cv_status wait_until_steady(std::unique_lock<Mutex>& lock, detail::TimePoint deadline);

    detail::SpinLock lock_;
    detail::WaitList waiters_;
};

// Go's sync.WaitGroup: wait() blocks until the counter, moved by add() and done(), is zero.
class WaitGroup {
public:
    // Starts the counter at `initial` (>= 0).
    explicit WaitGroup(std::int64_t initial = 0);
    WaitGroup(const WaitGroup&) = delete;
    WaitGroup& operator=(const WaitGroup&) = delete;
    ~WaitGroup() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, waiters_) && "~WaitGroup(): fibers or threads still wait on it");
    }

    // Adds n (may be negative); waking the waiters when it reaches zero. The counter must
    // not go below zero.
    void add(std::int64_t n = 1);
    // add(-1).
    void done() { add(-1); }
    // Blocks until the counter is zero.
    void wait();

private:
    // fiber_report()'s look at the count (WaitOps::describe).
    static void describe_wait(const void* group, char* out, std::size_t size) noexcept;

    detail::SpinLock lock_;
    std::int64_t count_ = 0;
    detail::WaitList waiters_;
};

template <class T>
class ReceiveCase;
template <class T>
class SendCase;

// A typed FIFO channel, Go style. Capacity 0: every send meets a receive (rendezvous).
// Senders and receivers are served in arrival order. A send or receive that finds the other
// side blocked claims it first (a waiter that gave up meanwhile, a timed wait that timed out
// or a select() that another case won, is skipped) and only then moves the value, once:
// each value is received once or stays its sender's. If that move throws (a T whose move or
// copy can throw), the call that made it throws the exception and the value stays where it
// was (the sender's, or the buffer's front); the claimed waiter is woken to try again, as if
// it had not been found. select() hands a received value to its case's function with one
// more move (the function's parameter), like `T v = *ch.receive();` after a receive(): a
// throw there leaves select() with the exception, and the value, already received, is gone.
template <class T>
class Channel {
public:
    // A channel that buffers up to `capacity` values.
    explicit Channel(std::size_t capacity = 0) : capacity_(capacity) {}
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;
    ~Channel() {
        FIBER_SCHED_ASSERT(detail::no_waiters_left(lock_, senders_, &receivers_) && "~Channel(): fibers or threads still wait on it");
    }

    // Sends `value`, blocking while the buffer is full (or, unbuffered, until a receiver
    // takes it). Returns false, dropping the value, once the channel is closed. If moving
    // the value throws in this call, send() throws it and the value was not sent; the
    // channel and its waiters are as before (a receiver claimed for it waits again). While
    // blocked, a move that throws in a receiver's call makes this send try again itself.
    bool send(T value) {
        for (;;) {
            std::unique_lock<detail::SpinLock> guard(lock_);
            if (closed_) return false;
            if (send_now(value, guard)) return true;
            detail::Waiter self;
            self.slot = &value;
            senders_.push_back(&self);
            guard.release();  // block() releases it
            detail::note_wait(detail::WaitReason::ChannelSend, this, &wait_ops_);
            detail::block(lock_, senders_, self, nullptr);
            if (!self.retry) return self.ok;
        }
    }

    // Sends `value` if that needs no wait: a receiver is waiting or the buffer has room.
    // Moves from `value` only when it returns true; false: full, or closed (see closed()).
    bool try_send(T& value) {
        std::unique_lock<detail::SpinLock> guard(lock_);
        if (closed_) return false;
        return send_now(value, guard);
    }

    // As send(), but gives up once `d` has passed (never earlier). Moves from `value` only
    // when it returns true; false: timed out, or the channel is closed. closed() tells the
    // two apart: after false, closed() is true if the send can never succeed any more (the
    // channel may have been closed just after the timeout; the value is the caller's either
    // way). A receiver racing the timeout either took the value (true) or did not (false).
    template <class Rep, class Period>
    bool send_for(T& value, const std::chrono::duration<Rep, Period>& d) {
        return send_until_steady(value, detail::deadline_after(d));
    }
    // As send_for(), until the time point `t`.
    template <class Clock, class Duration>
    bool send_until(T& value, const std::chrono::time_point<Clock, Duration>& t) {
        return send_until_steady(value, detail::to_steady(t));
    }

    // Receives the oldest value, blocking while there is none. Returns std::nullopt once
    // the channel is closed and drained. If moving the value throws, receive() throws it and
    // the value stays in the channel.
    std::optional<T> receive() {
        std::optional<T> result;  // the one object every path returns (named return value)
        for (;;) {
            std::unique_lock<detail::SpinLock> guard(lock_);
            if (receive_now(result, guard) || closed_) return result;
            detail::Waiter self;
            self.slot = &result;
            receivers_.push_back(&self);
            guard.release();  // block() releases it
            detail::note_wait(detail::WaitReason::ChannelReceive, this, &wait_ops_);
            detail::block(lock_, receivers_, self, nullptr);
            if (!self.retry) return result;  // retried: `result` is empty
        }
    }

    // Receives the oldest value if there is one now (buffered, or from a blocked sender);
    // std::nullopt otherwise (empty, or closed and drained: see closed()).
    std::optional<T> try_receive() {
        std::optional<T> result;
        std::unique_lock<detail::SpinLock> guard(lock_);
        receive_now(result, guard);
        return result;
    }

    // As receive(), but gives up once `d` has passed (never earlier): std::nullopt on a
    // timeout or once the channel is closed and drained (closed() tells which). A sender
    // racing the timeout either handed its value over (it is returned) or kept it.
    template <class Rep, class Period>
    std::optional<T> receive_for(const std::chrono::duration<Rep, Period>& d) {
        return receive_until_steady(detail::deadline_after(d));
    }
    // As receive_for(), until the time point `t`.
    template <class Clock, class Duration>
    std::optional<T> receive_until(const std::chrono::time_point<Clock, Duration>& t) {
        return receive_until_steady(detail::to_steady(t));
    }

    // Closes the channel: later sends fail; receives drain the buffer, then get nullopt.
    // Wakes every blocked sender (false) and receiver (nullopt). Closing twice is harmless.
    void close() noexcept {
        detail::WaitList woken;
        lock_.lock();
        closed_ = true;
        detail::pop_all_claimed(senders_, woken);
        detail::pop_all_claimed(receivers_, woken);
        lock_.unlock();
        detail::wake_waiters(woken);
    }

    // The capacity given at construction.
    std::size_t capacity() const noexcept { return capacity_; }
    // The values buffered now (at most capacity(); blocked senders' values not counted).
    std::size_t size() const {
        std::lock_guard<detail::SpinLock> guard(lock_);
        return buffer_.size();
    }
    // Whether close() has been called.
    bool closed() const {
        std::lock_guard<detail::SpinLock> guard(lock_);
        return closed_;
    }

    // A case for select(): receives a value; `fn` gets it, or std::nullopt if the channel
    // is closed and drained. `fn` may be empty. (select.hpp)
    ReceiveCase<T> on_receive(std::function<void(std::optional<T>)> fn) {
        return ReceiveCase<T>(*this, std::move(fn));
    }
    // A case for select(): sends `value`; `fn` gets true once sent, false if the channel is
    // closed. The value stays in the case (SendCase::value()) unless it was sent. (select.hpp)
    SendCase<T> on_send(T value, std::function<void(bool sent)> fn) {
        return SendCase<T>(*this, std::move(value), std::move(fn));
    }

private:
    template <class>
    friend class ReceiveCase;
    template <class>
    friend class SendCase;

    // Under lock_, the channel open: hands `value` to the longest waiting receiver, else
    // into the buffer if it has room; false if neither can take it now. `wake`: the receiver
    // to wake once the lock is released. If moving the value throws, the exception leaves
    // here with the value still the caller's, and `wake` may name a receiver claimed for it:
    // the caller wakes it all the same (marked to try again) once the lock is released.
    bool send_ready(T& value, detail::Waiter*& wake) {
        // Claimed before the value moves: a receiver that gave up meanwhile (a timed
        // receive, a select that another case won) is skipped, and a value never moves back.
        if (detail::Waiter* receiver = detail::pop_claimed(receivers_)) {
            wake = receiver;
            try {
                static_cast<std::optional<T>*>(receiver->slot)->emplace(std::move(value));
            } catch (...) {
                receiver->retry = true;
                throw;
            }
            receiver->ok = true;
            return true;
        }
        if (buffer_.size() < capacity_) {
            buffer_.push_back(std::move(value));  // strong guarantee
            return true;
        }
        return false;
    }

    // send_ready() or receive_ready() under `guard` (held): true once the value moved, with
    // the lock released and the other side woken; false with the lock still held. On a
    // throw: the lock released, a waiter claimed for the value woken to try again, the
    // exception rethrown.
    template <class Value>
    bool move_now(bool (Channel::*ready)(Value&, detail::Waiter*&), Value& value,
                  std::unique_lock<detail::SpinLock>& guard) {
        detail::Waiter* wake = nullptr;
        bool moved = false;
        try {
            moved = (this->*ready)(value, wake);
        } catch (...) {
            guard.unlock();
            if (wake) detail::wake_waiter(*wake);
            throw;
        }
        if (!moved) return false;
        guard.unlock();
        if (wake) detail::wake_waiter(*wake);
        return true;
    }
    bool send_now(T& value, std::unique_lock<detail::SpinLock>& guard) {
        return move_now(&Channel::send_ready, value, guard);
    }
    bool receive_now(std::optional<T>& result, std::unique_lock<detail::SpinLock>& guard) {
        return move_now(&Channel::receive_ready, result, guard);
    }

    // Under lock_: takes the oldest value into `result` (empty on entry): the buffer's front
    // (and the longest blocked sender's value moves in behind it), else straight from the
    // longest blocked sender; false if there is none now. `wake`: the sender to wake once the
    // lock is released. If moving the value out throws, the exception leaves here, the value
    // stays where it was, and `wake` may name a sender claimed for it: the caller wakes it
    // all the same (marked to try again) once the lock is released.
    bool receive_ready(std::optional<T>& result, detail::Waiter*& wake) {
        if (!buffer_.empty()) {
            result.emplace(std::move(buffer_.front()));  // may throw: nothing changed
            buffer_.pop_front();
            // The longest blocked sender's value moves in behind; if that move throws, the
            // sender tries again itself (its send() then throws it, or finds room later).
            if (detail::Waiter* sender = detail::pop_claimed(senders_)) {
                wake = sender;
                try {
                    buffer_.push_back(std::move(*static_cast<T*>(sender->slot)));
                    sender->ok = true;
                } catch (...) {
                    sender->retry = true;
                }
            }
            return true;
        }
        // Claimed before the value moves, as in send_ready().
        if (detail::Waiter* sender = detail::pop_claimed(senders_)) {
            wake = sender;
            try {
                result.emplace(std::move(*static_cast<T*>(sender->slot)));
            } catch (...) {
                sender->retry = true;
                throw;
            }
            sender->ok = true;
            return true;
        }
        return false;
    }

    bool send_until_steady(T& value, detail::TimePoint deadline) {
        for (;;) {  // again after a claim whose move threw in the receiver's call
            detail::Waiter self;
            std::unique_lock<detail::SpinLock> guard(lock_, std::defer_lock);
            for (bool prepared = false;; prepared = true) {
                guard.lock();
                if (closed_) return false;
                if (send_now(value, guard)) return true;
                if (prepared) break;
                // Not ready: prepare the timed wait (it may throw std::bad_alloc) with no
                // lock held, then look again. A ready send never allocates.
                guard.unlock();
                if (!(detail::clock_now() < deadline)) {
                    detail::give_way_to_one_task();
                    return false;
                }
                detail::prepare_timed_wait(self);
            }
            self.slot = &value;
            senders_.push_back(&self);
            guard.release();  // block() releases it
            detail::note_wait(detail::WaitReason::ChannelSend, this, &wait_ops_, &deadline);
            if (!detail::block(lock_, senders_, self, &deadline)) return false;  // the value is ours
            if (!self.retry) return self.ok;
        }
    }

    std::optional<T> receive_until_steady(detail::TimePoint deadline) {
        std::optional<T> result;
        for (;;) {  // again after a claim whose move threw in the sender's call
            detail::Waiter self;
            std::unique_lock<detail::SpinLock> guard(lock_, std::defer_lock);
            for (bool prepared = false;; prepared = true) {
                guard.lock();
                if (receive_now(result, guard)) return result;
                if (closed_ || prepared) break;
                guard.unlock();
                if (!(detail::clock_now() < deadline)) {
                    detail::give_way_to_one_task();
                    return result;
                }
                detail::prepare_timed_wait(self);  // may throw std::bad_alloc: nothing is held
            }
            if (closed_) return result;
            self.slot = &result;
            receivers_.push_back(&self);
            guard.release();  // block() releases it
            detail::note_wait(detail::WaitReason::ChannelReceive, this, &wait_ops_, &deadline);
            // Timed out: a sender that raced it lost its claim and moved nothing; `result`
            // is empty then.
            detail::block(lock_, receivers_, self, &deadline);
            if (!self.retry) return result;
        }
    }

    // fiber_report()'s look at a channel a fiber waits on (WaitOps::describe).
    static void describe_wait(const void* channel, char* out, std::size_t size) noexcept {
        auto* self = static_cast<const Channel*>(channel);
        if (!self->lock_.try_lock()) {
            std::snprintf(out, size, "busy");
            return;
        }
        const std::size_t length = self->buffer_.size();
        const bool closed = self->closed_;
        self->lock_.unlock();
        std::snprintf(out, size, "length %zu, capacity %zu%s", length, self->capacity_, closed ? ", closed" : "");
    }
    static constexpr detail::WaitOps wait_ops_{&Channel::describe_wait, nullptr};

    mutable detail::SpinLock lock_;  // guards everything below
    std::deque<T> buffer_;
    const std::size_t capacity_;
    bool closed_ = false;
    detail::WaitList senders_;
    detail::WaitList receivers_;
};

}  // namespace fsched
