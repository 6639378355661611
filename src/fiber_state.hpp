// ---------------------------------------------------------------------------
// A fiber's life cycle: every state and every transition, in one place. Fiber holds one
// FiberLifecycle; the switch paths (fiber_switch.hpp) and the scheduler (impl/sched_*.ipp)
// only call the transitions below, each named after the event that causes it.
//
// Fiber::State is what users see; the scheduler needs three more internal states (drawn in
// docs/diagrams/fiber_states.dot, shown in docs/design.md):
//
//   state                  public     meaning
//   Ready                  Ready      made or reset(), never run since
//   Running                Running    claimed by a resumer: running, switching, or queued to run
//   Suspended              Suspended  left by Fiber::yield(); anyone may resume or schedule it
//   Parked                 Suspended  waits inside a scheduler (sleep, lock, channel, io)
//   Term                   Term       its function returned or threw
//   RunningResumePending   Running    Running, and a schedule() came meanwhile
//   ParkedResumePending    Suspended  Parked, and a schedule() came meanwhile
//
//   transition (who)                                  from -> to
//   claim_for_resume (resume() by hand)               Ready/Suspended -> Running
//   claim_or_defer (a worker runs a schedule() task)  Ready/Suspended -> Running, Claimed
//                                                     Running -> RunningResumePending, Deferred
//                                                     Parked -> ParkedResumePending, Deferred
//                                                     Running, resumed by hand -> unchanged,
//                                                       Busy: queued again once switched out
//   claim_woken (a worker runs a wake-up task)        Parked -> Running
//                                                     ParkedResumePending -> RunningResumePending
//   finish_parked (resumer, switch-out done)          Running -> Parked
//                                                     RunningResumePending -> ParkedResumePending
//   finish_yielded (resumer, switch-out done)         Running -> Suspended
//                                                     RunningResumePending -> Running, true:
//                                                       the resumer queues the deferred resume
//   finish_returned (resumer, switch-out done)        Running -> Term
//   reset_to_ready (Fiber::reset)                     Term -> Ready
//
// this_fiber::yield() parks without leaving Running: the fiber is queued to run again at
// once, still claimed, so neither its switch-out nor its next run needs an atomic
// read-modify-write; a schedule() that finds it there is deferred like one that finds it
// running.
//
// Why it is race-free: only the resumer leaves Running, and only after the switch-out has
// completed, so whoever sees Suspended may resume the fiber at once on any thread. A Parked
// fiber belongs to whatever it waits for: a schedule() that finds it Parked (someone got its
// pointer before its wake-up ran) is deferred, like one that finds it Running, until the
// fiber leaves the scheduler, and then it is resumed exactly once. Leaving Running is an
// acq_rel exchange by the resumer, so a thread that sees Suspended/Term also sees the saved
// context, and a concurrent claim_or_defer() either claims first or is seen by the resumer.
// A fiber resumed by hand is not marked: its resumer leaves Running with a plain store (no
// read-modify-write on the switch path), which would wipe a mark. A worker that finds such
// a fiber Running (Busy) hands its task to a helper task that sleeps until the fiber has
// switched out, then queues it again (Worker::requeue_busy).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"
#include "priority.hpp"

namespace fsched {

class Scheduler;

namespace detail {

// Ready and Suspended come first: resume() claims a fiber with one compare (state <= Suspended).
enum class FiberState : std::uint8_t {
    Ready,
    Suspended,
    Running,
    Term,
    RunningResumePending,
    Parked,
    ParkedResumePending
};

// Where a scheduled fiber runs: its scheduler, the worker it is pinned to (-1: any), and
// at which priority it is queued whenever it is woken or yields.
struct ResumeTarget {
    Scheduler* scheduler = nullptr;
    int worker = -1;
    Priority priority = Priority::Normal;
};

// What claim_or_defer() did.
enum class Claim : std::uint8_t {
    Claimed,   // the fiber is the worker's to run
    Deferred,  // marked: whoever runs it now queues the resume once it has switched out
    Busy       // running by hand (Fiber::resume): the worker must try again later
};

class FiberLifecycle {
public:
    // For Fiber::state() and the misuse checks; acquire: pairs with the transitions' release.
    FiberState load() const noexcept { return state_.load(std::memory_order_acquire); }
    // The report's load after it set a fiber's hold (see claim_woken).
    FiberState load_seq_cst() const noexcept { return state_.load(std::memory_order_seq_cst); }

