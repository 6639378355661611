// ---------------------------------------------------------------------------
// Implementation: the stack pool.
//
// A guarded stack is one mapping of size + os::guard_size() (one page on POSIX), the guard
// below the stack faulting when touched; on Windows only its top is committed at first, the
// rest as it grows (os_win32.ipp), and a pooled stack keeps what it committed, as a pooled
// stack keeps its touched pages on POSIX (trim() gives the surplus back whole). A guard
// costs the OS something it has only so much of (on Linux two kernel mappings, of
// vm.max_map_count), so only os::guarded_stack_budget() stacks get one. Past that budget
// stacks are carved without a guard from slabs of 64; neighbouring slabs with equal
// protection merge into one mapping, so 100,000 fibers alive at once cost a few thousand
// mappings. stack_stats() counts both kinds. The memory calls are the OS layer's (os.ipp).
//
// Freed stacks go to a small per-thread cache first (no lock on the create/destroy path),
// then to the global pool, which keeps up to FIBER_SCHED_STACK_POOL_MAX of each size.
// ---------------------------------------------------------------------------

#pragma once

#include "stack.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"
#include "impl/context_backend.ipp"

namespace fsched {
namespace detail {

// How long surplus stacks sit unused before their memory goes back: an idle scheduler's
// wait (sched_run_loop.ipp), or the pool's decay (StackPool::decay_locked).
// FIBER_SCHED_STACK_TRIM_MS; tests change it. Relaxed: a setting.
std::atomic<long> stack_trim_delay_ms{FIBER_SCHED_STACK_TRIM_MS};
#if defined(FIBER_SCHED_FAULT_INJECTION)
void set_stack_trim_delay(std::chrono::milliseconds delay) noexcept {
    stack_trim_delay_ms.store(static_cast<long>(delay.count()), std::memory_order_relaxed);
}
#endif

// What acquire_stack() throws when the kernel refuses the memory (the address space limit,
// RLIMIT_AS, or the mapping count is reached).
class StackMapFailed : public std::bad_alloc {
public:
    const char* what() const noexcept override { return "fiber_sched: cannot map memory for a fiber stack"; }
};

class StackPool;
inline StackPool& stack_pool();  // the one pool, below

class StackPool {
public:
    StackPool()
        : page_(os::page_size()),
          guard_(os::guard_size()),
          reserve_((context_stack_reserve + page_ - 1) / page_ * page_),
          guarded_limit_(compute_guarded_limit()) {
        // fork(): the child gets one thread, the one that forked. These handlers hold the
        // pool's locks across the fork, so the child never inherits one held by a thread
        // that does not exist there, and the child forgets the other threads' records.
        os::at_fork([] { stack_pool().lock_for_fork(); }, [] { stack_pool().unlock_after_fork(false); },
                    [] { stack_pool().unlock_after_fork(true); });
    }

    std::size_t usable_size(std::size_t requested) const {
        std::size_t size = requested ? requested : static_cast<std::size_t>(FIBER_SCHED_DEFAULT_STACK_SIZE);
        if (size > max_stack_size) {
            throw std::length_error("fiber_sched: Fiber(): stack_size is above the limit (fsched::detail::max_stack_size)");
        }
        size = std::max(size, 4 * page_);
        // What the context backend keeps on every stack comes on top of what was asked for,
        // so the fiber keeps all of that (Fiber::stack_size() leaves it out).
        return (size + page_ - 1) / page_ * page_ + reserve_;  // no overflow: size <= max_stack_size
    }

    // context_stack_reserve in whole pages.
    std::size_t reserve() const noexcept { return reserve_; }

    void lock_for_fork() noexcept {
        mutex_.lock();
        threads_mutex_.lock();
    }

    void unlock_after_fork(bool in_child) noexcept {
        if (in_child) {
            ThreadState* self = thread_state();
            for (ThreadState* ts : threads_) {
                if (ts != self) exited_in_use_ += ts->stacks_in_use.load(std::memory_order_relaxed);
            }
            threads_.erase(std::remove_if(threads_.begin(), threads_.end(), [self](ThreadState* ts) { return ts != self; }),
                           threads_.end());
        }
        threads_mutex_.unlock();
        mutex_.unlock();
    }

