// One build of fiber_sched's create + run + destroy, as a shared object: bench/ab/run.sh
// compiles it once per header given, and driver.cpp calls them in turn.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>

// ns per `Fiber f([]{}, 64 KiB); f.resume();` over n of them.
extern "C" __attribute__((visibility("default"))) double fsched_ab_create_batch(int n) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
        fsched::Fiber f([] {}, 64 * 1024);
        f.resume();
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
}
