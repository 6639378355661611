// bench_frame.cpp — a game frame's job graph (examples/game_frame.cpp's shape) on 2 workers,
// fiber_sched beside a std::thread pool with std::future and Boost.Fiber, in one run.
//
// Each frame: 256 "physics" jobs; then 128 "animation" jobs (after physics); then 64
// "culling" jobs (after animation); plus one High-priority job and one job that must run on
// the main thread. Two workloads:
//   - small jobs (each ~1 µs of arithmetic on 64 floats): frame time p50 / p99 over the frames;
//   - empty jobs: the frame's time divided by its 450 jobs, the per-job cost of scheduling,
//     waking and joining (on 2 workers, so two jobs are in flight at once).
// Implementations, each with 2 threads doing jobs:
//   - fiber_sched: Scheduler(2, use_caller = true): the main thread is worker 0 and runs jobs
//     while it waits on each stage's WaitGroup; the main-thread job is pinned to worker 0
//     and the urgent job is Priority::High;
//   - thread pool: 2 std::threads on one std::mutex + std::condition_variable + std::deque
//     of std::packaged_task; the main thread submits and blocks on each stage's futures, and
//     runs the main-thread job itself; FIFO, so the urgent job queues behind physics;
//   - Boost.Fiber (when CMake found it): work_stealing on 2 threads, the main thread one of
//     them (its main fiber waits on a fiber latch per stage, and runs the main-thread job),
//     in a child process like bench_scheduler's Boost cases; no priorities either.
// "urgent at" is how many physics jobs finished between the urgent job's scheduling (after
// all of physics) and its run, median over the frames: the ones that overtook it.
//
// Usage: bench_frame [--quick] [--reps N] [--iters FRAMES] [--filter TEXT]
//   --iters sets the frames per workload (default 1000; --quick: 20); --reps is ignored.
// Results: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_util.hpp"

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/fiber/all.hpp>
#endif

namespace {

using fsched_bench::Clock;
using fsched_bench::format;

constexpr int physics_jobs = 256, animation_jobs = 128, culling_jobs = 64;
constexpr int jobs_per_frame = physics_jobs + animation_jobs + culling_jobs + 2;
constexpr int floats_per_job = 64;

// One job's work: `n` floats of arithmetic (0: an empty job).
struct Work {
    int n;
    std::vector<float> data = std::vector<float>(static_cast<std::size_t>(physics_jobs) * floats_per_job, 1.0f);
    std::vector<float> physics = std::vector<float>(physics_jobs), animation = std::vector<float>(animation_jobs);
    std::vector<float> culling = std::vector<float>(culling_jobs);

    float chunk(int c) {
        float sum = 0;
        float* v = &data[static_cast<std::size_t>(c) * floats_per_job];
        for (int i = 0; i < n; ++i) {
            v[i] = v[i] * 0.999f + std::sin(v[i] + 0.016f);
            sum += v[i];
        }
        return sum;
    }
    void physics_job(int c) { physics[static_cast<std::size_t>(c)] = chunk(c); }
    void animation_job(int a) {
        animation[static_cast<std::size_t>(a)] =
            physics[static_cast<std::size_t>(2 * a)] * 0.5f + physics[static_cast<std::size_t>(2 * a + 1)] * 0.5f;
        if (n) animation[static_cast<std::size_t>(a)] += chunk(a) * 1e-6f;
    }
    void culling_job(int k) {
        culling[static_cast<std::size_t>(k)] =
            animation[static_cast<std::size_t>(2 * k)] + animation[static_cast<std::size_t>(2 * k + 1)];
        if (n) culling[static_cast<std::size_t>(k)] += chunk(k) * 1e-6f;
    }
};

// Frame times and where the urgent job landed, per frame.
struct Figures {
    std::vector<double> frame_ms;
    std::vector<double> urgent_rank;
    bool failed = false;
};

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size())));
    return v[i];
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// --- fiber_sched ---------------------------------------------------------------------------

Figures frames_fsched(int frames, int n) {
    Figures f;
    Work w{n};
    fsched::Scheduler s(2, true, "frame");
    s.start();
    const std::thread::id main_thread = std::this_thread::get_id();
    for (int frame = 0; frame < frames; ++frame) {
        const auto t0 = Clock::now();
        std::atomic<int> physics_done{0};
        fsched::WaitGroup physics(physics_jobs + 2);
        for (int c = 0; c < physics_jobs; ++c) {
            s.schedule([&, c] {
                w.physics_job(c);
                physics_done.fetch_add(1, std::memory_order_relaxed);
                physics.done();
            });
        }
        const int done_before = physics_done.load(std::memory_order_relaxed);
        int rank = 0;
        s.schedule([&] {
            rank = physics_done.load(std::memory_order_relaxed) - done_before;
            physics.done();
        }, -1, fsched::Priority::High);
        bool on_main = false;
        s.schedule([&] {
            on_main = std::this_thread::get_id() == main_thread;
            physics.done();
        }, 0);
        physics.wait();
        fsched::WaitGroup animation(animation_jobs);
        for (int a = 0; a < animation_jobs; ++a) {
            s.schedule([&, a] {
                w.animation_job(a);
                animation.done();
            });
        }
        animation.wait();
        fsched::WaitGroup culling(culling_jobs);
        for (int k = 0; k < culling_jobs; ++k) {
            s.schedule([&, k] {
                w.culling_job(k);
                culling.done();
            });
        }
        culling.wait();
        f.frame_ms.push_back(ms_since(t0));
        f.urgent_rank.push_back(rank);
        f.failed = f.failed || !on_main;
    }
    s.stop();
    return f;
}