    // Stacks acquired (+1) or released (-1) by a thread whose exit clean-up has run (a
    // thread_local destroyed after ours): counted here, where stats() finds them.
    void count_exited(long delta) noexcept {
        std::lock_guard<std::mutex> lock(threads_mutex_);
        exited_in_use_ += delta;
    }

    // A stack of `size` bytes; with `extra`, also up to `extra_count` more pooled ones of
    // that size for the calling thread's cache, under the same lock. Returns how many extra
    // it took. Throws std::bad_alloc when no memory can be mapped.
    Stack acquire(std::size_t size, Stack* extra = nullptr, unsigned extra_count = 0, unsigned* taken = nullptr) {
        std::lock_guard<std::mutex> lock(mutex_);
        SizeClass& cls = size_class(size);
        Stack stack;
        if (!take_pooled(cls, stack)) {
            if (guarded_.load(std::memory_order_relaxed) < guarded_limit_ && map_guarded(size, stack)) {
                guarded_.fetch_add(1, std::memory_order_relaxed);
            } else {
                stack = carve_unguarded(cls);
            }
        }
        unsigned n = 0;
        while (n < extra_count && take_pooled(cls, extra[n])) ++n;
        if (taken) *taken = n;
        return stack;
    }

    // Stacks above this many bytes are not kept for reuse: they go back to the kernel at once
    // (a cached 1 TiB stack would hold that much address space, and RLIMIT_AS, forever).
    // Unguarded ones that large were carved from a slab of their own (carve_unguarded).
    static constexpr std::size_t reuse_limit = 16u << 20;

    void unmap(const Stack& stack) noexcept {
        // Exactly the range mapped: a guarded stack's own mapping, or a slab of one stack.
        os::unmap_memory(stack.base - stack.guard, stack.size + stack.guard);
        (stack.guard ? guarded_ : unguarded_).fetch_sub(1, std::memory_order_relaxed);
    }

    // Takes back `count` stacks, all at most reuse_limit bytes, under one lock. They are kept
    // for reuse, beyond FIBER_SCHED_STACK_POOL_MAX of a size too: giving memory back costs a
    // system call and, on a multi-core machine, a TLB shootdown (an interrupt to every other
    // core running this process) per stack, so a burst of fibers ending at once would pay
    // one per fiber, and the next burst a page fault per fiber to take the memory again.
    // What is kept beyond the cap goes back in trim(), which an idle scheduler calls, or
    // here once it has sat unused for a whole trim delay (decay_locked: no scheduler idles).
    void release(const Stack* stacks, unsigned count) noexcept {
        std::lock_guard<std::mutex> lock(mutex_);
        std::int64_t now = 0;  // read once, if a size is over the cap
        for (unsigned i = 0; i < count; ++i) {
            const Stack& stack = stacks[i];
            SizeClass& cls = size_class(stack.size);
            std::vector<Stack>& list = stack.guard ? cls.guarded : cls.unguarded;
            list.push_back(stack);
            pooled_.fetch_add(1, std::memory_order_relaxed);
            if (held(cls) > FIBER_SCHED_STACK_POOL_MAX) {
                surplus_.store(true, std::memory_order_relaxed);
                if (now == 0) now = std::chrono::steady_clock::now().time_since_epoch().count();
                decay_locked(cls, now);
            }
        }
    }

    void release(const Stack& stack) noexcept {
        if (stack.size > reuse_limit) return unmap(stack);
        release(&stack, 1);
    }

    // True when stacks beyond FIBER_SCHED_STACK_POOL_MAX of a size are kept (a hint).
    bool has_surplus() const noexcept { return surplus_.load(std::memory_order_relaxed); }

    // The decay without a release (decay_stack_pool): stacks freed into a thread's cache
    // never reach release(), so a busy scheduler looks now and then, at most once a quarter
    // of a trim delay, for each size over the cap. Clears the surplus hint once none is.
    void decay() noexcept {
        const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
        if (now < next_decay_.load(std::memory_order_relaxed)) return;
        std::lock_guard<std::mutex> lock(mutex_);
        if (now < next_decay_.load(std::memory_order_relaxed)) return;  // another thread looked
        next_decay_.store(now + delay_ticks() / 4, std::memory_order_relaxed);
        bool over = false;
        for (SizeClass& cls : classes_) {
            if (held(cls) <= FIBER_SCHED_STACK_POOL_MAX) continue;
            decay_locked(cls, now);
            over = over || held(cls) > FIBER_SCHED_STACK_POOL_MAX;
        }
        if (!over) surplus_.store(false, std::memory_order_relaxed);
    }

