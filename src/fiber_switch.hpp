// ---------------------------------------------------------------------------
// Fiber's switch paths, inline: resume() and yield() compile to a handful of stores and one
// call of the switch routine, with no call/return pair around it for the CPU's return
// predictor to get wrong (that costs more than the switch itself).
//
// A fiber is switched in only by run_claimed() and out only by switch_to_resumer().
// run_claimed() keeps the resumer's context in its own frame, so nesting needs no
// bookkeeping: a fiber that resumes another simply is that one's resumer. The state
// becomes Suspended or Term on the resumer's side after the switch back has completed,
// never on the fiber's side: whoever sees Suspended may resume the fiber at once, on any
// thread.
//
// Sanitizers: ASan is told the bounds of the stack we switch to before each switch and
// reports the bounds of the one we came from after it (the resumer may be another thread
// each time); a fiber's last switch passes no fake-stack slot so ASan frees its fake
// frames. TSan gets a fiber context per Fiber; switching to it also orders memory, which
// matches what the switch does.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber.hpp"

namespace fsched {
namespace detail {

// Set once install_stack_overflow_handler() has run; read (relaxed) by resume(), which
// then gives its thread an alternate signal stack. Nothing else synchronises through it.
extern std::atomic<bool> overflow_handler_installed;
void install_altstack(ThreadState* ts) noexcept;
// Re-enqueues a fiber whose resume was deferred while it was still switching out.
void resume_deferred(Fiber& fiber);

}  // namespace detail

FIBER_SCHED_ALWAYS_INLINE inline void Fiber::resume() {
    state_.claim_for_resume();
    run_claimed(false);
}

namespace detail {

#if FIBER_SCHED_SWITCH_EH_STATE
// The resumer's exception state, kept in run_claimed()'s frame while the fiber's is the
// thread's. Field by field, at each field's width: a 16-byte copy of the struct would read
// back two narrower stores made just before and stall store-to-load forwarding (~7 ns).
// Almost always both sides are outside every handler (all four fields zero): then nothing
// is stored, before the switch or after it.
struct EhSwap {
    FIBER_SCHED_ALWAYS_INLINE EhSwap(ThreadState* ts, const EhState& fiber) noexcept
        : eh(FIBER_SCHED_LIKELY(ts->eh != nullptr) ? ts->eh : eh_globals(ts)), resumer_caught(eh->caught), resumer_uncaught(eh->uncaught),
          swapped((reinterpret_cast<std::uintptr_t>(resumer_caught) | resumer_uncaught |
                   reinterpret_cast<std::uintptr_t>(fiber.caught) | fiber.uncaught) != 0) {
        if (FIBER_SCHED_UNLIKELY(swapped)) {
            eh->caught = fiber.caught;
            eh->uncaught = fiber.uncaught;
        }
    }
    // After the switch back. Not swapped: the fiber's state was empty and the resumer's is
    // still the thread's unless the fiber left one there (it switched out inside a handler).
    FIBER_SCHED_ALWAYS_INLINE void back(EhState& fiber) noexcept {
        if (FIBER_SCHED_UNLIKELY(swapped || eh->caught || eh->uncaught)) {
            fiber.caught = eh->caught;
            fiber.uncaught = eh->uncaught;
            eh->caught = resumer_caught;
            eh->uncaught = resumer_uncaught;
        }
    }

