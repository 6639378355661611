// bench_sync.cpp — fiber_sched's synchronisation primitives beside their baselines,
// measured in one run.
//
//   1. mutex: N fibers (4, 16) each lock / increment / unlock one shared counter through
//      std::lock_guard<fsched::Mutex>; ns per lock + unlock. On a Scheduler(2, false), with
//      baselines Boost.Fiber's boost::fibers::mutex with the same fibers on the
//      work_stealing algorithm on 2 threads, and std::mutex between 2 plain threads (for
//      scale); once more with the fibers pinned alternately to worker 0 and 1
//      (schedule(fn, i % 2)), so that both workers keep contending (unpinned, the fibers
//      may all end up on one worker). On a Scheduler(1, false), with Boost.Fiber's default
//      round_robin on 1 thread. On one thread a fiber never loses the CPU while it holds
//      the lock, so those rows measure the uncontended path; the "hand-off" rows yield
//      inside the critical section instead, so that every unlock hands the lock to a
//      parked waiter.
//   2. channel: two fibers bounce a value back and forth over two Channel<int>; ns per
//      one-way message. Unbuffered (capacity 0) against boost::fibers::unbuffered_channel,
//      and capacity 1 against boost::fibers::buffered_channel(2): Boost's capacity must be
//      a power of two >= 2, and its ring keeps one slot free, so capacity 2 holds one
//      value, like ours. On Scheduler(1, false) against round_robin, on Scheduler(2, false)
//      against work_stealing on 2 threads. Go's channels (the unbuffered one is the peer to
//      beat) on GOMAXPROCS=1 and 2, when the build made the Go twins (bench/go/channel.go,
//      FIBER_SCHED_BENCH_GO_TWINS): the same ping-pong between two goroutines, timed by the
//      twins with timed()'s calibration and repetitions.
//   3. memory per parked fiber: 100,000 tasks on a Scheduler(2, false), default stack
//      size, each parked in WaitGroup::wait() on one gate; resident memory (VmRSS) before
//      and after, KiB per parked fiber; then the gate opens and every task must finish.
//      Baseline: 100,000 Boost.Fiber fibers (default fixedsize_stack, round_robin on one
//      thread) blocked on a boost::fibers::condition_variable. Each side runs in its own
//      process (this program re-executed with --memory-child), so they share no memory.
//      Besides the total it shows where the memory goes: page tables (VmPTE), bytes the
//      allocator hands out (mallinfo2), and stack pages touched per fiber (mincore() on a
//      sample of the parked fibers' stacks).
//
// Boost.Fiber rows are compiled in when CMake found Boost's fiber component
// (FIBER_SCHED_BENCH_HAVE_BOOST_FIBER). Its work_stealing algorithm registers its threads
// in statics that can be set up once per process and not torn down safely, so every
// work_stealing case runs in one forked child process (the parent has no other threads
// when it forks); the round_robin cases run on a fresh thread of this process.
//
// Below the table, a "spread" list names every case whose slowest timed repetition took
// over twice its best: contended cases can switch between two very different regimes.
//
// Usage: bench_sync [--quick] [--reps N] [--iters N] [--rep-ms MS] [--filter TEXT] [--fibers N]
//   --fibers N   fibers to park in the memory benchmark (default 100000; --quick: 2000)
//   Defaults here: --reps 9 and --rep-ms 30 (24 timed cases; a full run takes about 9 s).
// Results and how to reproduce them: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_util.hpp"

#include <sys/mman.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/context/stack_traits.hpp>
#include <boost/fiber/algo/work_stealing.hpp>
#include <boost/fiber/buffered_channel.hpp>
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/fiber.hpp>
#include <boost/fiber/mutex.hpp>
#include <boost/fiber/operations.hpp>
#include <boost/fiber/unbuffered_channel.hpp>
#endif

namespace {

using fsched_bench::Options;
using fsched_bench::Result;
using fsched_bench::sink;
using fsched_bench::Timing;
using fsched_bench::timed;
using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "bench_sync: %s\n", what);
    std::exit(1);
}

