// ---------------------------------------------------------------------------
// Implementation: Fiber's life cycle (the switch paths are inline, in fiber_switch.hpp).
// ---------------------------------------------------------------------------

namespace fsched {

const char* backend() noexcept { return detail::backend_name; }

Fiber::Fiber(std::function<void()> fn, std::size_t stack_size)
    : stack_(detail::acquire_stack(stack_size)),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {
    FIBER_SCHED_ASSERT(fn_ && "Fiber(): the function is empty");
    try {
        prepare_context();
    } catch (...) {
        detail::release_stack(stack_);
        throw;
    }
#if defined(FIBER_SCHED_TSAN)
    shadow_.tsan_fiber = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
    FIBER_SCHED_ASSERT(state() != State::Running && "~Fiber(): a running fiber must not be destroyed");
#if defined(FIBER_SCHED_TSAN)
    __tsan_destroy_fiber(shadow_.tsan_fiber);
#endif
    detail::release_context(context_);
    detail::release_stack(stack_);
}

void Fiber::prepare_context() {
    returned_ = false;
    detail::release_context(context_);
    detail::make_context(context_, stack_.base, stack_.size, &Fiber::entry, this);
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
#if defined(FIBER_SCHED_TSAN)
        // A finished run's entry frame never returned, so its TSan context still holds that
        // frame: reusing it forever would grow TSan's shadow call stack by a frame or two
        // per run until it overflows (a crash in __tsan_func_entry). A fresh context costs
        // about as much as a thousand switches, so it is renewed every 256 runs.
        if (++shadow_.tsan_runs >= 256) {
            __tsan_destroy_fiber(shadow_.tsan_fiber);
            shadow_.tsan_fiber = __tsan_create_fiber(0);
            shadow_.tsan_runs = 0;
        }
#endif
        prepare_context();
        state_.reset_to_ready();
    }
}

Fiber::ptr Fiber::current_ptr() {
    Fiber* fiber = current();
    return fiber ? fiber->weak_from_this().lock() : nullptr;
}

}  // namespace fsched
