// ---------------------------------------------------------------------------
// Fiber stacks: mmap'ed, a guard page below, pooled and reused.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {

// Process-wide counts of fiber stacks, for diagnostics and tests.
struct StackStats {
    std::size_t in_use = 0;          // stacks owned by live fibers now
    std::size_t pooled = 0;          // freed stacks kept for reuse (global pool, not thread caches)
    std::size_t discarded = 0;       // of those, stacks whose memory went back to the OS (only
                                     // their address range is kept)
    std::size_t guarded = 0;         // mapped stacks with a guard page, in use or pooled
    std::size_t unguarded = 0;       // stacks carved without a guard page (mapping budget spent)
    std::size_t guarded_limit = 0;   // how many guarded stacks this process may map
};

// A snapshot of the stack counters.
StackStats stack_stats() noexcept;

// Opt-in: installs an alternate signal stack on each thread that runs fibers and a
// SIGSEGV/SIGBUS handler that, when a fiber runs into its guard page, prints the fiber's
// id and stack size and aborts; other faults go to the handler installed before.
// Idempotent; call it once early in main().
void install_stack_overflow_handler();

namespace detail {

// One fiber stack: usable memory [base, base + size), and `guard` bytes of PROT_NONE
// directly below base (0 when the stack was carved without a guard page).
// The largest stack a fiber may ask for: 1 TiB (1 GiB on 32-bit targets); every size
// computation stays far from overflow below it.
constexpr std::size_t max_stack_size = sizeof(std::size_t) >= 8 ? std::size_t{1} << 40 : std::size_t{1} << 30;

struct Stack {
    char* base = nullptr;
    std::size_t size = 0;
    std::size_t guard = 0;
};

// Returns a stack of at least `size` bytes (0: FIBER_SCHED_DEFAULT_STACK_SIZE), rounded up
// to whole pages. Throws std::length_error for a size above max_stack_size, and
// std::bad_alloc when no memory can be mapped.
Stack acquire_stack(std::size_t size);
// Gives a stack back to the pool. The stack's contents are dead.
void release_stack(Stack& stack) noexcept;
// The same with the calling thread's state at hand (a Fiber's constructor and destructor,
// which also list it in the registry: one thread_state() call for both).
struct ThreadState;
Stack acquire_stack(std::size_t size, ThreadState* ts);
void release_stack(Stack& stack, ThreadState* ts) noexcept;
// Bytes of every stack that the context backend keeps for itself, in whole pages (0 for the
// assembly backends; the ucontext one keeps its saved contexts there). acquire_stack() adds
// them to the size asked for.
std::size_t stack_reserve() noexcept;
// True when the pool keeps more stacks of a size than FIBER_SCHED_STACK_POOL_MAX (after a
// burst of fibers); trim_stack_pool() then gives their memory back. An idle scheduler does.
bool stack_pool_has_surplus() noexcept;
void trim_stack_pool() noexcept;
// Gives back the memory of surplus stacks that have sat unused for a trim delay (the pool's
// decay), if a look is due; a busy scheduler's workers call it now and then. Cheap when
// there is no surplus: one relaxed load.
void decay_stack_pool() noexcept;

}  // namespace detail
}  // namespace fsched