// Splits n operations among `parts` workers: part i does share(n, parts, i).
std::uint64_t share(std::uint64_t n, std::uint64_t parts, std::uint64_t i) {
    return n / parts + (i < n % parts ? 1 : 0);
}

// ---------------------------------------------------------------------------------------
// 1. mutex
// ---------------------------------------------------------------------------------------

// `yield_inside`: yield while holding the lock, so that every unlock has a waiter.
// `pinned`: fiber i runs on worker i % threads only, so that every worker keeps contending.
Timing mutex_fsched(const Options& opt, std::size_t threads, int fibers, bool yield_inside, bool pinned = false) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    fsched::Mutex mutex;
    std::uint64_t counter = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        counter = 0;
        fsched::WaitGroup done(fibers);
        for (int i = 0; i < fibers; ++i) {
            const std::uint64_t ops = share(n, static_cast<std::uint64_t>(fibers), static_cast<std::uint64_t>(i));
            sched.schedule([&, ops] {
                for (std::uint64_t k = 0; k < ops; ++k) {
                    std::lock_guard<fsched::Mutex> lock(mutex);
                    ++counter;
                    if (yield_inside) fsched::this_fiber::yield();
                }
                done.done();
            }, pinned ? i % static_cast<int>(threads) : -1);
        }
        done.wait();
        if (counter != n) fail("fsched::Mutex lost an increment");
    });
    sched.stop();
    sink = counter;
    return r;
}

Timing mutex_std_threads(const Options& opt) {
    std::mutex mutex;
    std::uint64_t counter = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        counter = 0;
        auto body = [&](std::uint64_t ops) {
            for (std::uint64_t k = 0; k < ops; ++k) {
                std::lock_guard<std::mutex> lock(mutex);
                ++counter;
            }
        };
        std::thread a(body, share(n, 2, 0));
        std::thread b(body, share(n, 2, 1));
        a.join();
        b.join();
        if (counter != n) fail("std::mutex lost an increment");
    });
    sink = counter;
    return r;
}

// ---------------------------------------------------------------------------------------
// 2. channel ping-pong
// ---------------------------------------------------------------------------------------

// n one-way messages: (n + 1) / 2 round trips, a ping and a pong each.
Timing channel_fsched(const Options& opt, std::size_t threads, std::size_t capacity) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        const std::uint64_t rounds = (n + 1) / 2;
        fsched::Channel<int> ping(capacity), pong(capacity);
        fsched::WaitGroup done(2);
        std::uint64_t sum = 0;
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                ping.send(static_cast<int>(k & 0xffff));
                sum += static_cast<std::uint64_t>(*pong.receive());
            }
            done.done();
        });
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) pong.send(*ping.receive() + 1);
            done.done();
        });
        done.wait();
        total += sum;
    });
    sched.stop();
    sink = total;
    return r;
}

// Go's ping-pong over two channels of `capacity` on GOMAXPROCS=`procs` (bench/go/channel.go),
// with our repetitions, calibration target and fixed count when --iters is given.
Timing channel_go(const Options& opt, std::size_t procs, std::size_t capacity) {
    const fsched_bench::GoResult g =
        fsched_bench::run_go_twin({"chan", "-procs", std::to_string(procs), "-cap", std::to_string(capacity), "-reps",
                                   std::to_string(opt.reps), "-rep-ms", fsched_bench::format("%g", opt.rep_ms),
                                   "-iters", std::to_string(opt.iters)});
    Timing t;
    t.failed = !g.ok;
    if (t.failed) return t;
    t.r.min_ns = g.best;
    t.r.median_ns = g.median;
    t.r.iters = g.work;
    t.max_ns = *std::max_element(g.samples.begin(), g.samples.end());
    return t;
}

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
namespace bf = boost::fibers;

Timing mutex_boost(const Options& opt, int fibers, bool yield_inside) {
    bf::mutex mutex;
    std::uint64_t counter = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        counter = 0;
        std::vector<bf::fiber> workers;
        for (int i = 0; i < fibers; ++i) {
            const std::uint64_t ops = share(n, static_cast<std::uint64_t>(fibers), static_cast<std::uint64_t>(i));
            workers.emplace_back([&, ops] {
                for (std::uint64_t k = 0; k < ops; ++k) {
                    std::lock_guard<bf::mutex> lock(mutex);
                    ++counter;
                    if (yield_inside) boost::this_fiber::yield();
                }
            });
        }
        for (bf::fiber& f : workers) f.join();
        if (counter != n) fail("boost::fibers::mutex lost an increment");
    });
    sink = counter;
    return r;
}

