// ---------------------------------------------------------------------------
// Implementation: the slow paths of sync_extra.hpp's primitives.
// ---------------------------------------------------------------------------

#pragma once

#include "sync_extra.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

// Waiters in `list` (timed-out ones on their way out included), for the report. Under the
// list's lock.
inline long listed_waiters(const WaitList& list) noexcept {
    long n = 0;
    for (const Waiter* w = list.front(); w; w = w->next) ++n;
    return n;
}

}  // namespace detail

// ---- Semaphore ------------------------------------------------------------------------

Semaphore::Semaphore(std::ptrdiff_t initial) : count_(initial) {
    FIBER_SCHED_ASSERT(initial >= 0 && "Semaphore(): the initial count must not be negative");
}

void Semaphore::acquire() {
    lock_.lock();
    if (count_ > 0) {
        --count_;
        lock_.unlock();
        return;
    }
    detail::Waiter self;
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Semaphore::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Semaphore, this, &ops);
    // Woken means claimed by release(), which gave us the unit instead of counting it.
    detail::block(lock_, waiters_, self, nullptr);
}

bool Semaphore::try_acquire() {
    std::lock_guard<detail::SpinLock> guard(lock_);
    if (count_ == 0) return false;
    --count_;
    return true;
}

bool Semaphore::try_acquire_until_steady(detail::TimePoint deadline) {
    detail::Waiter self;
    detail::prepare_timed_wait(self);  // may throw: nothing taken or queued yet
    lock_.lock();
    if (count_ > 0) {
        --count_;
        lock_.unlock();
        return true;
    }
    if (detail::clock_now() >= deadline) {
        lock_.unlock();
        detail::give_way_to_one_task();
        return false;
    }
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Semaphore::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Semaphore, this, &ops, &deadline);
    // The claim decides a release racing the timeout once: claimed, the unit is ours; timed
    // out, release() skipped us and gave the unit to another waiter or the count.
    return detail::block(lock_, waiters_, self, &deadline);
}

void Semaphore::release(std::ptrdiff_t n) {
    FIBER_SCHED_ASSERT(n >= 0 && "Semaphore::release(): the update must not be negative");
    detail::WaitList woken;
    lock_.lock();
    // Units go to the longest waiters first; only what is left is counted.
    std::ptrdiff_t left = n;
    while (left > 0) {
        detail::Waiter* w = detail::pop_claimed(waiters_);
        if (!w) break;
        woken.push_back(w);
        --left;
    }
    const bool overflow = left > (max)() - count_;
    if (!overflow) count_ += left;
    lock_.unlock();
    detail::wake_waiters(woken);
    FIBER_SCHED_ASSERT(!overflow && "Semaphore::release(): the count would exceed max()");
}

void Semaphore::describe_wait(const void* semaphore, char* out, std::size_t size) noexcept {
    auto* self = const_cast<Semaphore*>(static_cast<const Semaphore*>(semaphore));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const long long count = self->count_;
    const long waiting = detail::listed_waiters(self->waiters_);
    self->lock_.unlock();
    std::snprintf(out, size, "count %lld, %ld waiting", count, waiting);
}

// ---- Latch ----------------------------------------------------------------------------

Latch::Latch(std::ptrdiff_t count) : count_(count) {
    FIBER_SCHED_ASSERT(count >= 0 && "Latch(): the count must not be negative");
}

void Latch::count_down(std::ptrdiff_t n) {
    FIBER_SCHED_ASSERT(n >= 0 && "Latch::count_down(): the update must not be negative");
    detail::WaitList woken;
    lock_.lock();
    const bool below_zero = n > count_;
    if (!below_zero) {
        count_ -= n;
        if (count_ == 0 && n > 0) detail::pop_all_claimed(waiters_, woken);
    }
    lock_.unlock();
    FIBER_SCHED_ASSERT(!below_zero && "Latch::count_down(): the count went below zero");
    detail::wake_waiters(woken);
}

bool Latch::try_wait() const noexcept {
    std::lock_guard<detail::SpinLock> guard(lock_);
    return count_ == 0;
}

void Latch::wait() { arrive_and_wait(0); }

