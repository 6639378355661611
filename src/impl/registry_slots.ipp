// ---------------------------------------------------------------------------
// Implementation: the fiber registry's slots and the two calls every Fiber makes, inline:
// registry_add() (its creating thread's free list; plain loads and stores) and
// registry_remove() (a plain store, then a look at whether a report is reading). The
// protocol, the segments' life and the report's walk are in registry.ipp.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_switch.hpp"
#include "impl/common.ipp"
#include "impl/context_backend.ipp"

namespace fsched {
namespace detail {

// Plain pointers and sizes, for tools/fiber_sched_gdb.py too (chunks are never freed).
struct RegistryChunk {
    // `slots` is null when there is no memory for them (new (std::nothrow)).
    explicit RegistryChunk(std::size_t n) noexcept : size(n), slots(new (std::nothrow) std::atomic<Fiber*>[n]) {
        if (slots) {
            for (std::size_t i = 0; i < n; ++i) slots[i].store(nullptr, std::memory_order_relaxed);
        }
    }
    RegistryChunk* next = nullptr;  // the older chunk; set before this one is published
    const std::size_t size;
    std::atomic<Fiber*>* const slots;
};

struct RegistrySegment {
    std::atomic<RegistryChunk*> chunks{nullptr};  // newest first; release-published
    std::atomic<bool> reporting{false};           // a report reads this segment's fibers
    RegistrySegment* next = nullptr;              // in the list of all; set before published
    bool owned = false;                           // a thread makes its fibers here (registry mutex)
    // The owner's stack where another thread may get it later (os::reusable_thread_stack;
    // null otherwise): a fork()ed child unlists the fibers made there (registry mutex).
    const char* stack_lo = nullptr;
    const char* stack_hi = nullptr;
    // The owner's only (handed over under the registry mutex):
    std::atomic<Fiber*>* free_head = nullptr;  // the free list (its links: free_link)
    std::size_t capacity = 0;
};

// A free slot's value: the next free slot, tagged so that no one takes it for a fiber.
inline Fiber* free_link(std::atomic<Fiber*>* next) noexcept {
    return reinterpret_cast<Fiber*>(reinterpret_cast<std::uintptr_t>(next) | 1);
}
inline bool is_fiber(const Fiber* value) noexcept { return value && !(reinterpret_cast<std::uintptr_t>(value) & 1); }


// True until the heavy barrier is known to work: then destroyers need no fence.
std::atomic<bool> registry_fences{true};

// The fences of the protocol in registry.ipp's top comment. ThreadSanitizer has no fences (gcc refuses them):
// there the four accesses are seq_cst instead, which orders them the same way.
#if defined(FIBER_SCHED_TSAN)
constexpr std::memory_order registry_order = std::memory_order_seq_cst;
inline void registry_fence() noexcept {}
#else
constexpr std::memory_order registry_order = std::memory_order_relaxed;
inline void registry_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif
// The loads of the protocol: acquire (of a slot: the fiber it lists; of a flag: what the
// report read) where the fences order the rest, seq_cst with them otherwise.
constexpr std::memory_order registry_load_order =
    registry_order == std::memory_order_relaxed ? std::memory_order_acquire : registry_order;


// The ways out of the inline paths below (registry.ipp).
void registry_add_slow(Fiber& f, ThreadState* ts) noexcept;
void wait_for_report(RegistrySegment& seg) noexcept;
// Unlists the fibers whose objects lie in [lo, hi): a Suspended fiber's stack is going
// away with whatever its frames held (registry.ipp).
void registry_forget_range(const char* lo, const char* hi) noexcept;

// Gives `f` the first free slot of `seg` (its owner's thread).
FIBER_SCHED_ALWAYS_INLINE inline void take_slot(Fiber& f, RegistrySegment& seg) noexcept {
    std::atomic<Fiber*>* slot = seg.free_head;
    seg.free_head = reinterpret_cast<std::atomic<Fiber*>*>(
        reinterpret_cast<std::uintptr_t>(slot->load(std::memory_order_relaxed)) & ~std::uintptr_t{1});
    FiberAccess::registry_slot(f) = slot;
    FiberAccess::registry_segment(f) = &seg;
    slot->store(&f, std::memory_order_release);  // the report's acquire sees it whole
}

// Lists `f`, made by this thread. Never fails the creation: without memory it goes unlisted.
// `ts`: this thread's state (the caller has it: one thread_state() call saved).
FIBER_SCHED_ALWAYS_INLINE inline void registry_add(Fiber& f, ThreadState* ts) noexcept {
    if (Fiber* host = ts->current) {
        // Made on the running fiber's stack? (See registry_forget_range.)
        const Stack& stack = FiberAccess::stack(*host);
        if (in_running_frames(&f, stack.base, stack.size)) FiberAccess::hosts_fibers(*host) = true;
    }
    RegistrySegment* seg = ts->registry;  // null after the thread's exit clean-up
    if (FIBER_SCHED_LIKELY(seg && seg->free_head)) {
        take_slot(f, *seg);
    } else {
        registry_add_slow(f, ts);
    }
}

// Unlists `f` (any thread) before it is destroyed; returns once no report reads it. On the
// thread that owns its segment the slot goes straight back on the free list (the common
// case: no sweep needed to find it again); elsewhere it is nulled for the owner's sweep.
// `ts`: this thread's state.
FIBER_SCHED_ALWAYS_INLINE inline void registry_remove(Fiber& f, ThreadState* ts) noexcept {
    std::atomic<Fiber*>* slot = FiberAccess::registry_slot(f);
    if (!slot) return;
    RegistrySegment& seg = *FiberAccess::registry_segment(f);
    if (ts->registry == &seg) {
        slot->store(free_link(seg.free_head), registry_order);
        seg.free_head = slot;
    } else {
        slot->store(nullptr, registry_order);
    }
    if (FIBER_SCHED_UNLIKELY(registry_fences.load(std::memory_order_relaxed))) {
        registry_fence();
    } else {
        std::atomic_signal_fence(std::memory_order_seq_cst);  // the report's barrier does the rest
    }
    if (FIBER_SCHED_UNLIKELY(seg.reporting.load(registry_load_order))) wait_for_report(seg);
}

}  // namespace detail
}  // namespace fsched
