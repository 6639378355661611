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
// The round trips of a group are timed in turn, repetition by repetition, so that a slow
// spell of the machine hits them alike (the create rows one after the other).
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
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// Each loop below is a fiber (or context) made in the constructor that yields back at once
// each time it is resumed; operator()(n) makes n round trips; the destructor lets it end.
// `fiber_flags`: the fiber's MXCSR status flags as it starts; the caller's are raised.
// main() times the loops of a group in turn, repetition by repetition (measure_interleaved).

class FschedLoop {
public:
    explicit FschedLoop(FpFlags fiber_flags)
        : fiber_([this, fiber_flags] {
              set_fp_flags(fiber_flags);
              while (!stop_) {
                  ++count_;
                  fsched::Fiber::yield();
              }
          }) {
        set_fp_flags(FpFlags::Raised);
        fiber_.resume();  // the fiber starts: its flags are set from here on
    }
    FschedLoop(const FschedLoop&) = delete;
    FschedLoop& operator=(const FschedLoop&) = delete;
    ~FschedLoop() {
        stop_ = true;
        fiber_.resume();  // lets fn return, so the fiber is Term when destroyed
        sink = count_;
    }
    void operator()(std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) fiber_.resume();
    }

private:
    bool stop_ = false;
    std::uint64_t count_ = 0;
    fsched::Fiber fiber_;
};

#if !defined(_WIN32)
// makecontext() passes only ints to the entry function, so the state travels in a global.
// The contexts are members allocated apart: glibc's riscv64 ucontext_t ends in a
// zero-length array, which -Wpedantic refuses as a member.
class UcontextLoop {
public:
    UcontextLoop() : caller_(new ucontext_t), fiber_(new ucontext_t), stack_(new char[stack_size_64k]) {
        current = this;
        getcontext(fiber_.get());
        fiber_->uc_stack.ss_sp = stack_.get();
        fiber_->uc_stack.ss_size = stack_size_64k;
        fiber_->uc_link = caller_.get();
        makecontext(fiber_.get(), &UcontextLoop::entry, 0);
    }
    UcontextLoop(const UcontextLoop&) = delete;
    UcontextLoop& operator=(const UcontextLoop&) = delete;
    ~UcontextLoop() {
        stop_ = true;
        swapcontext(caller_.get(), fiber_.get());  // returns through uc_link
        sink = count_;
        current = nullptr;
    }
    void operator()(std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) swapcontext(caller_.get(), fiber_.get());
    }

private:
    static UcontextLoop* current;
    static void entry() {
        UcontextLoop& s = *current;
        while (!s.stop_) {
            ++s.count_;
            swapcontext(s.fiber_.get(), s.caller_.get());
        }
    }
    std::unique_ptr<ucontext_t> caller_;
    std::unique_ptr<ucontext_t> fiber_;
    std::unique_ptr<char[]> stack_;
    bool stop_ = false;
    std::uint64_t count_ = 0;
};
UcontextLoop* UcontextLoop::current = nullptr;
#else
// The calling thread as a fiber, for the Win32 rows (converted once, left so).
void* thread_as_fiber() {
    static thread_local void* self = IsThreadAFiber() ? GetCurrentFiber() : ConvertThreadToFiber(nullptr);
    return self;
}

// The Win32 fiber API by hand: the thread is converted once, the fiber switches back.
class Win32Loop {
public:
    Win32Loop() : caller_(thread_as_fiber()) {
        fiber_ = CreateFiberEx(0, stack_size_64k, FIBER_FLAG_FLOAT_SWITCH, &Win32Loop::entry, this);
        if (!fiber_) std::abort();
    }
    Win32Loop(const Win32Loop&) = delete;
    Win32Loop& operator=(const Win32Loop&) = delete;
    ~Win32Loop() {
        stop_ = true;
        SwitchToFiber(fiber_);
        DeleteFiber(fiber_);
        sink = count_;
    }
    void operator()(std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) SwitchToFiber(fiber_);
    }

private:
    static void WINAPI entry(void* arg) {
        auto& s = *static_cast<Win32Loop*>(arg);
        while (!s.stop_) {
            ++s.count_;
            SwitchToFiber(s.caller_);
        }
        SwitchToFiber(s.caller_);  // a fiber's function must not return
    }
    void* caller_;
    void* fiber_ = nullptr;
    bool stop_ = false;
    std::uint64_t count_ = 0;
};
#endif