template <class Chan, class... Args>
Timing channel_boost(const Options& opt, Args... args) {
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        const std::uint64_t rounds = (n + 1) / 2;
        Chan ping(args...), pong(args...);
        std::uint64_t sum = 0;
        bf::fiber a([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                ping.push(static_cast<int>(k & 0xffff));
                int v = 0;
                pong.pop(v);
                sum += static_cast<std::uint64_t>(v);
            }
        });
        bf::fiber b([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                int v = 0;
                ping.pop(v);
                pong.push(v + 1);
            }
        });
        a.join();
        b.join();
        total += sum;
    });
    sink = total;
    return r;
}

#endif

// ---------------------------------------------------------------------------------------
// Running cases: in this process, on a fresh thread, or in one forked child
// ---------------------------------------------------------------------------------------

enum class Where { here, fresh_thread, work_stealing_child };

struct Case {
    std::string group;
    std::string impl;
    bool ours;
    Where where;
    std::function<Timing(const Options&)> run;
    std::string shared_with;  // non-empty: reuse the result of the case with this impl name
    Timing result{};
    bool done = false;
};

std::vector<Case> make_cases() {
    std::vector<Case> c;
    auto add = [&](std::string group, std::string impl, bool ours, Where where,
                   std::function<Timing(const Options&)> run, std::string shared_with = "") {
        c.push_back(Case{std::move(group), std::move(impl), ours, where, std::move(run), std::move(shared_with)});
    };
    for (int fibers : {4, 16}) {
        const std::string n = std::to_string(fibers);
        const std::string g2 = "mutex, " + n + " fibers, 2 threads: ns per lock + unlock";
        add(g2, "fsched::Mutex, Scheduler(2)", true, Where::here,
            [fibers](const Options& o) { return mutex_fsched(o, 2, fibers, false); });
        add(g2, "fsched::Mutex, Scheduler(2), pinned i % 2", false, Where::here,
            [fibers](const Options& o) { return mutex_fsched(o, 2, fibers, false, true); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
        add(g2, "boost::fibers::mutex, work_stealing(2)", false, Where::work_stealing_child,
            [fibers](const Options& o) { return mutex_boost(o, fibers, false); });
#endif
        add(g2, "std::mutex, 2 threads (no fibers)", false, Where::here, mutex_std_threads,
            fibers == 4 ? "" : "std::mutex, 2 threads (no fibers)");
        for (const bool hand_off : {false, true}) {
            const std::string g1 =
                hand_off ? "mutex hand-off, " + n + " fibers, 1 thread, yield while locked: ns per lock + yield + unlock"
                         : "mutex, " + n + " fibers, 1 thread (uncontended): ns per lock + unlock";
            add(g1, "fsched::Mutex, Scheduler(1)", true, Where::here,
                [fibers, hand_off](const Options& o) { return mutex_fsched(o, 1, fibers, hand_off); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
            add(g1, "boost::fibers::mutex, round_robin", false, Where::fresh_thread,
                [fibers, hand_off](const Options& o) { return mutex_boost(o, fibers, hand_off); });
#endif
        }
    }
    for (std::size_t capacity : {std::size_t{0}, std::size_t{1}}) {
        const std::string what = capacity == 0 ? "channel ping-pong, unbuffered" : "channel ping-pong, capacity 1";
        for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
            const std::string g = what + (threads == 1 ? ", 1 thread" : ", 2 threads") + ": ns per one-way message";
            add(g, "fsched::Channel<int>(" + std::to_string(capacity) + "), Scheduler(" + std::to_string(threads) + ")",
                true, Where::here, [threads, capacity](const Options& o) { return channel_fsched(o, threads, capacity); });
            if (fsched_bench::have_go()) {
                add(g, std::string(capacity == 0 ? "Go chan int (unbuffered)" : "Go chan int, capacity 1") +
                           ", GOMAXPROCS=" + std::to_string(threads),
                    false, Where::here, [threads, capacity](const Options& o) { return channel_go(o, threads, capacity); });
            }
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
            const std::string algo = threads == 1 ? ", round_robin" : ", work_stealing(2)";
            const Where where = threads == 1 ? Where::fresh_thread : Where::work_stealing_child;
            if (capacity == 0) {
                add(g, "boost unbuffered_channel<int>" + algo, false, where,
                    [](const Options& o) { return channel_boost<bf::unbuffered_channel<int>>(o); });
            } else {
                add(g, "boost buffered_channel<int>(2)" + algo, false, where,
                    [](const Options& o) { return channel_boost<bf::buffered_channel<int>>(o, std::size_t{2}); });
            }
#endif
        }
    }
    return c;
}

// ---------------------------------------------------------------------------------------
// 3. memory per parked fiber (child processes: this program with --memory-child)
// ---------------------------------------------------------------------------------------
// Linux only: /proc/self/status, /proc/self/exe, mincore() with an unsigned char vector.
#if defined(__linux__)

// A /proc/self/status field in KiB ("VmRSS", "VmPTE", ...); -1 if absent.
long status_kib(const char* field) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long value = -1;
    const std::size_t len = std::strlen(field);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
            value = std::strtol(line + len + 1, nullptr, 10);
            break;
        }
    }
    std::fclose(f);
    return value;
}

