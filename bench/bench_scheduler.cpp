// bench_scheduler.cpp — fsched::Scheduler beside its baselines, measured in one run.
//
//   1. spawn: 1,000,000 empty tasks on 2 threads, M tasks/s. Go-style (one task schedules
//      all of them with Scheduler::current()->schedule() and waits on a WaitGroup, like
//      `for ... { go f() }; wg.Wait()`), and a batch scheduled from the main thread with
//      schedule(first, last).
//   2. skynet: a tree of tasks, 10 children per node, 1,000,000 leaves (6 levels); each
//      leaf returns its number, each node waits for its children and returns their sum.
//   3. yield: two fibers on a 1-thread scheduler alternating on this_fiber::yield(), ns per yield.
//   4. idle CPU: a 2-thread scheduler that ran one task and then sits idle for 2 s: the
//      process's CPU time meanwhile; fiber_sched's in the second of two such windows, the
//      first (also shown) including the give-back of what the earlier cases left.
//
// Baselines, each on 2 threads where threads apply:
//   - "thread pool": 2 std::threads, one std::mutex + std::condition_variable +
//     std::deque<std::function<void()>>, the plain design;
//   - "seed design": a small reimplementation of the scheduler fiber_sched started from
//     (sylar's, see SeedScheduler below): one mutex-protected std::list shared by every
//     thread, each callback in a new fsched::Fiber, and an idle routine that busy-waits;
//   - Boost.Fiber, when CMake found it (FIBER_SCHED_BENCH_HAVE_BOOST_FIBER): the
//     work_stealing algorithm on 2 threads (the main thread one of them), and the default
//     round_robin for yield. work_stealing keeps its thread registry in statics that can be
//     set up once per process, so every Boost.Fiber case runs in a forked child process;
//   - Go, when the build made the Go twins (bench/go/, FIBER_SCHED_BENCH_GO_TWINS): the same
//     shapes with goroutines and sync.WaitGroup on GOMAXPROCS=2, and runtime.Gosched() on
//     GOMAXPROCS=1 for yield, each case a run of the twins with our sizes and repetitions.
//     Without them the project's reference figures for Go are printed instead.
//
// Usage: bench_scheduler [--quick] [--reps N] [--iters N] [--filter TEXT]
//   --iters N sets the task count of "spawn" and the yields per fiber of "yield";
//   --rep-ms is accepted and ignored (every repetition is a fixed amount of work).
// Results and how to reproduce them: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_util.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/fiber/algo/work_stealing.hpp>
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/fiber.hpp>
#include <boost/fiber/mutex.hpp>
#include <boost/fiber/operations.hpp>
#endif

namespace {

using fsched_bench::Options;
using fsched_bench::sink;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of the whole process (every thread), in milliseconds.
double process_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// ---------------------------------------------------------------------------------------
// Sizes and the result table
// ---------------------------------------------------------------------------------------

struct Sizes {
    std::uint64_t spawn_tasks;        // fsched, thread pool, seed design
    std::uint64_t spawn_tasks_boost;  // Boost.Fiber is ~20x slower: fewer; the rate is per task
    std::uint64_t skynet_leaves;      // a power of 10
    std::uint64_t yields_per_fiber;
    double idle_seconds;
    int reps;         // repetitions of each fast case (spawn, yield)
    int reps_slow;    // of the slow spawn baselines (seed design, Boost.Fiber)
    int reps_skynet;       // of fsched's and the thread pool's skynet
    int reps_skynet_slow;  // of the seed design's and Boost.Fiber's skynet
};

Sizes sizes_for(const Options& opt, bool reps_given, bool iters_given) {
    Sizes s;
    if (opt.quick) {
        s = Sizes{10000, 10000, 10000, 10000, 0.2, 2, 1, 2, 1};
    } else {
        s = Sizes{1000000, 100000, 1000000, 1000000, 2.0, 5, 2, 3, 1};
    }
    if (iters_given && opt.iters > 0) {
        s.spawn_tasks = s.spawn_tasks_boost = opt.iters;
        s.yields_per_fiber = opt.iters;
    }
    if (reps_given) s.reps = s.reps_slow = s.reps_skynet = s.reps_skynet_slow = opt.reps;
    return s;
}

// One figure per repetition; the table shows the best and the median repetition.
struct Figures {
    std::vector<double> samples;
    std::uint64_t count = 0;  // work per repetition (tasks, leaves, yields)
    bool failed = false;
};

// Rows grouped by benchmark, like fsched_bench::Table, for figures in any unit. The ratio
// column is always a ratio of *times*, as in bench_fiber: ours / x below 1 means fiber_sched
// is faster (for a rate, that is x's rate / ours).
class FigureTable {
public:
    void begin_group(std::string title, std::string unit, bool higher_is_better) {
        groups_.push_back(Group{std::move(title), std::move(unit), higher_is_better, {}, -1, {}});
    }

    void add(std::string impl, Figures f, bool ours = false) {
        Group& g = groups_.back();
        if (ours && !f.failed) g.ours = static_cast<int>(g.rows.size());
        g.rows.push_back(Row{std::move(impl), std::move(f)});
    }

    // A line printed under the group's rows (references, targets, skipped rows).
    void note(std::string text) { groups_.back().notes.push_back(std::move(text)); }

    // Whether the current group has a row `impl` (run, or failed).
    bool has_row(const std::string& impl) const {
        for (const Row& row : groups_.back().rows)
            if (row.impl == impl) return true;
        return false;
    }

    // Whether any row failed, in any group.
    bool any_failed() const {
        for (const Group& g : groups_)
            for (const Row& row : g.rows)
                if (row.f.failed) return true;
        return false;
    }

