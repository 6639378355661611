// hello.cpp: a generator built from a Fiber.
//
// A fiber is a function with its own stack that can stop in the middle (yield) and be
// continued later (resume). Here one produces the Fibonacci numbers one at a time and
// main() pulls as many as it wants.
#define FIBER_SCHED_IMPLEMENTATION  // exactly one .cpp of a program defines this
#include "fiber_sched.hpp"

#include <cstdint>
#include <cstdio>

int main() {
    std::uint64_t current = 0;  // the generator's output slot

    fsched::Fiber fibonacci([&current] {
        std::uint64_t a = 0, b = 1;
        for (;;) {  // an endless generator: it only runs while someone resumes it
            current = a;
            fsched::Fiber::yield();  // hand `current` to main() and pause right here
            std::uint64_t next = a + b;
            a = b;
            b = next;
        }
    });

    std::printf("backend: %s, fiber %llu with a %zu-byte stack\n", fsched::backend(),
                static_cast<unsigned long long>(fibonacci.id()), fibonacci.stack_size());
    for (int i = 0; i < 10; ++i) {
        fibonacci.resume();  // runs the fiber until its next yield()
        std::printf("%llu ", static_cast<unsigned long long>(current));
    }
    std::printf("\n");
    // The generator is still Suspended; destroying it frees its stack.
    return fibonacci.state() == fsched::Fiber::State::Suspended ? 0 : 1;
}
