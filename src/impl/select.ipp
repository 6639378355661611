// ---------------------------------------------------------------------------
// Implementation: select()'s non-template part (the design is at the top of select.hpp).
//
// Why a lost case leaves its channel untouched. Every case's Waiter points at the one
// WaitState of the select; claim() is a CAS on it, so exactly one notifier (or the timer,
// or the caller's own timeout) wins, and claim() records which Waiter won. A notifier
// claims before it moves a value, and one that loses treats the waiter as timed out and
// moves nothing. The winner moves the value under that channel's lock, which the select
// takes again (to unlink) before it returns or reads any case. So no value is taken twice,
// lost, or left in a case that did not run. If the winner's move throws, it marks the
// waiter `retry` and the select, woken, starts over.
// ---------------------------------------------------------------------------

#pragma once

#include "select.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

namespace {

constexpr std::size_t no_case = static_cast<std::size_t>(-1);

// The channel locks of one select, each once, in address order: taken in that order and
// released in the reverse one. Released on an exception.
class SelectLocks {
public:
    SelectLocks(SpinLock** locks, std::size_t count) noexcept : locks_(locks), count_(count) {}
    SelectLocks(const SelectLocks&) = delete;
    SelectLocks& operator=(const SelectLocks&) = delete;
    ~SelectLocks() {
        if (held_) unlock();
    }
    void lock() noexcept {
        for (std::size_t i = 0; i < count_; ++i) locks_[i]->lock();
        held_ = true;
    }
    void unlock() noexcept {
        for (std::size_t i = count_; i-- > 0;) locks_[i]->unlock();
        held_ = false;
    }
    // block_all() released them.
    void released() noexcept { held_ = false; }
    SpinLock* const* locks() const noexcept { return locks_; }
    std::size_t count() const noexcept { return count_; }

private:
    SpinLock** locks_;
    std::size_t count_;
    bool held_ = false;
};

// What fiber_report() shows of a parked select (the object of its wait record).
struct SelectWait {
    std::size_t receives = 0;
    std::size_t sends = 0;
};

void describe_select(const void* object, char* out, std::size_t size) noexcept {
    const auto* wait = static_cast<const SelectWait*>(object);
    std::snprintf(out, size, "%zu receive, %zu send cases", wait->receives, wait->sends);
}

constexpr WaitOps select_wait_ops{&describe_select, nullptr};

// splitmix64's state for this thread; 0: not seeded yet.
thread_local std::uint64_t select_rng = 0;

}  // namespace

// Not inlined: a fiber that parks in run_select() may resume on another thread, and must not
// reuse the address of the thread_local it computed before (it draws only before parking).
std::size_t sim_random_below(Simulation& sim, std::size_t n) noexcept;

FIBER_SCHED_NOINLINE std::size_t select_pick(std::size_t n) noexcept {
    // In a simulation, its generator: the seed decides the pick too.
    if (Simulation* sim = thread_state()->simulation) return sim_random_below(*sim, n);
    std::uint64_t& state = select_rng;
    if (state == 0) {
        const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        state = (thread_identity() * 0x9e3779b97f4a7c15ull) ^ now ^ reinterpret_cast<std::uintptr_t>(&state);
        state |= 1;
    }
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    // The modulo's bias is below n / 2^64: nothing a select can show.
    return static_cast<std::size_t>(z % n);
}

std::size_t run_select(const SelectFrame& frame) {
    // Sort the cases out: the channel cases in a random order (Fisher-Yates: the first that
    // can complete is then uniform among those that can), their locks in address order.
    std::size_t channels = 0, default_case = no_case, timeout_case = no_case;
    SelectWait wait;
    for (std::size_t i = 0; i < frame.count; ++i) {
        const SelectCase& c = *frame.cases[i];
        switch (c.kind) {
        case SelectCase::Kind::Receive:
        case SelectCase::Kind::Send:
            (c.kind == SelectCase::Kind::Receive ? wait.receives : wait.sends)++;
            frame.locks[channels] = c.lock;
            frame.order[channels++] = i;
            break;
        case SelectCase::Kind::Default:
            FIBER_SCHED_ASSERT(default_case == no_case && "select(): more than one select_default case");
            default_case = i;
            break;
        case SelectCase::Kind::Timeout:
            if (timeout_case == no_case || c.deadline < frame.cases[timeout_case]->deadline) timeout_case = i;
            break;
        }
    }
    for (std::size_t k = channels; k > 1; --k) std::swap(frame.order[k - 1], frame.order[select_pick(k)]);
    std::sort(frame.locks, frame.locks + channels, std::less<SpinLock*>());
    SelectLocks held(frame.locks, static_cast<std::size_t>(std::unique(frame.locks, frame.locks + channels) - frame.locks));

    const TimePoint* deadline = timeout_case != no_case ? &frame.cases[timeout_case]->deadline : nullptr;
    for (;;) {  // again after a claim whose move threw in the notifier's call
        // The state every case's waiter shares; a timed wait in a task puts it on the heap.
        Waiter self;
        for (bool prepared = deadline == nullptr;; prepared = true) {
            held.lock();
            for (std::size_t k = 0; k < channels; ++k) {
                const std::size_t i = frame.order[k];
                bool ok = false;
                Waiter* wake = nullptr;
                bool done = false;
                try {
                    done = frame.cases[i]->try_now(ok, wake);
                } catch (...) {
                    held.unlock();
                    if (wake) wake_waiter(*wake);  // claimed for the value: it tries again
                    throw;
                }
                if (done) {
                    held.unlock();
                    if (wake) wake_waiter(*wake);
                    frame.cases[i]->run(ok);
                    return i;
                }
            }
            if (default_case != no_case) {
                held.unlock();
                frame.cases[default_case]->run(false);
                return default_case;
            }
            if (prepared) break;
            // Nothing ready: prepare the timed wait with no lock held (it may throw
            // std::bad_alloc: nothing is published yet), then look again.
            held.unlock();
            if (!(clock_now() < *deadline)) {
                give_way_to_one_task();
                frame.cases[timeout_case]->run(false);
                return timeout_case;
            }
            prepare_timed_wait(self);
        }

        for (std::size_t k = 0; k < channels; ++k) {
            const std::size_t i = frame.order[k];
            Waiter& w = frame.waiters[i];
            w.state = self.state;
            w.ok = false;
            w.retry = false;
            frame.cases[i]->enqueue(w);
        }
        note_wait(WaitReason::Select, &wait, &select_wait_ops, deadline);
        const bool claimed = block_all(held.locks(), held.count(), self, deadline);
        held.released();
        // Unlink every waiter still linked (the winner's notifier and those that failed to
        // claim the others took theirs off already); then the winner's fields are final.
        held.lock();
        for (std::size_t k = 0; k < channels; ++k) {
            const std::size_t i = frame.order[k];
            frame.cases[i]->unlink(frame.waiters[i]);
        }
        Waiter* winner = claimed ? self.state->claimed_by : nullptr;
        held.unlock();
        if (!winner) {
            frame.cases[timeout_case]->run(false);
            return timeout_case;
        }
        const auto i = static_cast<std::size_t>(winner - frame.waiters);
        FIBER_SCHED_ASSERT(i < frame.count && "select(): woken by a waiter that is not one of its cases");
        if (winner->retry) continue;
        frame.cases[i]->run(winner->ok);
        return i;
    }
}

}  // namespace detail
}  // namespace fsched
