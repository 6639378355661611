// trace.cpp: record what the fibers did, and look at it in Perfetto UI or speedscope.
//
// fsched::trace::start(path) records, on every thread, each slice a fiber ran (named by
// the fiber's or its task's name), why it ended (parked, yielded, returned) and an arrow
// from the fiber that woke another to where the woken one ran next. trace::stop() writes
// it as Chrome Trace Event JSON: open it at https://ui.perfetto.dev, chrome://tracing or
// https://www.speedscope.app. Here a producer hands work to two consumers over a channel
// on two workers, while a ticker sleeps and wakes.
//
// Usage: trace [output.json]   (default: fiber_sched_trace.json in the current directory)
#define FIBER_SCHED_IMPLEMENTATION  // exactly one .cpp of a program defines this
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <string>

namespace {

// Busy work for about `micros` microseconds, so that each slice has a visible width.
void compute_for(int micros) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
    while (std::chrono::steady_clock::now() < until) {
    }
}

// A task with a name: the trace shows its slices under that name.
fsched::ScheduleTask named(std::string name, std::function<void()> fn) {
    fsched::ScheduleTask task;
    task.name = std::move(name);
    task.cb = std::move(fn);
    return task;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string path = argc > 1 ? argv[1] : "fiber_sched_trace.json";
    fsched::Scheduler scheduler(2, false, "app");  // its workers: "app worker 0" and "1"
    if (!fsched::trace::start(path)) {
        std::fprintf(stderr, "trace: cannot write %s\n", path.c_str());
        return 1;
    }
    scheduler.start();

    fsched::Channel<int> work;  // unbuffered: each send parks until a consumer takes it
    fsched::WaitGroup done;
    done.add(4);
    scheduler.schedule(named("producer", [&] {
        for (int item = 0; item < 16; ++item) {
            compute_for(150);  // preparing the item
            work.send(item);
        }
        work.close();
        done.done();
    }));
    for (const char* name : {"consumer-a", "consumer-b"}) {
        scheduler.schedule(named(name, [&] {
            while (auto item = work.receive()) compute_for(300 + 40 * (*item % 3));
            done.done();
        }));
    }
    scheduler.schedule(named("ticker", [&] {
        for (int tick = 0; tick < 6; ++tick) {
            compute_for(80);
            fsched::this_fiber::sleep_for(std::chrono::milliseconds(1));
        }
        done.done();
    }));

    done.wait();  // main() is a plain thread: it blocks
    scheduler.stop();
    fsched::trace::stop();  // writes the file
    std::printf("trace written to %s\n", path.c_str());
    return 0;
}