    // The best figure of the current group's row `impl`; false if it did not run or failed.
    bool best_of(const std::string& impl, double& out) const {
        for (const Row& row : groups_.back().rows) {
            if (row.impl != impl || row.f.failed) continue;
            out = best(groups_.back(), row.f);
            return true;
        }
        return false;
    }

    // The best figure of fiber_sched's row in the current group; false if it did not run.
    bool ours_best(double& out) const {
        const Group& g = groups_.back();
        if (g.ours < 0) return false;
        out = best(g, g.rows[static_cast<std::size_t>(g.ours)].f);
        return true;
    }

    void print(std::FILE* out = stdout) const {
        fsched_bench::TextTable table;
        for (const Group& g : groups_) {
            if (g.rows.empty() && g.notes.empty()) continue;  // every row filtered out
            table.begin_group(g.title, {{"best " + g.unit, 12}, {"median", 12}, {"ours/x best", 11},
                                        {"ours/x med", 11}, {"work/rep", 12}, {"reps", 4}});
            for (const Row& row : g.rows) {
                if (row.f.failed) {
                    table.row(row.impl, {"failed"});
                    continue;
                }
                std::string ratio_best = "-", ratio_med = "-";
                if (g.ours >= 0) {
                    const Figures& ours = g.rows[static_cast<std::size_t>(g.ours)].f;
                    ratio_best = ratio(g, best(g, ours), best(g, row.f));
                    ratio_med = ratio(g, fsched_bench::median(ours.samples), fsched_bench::median(row.f.samples));
                }
                table.row(row.impl, {number(best(g, row.f)), number(fsched_bench::median(row.f.samples)), ratio_best,
                                     ratio_med, std::to_string(row.f.count), std::to_string(row.f.samples.size())});
            }
            for (const std::string& n : g.notes) table.note(n);
        }
        table.print(out);
        std::fprintf(out, "\nours/x is a ratio of times: < 1: fiber_sched is faster than x; > 1: slower.\n");
    }

private:
    struct Row {
        std::string impl;
        Figures f;
    };
    struct Group {
        std::string title;
        std::string unit;
        bool higher_is_better;
        std::vector<Row> rows;
        int ours;
        std::vector<std::string> notes;
    };

    static double best(const Group& g, const Figures& f) {
        return g.higher_is_better ? *std::max_element(f.samples.begin(), f.samples.end())
                                  : *std::min_element(f.samples.begin(), f.samples.end());
    }
    static std::string ratio(const Group& g, double ours, double x) {
        const double r = g.higher_is_better ? x / ours : ours / x;
        if (x == 0 && ours == 0) return "1.00";
        if (!g.higher_is_better && x == 0) return "inf";
        return fsched_bench::format(r < 0.01 ? "%.1e" : "%.2f", r);
    }
    static std::string number(double v) {
        return fsched_bench::format(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3f", v);
    }

    std::vector<Group> groups_;
};

// ---------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------

// Counts down from n; wait() blocks until zero. On std::mutex and std::condition_variable
// (Latch) it blocks the calling thread, for the baselines that run on plain threads
// (std::latch is C++20); on Boost.Fiber's (BoostLatch, below) it parks the calling fiber.
template <class Mutex, class ConditionVariable>
class BasicLatch {
public:
    explicit BasicLatch(std::int64_t n) : count_(n) {}
    void count_down() {
        if (count_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        std::lock_guard<Mutex> lock(mutex_);
        open_ = true;
        cv_.notify_all();  // under the lock: the waiter may destroy the latch once it sees open_
    }
    void wait() {
        std::unique_lock<Mutex> lock(mutex_);
        cv_.wait(lock, [this] { return open_; });
    }

private:
    std::atomic<std::int64_t> count_;
    Mutex mutex_;
    ConditionVariable cv_;
    bool open_ = false;
};

using Latch = BasicLatch<std::mutex, std::condition_variable>;

constexpr std::uint64_t skynet_expected(std::uint64_t leaves) { return leaves * (leaves - 1) / 2; }

// One child of a skynet node, in an array in the parent's frame. Tasks capture only a
// pointer to it, so every callback fits std::function's small buffer (16 bytes in
// libstdc++): no implementation pays a heap allocation per task for its closure.
template <class Done>
struct SkynetChild {
    std::uint64_t num = 0;     // the first leaf number under this child
    std::uint64_t leaves = 0;  // leaves under this child
    std::uint64_t result = 0;
    Done* done = nullptr;      // what the child signals when `result` is ready
};

// ---------------------------------------------------------------------------------------
// Baseline: a plain thread pool
// ---------------------------------------------------------------------------------------

using fsched_bench::ThreadPool;  // bench_util.hpp

// ---------------------------------------------------------------------------------------
// Baseline: the seed design (sylar's Scheduler, as described in the seed notes)
//
// One std::list of tasks under one mutex, shared by every thread. Each thread's loop scans
// the list for a task it may run (skipping fibers still Running: the seed's fix for a
// fiber scheduled before it finished switching out), runs a callback in a new Fiber (the
// seed resets its callback fiber after every task, so it makes one per callback), and when
// the list is empty resumes an idle fiber that yields straight back as long as the
// scheduler is not stopping: the thread busy-waits, taking the mutex twice a round.
// A fiber leaves the scheduler by Fiber::yield(); whoever holds its pointer schedules it
// again (that is how the seed's timers and IO wake fibers), so its fibers can block:
// SeedWaitGroup below is built that way.
// ---------------------------------------------------------------------------------------

class SeedScheduler {
public:
    struct Task {
        fsched::Fiber::ptr fiber;
        std::function<void()> cb;
        int thread = -1;
    };

    explicit SeedScheduler(std::size_t threads) : thread_count_(threads) {}
    ~SeedScheduler() { stop(); }

