// ---------------------------------------------------------------------------
// Implementation: Fiber's life cycle (the switch paths are inline, in fiber_switch.hpp).
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_switch.hpp"
#include "impl/common.ipp"
#include "impl/registry_slots.ipp"
#include "impl/stack.ipp"
#include "impl/context_backend.ipp"

namespace fsched {

const char* backend() noexcept { return detail::backend_name; }

// One thread_state() call for the stack and the registry. (The stack is made in the member
// initialiser, straight into stack_: copied in afterwards, its 16-byte loads of what
// acquire_stack() had just stored in 8-byte halves stalled store forwarding, +30 %.)
Fiber::Fiber(detail::TaskFunction fn, std::size_t stack_size)
    : Fiber(std::move(fn), stack_size, detail::thread_state()) {}

Fiber::Fiber(detail::TaskFunction&& fn, std::size_t stack_size, detail::ThreadState* ts)
    : stack_(detail::acquire_stack(stack_size, ts)),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {
    try {
        finish_construction(ts);
    } catch (...) {
        detail::release_stack(stack_, ts);
        throw;
    }
}

Fiber::Fiber(InStackTag, const detail::Stack& stack, detail::TaskFunction&& fn) noexcept
    : stack_(stack),
      fn_(std::move(fn)),
      id_(detail::next_fiber_id.fetch_add(1, std::memory_order_relaxed)) {}

void Fiber::finish_construction(detail::ThreadState* ts) {
    FIBER_SCHED_ASSERT(fn_ && "Fiber(): the function is empty");
    prepare_context();
#if defined(FIBER_SCHED_TSAN)
    shadow_.tsan_fiber = __tsan_create_fiber(0);
#endif
    if (detail::observing()) detail::observe_create(*this);
    detail::registry_add(*this, ts);  // last: a report may read it from now on
}

Fiber::~Fiber() {
    FIBER_SCHED_ASSERT(state() != State::Running && "~Fiber(): a running fiber must not be destroyed");
    detail::ThreadState* ts = detail::thread_state();
    detail::registry_remove(*this, ts);  // first: returns once no report reads it
    // Its frames are never unwound: fibers made in them are never destroyed (rare: a walk).
    if (FIBER_SCHED_UNLIKELY(hosts_fibers_) && state() == State::Suspended) {
        const char* lo;
        const char* hi;
        detail::frames_range(stack_.base, stack_.size - top_block_, lo, hi);
        detail::registry_forget_range(lo, hi);
    }
    if (announced_) detail::observe_destroy(*this);
    if (locals_) detail::clear_fiber_locals(locals_, true);  // a fiber destroyed before it returned
#if defined(FIBER_SCHED_TSAN)
    if (shadow_.tsan_fiber) __tsan_destroy_fiber(shadow_.tsan_fiber);  // none if its context failed
#endif
    detail::release_context(context_);
    if (top_block_ == 0) detail::release_stack(stack_, ts);  // else InStackAllocator frees it, last
}

void Fiber::prepare_context() {
    returned_ = false;
    detail::release_context(context_);
    detail::make_context(context_, stack_.base, stack_.size - top_block_, &Fiber::entry, this);
}

namespace detail {

// A fiber in its own stack's top (make_in_stack). From the top down: the backend's record
// (context_stack_record bytes), the Fiber object on a cache line of its own, the shared_ptr's
// control block, then the fiber's frames. The control block's type is the standard
// library's, and its size differs by target (libstdc++ on riscv64 with gcc 12 picks the
// mutex lock policy: 88 bytes instead of 48), so the room is not fixed here: the one place
// that knows the type, InStackAllocator::allocate(), puts the block directly below the
// Fiber, checks at compile time that both leave the top page to the frames, and tells the
// Fiber where its frames start. Its context is made after that (make_in_stack).
// The deleter only destroys the Fiber; the control block's allocator gives the stack back
// once the last weak_ptr is gone too, after the control block has been destroyed.
constexpr std::size_t in_stack_alignment = 64;
// Bytes from the stack's top down to the Fiber object.
constexpr std::size_t in_stack_fiber_offset =
    (context_stack_record + sizeof(Fiber) + in_stack_alignment - 1) / in_stack_alignment * in_stack_alignment;
static_assert(alignof(Fiber) <= in_stack_alignment, "a Fiber in its stack starts a cache line");

inline Fiber* in_stack_fiber(const Stack& stack) noexcept {
    return reinterpret_cast<Fiber*>(stack.base + stack.size - in_stack_fiber_offset);
}

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

    // T is the control block. Directly below the Fiber, whose offset is a multiple of
    // in_stack_alignment and so of alignof(T): sizeof(T) is a multiple of alignof(T).
    T* allocate(std::size_t n) {
        // The block's reference counts change from other threads (a waker copies the
        // fiber's shared_ptr) while the fiber runs: its frames start on the next cache line
        // below, never on the block's own.
        constexpr std::size_t block_at = in_stack_fiber_offset + sizeof(T);
        constexpr std::size_t top_block = (block_at + in_stack_alignment - 1) / in_stack_alignment * in_stack_alignment;
        static_assert(alignof(T) <= in_stack_alignment && top_block <= FiberAccess::in_stack_room,
                      "a Fiber and its shared_ptr control block leave most of the stack's top page to its frames");
        FIBER_SCHED_ASSERT(n == 1 && "InStackAllocator: one control block per stack");
        (void)n;
        FiberAccess::set_top_block(*in_stack_fiber(stack), top_block);
        return reinterpret_cast<T*>(stack.base + stack.size - block_at);
    }
    void deallocate(T*, std::size_t) noexcept { release_stack(stack); }

    template <class U>
    bool operator==(const InStackAllocator<U>& other) const noexcept { return stack.base == other.stack.base; }
    template <class U>
    bool operator!=(const InStackAllocator<U>& other) const noexcept { return !(*this == other); }
};

Fiber::ptr FiberAccess::make_in_stack(TaskFunction&& fn, std::size_t stack_size) {
    // A size past the limit goes as it is (acquire_stack throws std::length_error), not
    // wrapped round by the addition.
    const std::size_t asked = stack_size == 0 || stack_size > max_stack_size ? stack_size : stack_size + in_stack_room;
    ThreadState* ts = thread_state();
    const Stack stack = acquire_stack(asked, ts);
    // Neither throws nor allocates: the Fiber takes the stack and a moved callable,
    // and the allocator hands out the room below the Fiber.
    Fiber* fiber = new (in_stack_fiber(stack)) Fiber(Fiber::InStackTag{}, stack, std::move(fn));
    Fiber::ptr owner(fiber, InStackDeleter{}, InStackAllocator<Fiber>(stack));
    // Now that top_block_ is known. If this throws (an OS fiber that could not be made),
    // `owner` destroys the Fiber and its allocator frees the stack.
    fiber->finish_construction(ts);
    return owner;
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
    // Then its FiberLocal values, still on the fiber (their destructors may wait).
    if (self->locals_) detail::clear_fiber_locals(self->locals_, false);
    self->returned_ = true;
    self->switch_to_resumer(true);
    // No one resumes a returned fiber: resume() asserts on Term, reset() makes a new context.
    std::abort();
}

void Fiber::reset(detail::TaskFunction fn) { reset_function(std::move(fn)); }

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
