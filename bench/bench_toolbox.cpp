// bench_toolbox.cpp — the toolbox's primitives beside their peers, measured in one run.
//
//   1. semaphore hand-off: two fibers pass a turn back and forth through two Semaphores
//      (one releases, the other acquires); ns per one-way hand-off. Boost.Fiber has no
//      semaphore: its row is the one users write, a count under boost::fibers::mutex with a
//      condition_variable. On Scheduler(1) against round_robin, on Scheduler(2) against
//      work_stealing on 2 threads.
//   2. barrier phase: 4 fibers each call arrive_and_wait() once per phase; ns per phase.
//      Against boost::fibers::barrier, 1 and 2 threads as above.
//   3. future round trip: a task calls async(scheduler, fn).get() in a loop, fn returning
//      an int; ns per async + get. Against boost::fibers::async(fn).get() from a fiber.
//   4. select: a fiber runs select() over two Channel<int>(1), each fed by a fiber of its
//      own; ns per select. Against Go's select over two chan int of capacity 1 (bench/go).
//   5. timed receive: a ping-pong over two unbuffered channels whose every receive is
//      receive_for(1 s) (it never times out); ns per one-way message. Against Go's receive
//      in a select with a timer (Reset before, Stop after: the allocation-free idiom).
//   6. parallel_for on 2 workers: 1,000,000 trivial items (x = x * 3 + 1, grain 4096) and
//      10,000 heavy ones (about 1.5 us of arithmetic each, grain 1); ns per item. Against TBB's
//      tbb::parallel_for in a 2-thread task_arena (its auto partitioner) and OpenMP's
//      `parallel for num_threads(2) schedule(static)` (dynamic for the heavy case), each in
//      a child process of its own, so their idle threads cannot spin beside other rows.
//
// Usage: bench_toolbox [--quick] [--reps N] [--iters N] [--rep-ms MS] [--filter TEXT]
//   Defaults here: --reps 9 and --rep-ms 30.
// Results and how to reproduce them: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifndef FIBER_SCHED_BENCH_HAVE_TBB
#define FIBER_SCHED_BENCH_HAVE_TBB 0
#endif
#ifndef FIBER_SCHED_BENCH_HAVE_OPENMP
#define FIBER_SCHED_BENCH_HAVE_OPENMP 0
#endif

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/fiber/algo/work_stealing.hpp>
#include <boost/fiber/barrier.hpp>
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/fiber.hpp>
#include <boost/fiber/future.hpp>
#include <boost/fiber/mutex.hpp>
#include <boost/fiber/operations.hpp>
#endif
#if FIBER_SCHED_BENCH_HAVE_TBB
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif
#if FIBER_SCHED_BENCH_HAVE_OPENMP
#include <omp.h>
#endif

namespace {

using fsched_bench::Options;
using fsched_bench::Result;
using fsched_bench::sink;
using fsched_bench::Timing;
using fsched_bench::timed;
using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "bench_toolbox: %s\n", what);
    std::exit(1);
}

// ---------------------------------------------------------------------------------------
// 1. semaphore hand-off
// ---------------------------------------------------------------------------------------

// n one-way hand-offs: (n + 1) / 2 rounds of a release each way.
Timing semaphore_fsched(const Options& opt, std::size_t threads) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    Timing r = timed(opt, [&](std::uint64_t n) {
        const std::uint64_t rounds = (n + 1) / 2;
        fsched::Semaphore to_b(0), to_a(0);
        fsched::WaitGroup done(2);
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                to_b.release();
                to_a.acquire();
            }
            done.done();
        });
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                to_b.acquire();
                to_a.release();
            }
            done.done();
        });
        done.wait();
    });
    sched.stop();
    return r;
}

// ---------------------------------------------------------------------------------------
// 2. barrier phase
// ---------------------------------------------------------------------------------------

constexpr int barrier_fibers = 4;

Timing barrier_fsched(const Options& opt, std::size_t threads) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    Timing r = timed(opt, [&](std::uint64_t n) {
        fsched::Barrier barrier(barrier_fibers);
        fsched::WaitGroup done(barrier_fibers);
        for (int i = 0; i < barrier_fibers; ++i) {
            sched.schedule([&] {
                for (std::uint64_t k = 0; k < n; ++k) barrier.arrive_and_wait();
                done.done();
            });
        }
        done.wait();
    });
    sched.stop();
    return r;
}