    void start() {
        std::lock_guard<std::mutex> lock(mutex_);
        for (std::size_t i = 0; i < thread_count_; ++i) {
            threads_.emplace_back([this, i] { run(static_cast<int>(i)); });
        }
    }

    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        for (std::thread& t : threads_) t.join();
        threads_.clear();
    }

    void schedule(fsched::Fiber::ptr fiber, int thread = -1) {
        std::lock_guard<std::mutex> lock(mutex_);
        tasks_.push_back(Task{std::move(fiber), nullptr, thread});
        // The seed calls tickle() when the list was empty; the base class's tickle() only logs.
    }
    void schedule(std::function<void()> cb, int thread = -1) {
        std::lock_guard<std::mutex> lock(mutex_);
        tasks_.push_back(Task{nullptr, std::move(cb), thread});
    }
    template <class It>
    void schedule(It first, It last) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (; first != last; ++first) tasks_.push_back(Task{nullptr, std::move(*first), -1});
    }

private:
    bool stopping() {
        std::lock_guard<std::mutex> lock(mutex_);
        return stopping_ && tasks_.empty() && active_.load() == 0;
    }

    void run(int thread) {
        auto idle_fiber = std::make_shared<fsched::Fiber>([this] {
            while (!stopping()) fsched::Fiber::yield();
        });
        fsched::Fiber::ptr cb_fiber;
        Task task;
        for (;;) {
            task = Task{};
            {
                std::lock_guard<std::mutex> lock(mutex_);
                for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
                    if (it->thread != -1 && it->thread != thread) continue;
                    if (it->fiber && it->fiber->state() == fsched::Fiber::State::Running) continue;
                    task = std::move(*it);
                    tasks_.erase(it);
                    ++active_;
                    break;
                }
            }
            if (task.fiber) {
                task.fiber->resume();
                --active_;
            } else if (task.cb) {
                cb_fiber = std::make_shared<fsched::Fiber>(std::move(task.cb));
                cb_fiber->resume();
                --active_;
                cb_fiber.reset();
            } else {
                if (idle_fiber->state() == fsched::Fiber::State::Term) break;
                ++idle_;
                idle_fiber->resume();
                --idle_;
            }
        }
    }

    std::size_t thread_count_;
    std::mutex mutex_;
    std::list<Task> tasks_;
    std::vector<std::thread> threads_;
    std::atomic<std::size_t> active_{0};
    std::atomic<std::size_t> idle_{0};
    bool stopping_ = false;  // under mutex_
};

// A WaitGroup for the seed design, built only from what the seed offers: the waiter keeps
// its own Fiber::ptr and yields out of the scheduler; whoever brings the count to zero
// schedules it again. The count starts one higher and wait() takes that one away, so
// exactly one side sees zero: done() (the waiter is parked, or about to be, and the
// loop's Running check holds it back until it is) or wait() (nothing to wait for).
class SeedWaitGroup {
public:
    SeedWaitGroup(SeedScheduler& scheduler, std::int64_t n) : scheduler_(scheduler), count_(n + 1) {}
    void done() {
        if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) scheduler_.schedule(waiter_);
    }
    void wait() {
        waiter_ = fsched::Fiber::current_ptr();
        if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            waiter_.reset();
            return;
        }
        fsched::Fiber::yield();
        waiter_.reset();
    }

private:
    SeedScheduler& scheduler_;
    std::atomic<std::int64_t> count_;
    fsched::Fiber::ptr waiter_;
};

// ---------------------------------------------------------------------------------------
// 1. spawn
// ---------------------------------------------------------------------------------------

using SpawnFn = std::function<double(std::uint64_t)>;  // runs one repetition; returns seconds

// Runs `reps` repetitions of `n` tasks, after one warm-up (threads running, stacks and
// allocator pools filled) unless the case is too slow to afford one; M tasks/s each.
Figures spawn_rates(std::uint64_t n, int reps, const SpawnFn& rep, bool warm_up = true) {
    Figures f;
    f.count = n;
    if (warm_up) rep(n);
    for (int r = 0; r < reps; ++r) f.samples.push_back(static_cast<double>(n) / rep(n) / 1e6);
    return f;
}

Figures spawn_fsched_go(std::uint64_t n, int reps) {
    fsched::Scheduler scheduler(2, false);
    scheduler.start();
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        const auto t0 = Clock::now();
        fsched::WaitGroup finished;
        finished.add(1);
        scheduler.schedule([&finished, count] {
            fsched::WaitGroup wg;
            wg.add(static_cast<std::int64_t>(count));
            fsched::Scheduler* self = fsched::Scheduler::current();
            for (std::uint64_t i = 0; i < count; ++i) self->schedule([&wg] { wg.done(); });
            wg.wait();
            finished.done();
        });
        finished.wait();
        return seconds_since(t0);
    });
}

Figures spawn_fsched_batch(std::uint64_t n, int reps) {
    fsched::Scheduler scheduler(2, false);
    scheduler.start();
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        fsched::WaitGroup wg;
        // The caller's data: built before the clock starts.
        std::vector<std::function<void()>> batch(count, [&wg] { wg.done(); });
        const auto t0 = Clock::now();
        wg.add(static_cast<std::int64_t>(count));
        scheduler.schedule(std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
        wg.wait();
        return seconds_since(t0);
    });
}

// A pool task cannot wait for other pool tasks without tying up a thread, so the spawning
// task returns once it has submitted them and the main thread waits on a latch.
Figures spawn_pool_go(std::uint64_t n, int reps) {
    ThreadPool pool(2);
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        const auto t0 = Clock::now();
        Latch done(static_cast<std::int64_t>(count));
        pool.submit([&pool, &done, count] {
            for (std::uint64_t i = 0; i < count; ++i) pool.submit([&done] { done.count_down(); });
        });
        done.wait();
        return seconds_since(t0);
    });
}

