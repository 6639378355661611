// A program that overrides FIBER_SCHED_ASSERT: the library's misuse checks must go through
// the user's macro (here one that throws), with the rule broken in the expression text.
#include <cstdio>
#include <stdexcept>
#include <string>

[[noreturn]] inline void throw_misuse(const char* expr) { throw std::logic_error(expr); }
#define FIBER_SCHED_ASSERT(expr) ((expr) ? static_cast<void>(0) : throw_misuse(#expr))

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

int main() {
    fsched::Fiber fiber([] {});
    fiber.resume();
    try {
        fiber.resume();  // misuse: the fiber has terminated
    } catch (const std::logic_error& e) {
        const std::string what = e.what();
        if (what.find("resume(): fiber has terminated") != std::string::npos) {
            std::printf("custom FIBER_SCHED_ASSERT received: %s\n", e.what());
            return 0;
        }
        std::printf("custom FIBER_SCHED_ASSERT got an unexpected expression: %s\n", e.what());
        return 1;
    }
    std::printf("misuse went unnoticed\n");
    return 1;
}
