// ---------------------------------------------------------------------------
// Implementation: blocking and waking for the synchronisation primitives.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

namespace {

struct ParkArgs {
    WaitState* state;
    SpinLock* const* locks;
    std::size_t lock_count;
    const std::chrono::steady_clock::time_point* deadline;
    std::shared_ptr<WaitState>* shared;
};

void unlock_all(SpinLock* const* locks, std::size_t count) noexcept {
    for (std::size_t i = count; i-- > 0;) locks[i]->unlock();
}

void release_after_park(Fiber*, void* arg) {
    // Once the timer is in (it may fire at once) or the first lock is released, the fiber
    // may run on another worker and leave block_all(), whose frame holds `args`: read it
    // first. The lock array outlives the hook: it is released last to first, and its owner
    // cannot return before locks[0] is free (block()'s notifier needs it; a timed-out block()
    // and a woken select() take every lock again, locks[0] first).
    const auto* args = static_cast<const ParkArgs*>(arg);
    SpinLock* const* const locks = args->locks;
    const std::size_t count = args->lock_count;
    args->state->fiber = take_task_ref();
    if (args->deadline) {
        // On the worker the fiber parked from; only that worker touches its timer heap.
        thread_state()->worker->add_timer(*args->deadline, nullptr, *args->shared);
    }
    unlock_all(locks, count);  // only now may a notifier find and wake the fiber
}

}  // namespace

void prepare_timed_wait(Waiter& w) {
    if (w.shared || !in_scheduler_task()) return;
    if (FIBER_SCHED_FAULT(WaitAlloc)) throw std::bad_alloc();
    // The timer may outlive the waiter's frame: the state it races for lives on the heap.
    w.shared = std::make_shared<WaitState>();
    w.state = w.shared.get();
    reserve_timer();
}

void give_way_to_one_task() {
    if (SchedulerCore* core = caller_may_help()) {
        const TimePoint passed = TimePoint::min();
        help_until(*core, nullptr, &passed);
    }
}

bool block(SpinLock& lock, Waiter& w, const std::chrono::steady_clock::time_point* deadline, Unlink unlink,
           void* context) {
    if (deadline && !w.shared && in_scheduler_task()) {
        // Callers should have prepared this before taking the lock; if not, do it now
        // and, should it fail, leave nothing behind.
        try {
            prepare_timed_wait(w);
        } catch (...) {
            unlink(context, w);
            lock.unlock();
            throw;
        }
    }
    SpinLock* const locks[] = {&lock};
    if (block_all(locks, 1, w, deadline)) return true;
    std::lock_guard<SpinLock> guard(lock);
    unlink(context, w);
    return false;
}

bool block_all(SpinLock* const* locks, std::size_t count, Waiter& w,
               const std::chrono::steady_clock::time_point* deadline) {
    if (in_scheduler_task()) {
        ParkArgs args{w.state, locks, count, deadline, &w.shared};
        park(&release_after_park, &args);
        return w.state->status.load(std::memory_order_acquire) == WaitStatus::Notified;
    }
    if (FIBER_SCHED_UNLIKELY(thread_state()->simulation != nullptr)) {
        // A Fiber resumed by hand inside a simulated task: nothing would ever wake this
        // thread (the simulation runs on it), and the waiter is listed already.
        sim_fatal("testing::simulate(): a Fiber resumed by hand (not a scheduler task) waited on a primitive; "
                  "inside a simulation only tasks can wait: schedule() the fiber instead");
    }
    ThreadSignal signal;
    w.state->thread = &signal;
    if (SchedulerCore* core = caller_may_help()) {
        // The use_caller thread runs its scheduler's tasks until a notifier sets `done`.
        signal.helper = core;
        unlock_all(locks, count);
        help_until(*core, &signal.done, deadline);
        if (!signal.done.load(std::memory_order_seq_cst)) {
            WaitStatus expected = WaitStatus::Waiting;
            if (w.state->status.compare_exchange_strong(expected, WaitStatus::TimedOut, std::memory_order_acq_rel)) {
                return false;
            }
            // A notifier claimed us just as the deadline passed: help on until it signals.
            help_until(*core, &signal.done, nullptr);
        }
        // The notifier sets `done` and wakes us under the mutex: wait until it is out.
        std::lock_guard<std::mutex> guard(signal.mutex);
        return true;
    }
    unlock_all(locks, count);
    std::unique_lock<std::mutex> signal_lock(signal.mutex);
    if (deadline && !signal.cv.wait_until(signal_lock, *deadline, [&] { return signal.set; })) {
        WaitStatus expected = WaitStatus::Waiting;
        if (w.state->status.compare_exchange_strong(expected, WaitStatus::TimedOut, std::memory_order_acq_rel)) {
            return false;
        }
        // A notifier claimed us just as the deadline passed: take its signal.
    }
    signal.cv.wait(signal_lock, [&] { return signal.set; });
    return true;
}

