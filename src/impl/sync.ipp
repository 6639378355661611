// ---------------------------------------------------------------------------
// Implementation: blocking and waking for the synchronisation primitives.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

namespace {

struct ParkArgs {
    WaitState* state;
    SpinLock* lock;
    const std::chrono::steady_clock::time_point* deadline;
    std::shared_ptr<WaitState>* shared;
};

void release_after_park(Fiber*, void* arg) {
    auto* args = static_cast<ParkArgs*>(arg);
    args->state->fiber = take_task_ref();
    if (args->deadline) {
        // On the worker the fiber parked from; only that worker touches its timer heap.
        Worker* worker = thread_state()->worker;
        worker->timers.push(Timer{*args->deadline, worker->timer_sequence++, nullptr, *args->shared});
    }
    args->lock->unlock();  // only now may a notifier find and wake the fiber
}

}  // namespace

bool block(SpinLock& lock, Waiter& w, const std::chrono::steady_clock::time_point* deadline, Unlink unlink,
           void* context) {
    if (in_scheduler_task()) {
        if (deadline) {
            // The timer may outlive this frame: the state it races for lives on the heap.
            w.shared = std::make_shared<WaitState>();
            w.state = w.shared.get();
        }
        ParkArgs args{w.state, &lock, deadline, &w.shared};
        park(&release_after_park, &args);
        if (w.state->status.load(std::memory_order_acquire) == notified) return true;
        std::lock_guard<SpinLock> guard(lock);
        unlink(context, w);
        return false;
    }
    ThreadSignal signal;
    w.state->thread = &signal;
    lock.unlock();
    std::unique_lock<std::mutex> signal_lock(signal.mutex);
    if (deadline && !signal.cv.wait_until(signal_lock, *deadline, [&] { return signal.set; })) {
        int expected = waiting;
        if (w.state->status.compare_exchange_strong(expected, timed_out, std::memory_order_acq_rel)) {
            signal_lock.unlock();
            std::lock_guard<SpinLock> guard(lock);
            unlink(context, w);
            return false;
        }
        // A notifier claimed us just as the deadline passed: take its signal.
    }
    signal.cv.wait(signal_lock, [&] { return signal.set; });
    return true;
}

void wake_claimed(Waiter& w) {
    WaitState& state = *w.state;
    if (state.fiber) {
        wake(std::move(state.fiber));
        return;
    }
    ThreadSignal& signal = *state.thread;
    // Notify under the lock: the waiter may return, destroying `signal`, once it sees `set`.
    std::lock_guard<std::mutex> guard(signal.mutex);
    signal.set = true;
    signal.cv.notify_one();
}

}  // namespace detail

Mutex::~Mutex() { FIBER_SCHED_ASSERT(!locked_ && "~Mutex(): the mutex is still locked"); }

void Mutex::lock() {
    const std::uint64_t me = detail::caller_identity();
    lock_.lock();
    if (!locked_) {
        locked_ = true;
        owner_ = me;
        lock_.unlock();
        return;
    }
    FIBER_SCHED_ASSERT(owner_ != me && "Mutex::lock(): the caller already holds this mutex (it is not recursive)");
    detail::Waiter self;
    self.owner = me;
    waiters_.push_back(&self);
    detail::block(lock_, waiters_, self, nullptr);
    // unlock() handed the mutex to us: locked_ stayed true and owner_ is `me`.
}

bool Mutex::try_lock() {
    const std::uint64_t me = detail::caller_identity();
    std::lock_guard<detail::SpinLock> guard(lock_);
    if (locked_) return false;
    locked_ = true;
    owner_ = me;
    return true;
}

void Mutex::unlock() {
    const std::uint64_t me = detail::caller_identity();
    lock_.lock();
    FIBER_SCHED_ASSERT(locked_ && owner_ == me && "Mutex::unlock(): the mutex is not held by the caller");
    // Hand the lock to the longest waiter, so no waiter can be overtaken forever.
    while (detail::Waiter* next = waiters_.pop_front()) {
        if (!detail::claim(*next)) continue;
        owner_ = next->owner;
        lock_.unlock();
        detail::wake_claimed(*next);
        return;
    }
    locked_ = false;
    owner_ = 0;
    lock_.unlock();
}

void ConditionVariable::notify_one() {
    lock_.lock();
    while (detail::Waiter* w = waiters_.pop_front()) {
        if (!detail::claim(*w)) continue;
        lock_.unlock();
        detail::wake_claimed(*w);
        return;
    }
    lock_.unlock();
}

void ConditionVariable::notify_all() {
    std::vector<detail::Waiter*> woken;
    lock_.lock();
    while (detail::Waiter* w = waiters_.pop_front()) {
        if (detail::claim(*w)) woken.push_back(w);
    }
    lock_.unlock();
    for (detail::Waiter* w : woken) detail::wake_claimed(*w);
}

void ConditionVariable::wait(std::unique_lock<Mutex>& lock) {
    FIBER_SCHED_ASSERT(lock.owns_lock() && "ConditionVariable::wait(): the lock does not own its mutex");
    detail::Waiter self;
    lock_.lock();
    waiters_.push_back(&self);
    // Released while our lock is held: a notify in between finds us in the list.
    lock.mutex()->unlock();
    detail::block(lock_, waiters_, self, nullptr);
    lock.mutex()->lock();
}

std::cv_status ConditionVariable::wait_until_steady(std::unique_lock<Mutex>& lock,
                                                    std::chrono::steady_clock::time_point deadline) {
    FIBER_SCHED_ASSERT(lock.owns_lock() && "ConditionVariable::wait_until(): the lock does not own its mutex");
    detail::Waiter self;
    lock_.lock();
    waiters_.push_back(&self);
    lock.mutex()->unlock();
    const bool woken = detail::block(lock_, waiters_, self, &deadline);
    lock.mutex()->lock();
    return woken ? std::cv_status::no_timeout : std::cv_status::timeout;
}

WaitGroup::WaitGroup(std::int64_t initial) : count_(initial) {
    FIBER_SCHED_ASSERT(initial >= 0 && "WaitGroup(): the counter must not start below zero");
}

void WaitGroup::add(std::int64_t n) {
    std::vector<detail::Waiter*> woken;
    lock_.lock();
    const bool below_zero = count_ + n < 0;
    if (!below_zero) count_ += n;
    if (!below_zero && count_ == 0) {
        while (detail::Waiter* w = waiters_.pop_front()) {
            if (detail::claim(*w)) woken.push_back(w);
        }
    }
    lock_.unlock();
    FIBER_SCHED_ASSERT(!below_zero && "WaitGroup::add(): the counter went below zero (more done() than add())");
    for (detail::Waiter* w : woken) detail::wake_claimed(*w);
}

void WaitGroup::wait() {
    lock_.lock();
    if (count_ == 0) {
        lock_.unlock();
        return;
    }
    detail::Waiter self;
    waiters_.push_back(&self);
    detail::block(lock_, waiters_, self, nullptr);
}

}  // namespace fsched
