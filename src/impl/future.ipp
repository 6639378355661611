// ---------------------------------------------------------------------------
// Implementation: a future's wait and its hand-over (FutureStateBase), on sync.hpp's waits.
// ---------------------------------------------------------------------------

#pragma once

#include "future.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

void FutureStateBase::wait() {
    if (ready()) return;
    Waiter self;
    lock_.lock();
    if (ready_.load(std::memory_order_relaxed)) {  // set under lock_: the lock orders it
        lock_.unlock();
        return;
    }
    waiters_.push_back(&self);
    static constexpr WaitOps ops{&FutureStateBase::describe_wait, nullptr};
    note_wait(WaitReason::Future, this, &ops);
    block(lock_, waiters_, self, nullptr);
}

bool FutureStateBase::wait_until_steady(TimePoint deadline) {
    if (ready()) return true;
    Waiter self;
    prepare_timed_wait(self);  // may throw std::bad_alloc: nothing is held or listed yet
    lock_.lock();
    if (ready_.load(std::memory_order_relaxed)) {
        lock_.unlock();
        return true;
    }
    waiters_.push_back(&self);
    static constexpr WaitOps ops{&FutureStateBase::describe_wait, nullptr};
    note_wait(WaitReason::Future, this, &ops, &deadline);
    return block(lock_, waiters_, self, &deadline);
}

bool FutureStateBase::claim_set() noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    if (satisfied_) return false;
    satisfied_ = true;
    return true;
}

void FutureStateBase::unclaim_set() noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    satisfied_ = false;
}

namespace {
// The continuations fired by the outermost publish() on this thread (publish()).
struct ContinuationQueue {
    FutureStateBase::Continuation* head = nullptr;
    FutureStateBase::Continuation* tail = nullptr;
    bool draining = false;
};
thread_local ContinuationQueue continuation_queue;
}  // namespace

void FutureStateBase::publish() noexcept {
    WaitList woken;
    lock_.lock();
    // Release: the value (or exception) written before is seen by whoever reads ready().
    ready_.store(true, std::memory_order_release);
    pop_all_claimed(waiters_, woken);  // a waiter that timed out is skipped: decided once
    Continuation* next = continuations_;
    continuations_ = nullptr;
    // Copied here, under the lock, as a get() woken now takes the exception out under it.
    for (Continuation* c = next; c; c = c->next) c->error = exception_;
    lock_.unlock();
    wake_waiters(woken);
    if (!next) return;
    // A continuation may publish another state (when_all() of when_all()s): its
    // continuations join this thread's queue instead of firing one level deeper, so a chain
    // of any length runs in constant stack. Nothing here parks, so the queue stays this
    // thread's while it drains.
    ContinuationQueue& queue = continuation_queue;
    Continuation* last = next;
    while (last->next) last = last->next;
    if (queue.tail) {
        queue.tail->next = next;
    } else {
        queue.head = next;
    }
    queue.tail = last;
    if (queue.draining) return;  // the publish() below on this thread fires them
    queue.draining = true;
    while (Continuation* c = queue.head) {
        queue.head = c->next;  // read first: fire() may free c
        if (!queue.head) queue.tail = nullptr;
        c->fire(*c);
    }
    queue.draining = false;
}

bool FutureStateBase::add_continuation(Continuation& c) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    if (ready_.load(std::memory_order_relaxed)) {
        c.error = exception_;
        return false;
    }
    c.next = continuations_;
    continuations_ = &c;
    return true;
}

bool FutureStateBase::set_exception(std::exception_ptr error) noexcept {
    if (!claim_set()) return false;
    exception_ = std::move(error);
    publish();
    return true;
}

void FutureStateBase::describe_wait(const void* state, char* out, std::size_t size) noexcept {
    auto* self = const_cast<FutureStateBase*>(static_cast<const FutureStateBase*>(state));
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const bool satisfied = self->satisfied_;
    self->lock_.unlock();
    std::snprintf(out, size, satisfied ? "being set" : "no value yet");
}

}  // namespace detail
}  // namespace fsched
