// The program tests/gdb/check.sh debugs: fibers parked in known functions, then a stop in
// gdb_fibers_parked() where gdb runs tools/fiber_sched_gdb.py's commands.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

// Read by the gdb session (check.sh): the ids of the fibers it prints the backtraces of.
extern "C" {
volatile std::uint64_t gdb_channel_fiber = 0;
volatile std::uint64_t gdb_mutex_fiber = 0;
}

// The functions the backtraces must show.
__attribute__((noinline)) void parked_on_channel(fsched::Channel<int>& ch) {
    gdb_channel_fiber = fsched::this_fiber::id();
    ch.receive();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void parked_on_mutex(fsched::Mutex& m) {
    gdb_mutex_fiber = fsched::this_fiber::id();
    std::lock_guard<fsched::Mutex> lock(m);
    __asm__ volatile("" ::: "memory");
}

// gdb's breakpoint: every fiber above is parked.
extern "C" __attribute__((noinline)) void gdb_fibers_parked() { __asm__ volatile("" ::: "memory"); }

int main() {
    fsched::Scheduler scheduler(2, false, "debugged");
    scheduler.start();
    fsched::Channel<int> ch;
    fsched::Mutex m;
    fsched::Channel<int> release;
    scheduler.schedule(fsched::ScheduleTask{nullptr, [&] {
                                                std::lock_guard<fsched::Mutex> lock(m);
                                                release.receive();
                                            },
                                            -1, fsched::Priority::Normal, "holder"});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    scheduler.schedule(fsched::ScheduleTask{nullptr, [&] { parked_on_channel(ch); }, -1, fsched::Priority::Normal,
                                            "channel-reader"});
    scheduler.schedule(fsched::ScheduleTask{nullptr, [&] { parked_on_mutex(m); }, -1, fsched::Priority::Normal,
                                            "mutex-waiter"});
    // Wait until the report shows both parked.
    for (int i = 0; i < 2000; ++i) {
        const std::string report = fsched::fiber_report();
        if (report.find("(channel-reader): parked") != std::string::npos &&
            report.find("(mutex-waiter): parked") != std::string::npos) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    gdb_fibers_parked();
    release.send(1);
    ch.send(1);
    scheduler.stop();
    std::puts("done");
}
