// bench_fiber.cpp — the cost of fsched::Fiber beside its baselines, measured in one run.
//
//   1. round trip: resume + yield of one fiber, ns per round trip.
//      Baselines: POSIX ucontext (swapcontext both ways) and Boost.Context's
//      boost::context::fiber (one resume in each direction), when available: once with
//      the whole loop inlined (Boost's best case) and once through a non-inlined call on
//      each side, as fsched::Fiber::resume() and yield() always are. Both sides have the
//      same MXCSR status flags (each raises the precision flag first), Boost's best case.
//      On x86-64 the round trip again, beside Boost's, with the fiber's flags cleared while
//      the thread's are raised (a fiber made before the thread's first inexact result):
//      Boost.Context loads each side's whole MXCSR at every switch, which an Intel core makes
//      slow whenever the words differ; fiber_sched loads only control bits that differ.
//   2. create + run + destroy with a 64 KiB stack, fn returns at once.
//      Baselines: ucontext on a malloc'd stack; Boost.Context fiber with fixedsize_stack
//      (malloc, no guard), protected_fixedsize_stack (mmap + guard page, like ours) and
//      pooled_fixedsize_stack (a reused pool, like ours), when available.
// On Windows the baselines are the Win32 fiber API itself (SwitchToFiber both ways;
// CreateFiberEx + SwitchToFiber + DeleteFiber), and bench/bench_fiber_windows.sh builds this
// file for both Windows backends (MinGW-w64, run under wine) and prints the ratio.
//
// Usage: bench_fiber [--quick] [--reps N] [--iters N] [--rep-ms MS] [--filter TEXT]
// Results and how to reproduce them: BENCHMARKS.md.
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS declares the (deprecated) ucontext functions only with it
#endif

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_util.hpp"

#if defined(_WIN32)
#include <windows.h>
#else
#include <ucontext.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
#include <boost/context/fiber.hpp>
#include <boost/context/fixedsize_stack.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#endif

namespace {

// The MXCSR status flags (x86-64): Raised sets the precision flag, as the first inexact
// result does; Cleared clears all six. Nothing elsewhere.
enum class FpFlags { Raised, Cleared };
void set_fp_flags(FpFlags flags) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned csr;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    csr = flags == FpFlags::Raised ? (csr | 0x20u) : (csr & ~0x3fu);
    __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#else
    (void)flags;
#endif
}

using fsched_bench::Options;
using fsched_bench::Result;
using fsched_bench::measure;
using fsched_bench::sink;

constexpr std::size_t stack_size_64k = 64 * 1024;

// ---------------------------------------------------------------------------------------
// 1. round trip
// ---------------------------------------------------------------------------------------

// `fiber_flags`: the fiber's status flags as it starts; the caller's are raised.
Result round_trip_fsched(const Options& opt, FpFlags fiber_flags = FpFlags::Raised) {
    bool stop = false;
    std::uint64_t count = 0;
    fsched::Fiber fiber([&] {
        set_fp_flags(fiber_flags);
        while (!stop) {
            ++count;
            fsched::Fiber::yield();
        }
    });
    set_fp_flags(FpFlags::Raised);
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) fiber.resume();
    });
    stop = true;
    fiber.resume();  // lets fn return, so the fiber is Term when destroyed
    sink = count;
    return r;
}

#if !defined(_WIN32)
// makecontext() passes only ints to the entry function, so the state travels in a global.
// The contexts are locals of round_trip_ucontext(): glibc's riscv64 ucontext_t ends in a
// zero-length array, which -Wpedantic refuses as a member.
struct UcontextLoop {
    ucontext_t* caller = nullptr;
    ucontext_t* fiber = nullptr;
    bool stop = false;
    std::uint64_t count = 0;
};
UcontextLoop* g_uc_loop = nullptr;

void ucontext_loop_entry() {
    UcontextLoop& s = *g_uc_loop;
    while (!s.stop) {
        ++s.count;
        swapcontext(s.fiber, s.caller);
    }
    // returning switches to uc_link (the caller)
}