void Latch::arrive_and_wait(std::ptrdiff_t n) {
    FIBER_SCHED_ASSERT(n >= 0 && "Latch::arrive_and_wait(): the update must not be negative");
    lock_.lock();
    const bool below_zero = n > count_;
    if (below_zero || count_ == n) {
        // Either misuse, or this arrival opens the latch: nothing to wait for.
        detail::WaitList woken;
        if (!below_zero) {
            count_ = 0;
            if (n > 0) detail::pop_all_claimed(waiters_, woken);
        }
        lock_.unlock();
        FIBER_SCHED_ASSERT(!below_zero && "Latch::arrive_and_wait(): the count went below zero");
        detail::wake_waiters(woken);
        return;
    }
    count_ -= n;
    detail::Waiter self;
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Latch::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Latch, this, &ops);
    detail::block(lock_, waiters_, self, nullptr);
}

void Latch::describe_wait(const void* latch, char* out, std::size_t size) noexcept {
    auto* self = const_cast<Latch*>(static_cast<const Latch*>(latch));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const long long count = self->count_;
    self->lock_.unlock();
    std::snprintf(out, size, "count %lld", count);
}

// ---- Barrier --------------------------------------------------------------------------

Barrier::Barrier(std::ptrdiff_t count, std::function<void()> completion)
    : expected_(count), remaining_(count), completion_(std::move(completion)) {
    FIBER_SCHED_ASSERT(count >= 0 && "Barrier(): the count must not be negative");
}

void Barrier::arrive_and_wait() { arrive(false); }

void Barrier::arrive_and_drop() { arrive(true); }

void Barrier::arrive(bool drop) {
    lock_.lock();
    if (remaining_ <= 0) {
        lock_.unlock();
        if (drop) {
            FIBER_SCHED_ASSERT(!"Barrier::arrive_and_drop(): more arrivals in a phase than participants");
        } else {
            FIBER_SCHED_ASSERT(!"Barrier::arrive_and_wait(): more arrivals in a phase than participants");
        }
        return;
    }
    if (drop) --expected_;
    if (--remaining_ == 0) {
        complete_phase();
        return;
    }
    if (drop) {
        lock_.unlock();
        return;
    }
    // Not timed: the claim that complete_phase() makes always succeeds, so the list holds
    // exactly this phase's waiters (the next phase's cannot arrive before they are woken).
    detail::Waiter self;
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Barrier::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Barrier, this, &ops);
    detail::block(lock_, waiters_, self, nullptr);
}

void Barrier::complete_phase() {
    detail::WaitList woken;
    detail::pop_all_claimed(waiters_, woken);
    remaining_ = expected_;
    ++phase_;
    lock_.unlock();
    // Run before any waiter of the phase is woken (they are claimed but still parked), and
    // outside the spin lock: it is the user's code and may block. A throw must not leave
    // the phase's waiters parked for good: they are woken first, then it propagates.
    std::exception_ptr error;
    if (completion_) {
        try {
            completion_();
        } catch (...) {
            error = std::current_exception();
        }
    }
    detail::wake_waiters(woken);
    if (error) std::rethrow_exception(error);
}

void Barrier::describe_wait(const void* barrier, char* out, std::size_t size) noexcept {
    auto* self = const_cast<Barrier*>(static_cast<const Barrier*>(barrier));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const unsigned long long phase = self->phase_;
    const long long arrived = self->expected_ - self->remaining_;
    const long long expected = self->expected_;
    self->lock_.unlock();
    std::snprintf(out, size, "phase %llu, %lld of %lld arrived", phase, arrived, expected);
}

// ---- SharedMutex ----------------------------------------------------------------------

SharedMutex::~SharedMutex() {
    FIBER_SCHED_ASSERT(!writer_ && readers_ == 0 && "~SharedMutex(): the mutex is still locked");
}