// One repetition of a baseline's batch case: `count` callbacks that count a Latch down,
// made before the clock starts (the caller's data, as in spawn_fsched_batch) and handed over
// in one submit(first, last); seconds until every one has run.
template <class Submit>
double latch_batch_seconds(std::uint64_t count, Submit&& submit) {
    Latch done(static_cast<std::int64_t>(count));
    std::vector<std::function<void()>> batch(count, [&done] { done.count_down(); });
    const auto t0 = Clock::now();
    submit(batch.begin(), batch.end());
    done.wait();
    return seconds_since(t0);
}

Figures spawn_pool_batch(std::uint64_t n, int reps) {
    ThreadPool pool(2);
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        return latch_batch_seconds(count, [&](auto first, auto last) { pool.submit(first, last); });
    });
}

Figures spawn_seed_go(std::uint64_t n, int reps) {
    SeedScheduler seed(2);
    seed.start();
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        const auto t0 = Clock::now();
        Latch finished(1);
        seed.schedule([&seed, &finished, count] {
            SeedWaitGroup wg(seed, static_cast<std::int64_t>(count));
            for (std::uint64_t i = 0; i < count; ++i) seed.schedule([&wg] { wg.done(); });
            wg.wait();
            finished.count_down();
        });
        finished.wait();
        return seconds_since(t0);
    }, false);
}

Figures spawn_seed_batch(std::uint64_t n, int reps) {
    SeedScheduler seed(2);
    seed.start();
    return spawn_rates(n, reps, [&](std::uint64_t count) {
        return latch_batch_seconds(count, [&](auto first, auto last) { seed.schedule(first, last); });
    }, false);
}

// ---------------------------------------------------------------------------------------
// 2. skynet
// ---------------------------------------------------------------------------------------

// Each node is a task: it schedules its 10 children and waits for them on a WaitGroup.
void skynet_fsched(SkynetChild<fsched::WaitGroup>* node) {
    if (node->leaves == 1) {
        node->result = node->num;
        return;
    }
    SkynetChild<fsched::WaitGroup> children[10];
    fsched::WaitGroup wg;
    wg.add(10);
    const std::uint64_t step = node->leaves / 10;
    fsched::Scheduler* scheduler = fsched::Scheduler::current();
    for (int i = 0; i < 10; ++i) {
        SkynetChild<fsched::WaitGroup>* child = &children[i];
        *child = {node->num + static_cast<std::uint64_t>(i) * step, step, 0, &wg};
        scheduler->schedule([child] {
            skynet_fsched(child);
            child->done->done();
        });
    }
    wg.wait();
    std::uint64_t sum = 0;
    for (const auto& child : children) sum += child.result;
    node->result = sum;
}

// Runs one skynet of `leaves` leaves per repetition, after a warm-up unless the case is
// too slow to afford one; ms per repetition. `tree(leaves)` returns the total, checked
// against the expected sum.
Figures skynet_times(std::uint64_t leaves, int reps, const std::function<std::uint64_t(std::uint64_t)>& tree,
                     bool warm_up = true) {
    Figures f;
    f.count = leaves;
    for (int r = warm_up ? -1 : 0; r < reps; ++r) {  // r == -1: warm-up
        const auto t0 = Clock::now();
        const std::uint64_t total = tree(leaves);
        const double ms = seconds_since(t0) * 1e3;
        if (total != skynet_expected(leaves)) {
            std::fprintf(stderr, "skynet: wrong total %llu, expected %llu\n", static_cast<unsigned long long>(total),
                         static_cast<unsigned long long>(skynet_expected(leaves)));
            f.failed = true;
            return f;
        }
        if (r >= 0) f.samples.push_back(ms);
    }
    return f;
}

Figures skynet_fsched_run(std::uint64_t leaves, int reps) {
    fsched::Scheduler scheduler(2, false);
    scheduler.start();
    return skynet_times(leaves, reps, [&](std::uint64_t n) {
        SkynetChild<fsched::WaitGroup> root{0, n, 0, nullptr};
        fsched::WaitGroup finished;
        finished.add(1);
        scheduler.schedule([&] {
            skynet_fsched(&root);
            finished.done();
        });
        finished.wait();
        return root.result;
    });
}

// The thread pool in continuation style (a pool task that blocked on its children would
// hold a thread; two such and the pool deadlocks): a node allocates its state, submits its
// children and returns; each child adds its result to the parent's sum, and the child that
// completes the last one completes the parent in turn.
struct PoolNode {
    ThreadPool* pool;
    PoolNode* parent;
    std::atomic<std::uint64_t> sum{0};
    std::atomic<int> pending{10};
    Latch* root_done = nullptr;  // the root only
    std::uint64_t* root_result = nullptr;
};