Result round_trip_ucontext(const Options& opt) {
    ucontext_t caller;
    ucontext_t fiber;
    UcontextLoop s;
    s.caller = &caller;
    s.fiber = &fiber;
    g_uc_loop = &s;
    std::unique_ptr<char[]> stack(new char[stack_size_64k]);
    getcontext(&fiber);
    fiber.uc_stack.ss_sp = stack.get();
    fiber.uc_stack.ss_size = stack_size_64k;
    fiber.uc_link = &caller;
    makecontext(&fiber, ucontext_loop_entry, 0);
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) swapcontext(&caller, &fiber);
    });
    s.stop = true;
    swapcontext(&caller, &fiber);
    sink = s.count;
    g_uc_loop = nullptr;
    return r;
}
#else
// The Win32 fiber API by hand: the thread is converted once, the fiber switches back.
struct Win32Loop {
    void* caller = nullptr;
    void* fiber = nullptr;
    bool stop = false;
    std::uint64_t count = 0;
};

void WINAPI win32_loop_entry(void* arg) {
    auto& s = *static_cast<Win32Loop*>(arg);
    while (!s.stop) {
        ++s.count;
        SwitchToFiber(s.caller);
    }
    SwitchToFiber(s.caller);  // a fiber's function must not return
}

// The calling thread as a fiber, for the Win32 rows (converted once, left so).
void* thread_as_fiber() {
    static thread_local void* self = IsThreadAFiber() ? GetCurrentFiber() : ConvertThreadToFiber(nullptr);
    return self;
}

Result round_trip_win32(const Options& opt) {
    Win32Loop s;
    s.caller = thread_as_fiber();
    s.fiber = CreateFiberEx(0, stack_size_64k, FIBER_FLAG_FLOAT_SWITCH, &win32_loop_entry, &s);
    if (!s.fiber) std::abort();
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) SwitchToFiber(s.fiber);
    });
    s.stop = true;
    SwitchToFiber(s.fiber);
    DeleteFiber(s.fiber);
    sink = s.count;
    return r;
}
#endif

#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
namespace ctx = boost::context;

// One round trip: this side switches to the fiber with resume(fiber), the fiber back with
// resume(caller); each returns the context that switched back. The two rows differ only in
// `resume`.
template <class Resume>
Result round_trip_boost(const Options& opt, Resume resume, FpFlags fiber_flags = FpFlags::Raised) {
    bool stop = false;
    std::uint64_t count = 0;
    ctx::fiber fiber{[&](ctx::fiber&& caller) {
        set_fp_flags(fiber_flags);
        while (!stop) {
            ++count;
            caller = resume(std::move(caller));
        }
        return std::move(caller);
    }};
    set_fp_flags(FpFlags::Raised);
    fiber = resume(std::move(fiber));  // the fiber starts: its flags are set from here on
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) fiber = resume(std::move(fiber));
    });
    stop = true;
    fiber = std::move(fiber).resume();  // the fiber returns; `fiber` becomes empty
    sink = count;
    return r;
}

Result round_trip_boost_inline(const Options& opt) {
    return round_trip_boost(opt, [](ctx::fiber&& f) { return std::move(f).resume(); });
}


// With resume() inlined, each loop of round_trip_boost() is inlined whole around
// jump_fcontext, so no `ret` ever crosses a switch.
// fsched::Fiber::resume() and yield() are real calls into the implementation, and a call
// whose `ret` lands after a switch is mispredicted (the CPU's return stack holds the other
// stack's return address). This row calls Boost the same way, through one function that
// is not inlined on each side.
__attribute__((noinline)) ctx::fiber resume_out_of_line(ctx::fiber&& fiber) {
    return std::move(fiber).resume();
}

Result round_trip_boost_out_of_line(const Options& opt) {
    return round_trip_boost(opt, [](ctx::fiber&& f) { return resume_out_of_line(std::move(f)); });
}

Result round_trip_boost_flags_differ(const Options& opt) {
    return round_trip_boost(opt, [](ctx::fiber&& f) { return std::move(f).resume(); }, FpFlags::Cleared);
}
#endif

// ---------------------------------------------------------------------------------------
// 2. create + run + destroy, 64 KiB stack
// ---------------------------------------------------------------------------------------

Result create_fsched(const Options& opt) {
    std::uint64_t count = 0;
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) {
            fsched::Fiber fiber([&count] { ++count; }, stack_size_64k);
            fiber.resume();
        }
    });
    sink = count;
    return r;
}

#if !defined(_WIN32)
std::uint64_t* g_uc_count = nullptr;
void ucontext_count_entry() { ++*g_uc_count; }

