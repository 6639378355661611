// ---------------------------------------------------------------------------
// Implementation: Fiber's life cycle (the switch paths are inline, in fiber_switch.hpp).
// ---------------------------------------------------------------------------

namespace fsched {

const char* backend() noexcept { return detail::backend_name; }

Fiber::Fiber(std::function<void()> fn, std::size_t stack_size)
    : stack_(detail::acquire_stack(stack_size)),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {
    try {
        finish_construction();
    } catch (...) {
        detail::release_stack(stack_);
        throw;
    }
}

Fiber::Fiber(InStackTag, const detail::Stack& stack, std::size_t top_block, detail::TaskFunction&& fn)
    : stack_(stack),
      top_block_(top_block),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {
    finish_construction();  // the stack is freed by make_in_stack if this throws
}

void Fiber::finish_construction() {
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
    detail::release_context(context_);
    if (top_block_ == 0) detail::release_stack(stack_);  // else InStackAllocator frees it, last
}

void Fiber::prepare_context() {
    returned_ = false;
    detail::release_context(context_);
    detail::make_context(context_, stack_.base, stack_.size - top_block_, &Fiber::entry, this);
}

namespace detail {

// A fiber in its own stack's top (make_in_stack): below the backend's slot at the very top,
// the shared_ptr's control block, then the Fiber object, and its frames run below that.
// The deleter only destroys the Fiber; the control block's allocator gives the stack back
// once the last weak_ptr is gone too, after the control block has been destroyed.
struct InStackDeleter {
    void operator()(Fiber* fiber) const noexcept { fiber->~Fiber(); }
};

template <class T>
struct InStackAllocator {
    using value_type = T;
    Stack stack;

    explicit InStackAllocator(const Stack& s) noexcept : stack(s) {}
    template <class U>
    InStackAllocator(const InStackAllocator<U>& other) noexcept : stack(other.stack) {}

    T* allocate(std::size_t n) {
        static_assert(sizeof(T) <= in_stack_control_block && alignof(T) <= in_stack_backend_slot,
                      "the shared_ptr control block fits the room at the stack's top");
        FIBER_SCHED_ASSERT(n == 1 && "InStackAllocator: one control block per stack");
        (void)n;
        return reinterpret_cast<T*>(stack.base + stack.size - in_stack_backend_slot - in_stack_control_block);
    }
    void deallocate(T*, std::size_t) noexcept { release_stack(stack); }

    template <class U>
    bool operator==(const InStackAllocator<U>& other) const noexcept { return stack.base == other.stack.base; }
    template <class U>
    bool operator!=(const InStackAllocator<U>& other) const noexcept { return !(*this == other); }
};

// The room a Fiber takes at the top of its stack, control block included.
constexpr std::size_t in_stack_block =
    (in_stack_backend_slot + in_stack_control_block + sizeof(Fiber) + in_stack_alignment - 1) / in_stack_alignment *
    in_stack_alignment;

Fiber::ptr FiberAccess::make_in_stack(TaskFunction&& fn) {
    Stack stack = acquire_stack(0);
    static_assert(in_stack_block <= 1024 && alignof(Fiber) <= in_stack_alignment,
                  "a Fiber leaves most of its stack's top page to its frames");
    char* const at = stack.base + stack.size - in_stack_block;  // in_stack_alignment-aligned: pages are
    Fiber* fiber;
    try {
        fiber = new (at) Fiber(Fiber::InStackTag{}, stack, in_stack_block, std::move(fn));
    } catch (...) {
        release_stack(stack);
        throw;
    }
    // Neither allocates: the allocator hands out the top of the stack, and cannot fail.
    return Fiber::ptr(fiber, InStackDeleter{}, InStackAllocator<Fiber>(stack));
}

}  // namespace detail

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

void Fiber::reset(std::function<void()> fn) { reset_function(std::move(fn)); }

void Fiber::reset_function(detail::TaskFunction&& fn) {
    State state = this->state();
    FIBER_SCHED_ASSERT(state != State::Running && "reset(): fiber is running");
    FIBER_SCHED_ASSERT(state != State::Suspended &&
                       "reset(): fiber is suspended; only a Ready or Term fiber can be reset");
    FIBER_SCHED_ASSERT(fn && "reset(): the function is empty");
    fn_ = std::move(fn);
    exception_ = nullptr;
    if (state == State::Term) {
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(stack_.base, stack_.size - top_block_);
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
    Fiber* fiber = current();  // marks a callback's fiber as handed out: never pooled
    return fiber ? fiber->weak_from_this().lock() : nullptr;
}

}  // namespace fsched