    // Gives back the memory of the stacks kept beyond FIBER_SCHED_STACK_POOL_MAX of each
    // size: guarded ones are unmapped; carved ones keep their address range (a slab cannot
    // be split) and lose their pages.
    void trim() noexcept {
        std::lock_guard<std::mutex> lock(mutex_);
        surplus_.store(false, std::memory_order_relaxed);
        for (SizeClass& cls : classes_) trim_locked(cls, FIBER_SCHED_STACK_POOL_MAX);
    }

    void register_thread(ThreadState* ts) {
        std::lock_guard<std::mutex> lock(threads_mutex_);
        threads_.push_back(ts);
    }

    // Folds an exiting thread's count into the total of exited threads.
    void unregister_thread(ThreadState* ts) noexcept {
        std::lock_guard<std::mutex> lock(threads_mutex_);
        exited_in_use_ += ts->stacks_in_use.load(std::memory_order_relaxed);
        threads_.erase(std::find(threads_.begin(), threads_.end(), ts));
    }

    StackStats stats() noexcept {
        StackStats s;
        long in_use = 0;
        {
            std::lock_guard<std::mutex> lock(threads_mutex_);
            in_use = exited_in_use_;
            for (ThreadState* ts : threads_) in_use += ts->stacks_in_use.load(std::memory_order_relaxed);
        }
        s.in_use = in_use > 0 ? static_cast<std::size_t>(in_use) : 0;
        s.pooled = pooled_.load(std::memory_order_relaxed);
        s.discarded = discarded_.load(std::memory_order_relaxed);
        s.guarded = guarded_.load(std::memory_order_relaxed);
        s.unguarded = unguarded_.load(std::memory_order_relaxed);
        s.guarded_limit = guarded_limit_;
        return s;
    }

private:
    struct SizeClass {
        std::size_t size = 0;
        std::vector<Stack> guarded;
        std::vector<Stack> unguarded;
        std::vector<Stack> discarded;  // carved stacks whose pages went back (trim)
        char* slab_next = nullptr;
        std::size_t slab_left = 0;
        // The decay (decay_locked): since `period_start` (steady_clock ticks), the pool held
        // at least `low_water` of these stacks with their memory at every moment: so many sat
        // unused all that time. 0 before the first period: nothing is known to be unused.
        std::int64_t period_start = 0;
        std::size_t low_water = 0;
    };

    // The trim delay in steady_clock ticks.
    static std::int64_t delay_ticks() noexcept {
        return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::milliseconds(stack_trim_delay_ms.load(std::memory_order_relaxed)))
            .count();
    }

    // Pooled stacks of `cls` that hold their memory.
    static std::size_t held(const SizeClass& cls) noexcept { return cls.guarded.size() + cls.unguarded.size(); }

    // Under mutex_, `cls` over the cap: once a trim delay has passed since the period began,
    // the stacks that sat unused throughout it (low_water), beyond the cap, go back, the
    // oldest first; a new period begins. A burst that takes the pool's stacks again within
    // the delay (skynet, run after run) keeps them all: no system call, no page fault.
    void decay_locked(SizeClass& cls, std::int64_t now) noexcept {
        if (now - cls.period_start < delay_ticks()) return;
        const std::size_t cap = FIBER_SCHED_STACK_POOL_MAX;
        const std::size_t unused = std::min(cls.low_water, held(cls));
        if (unused > cap) trim_locked(cls, held(cls) - (unused - cap));
        cls.period_start = now;
        cls.low_water = held(cls);
    }

    static constexpr std::size_t slab_stacks = 64;

    // Takes a pooled stack of `cls`: guarded first, then carved ones with their pages, then
    // carved ones whose pages were given back (they fault in again).
    bool take_pooled(SizeClass& cls, Stack& out) noexcept {
        for (std::vector<Stack>* list : {&cls.guarded, &cls.unguarded, &cls.discarded}) {
            if (!list->empty()) {
                out = list->back();
                list->pop_back();
                pooled_.fetch_sub(1, std::memory_order_relaxed);
                if (list == &cls.discarded) discarded_.fetch_sub(1, std::memory_order_relaxed);
                cls.low_water = std::min(cls.low_water, held(cls));
                return true;
            }
        }
        return false;
    }

