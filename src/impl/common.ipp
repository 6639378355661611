// ---------------------------------------------------------------------------
// Implementation: assertions, the link-time check, per-thread state.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "testing.hpp"

namespace fsched {

namespace detail {

int define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file() noexcept { return 0; }

// Hands out fiber ids (and thread identities); relaxed: only uniqueness matters, and
// fetch_add keeps them increasing.
std::atomic<std::uint64_t> next_fiber_id{1};

#if defined(FIBER_SCHED_FAULT_INJECTION)
namespace {
std::atomic<long> fault_countdown[static_cast<int>(FaultSite::Count)];
std::atomic<bool> assert_throws{false};
}  // namespace

bool fault_hit(FaultSite site) noexcept {
    std::atomic<long>& countdown = fault_countdown[static_cast<int>(site)];
    long n = countdown.load(std::memory_order_relaxed);
    while (n > 1) {
        if (countdown.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) return false;
    }
    return n == 1;  // armed and reached: this hit and every later one fail
}

void inject_fault(FaultSite site, long nth) noexcept {
    fault_countdown[static_cast<int>(site)].store(nth, std::memory_order_relaxed);
}

void set_assert_throws(bool on) noexcept { assert_throws.store(on, std::memory_order_relaxed); }

std::atomic<void (*)(int)> sleep_announce_hook{nullptr};
void set_sleep_announce_hook(void (*hook)(int worker)) noexcept {
    sleep_announce_hook.store(hook, std::memory_order_relaxed);
}
std::atomic<void (*)(int)> sleep_wait_hook{nullptr};
void set_sleep_wait_hook(void (*hook)(int worker)) noexcept { sleep_wait_hook.store(hook, std::memory_order_relaxed); }
#endif

void assert_failed(const char* expr, const char* file, int line) {
    // Every library check reads `cond && "rule"`: print the rule first, where a user looks.
    const char* rule = std::strchr(expr, '"');
    const char* rule_end = rule ? std::strchr(rule + 1, '"') : nullptr;
#if defined(FIBER_SCHED_FAULT_INJECTION)
    if (assert_throws.load(std::memory_order_relaxed)) {
        throw std::logic_error(rule && rule_end ? std::string(rule + 1, rule_end) : std::string(expr));
    }
#endif
    // Inside testing::simulate(): the run fails with this, and explore() reports its seed.
    if (thread_state()->simulation) {
        // One during an unwinding is likely in a noexcept destructor, where the throw
        // ends the process: say what failed first.
        if (std::uncaught_exceptions() > 0 && rule && rule_end) {
            std::fprintf(stderr, "fiber_sched: %.*s (inside testing::simulate(), while an exception unwinds)\n",
                         static_cast<int>(rule_end - rule - 1), rule + 1);
            std::fflush(stderr);
        }
        throw testing::AssertionFailed(std::string("FIBER_SCHED_ASSERT failed: ") +
                                       (rule && rule_end ? std::string(rule + 1, rule_end) : std::string(expr)));
    }
    if (rule && rule_end) {
        std::fprintf(stderr, "fiber_sched: %.*s\n", static_cast<int>(rule_end - rule - 1), rule + 1);
    }
    std::fprintf(stderr, "fiber_sched: FIBER_SCHED_ASSERT(%s) failed at %s:%d\n", expr, file, line);
    std::fflush(stderr);
    std::abort();
}

#if FIBER_SCHED_EMUTLS
// MinGW-w64 g++ keeps thread_local variables in emutls, which frees a thread's variables
// before the thread_local destructors run (both are thread-exit callbacks of winpthreads,
// emutls's registered first): the clean-up in stack_overflow.ipp would find a new, empty
// ThreadState. So the ThreadState lives on the heap, found through a Win32 TLS slot that
// outlives emutls. It is not freed at thread exit (a few hundred bytes per thread that used
// fibers): a thread_local destroyed after the clean-up may still need it.
// Reading the slot is also what makes the switch fast here: an emutls access is a call
// (__emutls_get_address); the slot is one load from the TIB (TlsSlots, gs:0x1480), for the
// first 64 slots, where TlsAlloc() hands out a program's first ones.
inline DWORD thread_state_slot() noexcept {
    static const DWORD slot = TlsAlloc();
    FIBER_SCHED_ASSERT(slot != TLS_OUT_OF_INDEXES && "fiber_sched: no Win32 TLS slot left for the thread state");
    return slot;
}

FIBER_SCHED_NOINLINE ThreadState* thread_state_from_tls_slot() noexcept {
    const DWORD slot = thread_state_slot();
    const DWORD error = GetLastError();  // TlsGetValue() clears it; the caller's stays
    auto* state = static_cast<ThreadState*>(TlsGetValue(slot));
    if (!state) {
        state = new (std::nothrow) ThreadState();
        FIBER_SCHED_ASSERT(state && "fiber_sched: out of memory for a thread's state");
        TlsSetValue(slot, state);
    }
    SetLastError(error);
    return state;
}

FIBER_SCHED_NOINLINE ThreadState* thread_state() noexcept {
    const DWORD slot = thread_state_slot();
    ThreadState* p = nullptr;
    if (slot < 64) {
        // Volatile: the TIB is the running thread's, read anew on every call.
        __asm__ volatile("movq %%gs:0x1480(,%1,8), %0" : "=r"(p) : "r"(static_cast<std::uintptr_t>(slot)));
    }
    if (!p) p = thread_state_from_tls_slot();
    // As below: the compiler must not reuse one thread's answer after a switch.
    __asm__ volatile("" : "+r"(p) : : "memory");
    return p;
}
#else
FIBER_SCHED_NOINLINE ThreadState* thread_state() noexcept {
    static thread_local ThreadState state;
#if defined(_MSC_VER) && !defined(__clang__)
    // No inline assembly: a volatile round trip hides where p came from instead.
    ThreadState* volatile p = &state;
#else
    ThreadState* p = &state;
    // The empty asm hides where p came from, so the compiler cannot treat this function
    // as const and reuse one thread's answer after the calling fiber moved to another.
    __asm__ volatile("" : "+r"(p) : : "memory");
#endif
    return p;
}
#endif

// Builds the library's process-wide objects (the stack pool, the io registry) and registers
// every fork handler, once; before main() and in each Scheduler's constructor, so before
// any thread of the library exists (sched_fork.ipp, where it is defined, says why).
void build_process_state();

}  // namespace detail
}  // namespace fsched