void wake_waiter(Waiter& w) noexcept {
    WaitState& state = *w.state;
    if (state.fiber) {
        wake_fiber(std::move(state.fiber));
        return;
    }
    ThreadSignal& signal = *state.thread;
    // Notify under the lock: the waiter may return, destroying `signal`, once it sees `set`.
    std::lock_guard<std::mutex> guard(signal.mutex);
    if (signal.helper) {
        signal.done.store(true, std::memory_order_seq_cst);
        wake_caller(*signal.helper);  // then claims its `sleeping` (the lost-wake-up argument)
        return;
    }
    signal.set = true;
    signal.cv.notify_one();
}

}  // namespace detail

Mutex::~Mutex() {
    FIBER_SCHED_ASSERT(!(state_.load(std::memory_order_relaxed) & locked_bit) && "~Mutex(): the mutex is still locked");
    // unlock_slow() releases the mutex under lock_ and only then unlocks lock_: a thread that
    // took the mutex in between and destroys it, as the last user may, must wait for that
    // store (std::mutex allows destroying a mutex just unlocked by another thread).
    lock_.lock();
    lock_.unlock();
}

void Mutex::lock() {
    const std::uint64_t me = detail::caller_identity();
    std::uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, locked_bit, std::memory_order_acquire, std::memory_order_relaxed)) {
        owner_.store(me, std::memory_order_relaxed);
        return;
    }
    FIBER_SCHED_ASSERT(owner_.load(std::memory_order_relaxed) != me &&
                       "Mutex::lock(): the caller already holds this mutex (it is not recursive)");
    lock_slow(me, nullptr);
}

bool Mutex::lock_slow(std::uint64_t me, const detail::TimePoint* deadline) {
    using namespace std::chrono;
    const auto start = detail::clock_now();
    bool woken_before = false;
    for (;;) {
        std::uint32_t s = state_.load(std::memory_order_relaxed);
        if (!(s & (locked_bit | starving_bit))) {
            if (state_.compare_exchange_weak(s, s | locked_bit, std::memory_order_acquire, std::memory_order_relaxed)) {
                owner_.store(me, std::memory_order_relaxed);
                return true;
            }
            continue;
        }
        // Past the deadline (and this look found it taken): give up. A waiter woken to
        // compete after its deadline has had its look above, so a lock that unlock_slow()
        // left free for it is taken, not left idle while other waiters sleep; one that a
        // newcomer took will wake the next waiter when it is unlocked.
        if (deadline && detail::clock_now() >= *deadline) {
            detail::give_way_to_one_task();
            return false;
        }
        detail::Waiter self;
        self.owner = me;
        if (deadline) detail::prepare_timed_wait(self);  // may throw: nothing is held or counted
        lock_.lock();
        // Join the waiters while the lock is held; if it came free meanwhile, compete again.
        const bool starve = woken_before && detail::clock_now() - start > milliseconds(1);
        bool joined = false;
        s = state_.load(std::memory_order_relaxed);
        while (s & locked_bit) {
            const std::uint32_t next = (s + waiter_unit) | (starve ? starving_bit : 0u);
            if (state_.compare_exchange_weak(s, next, std::memory_order_relaxed, std::memory_order_relaxed)) {
                joined = true;
                break;
            }
        }
        if (!joined) {
            lock_.unlock();
            continue;
        }
        // A waiter that was woken and lost the race goes back to the front.
        if (woken_before) {
            waiters_.push_front(&self);
        } else {
            waiters_.push_back(&self);
        }
        // The report shows who holds it, and the watch follows holders to find lock cycles.
        static constexpr detail::WaitOps ops{nullptr, &Mutex::holder_of};
        detail::note_wait(detail::WaitReason::Mutex, this, &ops, deadline);
        // The claim decides a timeout racing an unlock once: unlock_slow() won it (true:
        // handed over, or woken to compete and already uncounted) or the timeout did (false:
        // leave_timed_out() has uncounted us under lock_, whether or not unlock_slow()
        // popped us on its way to a live waiter).
        bool woken;
        {
            const detail::WatchedMutexWait watched;
            woken = detail::block(lock_, self, deadline, &Mutex::leave_timed_out, this);
        }
        if (!woken) return false;
        if (self.ok) return true;  // handed over: unlock() made us the owner
        woken_before = true;
    }
}