    // resume() by hand. The caller owns the fiber, so no scheduler can race: a plain store.
    // Not noexcept, like every transition with a misuse check: a user's FIBER_SCHED_ASSERT
    // may throw.
    // Release: a worker that finds the fiber Running sees by_hand_ (see claim_or_defer).
    void claim_for_resume() {
        const FiberState state = load();
        if (FIBER_SCHED_UNLIKELY(state > FiberState::Suspended)) misused_resume(state);
        by_hand_.store(true, std::memory_order_relaxed);
        state_.store(FiberState::Running, std::memory_order_release);
    }

    // A worker takes a schedule()d fiber for `target` (Claimed), or, when it is still running,
    // switching out or parked in a scheduler, marks it so it is re-enqueued once it has left
    // the scheduler (Deferred); or, when it runs by hand, leaves it be (Busy).
    Claim claim_or_defer(ResumeTarget target) {
        FiberState state = load();
        for (;;) {
            switch (state) {
            case FiberState::Ready:
            case FiberState::Suspended:
                if (state_.compare_exchange_weak(state, FiberState::Running, std::memory_order_acq_rel,
                                                 std::memory_order_acquire)) {
                    set_resume(target);
                    // A stale true read by another worker only makes it try again later.
                    by_hand_.store(false, std::memory_order_relaxed);
                    return Claim::Claimed;
                }
                break;
            case FiberState::Running:
                if (by_hand_.load(std::memory_order_relaxed)) return Claim::Busy;
                [[fallthrough]];
            case FiberState::Parked: {
                // Published by the release half of the CAS below; the resumer reads it after
                // its own CAS observes the mark (finish_yielded).
                deferred_scheduler_ = target.scheduler;
                deferred_worker_ = target.worker;
                deferred_priority_ = target.priority;
                const FiberState marked = state == FiberState::Running ? FiberState::RunningResumePending
                                                                       : FiberState::ParkedResumePending;
                if (state_.compare_exchange_weak(state, marked, std::memory_order_acq_rel, std::memory_order_acquire)) {
                    return Claim::Deferred;
                }
                break;
            }
            case FiberState::RunningResumePending:
            case FiberState::ParkedResumePending:
                FIBER_SCHED_ASSERT(false && "schedule(): fiber is already scheduled to resume");
                return Claim::Deferred;
            case FiberState::Term:
                FIBER_SCHED_ASSERT(false && "schedule(): fiber has terminated");
                return Claim::Deferred;
            }
        }
    }

    // Claimed by resume() and not yet switched out (what makes claim_or_defer() say Busy).
    bool running_by_hand() const noexcept {
        return load() == FiberState::Running && by_hand_.load(std::memory_order_relaxed);
    }

    // A fiber's wake-up task runs. Only that task leaves the Parked states, but a schedule()
    // may mark the fiber concurrently, hence the CAS.
    // seq_cst: with a report's seq_cst hold and load (impl/registry.ipp) one of the two sees
    // the other (the same instructions as acq_rel on x86-64 and AArch64).
    void claim_woken() noexcept {
        FiberState state = load();
        for (;;) {
            const FiberState next =
                state == FiberState::ParkedResumePending ? FiberState::RunningResumePending : FiberState::Running;
            if (state_.compare_exchange_weak(state, next, std::memory_order_seq_cst, std::memory_order_acquire)) {
                return;
            }
        }
    }

    // The resumer, once the fiber has switched out to wait. A schedule() that marked the
    // fiber while it ran keeps its mark across the park.
    void finish_parked() noexcept {
        FiberState expected = FiberState::Running;
        if (!state_.compare_exchange_strong(expected, FiberState::Parked, std::memory_order_acq_rel)) {
            state_.store(FiberState::ParkedResumePending, std::memory_order_release);
        }
    }

