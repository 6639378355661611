// worker_pool.cpp: many jobs, few at a time. 100 jobs are scheduled at once, but each
// calls a service that takes at most 3 callers together (a database with 3 connections,
// say); a Semaphore with 3 units guards that section. Jobs waiting for a unit park, so
// the 4 worker threads keep running the jobs that can go on. A Latch tells main() when
// all are done.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>

int main() {
    constexpr int jobs = 100;
    constexpr int connections = 3;
    fsched::Scheduler scheduler(4, /*use_caller=*/false, "pool");
    fsched::Semaphore free_connections(connections);
    fsched::Latch all_done(jobs);
    std::atomic<int> in_use{0}, most_in_use{0}, served{0};
    scheduler.start();

    for (int j = 0; j < jobs; ++j) {
        scheduler.schedule([&] {
            free_connections.acquire();  // parks while all 3 are taken
            const int now = ++in_use;
            for (int seen = most_in_use.load(); now > seen && !most_in_use.compare_exchange_weak(seen, now);) {
            }
            fsched::this_fiber::sleep_for(std::chrono::milliseconds(1));  // the query
            --in_use;
            free_connections.release();
            ++served;
            all_done.count_down();
        });
    }

    all_done.wait();  // main() is a plain thread: this blocks it
    scheduler.stop();
    std::printf("%d jobs served, at most %d at once (limit %d)\n", served.load(), most_in_use.load(), connections);
    return served == jobs && most_in_use <= connections && most_in_use >= 1 ? 0 : 1;
}