#if FIBER_SCHED_SWITCH_EH_STATE && defined(_LIBCPPABI_VERSION)
// libc++abi (the C++ runtime of macOS, and of clang's -stdlib=libc++ elsewhere) exports
// __cxa_get_globals, but its <cxxabi.h>, unlike libstdc++'s, does not declare it. Declared
// as libc++abi declares it internally, so that a later public declaration still agrees.
namespace __cxxabiv1 {
struct __cxa_eh_globals;
extern "C" __cxa_eh_globals* __cxa_get_globals();
}  // namespace __cxxabiv1
#endif

namespace fsched {
namespace detail {

#if FIBER_SCHED_SWITCH_EH_STATE && FIBER_SCHED_EMUTLS
// MinGW-w64 g++: the runtime's exception state is an emutls variable, and the thread's exit
// frees it (emutls's winpthreads key destructor) before the thread_local destructors run
// (above): one of those that switches fibers would swap the state through a freed block.
// Those destructors run from a winpthreads key of the C++ runtime's too, made when the
// process first registers one; key destructors run in the order the keys were made. So
// this key is made before main() (build_process_state()), and its destructor, before any
// thread_local destructor, marks the thread as exiting: from then on the state is looked up
// at each switch, not kept. (A thread_local with a destructor made in another translation
// unit's global constructor, before the implementation's, comes first: not covered.)
void eh_exit_key_destructor(void* state) {
    auto* ts = static_cast<ThreadState*>(state);
    ts->eh = nullptr;
    ts->eh_exiting = true;
}
// The key, or nullptr when none could be made (then the state is never kept).
const pthread_key_t* eh_exit_key() noexcept {
    static pthread_key_t key;
    static const bool made = pthread_key_create(&key, &eh_exit_key_destructor) == 0;
    return made ? &key : nullptr;
}
#endif

EhState* eh_globals(ThreadState* ts) noexcept {
#if FIBER_SCHED_SWITCH_EH_STATE
    // The runtime's declaration is `const`: calling it after a switch could reuse another
    // thread's answer.
    auto* eh = reinterpret_cast<EhState*>(abi::__cxa_get_globals());
#if FIBER_SCHED_EMUTLS
    const pthread_key_t* key = eh_exit_key();
    if (ts->eh_exiting || !key || pthread_setspecific(*key, ts) != 0) return eh;  // not kept
#endif
    // Its address never changes while the thread runs, so it is looked up once.
    ts->eh = eh;
#else
    ts->eh = nullptr;  // not switched (see FIBER_SCHED_SWITCH_EH_STATE)
#endif
    return ts->eh;
}

// The implementation's window into Fiber's private state.
struct FiberAccess {
    static const Stack& stack(const Fiber& f) noexcept { return f.stack_; }

    static FiberLifecycle& lifecycle(Fiber& f) noexcept { return f.state_; }

    // Fiber::current() showed it to user code, which may keep a shared_ptr or weak_ptr to
    // it (shared_from_this(), weak_from_this(), current_ptr()): a pooled fiber reused for a
    // later task would make that reference lock onto another task's fiber.
    static bool handed_out(const Fiber& f) noexcept { return f.handed_out_; }

