// One build of fiber_sched's resume + yield round trip, for round_trip.sh: compiled once per
// header with its namespace and switch routines renamed (-Dfsched=..., objcopy), so that
// every build links into one program beside Boost's (round_trip_driver.cpp) and runs with
// the executable's own thread-local model, as a user's program does.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>

void ab_register(const char* name, double (*batch)(int));

namespace {

bool stop = false;
unsigned long count = 0;

// ns per `fiber.resume()` (a resume and a yield) over n of them; the fiber lives on.
double round_trip_batch(int n) {
    static auto* fiber = new fsched::Fiber([] {
        while (!stop) {
            ++count;
            fsched::Fiber::yield();
        }
    });
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) fiber->resume();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
}

const bool registered = (ab_register(AB_NAME, &round_trip_batch), true);

}  // namespace
