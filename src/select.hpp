// ---------------------------------------------------------------------------
// select() over channel cases (Go's select): Channel<T>::on_receive / on_send,
// select_default, select_timeout.
//
// select(cases...) runs exactly one case and returns its index. It locks every channel of
// its cases (each once, in address order, so two selects over the same channels cannot
// deadlock) and tries the channel cases in a random order: the first that can complete now
// does, so among the ready cases each is chosen with the same chance (detail::select_pick
// is the one source of that choice). A receive case on a closed, drained channel and a send
// case on a closed channel are ready (fn gets std::nullopt / false). If none is ready, the
// default case runs if there is one; else the caller publishes one Waiter per channel case,
// all sharing one WaitState, and parks (a fiber) or blocks (a thread) until the first claim
// of any of them wins the whole select, or the earliest timeout case's deadline passes. A
// notifier claims before it moves a value, and one that fails the claim skips the waiter as
// it skips a timed-out one: a case that lost leaves its channel untouched, and a send case
// that lost keeps its value. Woken, the caller takes the channel locks again to unlink
// every waiter still linked. The winning case's fn runs after every lock is released, in
// the caller. A claim whose value then failed to move (the move threw in the notifier's
// call) wakes the select to start again, as if nothing had been found.
//
// Cost: no allocation of its own. The Waiters, the lock order and the poll order live on
// the caller's stack (select() is a template over its cases). Each case's std::function
// allocates only if its callable does not fit the standard library's small buffer
// (libstdc++: a trivially copyable callable of at most 16 bytes, such as a lambda that
// captures two references). A timed select in a scheduler task that has to wait allocates
// its shared WaitState once (detail::prepare_timed_wait, as every timed wait); one that
// completes at once does not. A value sent into a buffer costs what std::deque costs.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
namespace detail {

// One case of a select() as its non-template part (impl/select.ipp) sees it. A channel case
// names its channel's lock; try_now, enqueue and unlink are called with it held.
class SelectCase {
public:
    enum class Kind : std::uint8_t { Receive, Send, Default, Timeout };

    // Completes the case now if it can (true): `ok` whether a value moved (false: the
    // channel is closed); `wake`: a waiter to wake once every lock is released. Throws what
    // moving the value throws, having moved nothing; `wake` may then name a waiter claimed
    // for it, to be woken all the same (it tries again: Channel::send_ready()).
    virtual bool try_now(bool& ok, Waiter*& wake) = 0;
    // Publishes `w` as this case's waiter on its channel.
    virtual void enqueue(Waiter& w) noexcept = 0;
    // Takes `w` off its channel's list if it is still there.
    virtual void unlink(Waiter& w) noexcept = 0;
    // With no lock held, after the case won: calls its fn with the outcome (`ok` as above).
    virtual void run(bool ok) = 0;

    Kind kind;
    SpinLock* lock = nullptr;  // a channel case's channel lock
    TimePoint deadline{};      // a timeout case's deadline

protected:
    explicit SelectCase(Kind k, SpinLock* l = nullptr) noexcept : kind(k), lock(l) {}
    SelectCase(const SelectCase&) = default;
    SelectCase& operator=(const SelectCase&) = default;
    ~SelectCase() = default;
};

// What select() hands its non-template part: its cases and room for `count` of each.
struct SelectFrame {
    SelectCase* const* cases;
    Waiter* waiters;          // waiters[i]: case i's, if it is a channel case
    std::size_t* order;       // the channel cases' indexes, in the order they are tried
    SpinLock** locks;         // their channels' locks, each once, in address order
    std::size_t count;
};

// Runs one case of `frame` (select() above) and returns its index.
std::size_t run_select(const SelectFrame& frame);

// A number in [0, n), n > 0, uniform: select()'s only source of randomness (a per-thread
// splitmix64; a deterministic simulation can route it through its own generator).
std::size_t select_pick(std::size_t n) noexcept;

}  // namespace detail

// select()'s receive case: Channel<T>::on_receive(fn).
template <class T>
class ReceiveCase final : public detail::SelectCase {
public:
    ReceiveCase(Channel<T>& channel, std::function<void(std::optional<T>)> fn)
        : SelectCase(Kind::Receive, &channel.lock_), channel_(&channel), fn_(std::move(fn)) {}

private:
    bool try_now(bool& ok, detail::Waiter*& wake) override {
        result_.reset();
        ok = channel_->receive_ready(result_, wake);
        return ok || channel_->closed_;
    }
    void enqueue(detail::Waiter& w) noexcept override {
        w.slot = &result_;
        channel_->receivers_.push_back(&w);
    }
    void unlink(detail::Waiter& w) noexcept override {
        if (w.linked) channel_->receivers_.remove(&w);
    }
    void run(bool) override {
        if (fn_) fn_(std::move(result_));
    }

