// bench_yield_ir.cpp — this_fiber::yield among F fibers on a one-worker use_caller scheduler,
// everything on the main thread inside stop(): no other thread runs, so callgrind's
// instruction count is the same every run, and a before/after comparison of the yield path
// needs no quiet machine. bench_scheduler's yield row is the wall-clock figure beside
// Boost.Fiber and Go; this is its deterministic twin.
//
// Usage: bench_yield_ir [--quick] [--iters N] [--fibers F] [--pinned] [--spawn]
//   N yields per fiber (default 1,000,000; --quick: 1,000); F fibers (default 2); --pinned
//   pins them to worker 0. --spawn: instead, one task schedules N empty tasks (at High
//   priority with --high) and waits for them on a WaitGroup. Prints ns per yield (task).
//   Instructions per yield:
//     valgrind --tool=callgrind bench_yield_ir --iters 100000   (Ir = a)
//     valgrind --tool=callgrind bench_yield_ir --iters 200000   (Ir = b)
//     (b - a) / (100000 * F)
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
    long iters = 1000000;
    int fibers = 2;
    bool pinned = false, spawn = false, high = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) {
            iters = 1000;
        } else if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = std::atol(argv[++i]);
        } else if (std::strcmp(argv[i], "--fibers") == 0 && i + 1 < argc) {
            fibers = std::atoi(argv[++i]);
        } else if (std::strcmp(argv[i], "--pinned") == 0) {
            pinned = true;
        } else if (std::strcmp(argv[i], "--spawn") == 0) {
            spawn = true;
        } else if (std::strcmp(argv[i], "--high") == 0) {
            high = true;
        } else {
            std::fprintf(stderr, "usage: %s [--quick] [--iters N] [--fibers F] [--pinned] [--spawn [--high]]\n",
                         argv[0]);
            return 2;
        }
    }
    if (iters < 1 || fibers < 1) return 2;
    fsched::Scheduler s(1, true);
    long count = 0;
    if (spawn) {
        s.schedule([&count, iters, high] {
            fsched::WaitGroup wg(iters);
            fsched::Scheduler& here = *fsched::Scheduler::current();
            for (long i = 0; i < iters; ++i) {
                here.schedule([&count, &wg] {
                    ++count;
                    wg.done();
                }, -1, high ? fsched::Priority::High : fsched::Priority::Normal);
            }
            wg.wait();
        });
        const auto t0 = std::chrono::steady_clock::now();
        s.stop();
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (count != iters) return 1;
        std::printf("bench_yield_ir --spawn: %s, %ld tasks%s: %.1f ns per task\n", fsched::backend(), iters,
                    high ? " at High" : "", ns / static_cast<double>(count));
        return 0;
    }
    for (int f = 0; f < fibers; ++f) {
        s.schedule([&count, iters] {
            for (long i = 0; i < iters; ++i) {
                ++count;
                fsched::this_fiber::yield();
            }
        }, pinned ? 0 : -1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    s.stop();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (count != iters * fibers) {
        std::fprintf(stderr, "bench_yield_ir: %ld yields, expected %ld\n", count, iters * fibers);
        return 1;
    }
    std::printf("bench_yield_ir: %s, %d fibers%s, %ld yields each: %.1f ns per yield\n", fsched::backend(), fibers,
                pinned ? " (pinned)" : "", iters, ns / static_cast<double>(count));
    return 0;
}