// ---------------------------------------------------------------------------------------
// 3. future round trip
// ---------------------------------------------------------------------------------------

Timing future_fsched(const Options& opt, std::size_t threads) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        fsched::WaitGroup done(1);
        std::uint64_t sum = 0;
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < n; ++k) {
                sum += static_cast<std::uint64_t>(fsched::async(sched, [k] { return static_cast<int>(k & 0xff); }).get());
            }
            done.done();
        });
        done.wait();
        total += sum;
    });
    sched.stop();
    sink = total;
    return r;
}

// ---------------------------------------------------------------------------------------
// 4. select over two channels, 5. timed receive
// ---------------------------------------------------------------------------------------

// n selects, over two channels that two fibers feed with (n + 1) / 2 values each.
Timing select_fsched(const Options& opt, std::size_t threads) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        const std::uint64_t half = (n + 1) / 2;
        fsched::Channel<int> a(1), b(1);
        fsched::WaitGroup done(3);
        std::uint64_t sum = 0;
        for (fsched::Channel<int>* c : {&a, &b}) {
            sched.schedule([&, c] {
                for (std::uint64_t k = 0; k < half; ++k) c->send(static_cast<int>(k & 0xffff));
                done.done();
            });
        }
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < 2 * half; ++k) {
                fsched::select(a.on_receive([&](std::optional<int> v) { sum += static_cast<std::uint64_t>(*v); }),
                               b.on_receive([&](std::optional<int> v) { sum += static_cast<std::uint64_t>(*v); }));
            }
            done.done();
        });
        done.wait();
        total += sum;
    });
    sched.stop();
    sink = total;
    return r;
}

Timing timed_receive_fsched(const Options& opt, std::size_t threads) {
    fsched::Scheduler sched(threads, false, "bench");
    sched.start();
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        const std::uint64_t rounds = (n + 1) / 2;
        fsched::Channel<int> ping(0), pong(0);
        fsched::WaitGroup done(2);
        std::uint64_t sum = 0;
        auto receive = [](fsched::Channel<int>& c) {
            std::optional<int> v = c.receive_for(std::chrono::seconds(1));
            if (!v) fail("a receive_for(1 s) timed out");
            return *v;
        };
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                ping.send(static_cast<int>(k & 0xffff));
                sum += static_cast<std::uint64_t>(receive(pong));
            }
            done.done();
        });
        sched.schedule([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) pong.send(receive(ping) + 1);
            done.done();
        });
        done.wait();
        total += sum;
    });
    sched.stop();
    sink = total;
    return r;
}

// Go's twin of `name` (bench/go/toolbox.go) on GOMAXPROCS=`procs`, with our repetition rule.
Timing go_case(const Options& opt, const char* name, std::size_t procs) {
    const fsched_bench::GoResult g =
        fsched_bench::run_go_twin({name, "-procs", std::to_string(procs), "-reps", std::to_string(opt.reps), "-rep-ms",
                                   fsched_bench::format("%g", opt.rep_ms), "-iters", std::to_string(opt.iters)});
    Timing t;
    t.failed = !g.ok;
    t.r.min_ns = g.best;
    t.r.median_ns = g.median;
    t.r.iters = g.work;
    return t;
}

// ---------------------------------------------------------------------------------------
// 6. parallel_for
// ---------------------------------------------------------------------------------------

struct Items {
    std::size_t count;
    std::size_t grain;  // ours; TBB partitions by itself, OpenMP splits statically
    bool heavy;
};

// About 1.5 us of dependent arithmetic the compiler cannot drop or vectorise away.
inline double heavy_work(std::size_t i) {
    double x = static_cast<double>(i % 1000) * 1e-3 + 1.0;
    for (int k = 0; k < 200; ++k) x = std::sqrt(x * 1.000001 + 0.5);
    return x;
}