void pool_report(PoolNode* node, std::uint64_t value) {
    while (node) {
        node->sum.fetch_add(value, std::memory_order_relaxed);
        if (node->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        value = node->sum.load(std::memory_order_relaxed);
        PoolNode* parent = node->parent;
        if (!parent) {
            *node->root_result = value;
            Latch* done = node->root_done;
            delete node;
            done->count_down();
            return;
        }
        delete node;
        node = parent;
    }
}

// Submits the 10 children of `node`, the first leaf under it being `num`.
void skynet_pool_children(PoolNode* node, std::uint64_t num, std::uint64_t leaves);

void skynet_pool_node(PoolNode* parent, std::uint64_t num, std::uint64_t leaves) {
    if (leaves == 1) {
        pool_report(parent, num);
        return;
    }
    skynet_pool_children(new PoolNode{parent->pool, parent}, num, leaves);
}

void skynet_pool_children(PoolNode* node, std::uint64_t num, std::uint64_t leaves) {
    const std::uint64_t step = leaves / 10;
    for (int i = 0; i < 10; ++i) {
        // The parent and the child's two numbers in 32-bit halves: 16 bytes of capture,
        // within std::function's small buffer.
        struct Args {
            PoolNode* node;
            std::uint32_t num;
            std::uint32_t leaves;
        };
        const Args args{node, static_cast<std::uint32_t>(num + static_cast<std::uint64_t>(i) * step),
                        static_cast<std::uint32_t>(step)};
        node->pool->submit([args] { skynet_pool_node(args.node, args.num, args.leaves); });
    }
}

Figures skynet_pool_run(std::uint64_t leaves, int reps) {
    ThreadPool pool(2);
    return skynet_times(leaves, reps, [&](std::uint64_t n) {
        std::uint64_t result = 0;
        Latch done(1);
        auto* root = new PoolNode{&pool, nullptr};
        root->root_done = &done;
        root->root_result = &result;
        pool.submit([root, n] { skynet_pool_children(root, 0, n); });
        done.wait();
        return result;
    });
}

// The seed design runs the same blocking code as fsched's: its fibers park by yielding out
// and the last child schedules the parent again (SeedWaitGroup).
void skynet_seed(SeedScheduler& seed, SkynetChild<SeedWaitGroup>* node) {
    if (node->leaves == 1) {
        node->result = node->num;
        return;
    }
    SkynetChild<SeedWaitGroup> children[10];
    SeedWaitGroup wg(seed, 10);
    const std::uint64_t step = node->leaves / 10;
    for (int i = 0; i < 10; ++i) {
        SkynetChild<SeedWaitGroup>* child = &children[i];
        *child = {node->num + static_cast<std::uint64_t>(i) * step, step, 0, &wg};
        seed.schedule([&seed, child] {
            skynet_seed(seed, child);
            child->done->done();
        });
    }
    wg.wait();
    std::uint64_t sum = 0;
    for (const auto& child : children) sum += child.result;
    node->result = sum;
}

Figures skynet_seed_run(std::uint64_t leaves, int reps) {
    SeedScheduler seed(2);
    seed.start();
    return skynet_times(leaves, reps, [&](std::uint64_t n) {
        SkynetChild<SeedWaitGroup> root{0, n, 0, nullptr};
        Latch finished(1);
        seed.schedule([&] {
            skynet_seed(seed, &root);
            finished.count_down();
        });
        finished.wait();
        return root.result;
    }, false);
}

// ---------------------------------------------------------------------------------------
// 3. yield
// ---------------------------------------------------------------------------------------

// ns per yield for one repetition of `run(yields_per_fiber)`, which returns seconds.
Figures yield_times(std::uint64_t per_fiber, int reps, const std::function<double(std::uint64_t)>& run) {
    Figures f;
    f.count = 2 * per_fiber;
    run(per_fiber / 10 + 1);  // warm-up
    for (int r = 0; r < reps; ++r) f.samples.push_back(run(per_fiber) * 1e9 / static_cast<double>(2 * per_fiber));
    return f;
}

Figures yield_fsched(std::uint64_t per_fiber, int reps) {
    fsched::Scheduler scheduler(1, false);
    scheduler.start();
    return yield_times(per_fiber, reps, [&](std::uint64_t n) {
        fsched::WaitGroup wg;
        wg.add(2);
        std::uint64_t count = 0;
        auto body = [&wg, &count, n] {
            for (std::uint64_t i = 0; i < n; ++i) {
                ++count;
                fsched::this_fiber::yield();
            }
            wg.done();
        };
        const auto t0 = Clock::now();
        scheduler.schedule(body);
        scheduler.schedule(body);
        wg.wait();
        const double s = seconds_since(t0);
        sink = count;
        return s;
    });
}

// The seed's yield: put the running fiber back on the list, then leave.
Figures yield_seed(std::uint64_t per_fiber, int reps) {
    SeedScheduler seed(1);
    seed.start();
    return yield_times(per_fiber, reps, [&](std::uint64_t n) {
        Latch done(2);
        std::uint64_t count = 0;
        auto body = [&seed, &done, &count, n] {
            for (std::uint64_t i = 0; i < n; ++i) {
                ++count;
                seed.schedule(fsched::Fiber::current_ptr());
                fsched::Fiber::yield();
            }
            done.count_down();
        };
        const auto t0 = Clock::now();
        seed.schedule(body);
        seed.schedule(body);
        done.wait();
        const double s = seconds_since(t0);
        sink = count;
        return s;
    });
}

// ---------------------------------------------------------------------------------------
// 4. idle CPU
// ---------------------------------------------------------------------------------------

// An idle case's one figure: the CPU ms the process uses while the main thread is in sleep().
template <class Sleep>
Figures idle_figures(Sleep&& sleep) {
    Figures f;
    f.count = 1;
    const double c0 = process_cpu_ms();
    sleep();
    f.samples.push_back(process_cpu_ms() - c0);
    return f;
}

void sleep_seconds(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// Two windows of idleness on one scheduler, one after the other. The first includes what the
// process's earlier cases left for idle workers to give back (the stack pool's surplus of a
// burst, unmapped once unused for FIBER_SCHED_STACK_TRIM_MS: a one-time cost, 3-150 ms of
// CPU by the host, mostly the kernel's); the second is the scheduler idle and nothing else.
struct IdleWindows {
    Figures first;
    Figures steady;
};

IdleWindows idle_fsched(double idle_seconds) {
    fsched::Scheduler scheduler(2, false);
    scheduler.start();
    fsched::WaitGroup wg;
    wg.add(1);
    scheduler.schedule([&wg] { wg.done(); });
    wg.wait();
    IdleWindows w;
    w.first = idle_figures([idle_seconds] { sleep_seconds(idle_seconds); });
    w.steady = idle_figures([idle_seconds] { sleep_seconds(idle_seconds); });
    scheduler.stop();
    return w;
}

Figures idle_seed(double idle_seconds) {
    SeedScheduler seed(2);
    seed.start();
    Latch done(1);
    seed.schedule([&done] { done.count_down(); });
    done.wait();
    const Figures f = idle_figures([idle_seconds] { sleep_seconds(idle_seconds); });
    seed.stop();
    return f;
}

// ---------------------------------------------------------------------------------------
// Boost.Fiber, each case in a forked child process
// ---------------------------------------------------------------------------------------

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
// One Boost.Fiber case in a forked child process (fsched_bench::ChildProcess): the
// constructor forks, collect() waits for the child's figures. The parent has no other
// threads when it forks (every scheduler above is stopped before the next case starts). The
// child sends its samples through the pipe and leaves with _exit(), without tearing down
// Boost's work_stealing schedulers (one thread's teardown can race the other's stealing).
class FiguresChild {
public:
    explicit FiguresChild(const std::function<Figures()>& fn)
        : child_([&fn](int fd) {
              alarm(120);  // a hung baseline must not hang the benchmark
              const Figures f = fn();
              const std::uint64_t header[2] = {f.count, f.failed ? ~std::uint64_t{0} : f.samples.size()};
              const bool ok = fsched_bench::write_all(fd, header, sizeof header) &&
                              fsched_bench::write_all(fd, f.samples.data(), f.samples.size() * sizeof(double));
              return ok ? 0 : 1;
          }) {}

    // The child's figures (failed if it crashed, hung or could not start). Once.
    Figures collect() {
        Figures f;
        std::uint64_t header[2] = {0, 0};
        bool ok = child_.read(header, sizeof header) && header[1] != ~std::uint64_t{0} && header[1] < 100000;
        if (ok) {
            f.count = header[0];
            f.samples.resize(header[1]);
            ok = child_.read(f.samples.data(), f.samples.size() * sizeof(double));
        }
        f.failed = !child_.wait() || !ok || f.samples.empty();
        return f;
    }

private:
    fsched_bench::ChildProcess child_;
};

Figures in_child_process(const std::function<Figures()>& fn) { return FiguresChild(fn).collect(); }

namespace bf = boost::fibers;

// The calling thread and one helper thread, both on work_stealing(2): the calling thread
// takes part (its main fiber runs the benchmark), the helper only runs fibers. Once per
// process: work_stealing registers its schedulers in statics.
class BoostPool {
public:
    explicit BoostPool(bool suspend) {
        helper_ = std::thread([this, suspend] {
            bf::use_scheduling_algorithm<bf::algo::work_stealing>(2, suspend);
            std::unique_lock<bf::mutex> lock(mutex_);
            cv_.wait(lock, [this] { return quit_; });
        });
        // Its constructor waits at a barrier until both threads have registered.
        bf::use_scheduling_algorithm<bf::algo::work_stealing>(2, suspend);
    }
    // Never destroyed: the helper runs until the child process ends with _exit() (see
    // in_child_process); make() leaks it on purpose.
    static BoostPool& make(bool suspend) { return *new BoostPool(suspend); }

private:
    std::thread helper_;
    bf::mutex mutex_;
    bf::condition_variable cv_;
    bool quit_ = false;
};

using BoostLatch = BasicLatch<bf::mutex, bf::condition_variable>;

Figures spawn_boost(std::uint64_t n, int reps) {
    return in_child_process([n, reps] {
        BoostPool::make(false);
        return spawn_rates(n, reps, [](std::uint64_t count) {
            const auto t0 = Clock::now();
            BoostLatch done(static_cast<std::int64_t>(count));
            for (std::uint64_t i = 0; i < count; ++i) bf::fiber([&done] { done.count_down(); }).detach();
            done.wait();
            return seconds_since(t0);
        }, false);
    });
}

std::uint64_t skynet_boost(std::uint64_t num, std::uint64_t leaves) {
    if (leaves == 1) return num;
    std::uint64_t results[10];
    bf::fiber children[10];
    const std::uint64_t step = leaves / 10;
    for (int i = 0; i < 10; ++i) {
        children[i] = bf::fiber([&results, i, num, step] {
            results[i] = skynet_boost(num + static_cast<std::uint64_t>(i) * step, step);
        });
    }
    for (bf::fiber& child : children) child.join();
    std::uint64_t sum = 0;
    for (std::uint64_t r : results) sum += r;
    return sum;
}

Figures skynet_boost_run(std::uint64_t leaves, int reps) {
    return in_child_process([leaves, reps] {
        BoostPool::make(false);
        return skynet_times(leaves, reps, [](std::uint64_t n) { return skynet_boost(0, n); }, false);
    });
}

Figures yield_boost(std::uint64_t per_fiber, int reps) {
    // On a fresh thread: its scheduler has the default round_robin algorithm.
    Figures f;
    std::thread t([&] {
        f = yield_times(per_fiber, reps, [](std::uint64_t n) {
            std::uint64_t count = 0;
            auto body = [&count, n] {
                for (std::uint64_t i = 0; i < n; ++i) {
                    ++count;
                    boost::this_fiber::yield();
                }
            };
            const auto t0 = Clock::now();
            bf::fiber a(body), b(body);
            a.join();
            b.join();
            const double s = seconds_since(t0);
            sink = count;
            return s;
        });
    });
    t.join();
    return f;
}

// Runs in a child process (see FiguresChild): sets up this process's one work_stealing pool.
Figures idle_boost_here(double idle_seconds, bool suspend) {
    BoostPool::make(suspend);
    bf::fiber([] {}).join();
    // The main fiber sleeps in Boost's scheduler, so both threads are idle in it.
    const auto idle = std::chrono::nanoseconds(static_cast<std::int64_t>(idle_seconds * 1e9));
    return idle_figures([idle] { boost::this_fiber::sleep_for(idle); });
}

Figures idle_boost(double idle_seconds, bool suspend) {
    return in_child_process([idle_seconds, suspend] { return idle_boost_here(idle_seconds, suspend); });
}
#endif

// ---------------------------------------------------------------------------------------
// Go, through the twins in bench/go/scheduler.go
// ---------------------------------------------------------------------------------------

// One case of the Go twins (fsched_bench::run_go_twin), as a row's figures.
Figures go_figures(const std::vector<std::string>& args) {
    const fsched_bench::GoResult r = fsched_bench::run_go_twin(args);
    Figures f;
    f.failed = !r.ok;
    f.count = r.work;
    f.samples = r.samples;
    return f;
}

// "target: <what> (<= x unit); fiber_sched best y unit: met / NOT met".
void target_note(FigureTable& table, const std::string& what, double target, bool higher_is_better,
                 const char* unit) {
    double ours = 0;
    if (!table.ours_best(ours)) return;
    const bool met = higher_is_better ? ours >= target : ours <= target;
    table.note(fsched_bench::format("target: %s (%s %.3g %s); fiber_sched best %.3g %s: %s", what.c_str(),
                                    higher_is_better ? ">=" : "<=", target, unit, ours, unit, met ? "met" : "NOT met"));
}

}  // namespace

int main(int argc, char** argv) {
    // Options::parse() fills in defaults meant for calibrated ns/op loops; here they only
    // override our fixed sizes when given on the command line.
    bool reps_given = false, iters_given = false;
    for (int i = 1; i < argc; ++i) {
        reps_given = reps_given || std::strcmp(argv[i], "--reps") == 0;
        iters_given = iters_given || std::strcmp(argv[i], "--iters") == 0;
    }
    Options opt;
    if (!opt.parse(argc, argv)) return 2;
    const Sizes sz = sizes_for(opt, reps_given, iters_given);

    const std::string boost =
        fsched_bench::boost_note(FIBER_SCHED_BENCH_HAVE_BOOST_FIBER, "", "Boost.Fiber not found, its rows are skipped");
    std::printf("%s%s%s; %u hardware threads\n%s; repetitions in the reps column, each case after one warm-up "
                "except the slow seed-design and Boost.Fiber spawn and skynet rows; best and median shown\n",
                fsched_bench::build_line("bench_scheduler").c_str(), boost.c_str(), fsched_bench::go_note().c_str(),
                std::thread::hardware_concurrency(), opt.quick ? "--quick: tiny counts, the numbers are noise" : "full run");
    std::fflush(stdout);

    FigureTable table;
    auto run = [&](const char* group, const char* impl, bool ours, auto&& fn) {
        const std::string name = std::string(group) + "/" + impl;
        if (!opt.selected(name)) return;
        table.add(impl, fn(), ours);
    };
    const auto n = sz.spawn_tasks;
    const auto nb = sz.spawn_tasks_boost;
    const int reps = sz.reps;
    const int slow = sz.reps_slow;
    // The Go rows run when the twins were built and answer; each is named here once, for its
    // row and for the target computed from it.
    const bool go = fsched_bench::have_go();
    const std::string go_spawn = "Go, go f() from a goroutine + WaitGroup";
    const std::string go_skynet = "Go, goroutines, WaitGroup per node";
    const std::string go_yield = "Go runtime.Gosched(), GOMAXPROCS=1";
    auto run_go = [&](const char* group, const std::string& impl, std::vector<std::string> args) {
        if (go) run(group, impl.c_str(), false, [&] { return go_figures(args); });
    };
    auto str = [](auto v) { return std::to_string(v); };
    // Why a reference figure stands in for Go's row `impl` in the current group.
    auto no_go = [&](const std::string& impl) -> std::string {
        return !go ? "Go not run, see the first line" : table.has_row(impl) ? "the Go row failed" : "the Go row filtered out";
    };

    table.begin_group("spawn: empty tasks on 2 threads, then wait for all; M tasks/s (higher is better)",
                      "M/s", true);
    run("spawn", "fsched, from a task + WaitGroup", true, [&] { return spawn_fsched_go(n, reps); });
    run("spawn", "fsched, batch from main thread", false, [&] { return spawn_fsched_batch(n, reps); });
    // No Go twin of the batch: Go has no batch submission, and its main goroutine is an
    // ordinary one on one of the Ps, so `go f()` from main is the row above again.
    run_go("spawn", go_spawn, {"spawn", "-procs", "2", "-n", str(n), "-reps", str(reps)});
    run("spawn", "thread pool, from a task", false, [&] { return spawn_pool_go(n, reps); });
    run("spawn", "thread pool, batch", false, [&] { return spawn_pool_batch(n, reps); });
    run("spawn", "seed design, from a task", false, [&] { return spawn_seed_go(n, slow); });
    run("spawn", "seed design, batch", false, [&] { return spawn_seed_batch(n, slow); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    run("spawn", "Boost.Fiber work_stealing", false, [&] { return spawn_boost(nb, slow); });
#else
    (void)nb;
#endif
    double go_best = 0;
    if (table.best_of(go_spawn, go_best)) {
        table.note("reference (measured by the project on this machine kind, not in this run): "
                   "marl 4.7, Boost.Fiber 0.15 M tasks/s");
        target_note(table, "1.2x Go's rate in this run", 1.2 * go_best, true, "M/s");
    } else {
        table.note("reference (measured by the project on this machine kind, not in this run; " + no_go(go_spawn) +
                   "): Go 9.5, marl 4.7, Boost.Fiber 0.15 M tasks/s");
        target_note(table, "at least Go's rate", 9.5, true, "M/s");
    }

    table.begin_group("skynet: 10 children per node, blocking wait in each node, 2 threads; ms (lower is better)",
                      "ms", false);
    run("skynet", "fsched, WaitGroup per node", true,
        [&] { return skynet_fsched_run(sz.skynet_leaves, sz.reps_skynet); });
    run_go("skynet", go_skynet,
           {"skynet", "-procs", "2", "-leaves", str(sz.skynet_leaves), "-reps", str(sz.reps_skynet)});
    run("skynet", "thread pool, continuations", false,
        [&] { return skynet_pool_run(sz.skynet_leaves, sz.reps_skynet); });
    run("skynet", "seed design, parking fibers", false,
        [&] { return skynet_seed_run(sz.skynet_leaves, sz.reps_skynet_slow); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    run("skynet", "Boost.Fiber work_stealing", false,
        [&] { return skynet_boost_run(sz.skynet_leaves, sz.reps_skynet_slow); });
#endif
    table.note(fsched_bench::format("total checked: %.0f; work/rep is the leaf count", static_cast<double>(skynet_expected(sz.skynet_leaves))));
    if (table.best_of(go_skynet, go_best)) {
        table.note("reference (project, not this run, 1,000,000 leaves): marl 1538, Boost.Fiber 2555 ms");
        target_note(table, "0.8x Go's time in this run", 0.8 * go_best, false, "ms");
    } else {
        table.note("reference (project, not this run, 1,000,000 leaves; " + no_go(go_skynet) +
                   "): Go 484, marl 1538, Boost.Fiber 2555 ms");
        if (sz.skynet_leaves == 1000000) target_note(table, "no slower than Go", 484, false, "ms");
    }

    table.begin_group("yield: two fibers alternating on 1 thread; ns per yield (lower is better)", "ns", false);
    run("yield", "fsched this_fiber::yield", true, [&] { return yield_fsched(sz.yields_per_fiber, reps); });
    run("yield", "seed design (schedule self + yield)", false, [&] { return yield_seed(sz.yields_per_fiber, slow); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    run("yield", "Boost.Fiber round_robin", false, [&] { return yield_boost(sz.yields_per_fiber, reps); });
#endif
    run_go("yield", go_yield, {"gosched", "-procs", "1", "-n", str(sz.yields_per_fiber), "-reps", str(reps)});
    {
        // Half of the faster of Boost.Fiber and Go, each as measured here when it ran, else
        // the project's reference figure for it.
        double boost_best = 46, go_yield_best = 48;
        const bool boost_here = table.best_of("Boost.Fiber round_robin", boost_best);
        const bool go_here = table.best_of(go_yield, go_yield_best);
        std::string refs;
        if (!boost_here) refs += "Boost.Fiber 46";
        if (!go_here) refs += std::string(refs.empty() ? "" : ", ") + "Go 48";
        if (!refs.empty()) table.note("reference (project, not this run): " + refs + " ns");
        const char* what = boost_here && go_here ? "half of Boost.Fiber's and Go's in this run"
                           : boost_here || go_here ? "half of Boost.Fiber's and Go's (one of them from this run)"
                                                  : "half of Boost.Fiber's and Go's";
        target_note(table, what, std::min(boost_best, go_yield_best) / 2, false, "ns");
    }

    table.begin_group(fsched_bench::format("idle CPU: 2-thread scheduler idle for %.1f s after one task; CPU ms used (lower is better)",
                             sz.idle_seconds),
                      "ms", false);
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    // Boost.Fiber's suspending idle runs in its child process while fsched's runs here:
    // neither uses a measurable amount of CPU, so they cannot disturb each other, and the
    // full run is one idle period shorter. (The busy-idle rows each get the machine alone.)
    const char* boost_suspend = "Boost.Fiber work_stealing, suspend";
    std::unique_ptr<FiguresChild> boost_suspend_idle;
    if (opt.selected(std::string("idle/") + boost_suspend)) {
        boost_suspend_idle = std::make_unique<FiguresChild>([&] { return idle_boost_here(sz.idle_seconds, true); });
    }
#endif
    const char* fsched_first_window = "fsched, the window before (earlier cases' stacks given back)";
    IdleWindows fsched_idle;
    if (opt.selected("idle/fsched") || opt.selected(std::string("idle/") + fsched_first_window)) {
        fsched_idle = idle_fsched(sz.idle_seconds);
    }
    run("idle", "fsched", true, [&] { return fsched_idle.steady; });
    run("idle", fsched_first_window, false, [&] { return fsched_idle.first; });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    Figures boost_suspend_figures;
    if (boost_suspend_idle) boost_suspend_figures = boost_suspend_idle->collect();
#endif
    run("idle", "seed design (busy idle)", false, [&] { return idle_seed(sz.idle_seconds); });
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    run("idle", "Boost.Fiber work_stealing (default)", false, [&] { return idle_boost(sz.idle_seconds, false); });
    if (boost_suspend_idle) table.add(boost_suspend, std::move(boost_suspend_figures));
#endif
    target_note(table, "at most 1 ms of CPU per 2 s idle", sz.idle_seconds / 2.0, false, "ms");

    table.print();
    // A failed row fails the run: CTest's --quick smoke test is how CI notices a broken case.
    return table.any_failed() ? 1 : 0;
}