    // Under mutex_: gives back the memory of all but `keep` of the stacks of `cls` that hold
    // it. The oldest stacks (the front) go: the back ones are the warmest.
    void trim_locked(SizeClass& cls, std::size_t keep) noexcept {
        // Guarded stacks are kept first (they detect overflow); carved ones fill the rest.
        const std::size_t keep_guarded = std::min(cls.guarded.size(), keep);
        const std::size_t keep_unguarded = std::min(cls.unguarded.size(), keep - keep_guarded);
        if (cls.guarded.size() > keep_guarded) {
            const std::size_t excess = cls.guarded.size() - keep_guarded;
            for (std::size_t i = 0; i < excess; ++i) unmap(cls.guarded[i]);
            cls.guarded.erase(cls.guarded.begin(), cls.guarded.begin() + static_cast<std::ptrdiff_t>(excess));
            pooled_.fetch_sub(excess, std::memory_order_relaxed);
        }
        if (cls.unguarded.size() > keep_unguarded) {
            const std::size_t excess = cls.unguarded.size() - keep_unguarded;
            std::size_t kept = 0;
            try {
                cls.discarded.reserve(cls.discarded.size() + excess);
                kept = excess;
            } catch (...) {
                // No room to remember them: their address ranges stay mapped, unused, like
                // a slab's unused rest; nothing else is lost.
            }
            for (std::size_t i = 0; i < excess; ++i) {
                os::discard_memory(cls.unguarded[i].base, cls.unguarded[i].size);
                if (i < kept) cls.discarded.push_back(cls.unguarded[i]);  // reserved: no throw
            }
            discarded_.fetch_add(kept, std::memory_order_relaxed);
            cls.unguarded.erase(cls.unguarded.begin(), cls.unguarded.begin() + static_cast<std::ptrdiff_t>(excess));
            pooled_.fetch_sub(excess - kept, std::memory_order_relaxed);
        }
        cls.low_water = std::min(cls.low_water, held(cls));
    }

    static std::size_t compute_guarded_limit() noexcept {
        if (FIBER_SCHED_GUARDED_STACK_LIMIT != 0) return FIBER_SCHED_GUARDED_STACK_LIMIT;
        return os::guarded_stack_budget();
    }

    SizeClass& size_class(std::size_t size) {
        for (SizeClass& cls : classes_) {
            if (cls.size == size) return cls;
        }
        classes_.emplace_back();
        classes_.back().size = size;
        return classes_.back();
    }

    bool map_guarded(std::size_t size, Stack& out) noexcept {
        if (FIBER_SCHED_FAULT(StackMap)) return false;
        // The budget is an estimate: the OS may still refuse the guard.
        void* mem = os::map_guarded_stack(size + guard_, guard_);
        if (!mem) return false;
        out.base = static_cast<char*>(mem) + guard_;
        out.size = size;
        out.guard = guard_;
        return true;
    }

    Stack carve_unguarded(SizeClass& cls) {
        if (cls.slab_left == 0) {
            // Slabs of up to 64 stacks and about 16 MiB; a stack above reuse_limit gets a slab
            // of its own, so that it can be unmapped on release.
            const std::size_t count =
                cls.size > reuse_limit ? 1 : std::max<std::size_t>(1, std::min<std::size_t>(slab_stacks, reuse_limit / cls.size));
            void* mem = FIBER_SCHED_FAULT(StackMap) ? nullptr : os::map_stack_memory(cls.size * count);
            if (!mem) throw StackMapFailed();
            cls.slab_next = static_cast<char*>(mem);
            cls.slab_left = count;
        }
        Stack stack;
        stack.base = cls.slab_next;
        stack.size = cls.size;
        stack.guard = 0;
        cls.slab_next += cls.size;
        --cls.slab_left;
        unguarded_.fetch_add(1, std::memory_order_relaxed);
        return stack;
    }