// One call over all items: trivial items update a vector in place, heavy ones store a result.
struct ItemData {
    std::vector<std::uint64_t> trivial;
    std::vector<double> heavy;
    explicit ItemData(const Items& items) {
        if (items.heavy) {
            heavy.assign(items.count, 0.0);
        } else {
            trivial.assign(items.count, 1);
        }
    }
    void item(std::size_t i) {
        if (!heavy.empty()) {
            heavy[i] = heavy_work(i);
        } else {
            trivial[i] = trivial[i] * 3 + 1;
        }
    }
    std::uint64_t check() const {
        std::uint64_t s = 0;
        for (std::uint64_t v : trivial) s += v;
        for (double v : heavy) s += static_cast<std::uint64_t>(v * 1000);
        return s;
    }
};

// ns per item; the count of calls calibrates (each call is over every item).
template <class Call>
Timing per_item(const Options& given, const Items& items, Call&& call) {
    Options opt = given;
    if (opt.quick) opt.iters = 2;  // --quick's 1000 operations would be 1000 calls here
    Timing t = timed(opt, [&](std::uint64_t calls) {
        for (std::uint64_t c = 0; c < calls; ++c) call();
    }, 1);
    t.r.min_ns /= static_cast<double>(items.count);
    t.r.median_ns /= static_cast<double>(items.count);
    return t;
}

Timing parallel_for_fsched(const Options& opt, const Items& items) {
    fsched::Scheduler sched(2, false, "bench");
    sched.start();
    ItemData data(items);
    Timing t = per_item(opt, items, [&] {
        fsched::parallel_for(sched, 0, items.count, items.grain, [&](std::size_t i) { data.item(i); });
    });
    sched.stop();
    sink = data.check();
    return t;
}

// The same on plain threads: what a user without a library writes (two std::threads per call,
// each doing half the range). The floor a pool should beat.
Timing parallel_for_threads(const Options& opt, const Items& items) {
    ItemData data(items);
    Timing t = per_item(opt, items, [&] {
        std::thread other([&] {
            for (std::size_t i = items.count / 2; i < items.count; ++i) data.item(i);
        });
        for (std::size_t i = 0; i < items.count / 2; ++i) data.item(i);
        other.join();
    });
    sink = data.check();
    return t;
}

#if FIBER_SCHED_BENCH_HAVE_TBB
Timing parallel_for_tbb(const Options& opt, const Items& items) {
    tbb::task_arena arena(2);
    ItemData data(items);
    Timing t = per_item(opt, items, [&] {
        arena.execute([&] {
            tbb::parallel_for(tbb::blocked_range<std::size_t>(0, items.count), [&](const tbb::blocked_range<std::size_t>& r) {
                for (std::size_t i = r.begin(); i != r.end(); ++i) data.item(i);
            });
        });
    });
    sink = data.check();
    return t;
}
#endif

#if FIBER_SCHED_BENCH_HAVE_OPENMP
Timing parallel_for_openmp(const Options& opt, const Items& items) {
    ItemData data(items);
    const long count = static_cast<long>(items.count);
    Timing t = per_item(opt, items, [&] {
        if (items.heavy) {
#pragma omp parallel for num_threads(2) schedule(dynamic)
            for (long i = 0; i < count; ++i) data.item(static_cast<std::size_t>(i));
        } else {
#pragma omp parallel for num_threads(2) schedule(static)
            for (long i = 0; i < count; ++i) data.item(static_cast<std::size_t>(i));
        }
    });
    sink = data.check();
    return t;
}
#endif

// ---------------------------------------------------------------------------------------
// Baselines of Boost.Fiber
// ---------------------------------------------------------------------------------------

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
namespace bf = boost::fibers;

// The semaphore a Boost.Fiber user writes.
class BoostSemaphore {
public:
    explicit BoostSemaphore(long count) : count_(count) {}
    void acquire() {
        std::unique_lock<bf::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return count_ > 0; });
        --count_;
    }
    void release() {
        {
            std::lock_guard<bf::mutex> lock(mutex_);
            ++count_;
        }
        cv_.notify_one();
    }

private:
    bf::mutex mutex_;
    bf::condition_variable cv_;
    long count_;
};