void Mutex::leave_timed_out(void* mutex, detail::Waiter& w) noexcept {
    auto* self = static_cast<Mutex*>(mutex);
    if (w.linked) self->waiters_.remove(&w);
    // Counts change only under lock_ (held here). The last waiter to leave also ends
    // starving mode: a locked, starving mutex with no waiters would be released by the fast
    // unlock with the starving bit still set, and then no one could take it.
    std::uint32_t s = self->state_.load(std::memory_order_relaxed);
    for (;;) {
        std::uint32_t next = s - waiter_unit;
        if (next < waiter_unit) next &= ~starving_bit;
        if (self->state_.compare_exchange_weak(s, next, std::memory_order_relaxed, std::memory_order_relaxed)) return;
    }
}

bool Mutex::try_lock_until_steady(detail::TimePoint deadline) {
    const std::uint64_t me = detail::caller_identity();
    if (try_lock()) return true;
    FIBER_SCHED_ASSERT(owner_.load(std::memory_order_relaxed) != me &&
                       "Mutex::try_lock_until(): the caller already holds this mutex (it is not recursive)");
    return lock_slow(me, &deadline);
}

std::uint64_t Mutex::holder_of(const void* mutex) noexcept {
    return static_cast<const Mutex*>(mutex)->owner_.load(std::memory_order_relaxed);
}

bool Mutex::try_lock() {
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    while (!(s & (locked_bit | starving_bit))) {
        if (state_.compare_exchange_weak(s, s | locked_bit, std::memory_order_acquire, std::memory_order_relaxed)) {
            owner_.store(detail::caller_identity(), std::memory_order_relaxed);
            return true;
        }
    }
    return false;
}

void Mutex::unlock() {
    const std::uint64_t me = detail::caller_identity();
    std::uint32_t s = state_.load(std::memory_order_relaxed);
    FIBER_SCHED_ASSERT((s & locked_bit) && owner_.load(std::memory_order_relaxed) == me &&
                       "Mutex::unlock(): the mutex is not held by the caller");
    owner_.store(0, std::memory_order_relaxed);
    while (s < waiter_unit) {  // no waiters (and so not starving): just release
        if (state_.compare_exchange_weak(s, s & ~locked_bit, std::memory_order_release, std::memory_order_relaxed)) {
            return;
        }
    }
    unlock_slow();
}

