// channel_pipeline.cpp: producer -> square -> add one -> consumer, connected by channels.
//
// Every stage is a fiber; a stage blocked on a full or empty channel parks and frees its
// worker. Closing a channel tells the next stage that no more values come.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <cstdio>

int main() {
    fsched::Scheduler scheduler(2, /*use_caller=*/false, "pipeline");
    fsched::Channel<long> numbers(8);  // buffered: the producer may run a little ahead
    fsched::Channel<long> squares;     // unbuffered: each value is handed over in person
    fsched::Channel<long> results(8);
    long total = 0;
    scheduler.start();

    scheduler.schedule([&] {  // producer
        for (long i = 1; i <= 100; ++i) numbers.send(i);
        numbers.close();
    });
    scheduler.schedule([&] {  // stage 1: square
        while (auto n = numbers.receive()) squares.send(*n * *n);
        squares.close();
    });
    scheduler.schedule([&] {  // stage 2: add one
        while (auto n = squares.receive()) results.send(*n + 1);
        results.close();
    });
    scheduler.schedule([&] {  // consumer: receive() gives nullopt once closed and drained
        while (auto n = results.receive()) total += *n;
    });

    scheduler.stop();
    // sum of i*i + 1 for i = 1..100 = 338350 + 100
    std::printf("total %ld (expected 338450)\n", total);
    return total == 338450 ? 0 : 1;
}
