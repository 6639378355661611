// A user's file that switches fibers; run.cmake builds it with and without a configuration
// that differs from impl.cpp's.
#include "fiber_sched.hpp"

int main() {
    int steps = 0;
    fsched::Fiber fiber([&] {
        ++steps;
        fsched::Fiber::yield();
        ++steps;
    });
    fiber.resume();
    fiber.resume();
    return steps == 2 && fiber.state() == fsched::Fiber::State::Term ? 0 : 1;
}
