// A program built with FIBER_SCHED_SWITCH_EH_STATE 0: the header compiles and links that way
// (the fiber report's demangler does not depend on it), fibers and a scheduler run, and the
// exception state is the thread's, as documented: a fiber that yields inside a catch block
// leaves its caught exception visible to its resumer.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#define FIBER_SCHED_SWITCH_EH_STATE 0
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

static_assert(FIBER_SCHED_SWITCH_EH_STATE == 0, "the macro is the user's");

int main() {
    fsched::Fiber fiber([] {
        try {
            throw std::runtime_error("in the fiber");
        } catch (const std::exception&) {
            fsched::Fiber::yield();
        }
    });
    fiber.resume();
    const bool shared = std::current_exception() != nullptr;  // the fiber's, on the thread
    fiber.resume();
    if (!shared) {
        std::printf("the exception state was switched although FIBER_SCHED_SWITCH_EH_STATE is 0\n");
        return 1;
    }
    if (std::current_exception() != nullptr) {
        std::printf("the fiber's caught exception outlived its catch block\n");
        return 1;
    }
    int ran = 0;
    std::string report;
    {
        fsched::Scheduler s(2, false, "eh-off");
        s.start();
        fsched::WaitGroup wg;
        wg.add(1);
        s.schedule([&] {
            report = fsched::fiber_report();
            ++ran;
            wg.done();
        });
        wg.wait();
        s.stop();
    }
    if (ran != 1 || report.find("fiber") == std::string::npos) {
        std::printf("the scheduler did not run its task, or the report is empty:\n%s\n", report.c_str());
        return 1;
    }
    std::printf("FIBER_SCHED_SWITCH_EH_STATE 0: builds, runs, and the exception state is the thread's\n");
    return 0;
}