// --- a std::thread pool with std::future -----------------------------------------------------

class FuturePool {
public:
    explicit FuturePool(int threads) {
        for (int i = 0; i < threads; ++i) {
            threads_.emplace_back([this] {
                for (;;) {
                    std::packaged_task<void()> task;
                    {
                        std::unique_lock<std::mutex> lock(mutex_);
                        cv_.wait(lock, [this] { return quit_ || !queue_.empty(); });
                        if (queue_.empty()) return;
                        task = std::move(queue_.front());
                        queue_.pop_front();
                    }
                    task();
                }
            });
        }
    }
    ~FuturePool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            quit_ = true;
        }
        cv_.notify_all();
        for (std::thread& t : threads_) t.join();
    }
    std::future<void> submit(std::function<void()> fn) {
        std::packaged_task<void()> task(std::move(fn));
        std::future<void> result = task.get_future();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            queue_.push_back(std::move(task));
        }
        cv_.notify_one();
        return result;
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::packaged_task<void()>> queue_;
    bool quit_ = false;
    std::vector<std::thread> threads_;
};

Figures frames_pool(int frames, int n) {
    Figures f;
    Work w{n};
    FuturePool pool(2);
    std::vector<std::future<void>> futures;
    futures.reserve(physics_jobs + 1);
    for (int frame = 0; frame < frames; ++frame) {
        const auto t0 = Clock::now();
        std::atomic<int> physics_done{0};
        futures.clear();
        for (int c = 0; c < physics_jobs; ++c) {
            futures.push_back(pool.submit([&, c] {
                w.physics_job(c);
                physics_done.fetch_add(1, std::memory_order_relaxed);
            }));
        }
        const int done_before = physics_done.load(std::memory_order_relaxed);
        int rank = 0;
        futures.push_back(
            pool.submit([&] { rank = physics_done.load(std::memory_order_relaxed) - done_before; }));
        fsched_bench::sink = fsched_bench::sink + 1;  // the main-thread job, run here
        for (auto& fu : futures) fu.get();
        futures.clear();
        for (int a = 0; a < animation_jobs; ++a) futures.push_back(pool.submit([&, a] { w.animation_job(a); }));
        for (auto& fu : futures) fu.get();
        futures.clear();
        for (int k = 0; k < culling_jobs; ++k) futures.push_back(pool.submit([&, k] { w.culling_job(k); }));
        for (auto& fu : futures) fu.get();
        f.frame_ms.push_back(ms_since(t0));
        f.urgent_rank.push_back(rank);
    }
    return f;
}

// --- Boost.Fiber -----------------------------------------------------------------------------

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
namespace bf = boost::fibers;

class BoostLatch {
public:
    explicit BoostLatch(int n) : n_(n) {}
    void count_down() {
        std::unique_lock<bf::mutex> lock(mutex_);
        if (--n_ == 0) cv_.notify_all();
    }
    void wait() {
        std::unique_lock<bf::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return n_ == 0; });
    }

private:
    bf::mutex mutex_;
    bf::condition_variable cv_;
    int n_;
};

Figures frames_boost_here(int frames, int n) {
    // The calling thread and one helper on work_stealing(2); never torn down (the child
    // process ends with _exit, see bench_scheduler's BoostPool).
    new std::thread([] {
        bf::use_scheduling_algorithm<bf::algo::work_stealing>(2, true);
        bf::mutex m;
        bf::condition_variable cv;
        std::unique_lock<bf::mutex> lock(m);
        cv.wait(lock, [] { return false; });
    });
    bf::use_scheduling_algorithm<bf::algo::work_stealing>(2, true);
    Figures f;
    Work w{n};
    for (int frame = 0; frame < frames; ++frame) {
        const auto t0 = Clock::now();
        std::atomic<int> physics_done{0};
        BoostLatch physics(physics_jobs + 1);
        for (int c = 0; c < physics_jobs; ++c) {
            bf::fiber([&, c] {
                w.physics_job(c);
                physics_done.fetch_add(1, std::memory_order_relaxed);
                physics.count_down();
            }).detach();
        }
        const int done_before = physics_done.load(std::memory_order_relaxed);
        int rank = 0;
        bf::fiber([&] {
            rank = physics_done.load(std::memory_order_relaxed) - done_before;
            physics.count_down();
        }).detach();
        fsched_bench::sink = fsched_bench::sink + 1;  // the main-thread job, run here
        physics.wait();
        BoostLatch animation(animation_jobs);
        for (int a = 0; a < animation_jobs; ++a) {
            bf::fiber([&, a] {
                w.animation_job(a);
                animation.count_down();
            }).detach();
        }
        animation.wait();
        BoostLatch culling(culling_jobs);
        for (int k = 0; k < culling_jobs; ++k) {
            bf::fiber([&, k] {
                w.culling_job(k);
                culling.count_down();
            }).detach();
        }
        culling.wait();
        f.frame_ms.push_back(ms_since(t0));
        f.urgent_rank.push_back(rank);
    }
    return f;
}