Timing semaphore_boost(const Options& opt) {
    return timed(opt, [&](std::uint64_t n) {
        const std::uint64_t rounds = (n + 1) / 2;
        BoostSemaphore to_b(0), to_a(0);
        bf::fiber a([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                to_b.release();
                to_a.acquire();
            }
        });
        bf::fiber b([&] {
            for (std::uint64_t k = 0; k < rounds; ++k) {
                to_b.acquire();
                to_a.release();
            }
        });
        a.join();
        b.join();
    });
}

Timing barrier_boost(const Options& opt) {
    return timed(opt, [&](std::uint64_t n) {
        bf::barrier barrier(barrier_fibers);
        std::vector<bf::fiber> fibers;
        for (int i = 0; i < barrier_fibers; ++i) {
            fibers.emplace_back([&] {
                for (std::uint64_t k = 0; k < n; ++k) barrier.wait();
            });
        }
        for (bf::fiber& f : fibers) f.join();
    });
}

Timing future_boost(const Options& opt) {
    std::uint64_t total = 0;
    Timing r = timed(opt, [&](std::uint64_t n) {
        std::uint64_t sum = 0;
        bf::fiber caller([&] {
            for (std::uint64_t k = 0; k < n; ++k) {
                sum += static_cast<std::uint64_t>(bf::async([k] { return static_cast<int>(k & 0xff); }).get());
            }
        });
        caller.join();
        total += sum;
    });
    sink = total;
    return r;
}

#endif

// ---------------------------------------------------------------------------------------
// Running cases: here, on a fresh thread (Boost.Fiber's round_robin), or in a child
// ---------------------------------------------------------------------------------------

enum class Where { here, fresh_thread, child, work_stealing_child };

struct Case {
    std::string group;
    std::string impl;
    bool ours;
    Where where;
    std::function<Timing(const Options&)> run;
    Timing result{};
    bool done = false;
};