Result create_ucontext(const Options& opt) {
    std::uint64_t count = 0;
    g_uc_count = &count;
    ucontext_t caller;
    ucontext_t fiber;
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) {
            void* stack = std::malloc(stack_size_64k);
            if (!stack) std::abort();
            getcontext(&fiber);
            fiber.uc_stack.ss_sp = stack;
            fiber.uc_stack.ss_size = stack_size_64k;
            fiber.uc_link = &caller;
            makecontext(&fiber, ucontext_count_entry, 0);
            swapcontext(&caller, &fiber);
            std::free(stack);
        }
    });
    sink = count;
    g_uc_count = nullptr;
    return r;
}
#else
struct Win32Create {
    void* caller;
    std::uint64_t count;
};

void WINAPI win32_count_entry(void* arg) {
    auto& s = *static_cast<Win32Create*>(arg);
    ++s.count;
    SwitchToFiber(s.caller);
}

Result create_win32(const Options& opt) {
    Win32Create s{thread_as_fiber(), 0};
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) {
            void* fiber = CreateFiberEx(0, stack_size_64k, FIBER_FLAG_FLOAT_SWITCH, &win32_count_entry, &s);
            if (!fiber) std::abort();
            SwitchToFiber(fiber);
            DeleteFiber(fiber);
        }
    });
    sink = s.count;
    return r;
}
#endif

#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
template <class StackAllocator>
Result create_boost(const Options& opt, StackAllocator salloc) {
    std::uint64_t count = 0;
    Result r = measure(opt, [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) {
            // The fiber keeps its own copy of the allocator (it frees the stack with it).
            ctx::fiber fiber{std::allocator_arg, StackAllocator(salloc), [&count](ctx::fiber&& caller) {
                                 ++count;
                                 return std::move(caller);
                             }};
            fiber = std::move(fiber).resume();  // runs to the end; the stack is freed here
        }
    });
    sink = count;
    return r;
}
#endif

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    if (!opt.parse(argc, argv)) return 2;

    const std::string boost =
        fsched_bench::boost_note(FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT, "", "Boost.Context not found, its rows are skipped");
    std::printf("%s%s\n%s; %d repetitions per case, best and median shown\n",
                fsched_bench::build_line("bench_fiber").c_str(), boost.c_str(),
                opt.quick ? "--quick: tiny counts, the numbers are noise" : "full run", opt.reps);

    fsched_bench::Table table;
    auto run = [&](const char* group, const char* impl, bool ours, auto&& fn) {
        const std::string name = std::string(group) + "/" + impl;
        if (!opt.selected(name)) return;
        table.add(impl, fn(opt), ours);
        std::fflush(stdout);
    };

    table.begin_group("round trip (resume + yield), ns per round trip");
    run("round trip", "fsched::Fiber", true, [](const Options& o) { return round_trip_fsched(o); });
#if defined(_WIN32)
    run("round trip", "Win32 SwitchToFiber", false, round_trip_win32);
#else
    run("round trip", "ucontext swapcontext", false, round_trip_ucontext);
#endif
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
    run("round trip", "boost::context::fiber", false, round_trip_boost_inline);
    run("round trip", "boost fiber, resume() via a call", false, round_trip_boost_out_of_line);
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    table.begin_group("resume + yield, the fiber's FP status flags cleared, the thread's raised, ns per pair");
    run("flags differ", "fsched::Fiber", true, [](const Options& o) { return round_trip_fsched(o, FpFlags::Cleared); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
    run("flags differ", "boost::context::fiber", false, round_trip_boost_flags_differ);
#endif
#endif

    table.begin_group("create + run + destroy, 64 KiB stack, ns per fiber");
    run("create", "fsched::Fiber", true, create_fsched);
#if defined(_WIN32)
    run("create", "Win32 CreateFiberEx", false, create_win32);
#else
    run("create", "ucontext + malloc", false, create_ucontext);
#endif
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
    run("create", "boost fixedsize_stack", false,
        [](const Options& o) { return create_boost(o, ctx::fixedsize_stack(stack_size_64k)); });
    run("create", "boost protected_fixedsize", false,
        [](const Options& o) { return create_boost(o, ctx::protected_fixedsize_stack(stack_size_64k)); });
    run("create", "boost pooled_fixedsize", false,
        [](const Options& o) { return create_boost(o, ctx::pooled_fixedsize_stack(stack_size_64k)); });
#endif

    table.print();
    return 0;
}
