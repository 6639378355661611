// ---------------------------------------------------------------------------
// Future<T>, Promise<T>, async(), when_all(): std's shape (std::future, std::promise), on
// fibers. The shared state is one allocation per Promise (make_shared), holding the value or
// the exception, a ready flag and the list of waiters under a SpinLock: get() and wait() park
// a scheduler task's fiber, block a plain thread, and let a use_caller thread outside its
// tasks run the scheduler's ready tasks meanwhile (sync.hpp's block()). Setting the value
// takes the lock once, flips `ready` and wakes every waiter; a timed wait that races it is
// decided once, by the waiter's status CAS (sync.hpp). Errors follow std: std::future_error
// with future_errc::broken_promise (a Promise destroyed unset), promise_already_satisfied,
// future_already_retrieved, no_state (a moved-from or consumed Future or Promise).
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {

template <class T>
class Future;
template <class T>
class Promise;

namespace detail {

template <class T>
class PromiseBase;

// The part of a future's shared state that does not depend on T: readiness, the exception,
// the waiters and the wait (impl/future.ipp).
class FutureStateBase {
public:
    FutureStateBase() = default;
    FutureStateBase(const FutureStateBase&) = delete;
    FutureStateBase& operator=(const FutureStateBase&) = delete;

    // True once a value or an exception is in. Acquire pairs with publish()'s release: the
    // value written before it is seen.
    bool ready() const noexcept { return ready_.load(std::memory_order_acquire); }
    // Blocks until ready().
    void wait();
    // Blocks until ready() (true) or `deadline` passes (false). May throw std::bad_alloc
    // (prepare_timed_wait) before it waits, leaving nothing behind.
    bool wait_until_steady(TimePoint deadline);

    // The setter's claim: false if a value or exception was set (or is being set) already.
    bool claim_set() noexcept;
    // Gives a claim back (the value's constructor threw): the state is unset again.
    void unclaim_set() noexcept;
    // After claim_set() and writing the value: makes it ready and wakes every waiter.
    void publish() noexcept;
    // claim_set() + the exception + publish(); false if it was satisfied already.
    bool set_exception(std::exception_ptr error) noexcept;
    // Marks the future handed out; false if it was already (get_future() twice).
    bool retrieve() noexcept { return !retrieved_.exchange(true, std::memory_order_relaxed); }

    // The exception, moved out (Future::get(): the state is used up). Once ready(); under
    // the lock, as publish() copies it for the continuations there.
    std::exception_ptr take_exception() noexcept {
        std::lock_guard<SpinLock> guard(lock_);
        return std::move(exception_);
    }

    // What runs once the state is ready (when_all()'s count): fire(*this) on the setter's
    // thread, after the waiters are woken, with `error` the state's exception (copied under
    // the lock as it became ready). Lives wherever its owner keeps it, until fired.
    struct Continuation {
        Continuation* next = nullptr;
        void (*fire)(Continuation&) noexcept = nullptr;
        std::exception_ptr error;
    };
    // Queues `c` until ready(); false if ready already (then `c.error` is filled in and the
    // caller fires it itself).
    bool add_continuation(Continuation& c) noexcept;
    // Whether a continuation waits (a broken promise must then still be delivered).
    bool has_continuations() noexcept {
        std::lock_guard<SpinLock> guard(lock_);
        return continuations_ != nullptr;
    }

private:
    // fiber_report()'s look at the state (WaitOps::describe).
    static void describe_wait(const void* state, char* out, std::size_t size) noexcept;

    SpinLock lock_;
    bool satisfied_ = false;              // under lock_: a set_* has claimed the state
    std::atomic<bool> ready_{false};      // set under lock_ (release), read without it (acquire)
    std::atomic<bool> retrieved_{false};  // get_future() was called (relaxed: a flag, no data)
    std::exception_ptr exception_;        // written by the claimer before publish()
    WaitList waiters_;                    // under lock_
    Continuation* continuations_ = nullptr;  // under lock_: fired by publish()
};

// The value's storage: T in an optional, T& as a pointer, nothing for void.
template <class T>
struct FutureValue {
    std::optional<T> value;
    template <class U>
    void set(U&& v) { value.emplace(std::forward<U>(v)); }
    T take() { return std::move(*value); }
};
template <class T>
struct FutureValue<T&> {
    T* value = nullptr;
    void set(T& v) noexcept { value = &v; }
    T& take() noexcept { return *value; }
};
template <>
struct FutureValue<void> {
    void take() noexcept {}
};

template <class T>
struct FutureState : FutureStateBase {
    FutureValue<T> storage;
};

[[noreturn]] inline void throw_future_error(std::future_errc code) {
    throw std::future_error(code);
}

// when_all()'s look at a future's state without consuming it.
struct FutureAccess {
    template <class T>
    static FutureStateBase* state(const Future<T>& f) noexcept { return f.state_.get(); }
};

}  // namespace detail

// The receiving end of a Promise (std::future's members, fiber-aware). Move-only.
template <class T>
class Future {
public:
    // An invalid future (valid() == false).
    Future() noexcept = default;
    Future(Future&&) noexcept = default;
    Future& operator=(Future&&) noexcept = default;
    Future(const Future&) = delete;
    Future& operator=(const Future&) = delete;

    // True while it refers to a shared state: from get_future() (or async()) until get().
    bool valid() const noexcept { return state_ != nullptr; }
    // True when the value or exception is in (get() would not wait). Precondition: valid().
    bool is_ready() const {
        check_valid();
        return state_->ready();
    }
    // Waits until the value is in, then returns it (moved out) or rethrows the exception;
    // valid() is false afterwards. Throws std::future_error(no_state) when !valid().
    T get() {
        check_valid();
        state_->wait();
        std::shared_ptr<detail::FutureState<T>> state = std::move(state_);
        // The exception leaves the state: then the setter, should it drop the state last,
        // does not release the exception object on its thread while this one still uses it
        // (libstdc++'s count on it is invisible to TSan, and the state is single-use anyway).
        if (std::exception_ptr error = state->take_exception()) std::rethrow_exception(std::move(error));
        return state->storage.take();
    }
    // Waits until the value is in. Throws std::future_error(no_state) when !valid().
    void wait() const {
        check_valid();
        state_->wait();
    }
    // Waits until the value is in (ready) or `d` has passed (timeout); never deferred.
    // Throws std::future_error(no_state) when !valid(), std::bad_alloc when a task's timed
    // wait cannot allocate its timer's record (nothing is left waiting then).
    template <class Rep, class Period>
    std::future_status wait_for(const std::chrono::duration<Rep, Period>& d) const {
        check_valid();
        if (state_->ready()) return std::future_status::ready;
        return status(state_->wait_until_steady(detail::deadline_after(d)));
    }
    // The same until the time point `t` (converted to steady_clock once).
    template <class Clock, class Duration>
    std::future_status wait_until(const std::chrono::time_point<Clock, Duration>& t) const {
        check_valid();
        if (state_->ready()) return std::future_status::ready;
        return status(state_->wait_until_steady(detail::to_steady(t)));
    }

private:
    friend class Promise<T>;
    friend class detail::PromiseBase<T>;
    friend struct detail::FutureAccess;

    explicit Future(std::shared_ptr<detail::FutureState<T>> state) noexcept : state_(std::move(state)) {}
    void check_valid() const {
        if (!state_) detail::throw_future_error(std::future_errc::no_state);
    }
    static std::future_status status(bool ready) noexcept {
        return ready ? std::future_status::ready : std::future_status::timeout;
    }

    std::shared_ptr<detail::FutureState<T>> state_;
};

namespace detail {

// What Promise<T>, Promise<T&> and Promise<void> share: the state, get_future(),
// set_exception() and the broken promise.
template <class T>
class PromiseBase {
public:
    PromiseBase() : state_(std::make_shared<FutureState<T>>()) {}
    PromiseBase(PromiseBase&&) noexcept = default;
    PromiseBase& operator=(PromiseBase&& other) noexcept {
        if (this != &other) {
            abandon();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    PromiseBase(const PromiseBase&) = delete;
    PromiseBase& operator=(const PromiseBase&) = delete;
    // A promise destroyed before a value was set delivers std::future_error(broken_promise).
    ~PromiseBase() { abandon(); }

    // The future of this promise; once. Throws std::future_error(future_already_retrieved)
    // the second time, no_state for a moved-from promise.
    Future<T> get_future() {
        check_state();
        if (!state_->retrieve()) throw_future_error(std::future_errc::future_already_retrieved);
        return Future<T>(state_);
    }
    // Stores the exception `error` (not null) and wakes the waiters. Throws
    // std::future_error(promise_already_satisfied) if a value or exception was set already.
    void set_exception(std::exception_ptr error) {
        FIBER_SCHED_ASSERT(error && "Promise::set_exception(): the exception_ptr is null");
        check_state();
        if (!state_->set_exception(std::move(error))) {
            throw_future_error(std::future_errc::promise_already_satisfied);
        }
    }

protected:
    void check_state() const {
        if (!state_) throw_future_error(std::future_errc::no_state);
    }
    // Claims the state, writes the value with `write` and wakes the waiters; a value whose
    // constructor throws leaves the state unset and the exception propagates.
    template <class Write>
    void set_with(Write&& write) {
        check_state();
        if (!state_->claim_set()) throw_future_error(std::future_errc::promise_already_satisfied);
        try {
            write(state_->storage);
        } catch (...) {
            state_->unclaim_set();
            throw;
        }
        state_->publish();
    }

    std::shared_ptr<FutureState<T>> state_;

private:
    void abandon() noexcept {
        // Only when unset (a set_value of this promise cannot be under way: it is ours) and
        // someone can still look (a future was handed out and lives, or a when_all() waits
        // for the state after its future has gone).
        if (state_ && !state_->ready() && (state_.use_count() > 1 || state_->has_continuations())) {
            state_->set_exception(std::make_exception_ptr(std::future_error(std::future_errc::broken_promise)));
        }
        state_.reset();
    }
};

}  // namespace detail

// The sending end (std::promise's members): set_value() or set_exception() once; its
// Future's get() returns or rethrows it. Move-only; a lambda that owns one is a move-only
// callable, which Scheduler::schedule() and Fiber accept.
template <class T>
class Promise : public detail::PromiseBase<T> {
public:
    // Stores `value` and wakes the waiters. Throws std::future_error
    // (promise_already_satisfied) if a value or exception was set already.
    void set_value(const T& value) {
        this->set_with([&](detail::FutureValue<T>& s) { s.set(value); });
    }
    void set_value(T&& value) {
        this->set_with([&](detail::FutureValue<T>& s) { s.set(std::move(value)); });
    }
};
template <class T>
class Promise<T&> : public detail::PromiseBase<T&> {
public:
    // Stores a reference to `value` (which must outlive the get()).
    void set_value(T& value) {
        this->set_with([&](detail::FutureValue<T&>& s) { s.set(value); });
    }
};
template <>
class Promise<void> : public detail::PromiseBase<void> {
public:
    // Makes the future ready.
    void set_value() {
        this->set_with([](detail::FutureValue<void>&) {});
    }
};

// Runs fn(args...) as a task on `scheduler` and returns the future of its result; what fn
// throws comes out of get(). fn and args are moved (or copied) into the task, move-only
// ones too, and are invoked as rvalues, as std::async does. May be called from any thread,
// inside tasks too. The task and its fiber cost what schedule() costs (the closure, holding
// the promise, goes to the heap: one allocation beside the shared state's).
template <class F, class... Args>
auto async(Scheduler& scheduler, F&& fn, Args&&... args) -> Future<std::invoke_result_t<F, Args...>> {
    using R = std::invoke_result_t<F, Args...>;
    Promise<R> promise;
    Future<R> future = promise.get_future();
    scheduler.schedule([promise = std::move(promise), fn = std::decay_t<F>(std::forward<F>(fn)),
                        args = std::make_tuple(std::decay_t<Args>(std::forward<Args>(args))...)]() mutable {
        // Set after the catch block: it has then let go of the exception on this thread
        // before the waiter can take it (libstdc++'s count on it is invisible to TSan).
        std::exception_ptr error;
        try {
            if constexpr (std::is_void_v<R>) {
                std::apply(std::move(fn), std::move(args));
                promise.set_value();
            } else {
                promise.set_value(std::apply(std::move(fn), std::move(args)));
            }
            return;
        } catch (...) {
            error = std::current_exception();
        }
        promise.set_exception(std::move(error));
    });
    return future;
}

namespace detail {

// when_all()'s record, on the heap from the call until the last of its futures is ready:
// one continuation per future, the count of those not fired yet (plus one that when_all()
// holds while it registers, so that none can be last meanwhile), and the result's promise.
// The last to fire settles the result and deletes the record.
class WhenAllJoin {
public:
    explicit WhenAllJoin(std::size_t count) : nodes_(count), left_(count + 1) {}

    Future<void> get_future() { return done_.get_future(); }
    // Makes `state` fire node `i` once ready (now, if it is).
    void watch(std::size_t i, FutureStateBase& state) noexcept {
        Node& node = nodes_[i];
        node.join = this;
        node.fire = &WhenAllJoin::fire;
        if (!state.add_continuation(node)) arrive();
    }
    // One future ready (or when_all()'s own count given back).
    void arrive() noexcept {
        // acq_rel: the last sees every node's `error`, written before each arrival.
        if (left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        // Every copy is let go here, before the result is published: once a waiter has been
        // woken, this thread must not be the one that frees an exception it may still read
        // (a release TSan cannot order: libstdc++'s counts are not instrumented).
        std::exception_ptr first;
        for (Node& node : nodes_) {
            if (!first && node.error) first = std::move(node.error);
            node.error = nullptr;
        }
        if (first) {
            done_.set_exception(std::move(first));
        } else {
            done_.set_value();
        }
        delete this;
    }

private:
    struct Node : FutureStateBase::Continuation {
        WhenAllJoin* join = nullptr;
    };
    static void fire(FutureStateBase::Continuation& c) noexcept { static_cast<Node&>(c).join->arrive(); }

    std::vector<Node> nodes_;
    std::atomic<std::size_t> left_;
    Promise<void> done_;
};

}  // namespace detail

// A Future<void> that becomes ready once every future of [first, last) (Future<T>s, all
// valid) is; it returns at once. Its get() returns, or rethrows the first exception in the
// range's order. The futures are not consumed: each stays valid, and its own get() returns
// its value or rethrows its exception (an exception one of them get()s before all are ready
// is still the one when_all's get() rethrows: it is copied as the future becomes ready).
// The futures need to be alive only during the call; the result is ready even if they are
// destroyed meanwhile (their promises still set them). An empty range gives a ready future.
// Allocates: one record for the call (std::bad_alloc before anything is registered).
template <class It>
Future<void> when_all(It first, It last) {
    std::vector<detail::FutureStateBase*> states;
    for (It it = first; it != last; ++it) {
        detail::FutureStateBase* state = detail::FutureAccess::state(*it);
        FIBER_SCHED_ASSERT(state && "when_all(): a future in the range is not valid");
        states.push_back(state);
    }
    auto* join = new detail::WhenAllJoin(states.size());
    Future<void> result = join->get_future();
    for (std::size_t i = 0; i < states.size(); ++i) join->watch(i, *states[i]);
    join->arrive();  // when_all's own count: from here on `join` may be gone
    return result;
}

}  // namespace fsched