void Mutex::unlock_slow() {
    lock_.lock();
    // Counted waiters are in the list, but for timed-out ones that are leaving (pop_claimed
    // skips them; leave_timed_out() uncounts them).
    detail::Waiter* next = detail::pop_claimed(waiters_);
    const std::uint32_t s = state_.load(std::memory_order_relaxed);
    if (!next) {  // only timed-out waiters are counted: release and leave starving mode
        state_.fetch_and(~(locked_bit | starving_bit), std::memory_order_release);
        lock_.unlock();
        return;
    }
    if (s & starving_bit) {
        // Hand-off: the mutex stays locked and becomes the longest waiter's. Leave
        // starving mode once no one else waits.
        const std::uint32_t leave = waiters_.empty() ? starving_bit : 0u;
        owner_.store(next->owner, std::memory_order_relaxed);
        next->ok = true;
        state_.fetch_sub(waiter_unit | leave, std::memory_order_release);
    } else {
        // Release, and wake the longest waiter to compete for the lock.
        state_.fetch_sub(waiter_unit | locked_bit, std::memory_order_release);
    }
    lock_.unlock();
    detail::wake_waiter(*next);
}

void ConditionVariable::notify_one() {
    lock_.lock();
    detail::Waiter* w = detail::pop_claimed(waiters_);
    lock_.unlock();
    if (w) detail::wake_waiter(*w);
}

void ConditionVariable::notify_all() {
    detail::WaitList woken;
    lock_.lock();
    detail::pop_all_claimed(waiters_, woken);
    lock_.unlock();
    detail::wake_waiters(woken);
}

void ConditionVariable::wait(std::unique_lock<Mutex>& lock) {
    FIBER_SCHED_ASSERT(lock.owns_lock() && "ConditionVariable::wait(): the lock does not own its mutex");
    detail::Waiter self;
    lock_.lock();
    waiters_.push_back(&self);
    // Released while our lock is held: a notify in between finds us in the list.
    lock.mutex()->unlock();
    detail::note_wait(detail::WaitReason::ConditionVariable, this);
    detail::block(lock_, waiters_, self, nullptr);
    lock.mutex()->lock();
}

std::cv_status ConditionVariable::wait_until_steady(std::unique_lock<Mutex>& lock,
                                                    std::chrono::steady_clock::time_point deadline) {
    FIBER_SCHED_ASSERT(lock.owns_lock() && "ConditionVariable::wait_until(): the lock does not own its mutex");
    detail::Waiter self;
    detail::prepare_timed_wait(self);  // may throw, with `lock` still held, as it should be
    lock_.lock();
    waiters_.push_back(&self);
    lock.mutex()->unlock();
    detail::note_wait(detail::WaitReason::ConditionVariable, this, nullptr, &deadline);
    const bool woken = detail::block(lock_, waiters_, self, &deadline);
    lock.mutex()->lock();
    return woken ? std::cv_status::no_timeout : std::cv_status::timeout;
}

WaitGroup::WaitGroup(std::int64_t initial) : count_(initial) {
    FIBER_SCHED_ASSERT(initial >= 0 && "WaitGroup(): the counter must not start below zero");
}

void WaitGroup::add(std::int64_t n) {
    detail::WaitList woken;
    lock_.lock();
    const bool below_zero = count_ + n < 0;
    if (!below_zero) count_ += n;
    if (!below_zero && count_ == 0) {
        detail::pop_all_claimed(waiters_, woken);
    }
    lock_.unlock();
    FIBER_SCHED_ASSERT(!below_zero && "WaitGroup::add(): the counter went below zero (more done() than add())");
    detail::wake_waiters(woken);
}

void WaitGroup::wait() {
    lock_.lock();
    if (count_ == 0) {
        lock_.unlock();
        return;
    }
    detail::Waiter self;
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&WaitGroup::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::WaitGroup, this, &ops);
    detail::block(lock_, waiters_, self, nullptr);
}

void WaitGroup::describe_wait(const void* group, char* out, std::size_t size) noexcept {
    auto* self = const_cast<WaitGroup*>(static_cast<const WaitGroup*>(group));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const long long count = self->count_;
    self->lock_.unlock();
    std::snprintf(out, size, "count %lld", count);
}

}  // namespace fsched
