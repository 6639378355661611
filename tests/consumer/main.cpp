// A program that uses fiber_sched through CMake (add_subdirectory or find_package).
// It only needs the target fiber_sched::fiber_sched; this file is its one implementation TU.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <cstdio>
#include <memory>

int main() {
    int steps = 0;
    auto fiber = std::make_shared<fsched::Fiber>([&steps] {
        ++steps;
        fsched::Fiber::yield();
        ++steps;
    });

    fiber->resume();
    const bool suspended = steps == 1 && fiber->state() == fsched::Fiber::State::Suspended;
    fiber->resume();
    const bool finished = steps == 2 && fiber->state() == fsched::Fiber::State::Term;

    const bool ok = suspended && finished;
    std::printf("fiber_sched %d.%d.%d, backend %s\n", FIBER_SCHED_VERSION_MAJOR,
                FIBER_SCHED_VERSION_MINOR, FIBER_SCHED_VERSION_PATCH, fsched::backend());
    std::printf("fiber_sched consumer: %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
