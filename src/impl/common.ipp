// ---------------------------------------------------------------------------
// Implementation: assertions, the link-time check, per-thread state.
// ---------------------------------------------------------------------------

namespace fsched {

namespace detail {

int define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file() noexcept { return 0; }

void assert_failed(const char* expr, const char* file, int line) noexcept {
    // Every library check reads `cond && "rule"`: print the rule first, where a user looks.
    const char* rule = std::strchr(expr, '"');
    const char* rule_end = rule ? std::strchr(rule + 1, '"') : nullptr;
    if (rule && rule_end) {
        std::fprintf(stderr, "fiber_sched: %.*s\n", static_cast<int>(rule_end - rule - 1), rule + 1);
    }
    std::fprintf(stderr, "fiber_sched: FIBER_SCHED_ASSERT(%s) failed at %s:%d\n", expr, file, line);
    std::fflush(stderr);
    std::abort();
}

__attribute__((noinline)) ThreadState* thread_state() noexcept {
    static thread_local ThreadState state;
    ThreadState* p = &state;
    // The empty asm hides where p came from, so the compiler cannot treat this function
    // as const and reuse one thread's answer after the calling fiber moved to another.
    __asm__ volatile("" : "+r"(p) : : "memory");
    return p;
}

// The implementation's window into Fiber's private state.
struct FiberAccess {
    static const Stack& stack(const Fiber& f) noexcept { return f.stack_; }
};

}  // namespace detail
}  // namespace fsched
