// ---------------------------------------------------------------------------
// Implementation: stack overflow reporting (opt-in) and thread exit.
//
// A fiber that runs off its stack touches its guard page and faults (SIGSEGV on POSIX)
// while its stack pointer is in that page, so the handler must run on a stack of its own,
// and those are per thread: install_stack_overflow_handler() sets one on the calling
// thread, and Fiber::resume() sets one on any other thread the first time it runs a fiber
// there. The OS layer (os_posix.ipp) catches the fault and asks report_if_stack_overflow(),
// which only reads the faulting thread's current fiber and writes with os::write_stderr(),
// both async-signal-safe. On Windows (os_win32.ipp) a vectored exception handler asks the
// same, on the faulting stack itself: the guard page there is a PAGE_GUARD page that
// becomes the handler's room once touched, and the winfiber backend's OS-made stacks
// report EXCEPTION_STACK_OVERFLOW, which names the current fiber directly.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/stack.ipp"
#include "impl/os.ipp"

namespace fsched {
namespace detail {

std::atomic<bool> overflow_handler_installed{false};
// install_stack_overflow_handler()'s lock. Function-local, so that another translation
// unit's global constructor finds it built; build_process_state() builds it, with the
// handlers that hold it across fork(), before any thread of the library exists.
std::mutex& overflow_install_mutex() noexcept {
    static std::mutex mutex;
    return mutex;
}

constexpr std::size_t altstack_bytes = 64 * 1024;

void install_altstack(ThreadState* ts) noexcept {
    ts->has_altstack = true;  // tried once per thread, whether or not it worked
    register_thread(ts);  // so the fault stack is freed at thread exit
    if (void* mem = os::install_fault_stack(altstack_bytes)) {
        ts->owned_altstack = mem;
        ts->owned_altstack_size = altstack_bytes;
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

[[noreturn]] void report_overflow(const Fiber& fiber) noexcept {
    char message[256];
    char* end = message + sizeof(message);
    char* out = append_text(message, end, "fiber_sched: stack overflow in fiber ");
    out = append_number(out, end, fiber.id());
    if (const char* name = fiber.name_c_str()) {  // interned: never freed, safe in a signal handler
        out = append_text(out, end, " (");
        out = append_text(out, end, name);
        out = append_text(out, end, ")");
    }
    out = append_text(out, end, ": it ran past its ");
    out = append_number(out, end, fiber.stack_size());
    out = append_text(out, end, "-byte stack into the guard page; "
                                "give it a larger stack_size. Aborting.\n");
    os::write_stderr(message, static_cast<std::size_t>(out - message));
    os::abort_after_report();
}

void report_if_stack_overflow(const void* fault_address) noexcept {
    Fiber* fiber = thread_state()->current;
    if (fiber) {
        const Stack& stack = FiberAccess::stack(*fiber);
        const char* addr = static_cast<const char*>(fault_address);
        if (stack.guard && addr >= stack.base - stack.guard && addr < stack.base) report_overflow(*fiber);
    }
}

#if defined(_WIN32)
void report_overflow_of_current_fiber() noexcept {
    if (Fiber* fiber = thread_state()->current) report_overflow(*fiber);
}
#endif

namespace {

// The one thread_local with a destructor: created by register_thread(), it cleans up the
// thread's ThreadState when the thread exits.
struct ThreadExit {
    ~ThreadExit() {
        ThreadState* ts = thread_state();
        // First: a value's destructor may still use fibers. One that makes a value meanwhile
        // finds these slots and is cleared with them. (A thread_local destroyed after this
        // one that makes a value: clear_late_fiber_locals.)
        if (FiberLocalSlots* locals = ts->fiber_locals) {
            clear_fiber_locals(locals, true);
            ts->fiber_locals = nullptr;
        }
        stack_pool().unregister_thread(ts);
        release_registry_segment(ts);
        for (unsigned i = 0; i < ts->cached_stack_count; ++i) stack_pool().release(ts->cached_stacks[i]);
        ts->cached_stack_count = 0;
        if (ts->owned_altstack) {
            os::remove_fault_stack(ts->owned_altstack, ts->owned_altstack_size);
            ts->owned_altstack = nullptr;
        }
        if (ts->context_exit) {
            ts->context_exit();
            ts->context_exit = nullptr;
        }
        // Stays registered: a thread_local destroyed after this one may still create or
        // destroy fibers, and those are counted in the pool's total (acquire_stack).
        ts->exited = true;
    }
};

}  // namespace

// A thread's FiberLocal values made after its exit clean-up (by a thread_local destroyed
// after ThreadExit, one made before the thread's first use of the library): the OS's
// thread-end hook, armed when they were made (current_fiber_locals), clears them after the
// thread_local destructors. One made meanwhile arms the hook again, and is cleared with them.
void clear_late_fiber_locals(void* state) {
    auto* ts = static_cast<ThreadState*>(state);
    if (FiberLocalSlots* locals = ts->fiber_locals) {
        clear_fiber_locals(locals, true);
        ts->fiber_locals = nullptr;
    }
}

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
    detail::build_process_state();  // the lock's fork handlers, before it is first taken
    std::lock_guard<std::mutex> lock(detail::overflow_install_mutex());
    if (detail::overflow_handler_installed.load(std::memory_order_relaxed)) return;
    detail::os::install_fault_handler();
    detail::install_altstack(detail::thread_state());
    detail::overflow_handler_installed.store(true, std::memory_order_relaxed);
}

}  // namespace fsched