    // The resumer, once the fiber has switched out through Fiber::yield(). `scheduled`: run
    // by a scheduler, where the fiber's own code may have handed it to schedule() first; the
    // CAS sees that mark or the marker sees Suspended. True when the mark was there: the
    // fiber stays claimed (Running) for the deferred resume, which the caller must queue
    // (take_deferred() says where). Resumed by hand, no scheduler can be racing.
    bool finish_yielded(bool scheduled) noexcept {
        if (!scheduled) {
            state_.store(FiberState::Suspended, std::memory_order_release);
            return false;
        }
        FiberState expected = FiberState::Running;
        if (state_.compare_exchange_strong(expected, FiberState::Suspended, std::memory_order_acq_rel)) return false;
        state_.store(FiberState::Running, std::memory_order_relaxed);
        return true;
    }

    // The resumer, once the fiber's function has returned (or thrown).
    void finish_returned(bool scheduled) {
        if (!scheduled) {
            state_.store(FiberState::Term, std::memory_order_release);
            return;
        }
        const FiberState previous = state_.exchange(FiberState::Term, std::memory_order_acq_rel);
        FIBER_SCHED_ASSERT(previous != FiberState::RunningResumePending &&
                           "schedule(): the fiber returned before the scheduled resume could run");
    }

    // Fiber::reset() of a Term fiber; its owner holds it, nothing races.
    void reset_to_ready() noexcept { state_.store(FiberState::Ready, std::memory_order_relaxed); }

    // The deferred schedule() takes effect: the fiber belongs to that scheduler now.
    ResumeTarget take_deferred() noexcept {
        set_resume(ResumeTarget{deferred_scheduler_, deferred_worker_, deferred_priority_});
        return resume_target();
    }

    // Where the fiber runs while it belongs to a scheduler (set when it was claimed).
    ResumeTarget resume_target() const noexcept {
        return ResumeTarget{resume_scheduler_, resume_worker_, resume_priority_};
    }

    // A parked fiber a failed testing::simulate() run abandoned: it belongs to no scheduler
    // any more, and wake_fiber() drops a wake that still reaches it (simulation.ipp).
    void abandon() noexcept { set_resume(ResumeTarget{nullptr, -1, Priority::Normal}); }

private:
    // resume() of a fiber that is not Ready or Suspended: out of line, off the switch path.
    FIBER_SCHED_NOINLINE FIBER_SCHED_COLD static void misused_resume(FiberState state) {
        FIBER_SCHED_ASSERT(state != FiberState::Running && state != FiberState::RunningResumePending &&
                           "resume(): fiber is already running");
        FIBER_SCHED_ASSERT(state != FiberState::Term && "resume(): fiber has terminated; reset() it first");
        FIBER_SCHED_ASSERT(state != FiberState::Parked && state != FiberState::ParkedResumePending &&
                           "resume(): fiber is parked in a scheduler; it runs again when its wait ends");
        (void)state;
    }

    void set_resume(ResumeTarget target) noexcept {
        resume_scheduler_ = target.scheduler;
        resume_worker_ = target.worker;
        resume_priority_ = target.priority;
    }

    // Written before the state change that publishes them (see claim_or_defer). Two
    // ResumeTargets side by side, unpacked so that their padding does not grow every Fiber.
    Scheduler* resume_scheduler_ = nullptr;
    Scheduler* deferred_scheduler_ = nullptr;  // where a deferred schedule() wants it to go
    int resume_worker_ = -1;
    int deferred_worker_ = -1;
    std::atomic<FiberState> state_{FiberState::Ready};
    Priority resume_priority_ = Priority::Normal;    // beside state_, in what was padding
    Priority deferred_priority_ = Priority::Normal;
    // Claimed by resume() (true) or by a worker (false) when last claimed; read by a worker
    // that finds the fiber Running. Padding too.
    std::atomic<bool> by_hand_{false};
};

}  // namespace detail
}  // namespace fsched
