// inspect.cpp: see what every fiber is doing — a report of each live fiber with what it
// waits for and its backtrace, a lock-order deadlock found by itself, and the last moments
// on each worker from the flight recorder.
//
// Three things go wrong on purpose: two fibers take two mutexes in opposite orders (a
// lock-order deadlock, which fiber_sched reports on stderr within a few seconds), a slow
// task sleeps, and a fiber parks deep in a recursion. The program then prints
// fiber_report() and writes the flight recorder's events to inspect_trace.json (open it at
// https://ui.perfetto.dev). Build with -fno-omit-frame-pointer (backtraces follow frame
// pointers) and link with -rdynamic (function names); CMake does both for this example.
//
// Usage: inspect [trace.json]
#define FIBER_SCHED_IMPLEMENTATION  // exactly one .cpp of a program defines this
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace {

fsched::ScheduleTask named(std::string name, std::function<void()> fn) {
    fsched::ScheduleTask task;
    task.name = std::move(name);
    task.cb = std::move(fn);
    return task;
}

// Parks at the bottom of `depth` frames (the report shows them, and the stack they touch).
int descend(int depth, fsched::Channel<int>& wake) {
    volatile char frame[512];
    frame[0] = static_cast<char>(depth);
    if (depth == 0) return wake.receive().value_or(0);
    return descend(depth - 1, wake) + frame[0];
}

}  // namespace

int main(int argc, char** argv) {
    const std::string trace_path = argc > 1 ? argv[1] : "inspect_trace.json";
    fsched::trace::start_ring(256);  // the newest 256 events of each thread, kept in memory

    fsched::Scheduler scheduler(2, false, "app");
    scheduler.start();
    fsched::Mutex accounts, journal;
    fsched::WaitGroup both_hold(2);
    fsched::Channel<int> wake;

    // The lock-order deadlock: each takes one mutex, then wants the other's.
    scheduler.schedule(named("net-reader", [&] {
        std::lock_guard<fsched::Mutex> a(accounts);
        both_hold.done();
        both_hold.wait();
        std::lock_guard<fsched::Mutex> b(journal);
    }));
    scheduler.schedule(named("db-writer", [&] {
        std::lock_guard<fsched::Mutex> b(journal);
        both_hold.done();
        both_hold.wait();
        std::lock_guard<fsched::Mutex> a(accounts);
    }));
    // A slow task, and a deep one.
    scheduler.schedule(named("slow-report", [] { fsched::this_fiber::sleep_for(std::chrono::seconds(30)); }));
    scheduler.schedule(named("deep-parser", [&] { descend(40, wake); }));

    // The watch thread looks once a second and reports a cycle it has seen twice.
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    std::fputs(fsched::fiber_report().c_str(), stdout);
    if (fsched::trace::dump(trace_path)) std::printf("trace: %s\n", trace_path.c_str());
    std::fflush(stdout);
    // A deadlocked scheduler cannot stop (stop() would wait for its tasks for ever): a real
    // program would be stopped here, with the report in hand.
    std::_Exit(0);
}