    Channel<T>* channel_;
    std::function<void(std::optional<T>)> fn_;
    std::optional<T> result_;  // where the value arrives (a sender writes it under the lock, once claimed)
};

// select()'s send case: Channel<T>::on_send(value, fn).
template <class T>
class SendCase final : public detail::SelectCase {
public:
    SendCase(Channel<T>& channel, T value, std::function<void(bool)> fn)
        : SelectCase(Kind::Send, &channel.lock_), channel_(&channel), fn_(std::move(fn)), value_(std::move(value)) {}

    // The value to send: still the caller's after a select() in which this case did not
    // send it (another case ran, or the channel was closed); moved from once it was sent.
    T& value() noexcept { return value_; }

private:
    bool try_now(bool& ok, detail::Waiter*& wake) override {
        if (channel_->closed_) {
            ok = false;
            return true;
        }
        ok = channel_->send_ready(value_, wake);
        return ok;
    }
    void enqueue(detail::Waiter& w) noexcept override {
        w.slot = &value_;
        channel_->senders_.push_back(&w);
    }
    void unlink(detail::Waiter& w) noexcept override {
        if (w.linked) channel_->senders_.remove(&w);
    }
    void run(bool ok) override {
        if (fn_) fn_(ok);
    }

    Channel<T>* channel_;
    std::function<void(bool)> fn_;
    T value_;  // a receiver that claimed this case moves it out under the lock
};

// select()'s default case (select_default) and timeout case (select_timeout).
class FallbackCase final : public detail::SelectCase {
public:
    FallbackCase(Kind k, std::function<void()> fn) : SelectCase(k), fn_(std::move(fn)) {}

private:
    bool try_now(bool&, detail::Waiter*&) override { return false; }
    void enqueue(detail::Waiter&) noexcept override {}
    void unlink(detail::Waiter&) noexcept override {}
    void run(bool) override {
        if (fn_) fn_();
    }

    std::function<void()> fn_;
};

// A case that runs when no channel case is ready at once (Go's default). At most one per select.
inline FallbackCase select_default(std::function<void()> fn = {}) {
    return FallbackCase(FallbackCase::Kind::Default, std::move(fn));
}

// A case that runs when no channel case has completed within `d` from now (never earlier).
// With several, the earliest deadline counts; a default case makes them moot.
template <class Rep, class Period>
FallbackCase select_timeout(const std::chrono::duration<Rep, Period>& d, std::function<void()> fn = {}) {
    FallbackCase c(FallbackCase::Kind::Timeout, std::move(fn));
    c.deadline = detail::deadline_after(d);
    return c;
}
// The same with a deadline: runs when no channel case has completed by `t`.
template <class Clock, class Duration>
FallbackCase select_until(const std::chrono::time_point<Clock, Duration>& t, std::function<void()> fn = {}) {
    FallbackCase c(FallbackCase::Kind::Timeout, std::move(fn));
    c.deadline = detail::to_steady(t);
    return c;
}

// Runs exactly one of `cases` (on_receive, on_send, select_default, select_timeout and
// select_until cases, over channels of any types; the same channel may appear in several)
// and returns its index among them: a ready channel case chosen uniformly at random, else
// the default case, else the first channel case to complete or the timeout, whichever comes
// first; with neither default nor timeout it waits for a channel case. The case's fn runs in
// the caller after every channel lock is released; what it throws, select() throws. If a
// blocked sender's value throws on its way into a buffer, select() throws that instead.
template <class... Cases>
std::size_t select(Cases&&... cases) {
    static_assert(sizeof...(Cases) > 0, "select(): give it at least one case");
    static_assert((std::is_base_of<detail::SelectCase, std::remove_cv_t<std::remove_reference_t<Cases>>>::value && ...),
                  "select(): every argument is a case (Channel::on_receive, Channel::on_send, select_default, "
                  "select_timeout, select_until)");
    static_assert((!std::is_const<std::remove_reference_t<Cases>>::value && ...),
                  "select(): a case is used up by the select, so it cannot be const");
    constexpr std::size_t n = sizeof...(Cases);
    detail::SelectCase* const list[n] = {static_cast<detail::SelectCase*>(&cases)...};
    detail::Waiter waiters[n];
    std::size_t order[n];
    detail::SpinLock* locks[n];
    return detail::run_select(detail::SelectFrame{list, waiters, order, locks, n});
}

}  // namespace fsched
