// ---------------------------------------------------------------------------
// Implementation: the stack pool.
//
// A guarded stack is one mapping of size + one page, the lowest page no-access. A guard
// costs the OS something it has only so much of (on Linux two kernel mappings, of
// vm.max_map_count), so only os::guarded_stack_budget() stacks get one. Past that budget
// stacks are carved without a guard from slabs of 64; neighbouring slabs with equal
// protection merge into one mapping, so 100,000 fibers alive at once cost a few thousand
// mappings. stack_stats() counts both kinds. The memory calls are the OS layer's (os.ipp).
//
// Freed stacks go to a small per-thread cache first (no lock on the create/destroy path),
// then to the global pool, which keeps up to FIBER_SCHED_STACK_POOL_MAX of each size.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

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

    Stack acquire(std::size_t size) {
        std::lock_guard<std::mutex> lock(mutex_);
        SizeClass& cls = size_class(size);
        for (std::vector<Stack>* list : {&cls.guarded, &cls.unguarded}) {
            if (!list->empty()) {
                Stack stack = list->back();
                list->pop_back();
                pooled_.fetch_sub(1, std::memory_order_relaxed);
                return stack;
            }
        }
        if (guarded_.load(std::memory_order_relaxed) < guarded_limit_) {
            Stack stack;
            if (map_guarded(size, stack)) {
                guarded_.fetch_add(1, std::memory_order_relaxed);
                return stack;
            }
        }
        return carve_unguarded(cls);
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

    void release(const Stack& stack) noexcept {
        if (stack.size > reuse_limit) return unmap(stack);
        std::lock_guard<std::mutex> lock(mutex_);
        SizeClass& cls = size_class(stack.size);
        std::vector<Stack>& list = stack.guard ? cls.guarded : cls.unguarded;
        if (list.size() >= FIBER_SCHED_STACK_POOL_MAX) {
            if (stack.guard) return unmap(stack);
            // A carved stack cannot be unmapped without splitting its slab's mapping; give
            // its memory back and keep the address range.
            os::discard_memory(stack.base, stack.size);
        }
        list.push_back(stack);
        pooled_.fetch_add(1, std::memory_order_relaxed);
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
        char* slab_next = nullptr;
        std::size_t slab_left = 0;
    };

    static constexpr std::size_t slab_stacks = 64;

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
        if (FIBER_SCHED_FAULT(stack_map)) return false;
        void* mem = os::map_stack_memory(size + page_);
        if (!mem) return false;
        if (!os::guard_pages(mem, page_)) {
            // The budget is an estimate: the OS may still refuse the guard.
            os::unmap_memory(mem, size + page_);
            return false;
        }
        out.base = static_cast<char*>(mem) + page_;
        out.size = size;
        out.guard = page_;
        return true;
    }

    Stack carve_unguarded(SizeClass& cls) {
        if (cls.slab_left == 0) {
            // Slabs of up to 64 stacks and about 16 MiB; a stack above reuse_limit gets a slab
            // of its own, so that it can be unmapped on release.
            const std::size_t count =
                cls.size > reuse_limit ? 1 : std::max<std::size_t>(1, std::min<std::size_t>(slab_stacks, reuse_limit / cls.size));
            void* mem = FIBER_SCHED_FAULT(stack_map) ? nullptr : os::map_stack_memory(cls.size * count);
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
    std::size_t reserve_;
    std::size_t guarded_limit_;
    std::mutex mutex_;
    std::vector<SizeClass> classes_;
    // Statistics only: nothing synchronises through these counters.
    std::atomic<std::size_t> pooled_{0};
    std::atomic<std::size_t> guarded_{0};
    std::atomic<std::size_t> unguarded_{0};
    std::mutex threads_mutex_;
    std::vector<ThreadState*> threads_;
    long exited_in_use_ = 0;
};

inline StackPool& stack_pool() {
    // Never destroyed: thread-exit flushes and late fiber destructors may still use it.
    static StackPool* pool = new StackPool();
    return *pool;
}

Stack acquire_stack(std::size_t requested) {
    StackPool& pool = stack_pool();
    std::size_t size = pool.usable_size(requested);
    ThreadState* ts = thread_state();
    register_thread(ts);
    if (ts->exited) {  // a thread_local destroyed after our clean-up: no cache any more
        Stack stack = pool.acquire(size);
        pool.count_exited(1);
        return stack;
    }
    for (unsigned i = 0; i < ts->cached_stack_count; ++i) {
        if (ts->cached_stacks[i].size == size) {
            Stack stack = ts->cached_stacks[i];
            ts->cached_stacks[i] = ts->cached_stacks[--ts->cached_stack_count];
            ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            return stack;
        }
    }
    Stack stack = pool.acquire(size);
    ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return stack;
}

void release_stack(Stack& stack) noexcept {
    if (!stack.base) return;
#if defined(FIBER_SCHED_ASAN)
    // Frames abandoned on this stack (a finished or destroyed fiber never unwinds its
    // last frames) leave poisoned redzones that the next owner must not trip over.
    __asan_unpoison_memory_region(stack.base, stack.size);
#endif
    ThreadState* ts = thread_state();
    register_thread(ts);
    if (ts->exited) {
        stack_pool().count_exited(-1);
        stack_pool().release(stack);
    } else {
        ts->stacks_in_use.store(ts->stacks_in_use.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
        if (ts->cached_stack_count < ThreadState::stack_cache_capacity && stack.size <= StackPool::reuse_limit) {
            ts->cached_stacks[ts->cached_stack_count++] = stack;
        } else {
            stack_pool().release(stack);
        }
    }
    stack = Stack{};
}

std::size_t stack_reserve() noexcept { return stack_pool().reserve(); }

}  // namespace detail

StackStats stack_stats() noexcept { return detail::stack_pool().stats(); }

}  // namespace fsched