void SharedMutex::lock() {
    const std::uint64_t me = detail::caller_identity();
    lock_.lock();
    if (!writer_ && readers_ == 0) {
        writer_ = true;
        owner_.store(me, std::memory_order_relaxed);
        lock_.unlock();
        return;
    }
    if (writer_ && owner_.load(std::memory_order_relaxed) == me) {
        lock_.unlock();
        FIBER_SCHED_ASSERT(!"SharedMutex::lock(): the caller already holds this mutex (it is not recursive)");
        return;
    }
    detail::Waiter self;
    self.owner = me;
    writers_.push_back(&self);
    static constexpr detail::WaitOps ops{&SharedMutex::describe_wait, &SharedMutex::holder_of};
    detail::note_wait(detail::WaitReason::SharedMutex, this, &ops);
    const detail::WatchedMutexWait watched;  // the deadlock watch, as Mutex
    // Woken means handed over: the unlocker made us the exclusive owner.
    detail::block(lock_, writers_, self, nullptr);
}

bool SharedMutex::try_lock() {
    std::lock_guard<detail::SpinLock> guard(lock_);
    if (writer_ || readers_ != 0) return false;
    writer_ = true;
    owner_.store(detail::caller_identity(), std::memory_order_relaxed);
    return true;
}

void SharedMutex::unlock() {
    const std::uint64_t me = detail::caller_identity();
    detail::WaitList woken;
    lock_.lock();
    if (!writer_ || owner_.load(std::memory_order_relaxed) != me) {
        lock_.unlock();
        FIBER_SCHED_ASSERT(!"SharedMutex::unlock(): the mutex is not held exclusively by the caller");
        return;
    }
    if (!readers_queue_.empty()) {
        // The readers that queued behind this writer go first, all together; a writer
        // waiting too gets it when they are done (the last unlock_shared()).
        writer_ = false;
        owner_.store(0, std::memory_order_relaxed);
        detail::pop_all_claimed(readers_queue_, woken);
        for (detail::Waiter* w = woken.front(); w; w = w->next) ++readers_;
    } else if (detail::Waiter* next = detail::pop_claimed(writers_)) {
        owner_.store(next->owner, std::memory_order_relaxed);  // stays locked: a hand-off
        woken.push_back(next);
    } else {
        writer_ = false;
        owner_.store(0, std::memory_order_relaxed);
    }
    lock_.unlock();
    detail::wake_waiters(woken);
}

void SharedMutex::lock_shared() {
    lock_.lock();
    // Behind a waiting writer: writer preference.
    if (!writer_ && writers_.empty()) {
        ++readers_;
        lock_.unlock();
        return;
    }
    if (writer_ && owner_.load(std::memory_order_relaxed) == detail::caller_identity()) {
        lock_.unlock();
        FIBER_SCHED_ASSERT(!"SharedMutex::lock_shared(): the caller holds this mutex exclusively");
        return;
    }
    detail::Waiter self;
    readers_queue_.push_back(&self);
    static constexpr detail::WaitOps ops{&SharedMutex::describe_wait, &SharedMutex::holder_of};
    detail::note_wait(detail::WaitReason::SharedMutexShared, this, &ops);
    const detail::WatchedMutexWait watched;  // the deadlock watch, as Mutex
    // Woken means handed over: the unlocker counted us among the readers.
    detail::block(lock_, readers_queue_, self, nullptr);
}

bool SharedMutex::try_lock_shared() {
    std::lock_guard<detail::SpinLock> guard(lock_);
    if (writer_ || !writers_.empty()) return false;
    ++readers_;
    return true;
}

void SharedMutex::unlock_shared() {
    detail::Waiter* next = nullptr;
    lock_.lock();
    if (readers_ == 0) {
        lock_.unlock();
        FIBER_SCHED_ASSERT(!"SharedMutex::unlock_shared(): no shared lock is held");
        return;
    }
    if (--readers_ == 0 && (next = detail::pop_claimed(writers_)) != nullptr) {
        writer_ = true;
        owner_.store(next->owner, std::memory_order_relaxed);
    }
    lock_.unlock();
    if (next) detail::wake_waiter(*next);
}

void SharedMutex::describe_wait(const void* mutex, char* out, std::size_t size) noexcept {
    auto* self = const_cast<SharedMutex*>(static_cast<const SharedMutex*>(mutex));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const bool writer = self->writer_;
    const long long readers = self->readers_;
    const long writers_waiting = detail::listed_waiters(self->writers_);
    const long readers_waiting = detail::listed_waiters(self->readers_queue_);
    self->lock_.unlock();
    std::snprintf(out, size, "%s, %lld readers, %ld writers and %ld readers waiting",
                  writer ? "held exclusively" : "not held exclusively", readers, writers_waiting, readers_waiting);
}

