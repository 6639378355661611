// Boost.Context's round trip for round_trip.sh: one resume each way, the loop inlined (its
// best case), both sides with the same MXCSR status flags (bench_fiber.cpp's rows say why).
#include <boost/context/fiber.hpp>

#include <chrono>

void ab_register(const char* name, double (*batch)(int));

namespace {

unsigned long count = 0;

void raise_precision_flag() {
    volatile double third = 1.0;
    third = third / 3.0;
}

double round_trip_batch(int n) {
    namespace ctx = boost::context;
    static auto* fiber = [] {
        raise_precision_flag();
        auto* f = new ctx::fiber([](ctx::fiber&& caller) {
            raise_precision_flag();
            for (;;) {
                ++count;
                caller = std::move(caller).resume();
            }
            return std::move(caller);
        });
        *f = std::move(*f).resume();
        return f;
    }();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) *fiber = std::move(*fiber).resume();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
}

const bool registered = (ab_register("boost::context::fiber", &round_trip_batch), true);

}  // namespace
