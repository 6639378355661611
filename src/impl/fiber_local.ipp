// ---------------------------------------------------------------------------
// Implementation: FiberLocal's slots (the design is at the top of fiber_local.hpp).
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_local.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"

namespace fsched {
namespace detail {

void clear_fiber_locals(FiberLocalSlots* slots, bool free_slots) noexcept {
    // A destructor may make values again (a FiberLocal used in another's destructor, which
    // finds these slots): each round destroys what the one before left.
    for (int round = 0; !slots->empty(); ++round) {
        FIBER_SCHED_ASSERT(round < 4 && "FiberLocal: the values' destructors keep making new values (past four rounds)");
        for (std::size_t n = slots->size(); n > 0 && slots->destroy_newest(); --n) {
        }
    }
    if (free_slots) delete slots;
}

FiberLocalSlots& current_fiber_locals() {
    ThreadState* ts = thread_state();
    if (Fiber* fiber = ts->current) {
        FiberLocalSlots*& slots = FiberAccess::locals(*fiber);
        if (!slots) slots = new FiberLocalSlots();
        return *slots;
    }
    if (!ts->fiber_locals) {
        register_thread(ts);  // its exit frees them (stack_overflow.ipp)
        ts->fiber_locals = new FiberLocalSlots();
        // Made after that exit clean-up: the thread's end frees them (not on Windows).
        if (ts->exited) os::arm_thread_end_hook(ts);
    }
    return *ts->fiber_locals;
}

std::uint64_t new_fiber_local_key() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace fsched