std::vector<Case> make_cases() {
    std::vector<Case> c;
    auto add = [&](std::string group, std::string impl, bool ours, Where where, std::function<Timing(const Options&)> run) {
        c.push_back(Case{std::move(group), std::move(impl), ours, where, std::move(run)});
    };
    for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
        const std::string t = std::to_string(threads);
        const std::string on = threads == 1 ? ", 1 thread" : ", 2 threads";
        [[maybe_unused]] const Where boost_where = threads == 1 ? Where::fresh_thread : Where::work_stealing_child;
        [[maybe_unused]] const std::string boost_algo = threads == 1 ? "round_robin" : "work_stealing(2)";

        std::string g = "semaphore hand-off" + on + ": ns per one-way hand-off";
        add(g, "fsched::Semaphore, Scheduler(" + t + ")", true, Where::here,
            [threads](const Options& o) { return semaphore_fsched(o, threads); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
        add(g, "boost::fibers mutex + condition_variable, " + boost_algo, false, boost_where, semaphore_boost);
#endif
        g = "barrier, 4 fibers" + on + ": ns per phase";
        add(g, "fsched::Barrier, Scheduler(" + t + ")", true, Where::here,
            [threads](const Options& o) { return barrier_fsched(o, threads); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
        add(g, "boost::fibers::barrier, " + boost_algo, false, boost_where, barrier_boost);
#endif
        g = "future round trip" + on + ": ns per async(fn).get()";
        add(g, "fsched::async, Scheduler(" + t + ")", true, Where::here,
            [threads](const Options& o) { return future_fsched(o, threads); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
        add(g, "boost::fibers::async, " + boost_algo, false, boost_where, future_boost);
#endif
        g = "select over two channels" + on + ": ns per select";
        add(g, "fsched::select, Scheduler(" + t + ")", true, Where::here,
            [threads](const Options& o) { return select_fsched(o, threads); });
        if (fsched_bench::have_go()) {
            add(g, "Go select, GOMAXPROCS=" + t, false, Where::here,
                [threads](const Options& o) { return go_case(o, "select", threads); });
        }
        g = "timed receive (1 s, never reached), ping-pong" + on + ": ns per one-way message";
        add(g, "fsched::Channel::receive_for, Scheduler(" + t + ")", true, Where::here,
            [threads](const Options& o) { return timed_receive_fsched(o, threads); });
        if (fsched_bench::have_go()) {
            add(g, "Go select with a timer, GOMAXPROCS=" + t, false, Where::here,
                [threads](const Options& o) { return go_case(o, "timedrecv", threads); });
        }
    }
    const Items trivial{1000000, 4096, false};
    const Items heavy{10000, 1, true};
    for (const Items& items : {trivial, heavy}) {
        const std::string g = items.heavy ? "parallel_for, 10,000 heavy items (~1.5 us each), 2 threads: ns per item"
                                          : "parallel_for, 1,000,000 trivial items, 2 threads: ns per item";
        add(g, "fsched::parallel_for, Scheduler(2), grain " + std::to_string(items.grain), true, Where::here,
            [items](const Options& o) { return parallel_for_fsched(o, items); });
#if FIBER_SCHED_BENCH_HAVE_TBB
        add(g, "tbb::parallel_for, task_arena(2)", false, Where::child,
            [items](const Options& o) { return parallel_for_tbb(o, items); });
#endif
#if FIBER_SCHED_BENCH_HAVE_OPENMP
        add(g, std::string("OpenMP parallel for, 2 threads, ") + (items.heavy ? "dynamic" : "static"), false,
            Where::child, [items](const Options& o) { return parallel_for_openmp(o, items); });
#endif
        add(g, "2 std::threads per call, half each", false, Where::here,
            [items](const Options& o) { return parallel_for_threads(o, items); });
    }
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    opt.reps = 9;
    opt.rep_ms = 30;
    if (!opt.parse(argc, argv)) {
        std::fprintf(stderr, "bench_toolbox's own defaults: --reps 9, --rep-ms 30\n");
        return 2;
    }
    const std::string boost = fsched_bench::boost_note(FIBER_SCHED_BENCH_HAVE_BOOST_FIBER, " (Boost.Fiber)",
                                                       "Boost.Fiber not compiled in (no Boost rows)");
    std::printf("%s%s%s%s%s\n%s; %d repetitions per case, best and median shown\n",
                fsched_bench::build_line("bench_toolbox").c_str(), boost.c_str(), fsched_bench::go_note().c_str(),
                FIBER_SCHED_BENCH_HAVE_TBB ? "; TBB" : "; no TBB", FIBER_SCHED_BENCH_HAVE_OPENMP ? "; OpenMP" : "; no OpenMP",
                opt.quick ? "quick run (numbers are noise)" : "full run", opt.reps);

    std::vector<Case> cases = make_cases();
    auto name = [](const Case& c) { return c.group + "/" + c.impl; };
    bool any_failed = false;

    // The children first, while this process has no threads: Boost's work_stealing cases
    // together in one, each TBB or OpenMP case in one of its own.
    std::vector<std::size_t> ws;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        if (!opt.selected(name(cases[i]))) continue;
        if (cases[i].where == Where::work_stealing_child) ws.push_back(i);
        if (cases[i].where == Where::child && !fsched_bench::run_cases_in_child(cases, {i}, opt, nullptr)) {
            std::fprintf(stderr, "bench_toolbox: %s: its child failed\n", name(cases[i]).c_str());
            any_failed = true;
        }
    }
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    if (!ws.empty() && !fsched_bench::run_cases_in_child(cases, ws, opt, fsched_bench::join_boost_work_stealing)) {
        std::fprintf(stderr, "bench_toolbox: the Boost.Fiber work_stealing child failed\n");
        any_failed = true;
    }
#endif
    for (Case& c : cases) {
        if (c.done || c.where == Where::child || c.where == Where::work_stealing_child || !opt.selected(name(c))) continue;
        if (c.where == Where::fresh_thread) {
            std::thread t([&] { c.result = c.run(opt); });  // a new thread gets round_robin
            t.join();
        } else {
            c.result = c.run(opt);
        }
        c.done = true;
    }

    fsched_bench::Table table;
    std::string group;
    for (const Case& c : cases) {
        if (!c.done) continue;
        if (c.result.failed) {
            std::fprintf(stderr, "bench_toolbox: %s: failed, left out of the table\n", name(c).c_str());
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
    return any_failed ? 1 : 0;
}
