// ---------------------------------------------------------------------------
// Implementation: stack overflow reporting (opt-in) and thread exit.
//
// A fiber that runs off its stack touches its guard page and takes SIGSEGV while its
// stack pointer is in that page, so the handler must run on an alternate signal stack,
// and those are per thread: install_stack_overflow_handler() sets one on the calling
// thread, and Fiber::resume() sets one on any other thread the first time it runs a
// fiber there. The handler only reads the faulting thread's current fiber and writes
// with write(2), both async-signal-safe.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

std::atomic<bool> overflow_handler_installed{false};
struct sigaction previous_segv_action;
struct sigaction previous_bus_action;

constexpr std::size_t altstack_bytes = 64 * 1024;

void install_altstack(ThreadState* ts) noexcept {
    ts->has_altstack = true;
    register_thread(ts);  // so the signal stack is freed at thread exit
    stack_t current{};
    if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE) &&
        current.ss_size >= altstack_bytes / 2) {
        return;  // someone (a sanitizer runtime, the application) already gave it one
    }
    void* mem = mmap(nullptr, altstack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return;
    stack_t ss{};
    ss.ss_sp = mem;
    ss.ss_size = altstack_bytes;
    ss.ss_flags = 0;
    if (sigaltstack(&ss, nullptr) != 0) {
        munmap(mem, altstack_bytes);
        return;
    }
    ts->owned_altstack = mem;
    ts->owned_altstack_size = altstack_bytes;
}

inline void write_all(const char* text, std::size_t n) noexcept {
    while (n > 0) {
        ssize_t written = ::write(STDERR_FILENO, text, n);
        if (written <= 0) return;
        text += written;
        n -= static_cast<std::size_t>(written);
    }
}

inline char* append_text(char* out, char* end, const char* text) noexcept {
    while (*text && out < end) *out++ = *text++;
    return out;
}

inline char* append_number(char* out, char* end, std::uint64_t value) noexcept {
    char digits[24];
    int n = 0;
    do {
        digits[n++] = static_cast<char>('0' + value % 10);
        value /= 10;
    } while (value);
    while (n > 0 && out < end) *out++ = digits[--n];
    return out;
}

void pass_to_previous_handler(int sig, siginfo_t* info, void* uctx) noexcept {
    const struct sigaction& previous = sig == SIGBUS ? previous_bus_action : previous_segv_action;
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) previous.sa_sigaction(sig, info, uctx);
        return;
    }
    if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        // Back to the default action: a real fault happens again on return and kills the
        // process as if we had never been here; a signal sent by kill() is re-raised.
        signal(sig, SIG_DFL);
        if (info->si_code <= 0) raise(sig);
        return;
    }
    previous.sa_handler(sig);
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
    Fiber* fiber = thread_state()->current;
    if (fiber) {
        const Stack& stack = FiberAccess::stack(*fiber);
        const char* addr = static_cast<const char*>(info->si_addr);
        if (stack.guard && addr >= stack.base - stack.guard && addr < stack.base) {
            char message[256];
            char* end = message + sizeof(message);
            char* out = append_text(message, end, "fiber_sched: stack overflow in fiber ");
            out = append_number(out, end, fiber->id());
            out = append_text(out, end, ": it ran past its ");
            out = append_number(out, end, stack.size);
            out = append_text(out, end, "-byte stack into the guard page; "
                                        "give it a larger stack_size. Aborting.\n");
            write_all(message, static_cast<std::size_t>(out - message));
            std::abort();
        }
    }
    pass_to_previous_handler(sig, info, uctx);
}

namespace {

// The one thread_local with a destructor: created by register_thread(), it cleans up the
// thread's ThreadState when the thread exits.
struct ThreadExit {
    ~ThreadExit() {
        ThreadState* ts = thread_state();
        stack_pool().unregister_thread(ts);
        for (unsigned i = 0; i < ts->cached_stack_count; ++i) stack_pool().release(ts->cached_stacks[i]);
        ts->cached_stack_count = 0;
        if (ts->owned_altstack) {
            stack_t ss{};
            ss.ss_flags = SS_DISABLE;
            sigaltstack(&ss, nullptr);
            munmap(ts->owned_altstack, ts->owned_altstack_size);
            ts->owned_altstack = nullptr;
        }
        // Stays registered: a thread_local destroyed after this one may still create or
        // destroy fibers, and those are counted in the pool's total (acquire_stack).
        ts->exited = true;
    }
};

}  // namespace

void register_thread(ThreadState* ts) {
    if (ts->registered) return;
    ts->registered = true;
    stack_pool().register_thread(ts);
    static thread_local ThreadExit on_exit;
    (void)&on_exit;
}

std::uint64_t thread_identity() noexcept {
    ThreadState* ts = thread_state();
    if (ts->identity == 0) ts->identity = next_fiber_id.fetch_add(1, std::memory_order_relaxed);
    return ts->identity;
}

}  // namespace detail

void install_stack_overflow_handler() {
    static std::mutex install_mutex;
    std::lock_guard<std::mutex> lock(install_mutex);
    if (detail::overflow_handler_installed.load(std::memory_order_relaxed)) return;
    struct sigaction action {};
    action.sa_sigaction = &detail::on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &detail::previous_segv_action) != 0 ||
        sigaction(SIGBUS, &action, &detail::previous_bus_action) != 0) {
        throw std::system_error(errno, std::generic_category(),
                                "fiber_sched: install_stack_overflow_handler(): sigaction failed");
    }
    detail::install_altstack(detail::thread_state());
    detail::overflow_handler_installed.store(true, std::memory_order_relaxed);
}

}  // namespace fsched