// In a child process: work_stealing keeps per-process statics (see bench_scheduler.cpp).
Figures frames_boost(int frames, int n) {
    fsched_bench::ChildProcess child([frames, n](int fd) {
        alarm(300);
        const Figures f = frames_boost_here(frames, n);
        const std::uint64_t count = f.frame_ms.size();
        const bool ok = fsched_bench::write_all(fd, &count, sizeof count) &&
                        fsched_bench::write_all(fd, f.frame_ms.data(), count * sizeof(double)) &&
                        fsched_bench::write_all(fd, f.urgent_rank.data(), count * sizeof(double));
        return ok ? 0 : 1;
    });
    Figures f;
    std::uint64_t count = 0;
    bool ok = child.read(&count, sizeof count) && count < 10000000;
    if (ok) {
        f.frame_ms.resize(count);
        f.urgent_rank.resize(count);
        ok = child.read(f.frame_ms.data(), count * sizeof(double)) &&
             child.read(f.urgent_rank.data(), count * sizeof(double));
    }
    f.failed = !child.wait() || !ok || f.frame_ms.empty();
    return f;
}
#endif

}  // namespace

int main(int argc, char** argv) {
    fsched_bench::Options opt;
    if (!opt.parse(argc, argv)) return 2;
    const int frames = static_cast<int>(opt.quick ? 20 : (opt.iters ? opt.iters : 1000));
    std::printf("%s%s\n", fsched_bench::build_line("bench_frame").c_str(),
                fsched_bench::boost_note(FIBER_SCHED_BENCH_HAVE_BOOST_FIBER, ", Boost.Fiber work_stealing(2)",
                                         "Boost.Fiber not found: its rows are skipped")
                    .c_str());
    std::printf("%d frames per workload, %d jobs per frame, 2 threads running jobs; %s\n", frames, jobs_per_frame,
                opt.quick ? "--quick: tiny counts, the numbers are noise" : "full run");

    struct Impl {
        const char* name;
        std::function<Figures(int, int)> run;
    };
    std::vector<Impl> impls{{"fiber_sched, use_caller + priorities", frames_fsched},
                            {"std::thread pool + std::future", frames_pool}};
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    impls.push_back({"Boost.Fiber work_stealing", frames_boost});
#endif
    fsched_bench::TextTable table;
    bool failed = false;
    for (const int n : {floats_per_job, 0}) {
        const bool empty = n == 0;
        table.begin_group(empty ? "empty jobs: per-job cost (frame time / jobs per frame)"
                                : "small jobs (~1 us each): frame time",
                          {{"p50 ms", 9}, {"p99 ms", 9}, {"ns/job p50", 11}, {"ours/x p50", 11}, {"ours/x p99", 11},
                           {"urgent at", 10}});
        double ours_p50 = 0, ours_p99 = 0;
        for (const Impl& impl : impls) {
            if (!opt.selected(std::string(empty ? "empty/" : "small/") + impl.name)) continue;
            const Figures f = impl.run(frames, n);
            if (f.failed) {
                table.row(impl.name, {"failed"});
                failed = true;
                continue;
            }
            const double p50 = percentile(f.frame_ms, 50), p99 = percentile(f.frame_ms, 99);
            if (&impl == &impls.front()) {
                ours_p50 = p50;
                ours_p99 = p99;
            }
            table.row(impl.name, {format("%.3f", p50), format("%.3f", p99), format("%.0f", p50 * 1e6 / jobs_per_frame),
                                  ours_p50 > 0 ? format("%.2f", ours_p50 / p50) : "-",
                                  ours_p99 > 0 ? format("%.2f", ours_p99 / p99) : "-",
                                  format("%.0f", percentile(f.urgent_rank, 50))});
        }
    }
    table.print();
    std::printf("\nours/x < 1: fiber_sched is faster than x. \"urgent at\": physics jobs that finished between the\n"
                "urgent job's scheduling, after all %d of them, and its run (fiber_sched runs it at\n"
                "Priority::High; the others have no priorities).\n",
                physics_jobs);
    return failed ? 1 : 0;
}