// Bytes the allocator has handed out and not taken back, every arena.
double malloc_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    return static_cast<double>(mi.uordblks + mi.hblkhd);
#else
    return -1;
#endif
}

// Resident pages in the 64 KiB below and 8 KiB above `addr` (a local variable of a parked
// fiber, near the top of its stack): that fiber's touched stack. Pages that are not mapped
// (a neighbour's guard page, the gap past a mapping) count as not resident.
int resident_stack_pages(const void* addr) {
    const long page = sysconf(_SC_PAGESIZE);
    const auto at = reinterpret_cast<std::uintptr_t>(addr) & ~static_cast<std::uintptr_t>(page - 1);
    int count = 0;
    for (long i = -16; i <= 2; ++i) {
        unsigned char vec = 0;
        void* p = reinterpret_cast<void*>(at + static_cast<std::uintptr_t>(i * page));
        if (mincore(p, static_cast<std::size_t>(page), &vec) == 0 && (vec & 1)) ++count;
    }
    return count;
}

struct MemorySnapshot {
    long rss_kib;
    long pte_kib;
    double malloc_bytes;
    static MemorySnapshot take() { return MemorySnapshot{status_kib("VmRSS"), status_kib("VmPTE"), malloc_in_use()}; }
};

// Mean resident stack pages over about 1000 of the fibers, while they are parked.
struct StackSample {
    double pages_per_fiber = -1;
    std::size_t sampled = 0;
    static StackSample take(const std::vector<const void*>& stack_marks) {
        StackSample s;
        std::size_t pages = 0;
        const std::size_t step = std::max<std::size_t>(1, stack_marks.size() / 1000);
        for (std::size_t i = 0; i < stack_marks.size(); i += step) {
            if (!stack_marks[i]) continue;
            pages += static_cast<std::size_t>(resident_stack_pages(stack_marks[i]));
            ++s.sampled;
        }
        if (s.sampled) s.pages_per_fiber = static_cast<double>(pages) / static_cast<double>(s.sampled);
        return s;
    }
};

// What a memory child prints: one "key value" per line, read back by the parent.
void print_memory_report(const char* impl, std::size_t fibers, std::size_t parked, std::size_t finished,
                         const MemorySnapshot& before, const MemorySnapshot& after, const StackSample& stacks,
                         double park_s, double finish_s, std::size_t stack_size, std::size_t fiber_object_size) {
    std::printf("impl %s\nfibers %zu\nparked %zu\nfinished %zu\n", impl, fibers, parked, finished);
    std::printf("rss_before_kib %ld\nrss_after_kib %ld\npte_before_kib %ld\npte_after_kib %ld\n", before.rss_kib,
                after.rss_kib, before.pte_kib, after.pte_kib);
    std::printf("malloc_before %.0f\nmalloc_after %.0f\n", before.malloc_bytes, after.malloc_bytes);
    std::printf("stack_pages_per_fiber %.3f\nsampled %zu\n", stacks.pages_per_fiber, stacks.sampled);
    std::printf("park_s %.4f\nfinish_s %.4f\nstack_size %zu\nfiber_object %zu\n", park_s, finish_s, stack_size,
                fiber_object_size);
    std::fflush(stdout);
}

