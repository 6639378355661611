// ---------------------------------------------------------------------------
// Implementation: assertions, the link-time check, per-thread state.
// ---------------------------------------------------------------------------

namespace fsched {

namespace detail {

int define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file() noexcept { return 0; }

// Hands out fiber ids (and thread identities); relaxed: only uniqueness matters, and
// fetch_add keeps them increasing.
std::atomic<std::uint64_t> next_fiber_id{1};

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

    static Scheduler* resume_scheduler(const Fiber& f) noexcept { return f.resume_scheduler_; }
    static int resume_thread(const Fiber& f) noexcept { return f.resume_thread_; }

    // Takes a Ready/Suspended fiber for `scheduler` (true), or, when it is still running or
    // switching out, marks it so its resumer re-enqueues it once switched out (false).
    static bool claim_or_defer(Fiber& f, Scheduler& scheduler, int thread) {
        FiberState state = f.state_.load(std::memory_order_acquire);
        for (;;) {
            switch (state) {
            case FiberState::Ready:
            case FiberState::Suspended:
                if (f.state_.compare_exchange_weak(state, FiberState::Running, std::memory_order_acq_rel,
                                                   std::memory_order_acquire)) {
                    f.resume_scheduler_ = &scheduler;
                    f.resume_thread_ = thread;
                    return true;
                }
                break;
            case FiberState::Running:
                // Published by the release half of the exchange below; the resumer reads
                // them after its acq_rel exchange observes RunningResumePending.
                f.resume_scheduler_ = &scheduler;
                f.resume_thread_ = thread;
                if (f.state_.compare_exchange_weak(state, FiberState::RunningResumePending,
                                                   std::memory_order_acq_rel, std::memory_order_acquire)) {
                    return false;
                }
                break;
            case FiberState::RunningResumePending:
                FIBER_SCHED_ASSERT(false && "schedule(): fiber is already scheduled to resume");
                return false;
            case FiberState::Term:
                FIBER_SCHED_ASSERT(false && "schedule(): fiber has terminated");
                return false;
            }
        }
    }

    // A fiber coming back from a park is Suspended and reachable only through the task
    // that woke it: no one can race for it, so a plain store claims it.
    static void claim_woken(Fiber& f) noexcept { f.state_.store(FiberState::Running, std::memory_order_relaxed); }

    static SwitchOutcome run(Fiber& f) { return f.run_claimed(true); }

    // A pooled fiber reused for a new task is a new fiber to its user: it gets a new id.
    static void reuse(Fiber& f, std::function<void()>&& fn) {
        f.reset(std::move(fn));
        f.id_ = next_fiber_id.fetch_add(1, std::memory_order_relaxed);
    }

    // Switches the running fiber out; resume() runs on_parked(fiber, arg) on the resumer's
    // stack once the switch is complete.
    static void park_current(void (*on_parked)(Fiber*, void*), void* arg) noexcept {
        Fiber* self = thread_state()->current;
        self->after_switch_ = on_parked;
        self->after_switch_arg_ = arg;
        self->switch_to_resumer(false);
    }
};

}  // namespace detail
}  // namespace fsched