    EhState* const eh;
    void* const resumer_caught;
    const unsigned int resumer_uncaught;
    const bool swapped;
};
#endif

}  // namespace detail

FIBER_SCHED_ALWAYS_INLINE inline detail::SwitchOutcome Fiber::run_claimed(bool scheduled) {
    detail::ThreadState* ts = detail::thread_state();
    // Tested first, so that the usual case (no overflow handler) is one not-taken branch.
    if (FIBER_SCHED_UNLIKELY(detail::overflow_handler_installed.load(std::memory_order_relaxed)) &&
        !ts->has_altstack) {
        detail::install_altstack(ts);
    }
    Fiber* resumer = ts->current;
    // Written by the switch routine before anything reads it.
    detail::Context resumer_context{detail::Context::Unset{}};
    resumer_context_ = &resumer_context;
    ts->current = this;
#if FIBER_SCHED_SWITCH_EH_STATE
    detail::EhSwap eh_swap(ts, eh_);
#endif
    if (detail::observing()) detail::observe_switch_in(*this, resumer);
    switch_in(resumer_context);
    // Back on the thread that called resume(): a resumer cannot move while it waits here.
    ts->current = resumer;
#if FIBER_SCHED_SWITCH_EH_STATE
    eh_swap.back(eh_);
#endif
    // Before after_switch_back(), which may let another thread resume it.
    if (detail::observing()) detail::observe_switch_out(*this, resumer);
    return after_switch_back(scheduled);
}

FIBER_SCHED_ALWAYS_INLINE inline void Fiber::switch_in(detail::Context& resumer_context) noexcept {
#if defined(FIBER_SCHED_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stack_.base, stack_.size - top_block_);
#endif
#if defined(FIBER_SCHED_TSAN)
    shadow_.tsan_resumer = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(shadow_.tsan_fiber, 0);
#endif
    detail::switch_context(resumer_context, context_);
#if defined(FIBER_SCHED_ASAN)
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

FIBER_SCHED_ALWAYS_INLINE inline detail::SwitchOutcome Fiber::after_switch_back(bool scheduled) {
    auto after_switch = after_switch_;
    if (FIBER_SCHED_LIKELY(!after_switch && !returned_)) {  // Fiber::yield(), the usual way out
        if (state_.finish_yielded(scheduled)) detail::resume_deferred(*this);
        return detail::SwitchOutcome::Yielded;
    }
    after_switch_ = nullptr;
    if (returned_) {
        std::exception_ptr exception = std::move(exception_);
        exception_ = nullptr;
        state_.finish_returned(scheduled);
        if (exception) std::rethrow_exception(exception);
        return detail::SwitchOutcome::Returned;
    }
    void* after_switch_arg = after_switch_arg_;
    if (!park_stays_running_) state_.finish_parked();
    // From here on another thread may resume, or destroy, this fiber.
    after_switch(this, after_switch_arg);
    return detail::SwitchOutcome::Parked;
}

// User code can name a scheduler's callback fiber only through this pointer: the scheduler
// hands its callback fibers to no one else (its queues, timers and waiters are its own), and
// shared_from_this(), weak_from_this() and current_ptr() all start from a Fiber. So marking
// the fiber here is enough for a worker to know that a shared_ptr or weak_ptr to it may
// exist (the weak count is not public, and weak_from_this() runs none of our code): it
// does not pool it (Worker::run_task), and a fiber no one looked at is pooled as before, at
// the cost of one plain store per call here. Only the running fiber's own code writes it,
// and whoever reads it has resumed the fiber since (the switch orders the two).
inline Fiber* Fiber::current() noexcept {
    Fiber* fiber = detail::thread_state()->current;
    if (fiber) fiber->handed_out_ = true;
    return fiber;
}

namespace detail {
// The fiber running on this thread, for the library's own use: unlike Fiber::current() it
// leaves a callback's fiber poolable, which the library's own looks (a Mutex's owner, an id)
// must, or every task that locks a Mutex would lose its pooled fiber.
inline Fiber* running_fiber() noexcept { return thread_state()->current; }
}  // namespace detail

inline void Fiber::yield() {
    Fiber* self = detail::running_fiber();
    FIBER_SCHED_ASSERT(self && "yield(): called outside a fiber");
    self->switch_to_resumer(false);
}

inline void Fiber::switch_to_resumer(bool terminating) noexcept {
#if defined(FIBER_SCHED_ASAN)
    __sanitizer_start_switch_fiber(terminating ? nullptr : &shadow_.asan_fake_stack,
                                   shadow_.resumer_stack_bottom, shadow_.resumer_stack_size);
#else
    (void)terminating;
#endif
#if defined(FIBER_SCHED_TSAN)
    __tsan_switch_to_fiber(shadow_.tsan_resumer, 0);
#endif
    detail::switch_context(context_, *resumer_context_);
    // Resumed, perhaps by another resumer on another thread.
#if defined(FIBER_SCHED_ASAN)
    __sanitizer_finish_switch_fiber(shadow_.asan_fake_stack, &shadow_.resumer_stack_bottom,
                                    &shadow_.resumer_stack_size);
#endif
}

}  // namespace fsched