int memory_child_fsched(std::size_t fibers) {
    std::vector<const void*> marks(fibers, nullptr);  // touched now, before the baseline
    std::size_t stack_size = 0;
    fsched::Scheduler sched(2, false, "memory");
    sched.start();
    {
        // Let both workers set up (thread state, first stack, allocator arenas) first.
        fsched::WaitGroup warm(2);
        for (int w = 0; w < 2; ++w) {
            sched.schedule([&] {
                stack_size = fsched::Fiber::current()->stack_size();
                warm.done();
            }, w);
        }
        warm.wait();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const MemorySnapshot before = MemorySnapshot::take();

    fsched::WaitGroup arrived(static_cast<std::int64_t>(fibers));
    fsched::WaitGroup gate(1);
    std::atomic<std::size_t> finished{0};
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < fibers; ++i) {
        sched.schedule([&, i] {
            int local = 0;
            marks[i] = &local;
            arrived.done();
            gate.wait();
            sink = static_cast<std::uint64_t>(local);
            finished.fetch_add(1, std::memory_order_relaxed);
        });
    }
    arrived.wait();
    const double park_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // The last arrivals are between done() and their park; give them a moment.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const MemorySnapshot after = MemorySnapshot::take();
    const StackSample stacks = StackSample::take(marks);
    const std::size_t parked = fibers - finished.load();

    const auto t1 = Clock::now();
    gate.done();
    sched.stop();
    const double finish_s = std::chrono::duration<double>(Clock::now() - t1).count();
    print_memory_report("fsched", fibers, parked, finished.load(), before, after, stacks, park_s, finish_s,
                        stack_size, sizeof(fsched::Fiber));
    return finished.load() == fibers ? 0 : 1;
}

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
int memory_child_boost(std::size_t fibers) {
    std::vector<const void*> marks(fibers, nullptr);
    std::vector<bf::fiber> all;
    all.reserve(fibers);
    bf::fiber([] {}).join();  // this thread's scheduler exists before the baseline
    const MemorySnapshot before = MemorySnapshot::take();

    bf::mutex mutex;
    bf::condition_variable gate, all_arrived;
    bool open = false;
    std::size_t arrived = 0, finished = 0;
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < fibers; ++i) {
        all.emplace_back([&, i] {
            int local = 0;
            marks[i] = &local;
            std::unique_lock<bf::mutex> lock(mutex);
            if (++arrived == fibers) all_arrived.notify_one();
            gate.wait(lock, [&] { return open; });
            ++finished;
            sink = static_cast<std::uint64_t>(local);
        });
    }
    {
        std::unique_lock<bf::mutex> lock(mutex);
        all_arrived.wait(lock, [&] { return arrived == fibers; });
    }
    const double park_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const MemorySnapshot after = MemorySnapshot::take();
    const StackSample stacks = StackSample::take(marks);
    const std::size_t parked = arrived - finished;

    const auto t1 = Clock::now();
    {
        std::lock_guard<bf::mutex> lock(mutex);
        open = true;
    }
    gate.notify_all();
    for (bf::fiber& f : all) f.join();
    const double finish_s = std::chrono::duration<double>(Clock::now() - t1).count();
    print_memory_report("boost", fibers, parked, finished, before, after, stacks, park_s, finish_s,
                        boost::context::stack_traits::default_size(), 0);
    return finished == fibers ? 0 : 1;
}
#endif