    std::size_t page_;
    std::size_t guard_;  // bytes below a guarded stack: os::guard_size()
    std::size_t reserve_;
    std::size_t guarded_limit_;
    std::mutex mutex_;
    std::vector<SizeClass> classes_;
    // Statistics only: nothing synchronises through these counters.
    std::atomic<std::size_t> pooled_{0};
    std::atomic<std::size_t> guarded_{0};
    std::atomic<std::size_t> unguarded_{0};
    std::atomic<std::size_t> discarded_{0};
    // Set when a size holds more than FIBER_SCHED_STACK_POOL_MAX stacks, cleared by trim();
    // relaxed: only a hint that an idle scheduler should call trim().
    std::atomic<bool> surplus_{false};
    std::atomic<std::int64_t> next_decay_{0};  // steady_clock ticks: decay()'s next look
    std::mutex threads_mutex_;
    std::vector<ThreadState*> threads_;
    long exited_in_use_ = 0;
};

inline StackPool& stack_pool() {
    // Never destroyed: thread-exit flushes and late fiber destructors may still use it.
    // Built by build_process_state() before any thread of the library exists (a fork()
    // while a thread is inside this initialiser leaves its guard taken in the child).
    static StackPool* pool = new StackPool();
    return *pool;
}

Stack acquire_stack(std::size_t requested) { return acquire_stack(requested, thread_state()); }

Stack acquire_stack(std::size_t requested, ThreadState* ts) {
    StackPool& pool = stack_pool();
    std::size_t size = pool.usable_size(requested);
    register_thread(ts);
    if (ts->exited) {  // a thread_local destroyed after our clean-up: no cache any more
        Stack stack = pool.acquire(size);
        pool.count_exited(1);
        return stack;
    }
    // The most recently freed first: its pages are the likeliest to be in the caches.
    for (unsigned i = ts->cached_stack_count; i-- > 0;) {
        if (ts->cached_stacks[i].size == size) {
            Stack stack = ts->cached_stacks[i];
            ts->cached_stacks[i] = ts->cached_stacks[--ts->cached_stack_count];
            ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            return stack;
        }
    }
    // A miss refills the cache with more of this size under the same lock, so a thread
    // making many fibers takes the pool's lock once per few of them, not once each.
    unsigned taken = 0;
    const unsigned room = ThreadState::stack_cache_capacity - ts->cached_stack_count;
    Stack stack = size <= StackPool::reuse_limit
                      ? pool.acquire(size, ts->cached_stacks + ts->cached_stack_count,
                                     std::min(room, ThreadState::stack_cache_capacity / 2), &taken)
                      : pool.acquire(size);
    ts->cached_stack_count += taken;
    ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return stack;
}

void release_stack(Stack& stack) noexcept {
    if (stack.base) release_stack(stack, thread_state());
}

void release_stack(Stack& stack, ThreadState* ts) noexcept {
    if (!stack.base) return;
#if defined(FIBER_SCHED_ASAN)
    // Frames abandoned on this stack (a finished or destroyed fiber never unwinds its
    // last frames) leave poisoned redzones that the next owner must not trip over.
    __asan_unpoison_memory_region(stack.base, stack.size);
#endif
    register_thread(ts);
    if (ts->exited) {
        stack_pool().count_exited(-1);
        stack_pool().release(stack);
    } else {
        ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
        if (stack.size > StackPool::reuse_limit) {
            stack_pool().release(stack);
        } else {
            if (ts->cached_stack_count == ThreadState::stack_cache_capacity) {
                // Full: the older half goes to the pool in one locked call.
                constexpr unsigned half = ThreadState::stack_cache_capacity / 2;
                stack_pool().release(ts->cached_stacks, half);
                for (unsigned i = half; i < ThreadState::stack_cache_capacity; ++i) {
                    ts->cached_stacks[i - half] = ts->cached_stacks[i];
                }
                ts->cached_stack_count -= half;
            }
            ts->cached_stacks[ts->cached_stack_count++] = stack;
        }
    }
    stack = Stack{};
}

std::size_t stack_reserve() noexcept { return stack_pool().reserve(); }
bool stack_pool_has_surplus() noexcept { return stack_pool().has_surplus(); }
void trim_stack_pool() noexcept { stack_pool().trim(); }
void decay_stack_pool() noexcept {
    StackPool& pool = stack_pool();
    if (pool.has_surplus()) pool.decay();
}

}  // namespace detail

StackStats stack_stats() noexcept { return detail::stack_pool().stats(); }

}  // namespace fsched
