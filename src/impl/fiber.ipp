// ---------------------------------------------------------------------------
// Implementation: Fiber.
//
// A fiber is switched in only by resume() and out only by switch_to_resumer(). resume()
// keeps the resumer's context in its own frame, so nesting needs no bookkeeping: a fiber
// that resumes another simply is that one's resumer. The state becomes Suspended or Term
// on the resumer's side after the switch back has completed, never on the fiber's side:
// whoever sees Suspended may resume the fiber at once, on any thread.
//
// Sanitizers: ASan is told the bounds of the stack we switch to before each switch and
// reports the bounds of the one we came from after it (the resumer may be another thread
// each time); a fiber's last switch passes no fake-stack slot so ASan frees its fake
// frames. TSan gets a fiber context per Fiber; switching to it also orders memory, which
// matches what the switch does.
// ---------------------------------------------------------------------------

namespace fsched {

const char* backend() noexcept { return detail::backend_name; }

Fiber::Fiber(std::function<void()> fn, std::size_t stack_size)
    : stack_(detail::acquire_stack(stack_size)),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {
    FIBER_SCHED_ASSERT(fn_ && "Fiber(): the function is empty");
    prepare_context();
#if defined(FIBER_SCHED_TSAN)
    shadow_.tsan_fiber = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
    FIBER_SCHED_ASSERT(state() != State::Running && "~Fiber(): a running fiber must not be destroyed");
#if defined(FIBER_SCHED_TSAN)
    __tsan_destroy_fiber(shadow_.tsan_fiber);
#endif
    detail::release_stack(stack_);
}

void Fiber::prepare_context() noexcept {
    returned_ = false;
    detail::make_context(context_, stack_.base, stack_.size, &Fiber::entry, this);
}

void Fiber::resume() {
    using detail::FiberState;
    FiberState state = state_.load(std::memory_order_acquire);
    FIBER_SCHED_ASSERT(state != FiberState::Running && state != FiberState::RunningResumePending &&
                       "resume(): fiber is already running");
    FIBER_SCHED_ASSERT(state != FiberState::Term && "resume(): fiber has terminated; reset() it first");
    state_.store(FiberState::Running, std::memory_order_relaxed);
    run_claimed();
}

detail::SwitchOutcome Fiber::run_claimed() {
    using detail::FiberState;
    detail::ThreadState* ts = detail::thread_state();
    if (!ts->has_altstack && detail::overflow_handler_installed.load(std::memory_order_relaxed)) {
        detail::install_altstack(ts);
    }
    Fiber* resumer = ts->current;
    detail::Context resumer_context;
    resumer_context_ = &resumer_context;
    ts->current = this;
#if defined(FIBER_SCHED_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stack_.base, stack_.size);
#endif
#if defined(FIBER_SCHED_TSAN)
    shadow_.tsan_resumer = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(shadow_.tsan_fiber, 0);
#endif
    detail::switch_context(resumer_context, context_);
#if defined(FIBER_SCHED_ASAN)
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    // Back on the thread that called resume(): a resumer cannot move while it waits here.
    ts->current = resumer;
    auto after_switch = after_switch_;
    void* after_switch_arg = after_switch_arg_;
    after_switch_ = nullptr;
    if (returned_) {
        std::exception_ptr exception = std::move(exception_);
        exception_ = nullptr;
        FiberState previous = state_.exchange(FiberState::Term, std::memory_order_acq_rel);
        FIBER_SCHED_ASSERT(previous != FiberState::RunningResumePending &&
                           "schedule(): the fiber returned before the scheduled resume could run");
        if (exception) std::rethrow_exception(exception);
        return detail::SwitchOutcome::Returned;
    }
    if (after_switch) {
        // A parked fiber is reachable only through what its hook publishes, so no
        // claim_or_defer() can race this store (scheduling a parked fiber is misuse).
        state_.store(FiberState::Suspended, std::memory_order_release);
        // From here on another thread may resume, or destroy, this fiber.
        after_switch(this, after_switch_arg);
        return detail::SwitchOutcome::Parked;
    }
    // A fiber that yielded may have been handed to schedule() by its own code first.
    FiberState previous = state_.exchange(FiberState::Suspended, std::memory_order_acq_rel);
    if (previous == FiberState::RunningResumePending) detail::resume_deferred(*this);
    return detail::SwitchOutcome::Yielded;
}

void Fiber::yield() {
    Fiber* self = current();
    FIBER_SCHED_ASSERT(self && "yield(): called outside a fiber");
    self->switch_to_resumer(false);
}

void Fiber::switch_to_resumer(bool terminating) noexcept {
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

void Fiber::entry(void* arg) noexcept {
    auto* self = static_cast<Fiber*>(arg);
#if defined(FIBER_SCHED_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &self->shadow_.resumer_stack_bottom,
                                    &self->shadow_.resumer_stack_size);
#endif
    try {
        self->fn_();
    } catch (...) {
        self->exception_ = std::current_exception();
    }
    // Release what the function captured now, like std::thread does, not at reset().
    self->fn_ = nullptr;
    self->returned_ = true;
    self->switch_to_resumer(true);
    // No one resumes a returned fiber: resume() asserts on Term, reset() makes a new context.
    std::abort();
}

void Fiber::reset(std::function<void()> fn) {
    State state = this->state();
    FIBER_SCHED_ASSERT(state != State::Running && "reset(): fiber is running");
    FIBER_SCHED_ASSERT(state != State::Suspended &&
                       "reset(): fiber is suspended; only a Ready or Term fiber can be reset");
    FIBER_SCHED_ASSERT(fn && "reset(): the function is empty");
    fn_ = std::move(fn);
    exception_ = nullptr;
    if (state == State::Term) {
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(stack_.base, stack_.size);
#endif
        prepare_context();
        state_.store(detail::FiberState::Ready, std::memory_order_relaxed);
    }
}

Fiber* Fiber::current() noexcept { return detail::thread_state()->current; }

Fiber::ptr Fiber::current_ptr() {
    Fiber* fiber = current();
    return fiber ? fiber->weak_from_this().lock() : nullptr;
}

}  // namespace fsched