// Runs this program again with --memory-child and parses what it prints.
bool run_memory_child(const char* impl, std::size_t fibers, std::map<std::string, std::string>& out) {
    const std::string count = std::to_string(fibers);
    fsched_bench::ChildProcess child([&](int fd) {
        dup2(fd, STDOUT_FILENO);
        execl("/proc/self/exe", "bench_sync", "--memory-child", impl, count.c_str(), static_cast<char*>(nullptr));
        return 127;
    });
    const std::string text = child.read_to_end();
    const bool exited_ok = child.wait();
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(pos, end - pos);
        const std::size_t space = line.find(' ');
        if (space != std::string::npos) out[line.substr(0, space)] = line.substr(space + 1);
        pos = end + 1;
    }
    return exited_ok && out.count("rss_after_kib");
}

void memory_benchmark(std::size_t fibers, const Options& opt) {
    struct Row {
        const char* impl;
        const char* label;
    };
    std::vector<Row> rows = {{"fsched", "fsched, Scheduler(2), WaitGroup"}};
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    rows.push_back({"boost", "Boost.Fiber, round_robin, condition_variable"});
#endif
    using fsched_bench::format;
    fsched_bench::TextTable table;
    table.begin_group(format("memory per parked fiber: %zu fibers parked at once, default stacks, each in its own process",
                             fibers),
                      {{"parked", 8}, {"RSS KiB", 9}, {"KiB/fiber", 9}, {"+PTE/fiber", 10}, {"heap B/f", 9},
                       {"stack pg/f", 11}, {"stack KiB", 9}, {"all done", 8}});
    std::map<std::string, double> per_fiber;
    for (const Row& row : rows) {
        if (!opt.selected(std::string("memory/") + row.impl)) continue;
        std::map<std::string, std::string> m;
        const bool ok = run_memory_child(row.impl, fibers, m);
        if (!m.count("rss_after_kib")) {
            table.row(row.label, {"failed (see stderr)"});
            continue;
        }
        auto num = [&](const char* k) { return m.count(k) ? std::atof(m[k].c_str()) : 0.0; };
        const double parked = num("parked");
        const double rss = num("rss_after_kib") - num("rss_before_kib");
        const double pte = num("pte_after_kib") - num("pte_before_kib");
        const double heap = num("malloc_after") - num("malloc_before");
        const double kib = parked > 0 ? rss / parked : 0;
        per_fiber[row.impl] = kib;
        table.row(row.label, {format("%.0f", parked), format("%.0f", rss), format("%.2f", kib),
                              format("%.2f", parked > 0 ? (rss + pte) / parked : 0),
                              format("%.0f", parked > 0 && heap >= 0 ? heap / parked : -1),
                              format("%.2f", num("stack_pages_per_fiber")), format("%.0f", num("stack_size") / 1024),
                              ok ? "yes" : "NO"});
        // The times, on a line of their own under the row's figures.
        table.row("", {format("park %.3f s, release + finish %.3f s%s", num("park_s"), num("finish_s"),
                              m.count("fiber_object") && num("fiber_object") > 0
                                  ? (", sizeof(fsched::Fiber) " + m["fiber_object"] + " B").c_str()
                                  : "")});
    }
    if (per_fiber.count("fsched") && per_fiber.count("boost")) {
        table.note(format("fsched / Boost.Fiber: %.2f", per_fiber["fsched"] / per_fiber["boost"]));
    }
    table.print();
    std::printf("RSS KiB: VmRSS after minus before; +PTE/fiber: KiB per fiber with page tables (VmPTE) added;\n"
                "heap B/f: mallinfo2() bytes in use per fiber; stack pg/f: resident stack pages per fiber (mincore,\n"
                "~1000 fibers sampled).\n");
}

#else
void memory_benchmark(std::size_t, const Options&) {
    std::printf("\nmemory per parked fiber: skipped (needs Linux: /proc/self/status, /proc/self/exe)\n");
}
#endif  // __linux__

}  // namespace