    static FiberLocalSlots*& locals(Fiber& f) noexcept { return f.locals_; }
    static const Worker*& last_worker(Fiber& f) noexcept { return f.last_worker_; }

    FIBER_SCHED_ALWAYS_INLINE static SwitchOutcome run(Fiber& f) { return f.run_claimed(true); }

    // A Ready fiber for `fn` that lives at the top of its own stack (fiber.ipp): a parked
    // one costs its touched stack pages and no heap memory. `stack_size` 0: the default
    // size, the Fiber's room taken from it (the size class Fiber() uses); else at least
    // `stack_size` usable bytes (Fiber::stack_size()), the room added (in_stack_room at
    // most). Throws what acquire_stack() throws.
    static Fiber::ptr make_in_stack(TaskFunction&& fn, std::size_t stack_size = 0);
    // The most bytes a Fiber made by make_in_stack and its control block take at the top.
    static constexpr std::size_t in_stack_room = 1024;
    // The bytes at the top of its stack that a Fiber made by make_in_stack lives in, with its
    // control block; its frames run below them. Set before its context is made.
    static void set_top_block(Fiber& f, std::size_t top_block) noexcept { f.top_block_ = top_block; }

    // A pooled fiber reused for a new task is a new fiber to its user: it gets a new id.
    static void reuse(Fiber& f, TaskFunction&& fn) {
        f.reset_function(std::move(fn));
        f.id_.store(next_fiber_id.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
        if (observing()) observe_create(f);
    }
    // A callback's fiber goes back to its worker's pool: to hooks, that fiber is gone.
    static void retire(Fiber& f) noexcept {
        if (f.announced_) observe_destroy(f);
        f.name_.store(nullptr, std::memory_order_relaxed);  // a task's name goes with its task
    }
    static bool& announced(Fiber& f) noexcept { return f.announced_; }
    // How the fiber just switched out, for the trace: read on the resumer's thread before
    // after_switch_back() (which clears after_switch_).
    static const char* switch_out_kind(const Fiber& f) noexcept {
        if (f.returned_) return "returned";
        if (f.after_switch_) return f.park_stays_running_ ? "yielded" : "parked";
        return "suspended";  // Fiber::yield(): back to whoever resumed it
    }
    static void set_task_name(Fiber& f, const char* name) noexcept { f.name_.store(name, std::memory_order_release); }

    // Switches the running fiber out; resume() runs on_parked(fiber, arg) on the resumer's
    // stack once the switch is complete.
    // `stays_running`: the hook queues the fiber to run again at once (this_fiber::yield).
    static void park_current(void (*on_parked)(Fiber*, void*), void* arg, bool stays_running) noexcept {
        park_current(thread_state()->current, on_parked, arg, stays_running);
    }
    // The same for `self`, the running fiber, when the caller has it at hand.
    static void park_current(Fiber* self, void (*on_parked)(Fiber*, void*), void* arg, bool stays_running) noexcept {
        self->after_switch_ = on_parked;
        self->after_switch_arg_ = arg;
        self->park_stays_running_ = stays_running;
        self->switch_to_resumer(false);
        self->wait_.kind.store(WaitReason::None, std::memory_order_relaxed);  // running again
    }

    // The report's window (registry.ipp): what a fiber waits for, its hold, its registry
    // slot, its saved context and the stack's bytes its frames may use.
    static WaitRecord& wait(Fiber& f) noexcept { return f.wait_; }
    static std::atomic<bool>& woken(Fiber& f) noexcept { return f.woken_; }
    static std::atomic<bool>& inspected(Fiber& f) noexcept { return f.inspected_; }
    static std::atomic<Fiber*>*& registry_slot(Fiber& f) noexcept { return f.registry_slot_; }
    static RegistrySegment*& registry_segment(Fiber& f) noexcept { return f.registry_segment_; }
    static bool& hosts_fibers(Fiber& f) noexcept { return f.hosts_fibers_; }
    static const Context& context(const Fiber& f) noexcept { return f.context_; }
    static std::size_t frames_size(const Fiber& f) noexcept { return f.stack_.size - f.top_block_; }
    // A wake-up claimed `f` (claim_woken, seq_cst) while a report reads it: wait until the
    // report lets go, so the fiber neither runs under the report's reads nor is misreported.
    FIBER_SCHED_ALWAYS_INLINE static void wait_while_inspected(Fiber& f) noexcept {
        if (FIBER_SCHED_UNLIKELY(f.inspected_.load(std::memory_order_seq_cst))) wait_for_inspection(f);
    }
    FIBER_SCHED_NOINLINE static void wait_for_inspection(Fiber& f) noexcept {
        while (f.inspected_.load(std::memory_order_acquire)) std::this_thread::yield();
    }
};

}  // namespace detail
}  // namespace fsched