#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
namespace ctx = boost::context;

// One round trip: this side switches to the fiber with resume(fiber), the fiber back with
// resume(caller); each returns the context that switched back. The two rows differ only in
// `Resume`.
template <class Resume>
class BoostLoop {
public:
    explicit BoostLoop(FpFlags fiber_flags)
        : fiber_{[this, fiber_flags](ctx::fiber&& caller) {
              set_fp_flags(fiber_flags);
              while (!stop_) {
                  ++count_;
                  caller = Resume{}(std::move(caller));
              }
              return std::move(caller);
          }} {
        set_fp_flags(FpFlags::Raised);
        fiber_ = Resume{}(std::move(fiber_));  // the fiber starts: its flags are set from here on
    }
    BoostLoop(const BoostLoop&) = delete;
    BoostLoop& operator=(const BoostLoop&) = delete;
    ~BoostLoop() {
        stop_ = true;
        fiber_ = std::move(fiber_).resume();  // the fiber returns; `fiber_` becomes empty
        sink = count_;
    }
    void operator()(std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) fiber_ = Resume{}(std::move(fiber_));
    }

private:
    bool stop_ = false;
    std::uint64_t count_ = 0;
    ctx::fiber fiber_;
};

struct ResumeInline {
    ctx::fiber operator()(ctx::fiber&& f) const { return std::move(f).resume(); }
};

// With resume() inlined, each loop of BoostLoop is inlined whole around jump_fcontext, so
// no `ret` ever crosses a switch. A call whose `ret` lands after a switch is mispredicted
// (the CPU's return stack holds the other stack's return address). This row calls Boost
// through one function that is not inlined on each side.
__attribute__((noinline)) ctx::fiber resume_out_of_line(ctx::fiber&& fiber) {
    return std::move(fiber).resume();
}
struct ResumeOutOfLine {
    ctx::fiber operator()(ctx::fiber&& f) const { return resume_out_of_line(std::move(f)); }
};
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

    // A group's loops, timed in turn repetition by repetition (measure_interleaved); the
    // selected ones only.
    struct Interleaved {
        std::vector<std::string> names;
        std::vector<bool> ours;
        std::vector<std::function<void(std::uint64_t)>> bodies;
    };
    auto add = [&](Interleaved& g, const char* group, const char* impl, bool ours, auto& loop) {
        if (!opt.selected(std::string(group) + "/" + impl)) return;
        g.names.push_back(impl);
        g.ours.push_back(ours);
        g.bodies.push_back([&loop](std::uint64_t n) { loop(n); });
    };
    auto time_group = [&](Interleaved& g) {
        const std::vector<Result> results = fsched_bench::measure_interleaved(opt, g.bodies);
        for (std::size_t k = 0; k < results.size(); ++k) table.add(g.names[k], results[k], g.ours[k]);
        std::fflush(stdout);
    };

    table.begin_group("round trip (resume + yield), ns per round trip");
    {
        Interleaved g;
        FschedLoop fsched_loop(FpFlags::Raised);
        add(g, "round trip", "fsched::Fiber", true, fsched_loop);
#if defined(_WIN32)
        Win32Loop win32_loop;
        add(g, "round trip", "Win32 SwitchToFiber", false, win32_loop);
#else
        UcontextLoop ucontext_loop;
        add(g, "round trip", "ucontext swapcontext", false, ucontext_loop);
#endif
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
        BoostLoop<ResumeInline> boost_inline(FpFlags::Raised);
        BoostLoop<ResumeOutOfLine> boost_out_of_line(FpFlags::Raised);
        add(g, "round trip", "boost::context::fiber", false, boost_inline);
        add(g, "round trip", "boost fiber, resume() via a call", false, boost_out_of_line);
#endif
        time_group(g);
    }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    table.begin_group("resume + yield, the fiber's FP status flags cleared, the thread's raised, ns per pair");
    {
        Interleaved g;
        FschedLoop fsched_loop(FpFlags::Cleared);
        add(g, "flags differ", "fsched::Fiber", true, fsched_loop);
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
        BoostLoop<ResumeInline> boost_inline(FpFlags::Cleared);
        add(g, "flags differ", "boost::context::fiber", false, boost_inline);
#endif
        time_group(g);
    }
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