int main(int argc, char** argv) {
#if defined(__linux__)
    if (argc >= 4 && std::strcmp(argv[1], "--memory-child") == 0) {
        const std::size_t fibers = std::strtoull(argv[3], nullptr, 10);
        if (std::strcmp(argv[2], "fsched") == 0) return memory_child_fsched(fibers);
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
        if (std::strcmp(argv[2], "boost") == 0) return memory_child_boost(fibers);
#endif
        return 2;
    }
#endif

    // --fibers is ours; the rest is bench_util's common command line.
    std::size_t fibers = 0;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
        if (i > 0 && std::strcmp(argv[i], "--fibers") == 0 && i + 1 < argc) {
            fibers = std::strtoull(argv[++i], nullptr, 10);
            continue;
        }
        args.push_back(argv[i]);
    }
    Options opt;
    opt.reps = 9;  // 21 timed cases: keeps a full run near 15 s on 2 cores
    opt.rep_ms = 30;
    if (!opt.parse(static_cast<int>(args.size()), args.data())) {
        std::fprintf(stderr,
                     "  --fibers N    fibers parked at once in the memory benchmark (default 100000)\n"
                     "bench_sync's own defaults: --reps 9, --rep-ms 30\n");
        return 2;
    }
    if (fibers == 0) fibers = opt.quick ? 2000 : 100000;

    const std::string boost = fsched_bench::boost_note(FIBER_SCHED_BENCH_HAVE_BOOST_FIBER, " (Boost.Fiber)",
                                                       "Boost.Fiber not compiled in (no baselines but std::mutex)");
    std::printf("%s%s%s\n%s; %d repetitions per case, best and median shown\n", fsched_bench::build_line("bench_sync").c_str(),
                boost.c_str(), fsched_bench::go_note().c_str(), opt.quick ? "quick run (numbers are noise)" : "full run",
                opt.reps);

    std::vector<Case> cases = make_cases();
    auto name = [](const Case& c) { return c.group + "/" + c.impl; };

    // Boost's work_stealing cases first, together, in one child (see run_in_child).
    std::vector<std::size_t> ws;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        if (cases[i].where == Where::work_stealing_child && opt.selected(name(cases[i]))) ws.push_back(i);
    }
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    if (!ws.empty() && !fsched_bench::run_cases_in_child(cases, ws, opt, fsched_bench::join_boost_work_stealing)) {
        std::fprintf(stderr, "bench_sync: the Boost.Fiber work_stealing child failed\n");
    }
#endif
    for (Case& c : cases) {
        if (c.where == Where::work_stealing_child || !opt.selected(name(c))) continue;
        if (!c.shared_with.empty()) {
            for (const Case& other : cases) {
                if (&other != &c && other.impl == c.shared_with && other.done) {
                    c.result = other.result;
                    c.done = true;
                    break;
                }
            }
            if (c.done) continue;
        }
        if (c.where == Where::fresh_thread) {
            // A new thread gets Boost.Fiber's default round_robin scheduler.
            std::thread t([&] { c.result = c.run(opt); });
            t.join();
        } else {
            c.result = c.run(opt);
        }
        c.done = true;
    }

    fsched_bench::Table table;
    std::string group;
    bool any_failed = false;
    for (const Case& c : cases) {
        if (!c.done) continue;
        if (c.result.failed) {
            std::fprintf(stderr, "bench_sync: %s: failed, left out of the table\n", name(c).c_str());
            any_failed = true;
            continue;
        }
        if (c.group != group) {
            table.begin_group(c.group);
            group = c.group;
        }
        table.add(c.impl, c.result.r, c.ours);
    }
    table.print();

    // Where the slowest repetition took over twice the best, say so: the best and median
    // columns alone would hide a bimodal case.
    bool header = false;
    for (const Case& c : cases) {
        if (!c.done || c.result.failed || c.result.max_ns <= 2 * c.result.r.min_ns) continue;
        if (!header) std::printf("\nspread: slowest repetition over twice the best (ns/op: best / median / slowest)\n");
        header = true;
        std::printf("  %s / %s: %.1f / %.1f / %.1f\n", c.group.substr(0, c.group.find(':')).c_str(), c.impl.c_str(),
                    c.result.r.min_ns, c.result.r.median_ns, c.result.max_ns);
    }

    memory_benchmark(fibers, opt);
    // A failed case fails the run: CTest's --quick smoke test is how CI notices one.
    return any_failed ? 1 : 0;
}