std::uint64_t SharedMutex::holder_of(const void* mutex) noexcept {
    return static_cast<const SharedMutex*>(mutex)->owner_.load(std::memory_order_relaxed);
}

// ---- Event ----------------------------------------------------------------------------

Event::Event(Mode mode, bool initially_set) : mode_(mode), set_(initially_set) {}

void Event::signal() {
    detail::WaitList woken;
    lock_.lock();
    if (mode_ == Mode::Manual) {
        set_ = true;
        detail::pop_all_claimed(waiters_, woken);
    } else if (detail::Waiter* w = detail::pop_claimed(waiters_)) {
        woken.push_back(w);  // the signal is consumed by its hand-over: the event stays clear
    } else {
        set_ = true;
    }
    lock_.unlock();
    detail::wake_waiters(woken);
}

void Event::clear() {
    std::lock_guard<detail::SpinLock> guard(lock_);
    set_ = false;
}

bool Event::take_locked() noexcept {
    if (!set_) return false;
    if (mode_ == Mode::Auto) set_ = false;
    return true;
}

void Event::wait() {
    lock_.lock();
    if (take_locked()) {
        lock_.unlock();
        return;
    }
    detail::Waiter self;
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Event::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Event, this, &ops);
    detail::block(lock_, waiters_, self, nullptr);
}

bool Event::wait_until_steady(detail::TimePoint deadline) {
    detail::Waiter self;
    detail::prepare_timed_wait(self);  // may throw: nothing consumed or queued yet
    lock_.lock();
    if (take_locked()) {
        lock_.unlock();
        return true;
    }
    if (detail::clock_now() >= deadline) {
        lock_.unlock();
        detail::give_way_to_one_task();
        return false;
    }
    waiters_.push_back(&self);
    static constexpr detail::WaitOps ops{&Event::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::Event, this, &ops, &deadline);
    // Claimed: signal() handed us its signal (Auto) or woke everyone (Manual); timed out:
    // signal() skipped us and left the signal set or gave it to another waiter.
    return detail::block(lock_, waiters_, self, &deadline);
}

bool Event::test() {
    std::lock_guard<detail::SpinLock> guard(lock_);
    return take_locked();
}

bool Event::is_set() const {
    std::lock_guard<detail::SpinLock> guard(lock_);
    return set_;
}

void Event::describe_wait(const void* event, char* out, std::size_t size) noexcept {
    auto* self = const_cast<Event*>(static_cast<const Event*>(event));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const bool set = self->set_;
    const long waiting = detail::listed_waiters(self->waiters_);
    self->lock_.unlock();
    std::snprintf(out, size, "%s, %s, %ld waiting", self->mode_ == Mode::Auto ? "auto" : "manual",
                  set ? "set" : "clear", waiting);
}

// ---- ConditionVariableAny -------------------------------------------------------------

void ConditionVariableAny::notify_one() {
    lock_.lock();
    detail::Waiter* w = detail::pop_claimed(waiters_);
    lock_.unlock();
    if (w) detail::wake_waiter(*w);
}

void ConditionVariableAny::notify_all() {
    detail::WaitList woken;
    lock_.lock();
    detail::pop_all_claimed(waiters_, woken);
    lock_.unlock();
    detail::wake_waiters(woken);
}

void ConditionVariableAny::note_wait(const detail::TimePoint* deadline) noexcept {
    static constexpr detail::WaitOps ops{&ConditionVariableAny::describe_wait, nullptr};
    detail::note_wait(detail::WaitReason::ConditionVariableAny, this, &ops, deadline);
}

void ConditionVariableAny::describe_wait(const void* cv, char* out, std::size_t size) noexcept {
    auto* self = const_cast<ConditionVariableAny*>(static_cast<const ConditionVariableAny*>(cv));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const long waiting = detail::listed_waiters(self->waiters_);
    self->lock_.unlock();
    std::snprintf(out, size, "%ld waiting", waiting);
}

}  // namespace fsched
