// SchedulerOptions (the options constructor, the callbacks' stack size, the thread hooks, CPU
// affinity), ScheduleTask::stack_size and Scheduler::stats(), at 1, 2, 4 and 8 workers with
// use_caller on and off where the feature depends on them.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>
#endif

using fsched::Fiber;
using fsched::ScheduleTask;
using fsched::Scheduler;
using fsched::SchedulerOptions;
using fsched::SchedulerStats;
using fsched::detail::FaultSite;
using namespace std::chrono_literals;

namespace {

using test::Fault;

SchedulerOptions options_for(const test::Config& c, const char* name = "options") {
    SchedulerOptions options;
    options.threads = c.threads;
    options.use_caller = c.use_caller;
    options.name = name;
    return options;
}

// Workers that spin the whole of every timed wait (timer_spin = nanoseconds::max()).
SchedulerOptions spinning_options(std::size_t threads = 1, bool use_caller = false) {
    SchedulerOptions options;
    options.threads = threads;
    options.use_caller = use_caller;
    options.name = "spinning";
    options.timer_spin = std::chrono::nanoseconds::max();
    return options;
}

// Until a worker of `s` spins to a timer (at most 20 s; the caller REQUIREs it).
void wait_until_spinning(const Scheduler& s) {
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (s.stats().timer_spins == 0 && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(1ms);
}

// What the thread hooks saw: per OS thread, the hook calls in order ("start 1", "stop 1"),
// and whether a task ran on a thread whose start hook had not run or whose stop hook had.
struct HookLog {
    std::mutex mutex;
    std::map<long, std::vector<std::string>> calls;  // by OS thread id
    std::map<long, bool> open;                       // between its start and its stop hook
    std::atomic<int> starts{0};
    std::atomic<int> stops{0};
    std::atomic<int> tasks_outside{0};  // a task on a worker thread outside its hooks
    std::atomic<int> current_in_hook{0};  // Scheduler::current() was set inside a hook

    void hooks(SchedulerOptions& options) {
        options.on_thread_start = [this](int worker) {
            if (Scheduler::current() != nullptr) current_in_hook++;
            std::lock_guard<std::mutex> lock(mutex);
            calls[test::os_thread_id()].push_back("start " + std::to_string(worker));
            open[test::os_thread_id()] = true;
            starts++;
        };
        options.on_thread_stop = [this](int worker) {
            std::lock_guard<std::mutex> lock(mutex);
            calls[test::os_thread_id()].push_back("stop " + std::to_string(worker));
            open[test::os_thread_id()] = false;
            stops++;
        };
    }
    // In a task: the thread it runs on has run its start hook and not its stop hook.
    void task_ran() {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = open.find(test::os_thread_id());
        if (it == open.end() || !it->second) tasks_outside++;
    }
    // Every thread's calls pair up: start w, stop w, start w, stop w... on the same thread.
    bool paired() {
        std::lock_guard<std::mutex> lock(mutex);
        for (auto& [thread, list] : calls) {
            if (list.size() % 2 != 0) return false;
            for (std::size_t i = 0; i < list.size(); i += 2) {
                if (list[i].rfind("start ", 0) != 0 || list[i + 1] != "stop " + list[i].substr(6)) return false;
            }
        }
        return true;
    }
};

#if defined(__linux__)
int thread_count_now() {
    int n = 0;
    if (DIR* dir = opendir("/proc/self/task")) {
        while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
        closedir(dir);
    }
    return n;
}

// CPU 0 if this process may run there, else the lowest CPU it may.
int first_allowed_cpu() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) return cpu;
    }
    return -1;
}
#endif

// Writes and reads back `bytes` (at most 1 MiB) of a local array, every KiB; true if every
// byte read back is what was written.
FIBER_SCHED_NOINLINE bool use_stack(std::size_t bytes) {
    constexpr std::size_t max_bytes = 1u << 20;
    volatile unsigned char block[max_bytes];
    const std::size_t n = bytes < max_bytes ? bytes : max_bytes;
    for (std::size_t i = 0; i < n; i += 1024) block[i] = static_cast<unsigned char>(i >> 10);
    bool same = true;
    for (std::size_t i = 0; i < n; i += 1024) same = same && block[i] == static_cast<unsigned char>(i >> 10);
    return same;
}

}  // namespace

TEST_CASE("Scheduler(options) is Scheduler(threads, use_caller, name), which delegates to it") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(options_for(c, "by-options"));
        CHECK(s.name() == "by-options");
        CHECK(s.thread_count() == c.threads);
        std::atomic<int> ran{0};
        std::atomic<int> outside{0};
        s.start();
        for (int i = 0; i < 200; ++i) {
            s.schedule([&] {
                if (Scheduler::current() != &s) outside++;
                ran++;
            });
        }
        for (int w = 0; w < static_cast<int>(c.threads); ++w) {
            s.schedule([&, w] {
                if (Scheduler::worker_index() != w) outside++;
                ran++;
            }, w);
        }
        s.stop();
        CHECK(ran == 200 + static_cast<int>(c.threads));
        CHECK(outside == 0);
    });
}

TEST_CASE("options: a default-constructed SchedulerOptions is the positional constructor's defaults") {
    SchedulerOptions options;
    CHECK(options.threads == 1);
    CHECK(options.use_caller);
    CHECK(options.name == "Scheduler");
    CHECK(options.stack_size == 0);
    CHECK(!options.on_thread_start);
    CHECK(!options.on_thread_stop);
    CHECK(options.cpu_affinity.empty());
    CHECK(options.timer_slack == std::chrono::microseconds(1));
    Scheduler s(options);
    CHECK(s.name() == "Scheduler");
    CHECK(s.thread_count() == 1);
}

// ---- thread hooks -------------------------------------------------------------------------

TEST_CASE("thread hooks run on each worker thread around its tasks; the use_caller thread's in the constructor and stop()") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        HookLog log;
        const long caller = test::os_thread_id();
        {
            SchedulerOptions options = options_for(c, "hooks");
            log.hooks(options);
            Scheduler s(options);
            // With use_caller, worker 0's start hook has run here, on this thread.
            CHECK(log.starts == (c.use_caller ? 1 : 0));
            if (c.use_caller) {
                std::lock_guard<std::mutex> lock(log.mutex);
                CHECK(log.calls[caller] == std::vector<std::string>{"start 0"});
            }
            s.start();
            for (int i = 0; i < 500; ++i) s.schedule([&] { log.task_ran(); });
            for (int w = 0; w < static_cast<int>(c.threads); ++w) s.schedule([&] { log.task_ran(); }, w);
            s.stop();
            // Every worker's thread (and the use_caller thread) has run both hooks once.
            CHECK(log.starts == static_cast<int>(c.threads));
            CHECK(log.stops == static_cast<int>(c.threads));
            s.stop();  // harmless: no second stop hook
            CHECK(log.stops == static_cast<int>(c.threads));
        }
        CHECK(log.stops == static_cast<int>(c.threads));  // nor one from ~Scheduler
        CHECK(log.tasks_outside == 0);
        CHECK(log.current_in_hook == 0);
        CHECK(log.paired());
        std::lock_guard<std::mutex> lock(log.mutex);
        CHECK(log.calls.size() == c.threads);  // one thread per worker
        std::map<std::string, int> workers;
        for (auto& [thread, list] : log.calls) {
            workers[list.front()]++;
            if (c.use_caller && thread == caller) CHECK(list == std::vector<std::string>{"start 0", "stop 0"});
        }
        for (int w = 0; w < static_cast<int>(c.threads); ++w) CHECK(workers["start " + std::to_string(w)] == 1);
    });
}

TEST_CASE("thread hooks: the use_caller thread's stop hook runs in ~Scheduler when stop() was not called") {
    HookLog log;
    {
        SchedulerOptions options;
        options.threads = 2;
        log.hooks(options);
        Scheduler s(options);
        s.start();
        s.schedule([&] { log.task_ran(); });
    }
    CHECK(log.starts == 2);
    CHECK(log.stops == 2);
    CHECK(log.paired());
    CHECK(log.tasks_outside == 0);
}

TEST_CASE("thread hooks: a thread that stop() starts again runs them again") {
    // Worker 1's stop hook waits for every other worker thread's stop hook, then schedules
    // one more task, the first time: stop() then finds work queued after the workers left,
    // starts their threads again, and each new thread runs its own start and stop hooks.
    // With use_caller, the caller's loop (in stop()) may still be there to run that task
    // itself: then no thread starts again, and the hooks still pair up.
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        HookLog log;
        std::atomic<bool> rescheduled{false};
        std::atomic<int> late_ran{0};
        SchedulerOptions options;
        options.threads = 3;
        options.use_caller = use_caller;
        log.hooks(options);
        Scheduler* scheduler = nullptr;
        auto stop_hook = options.on_thread_stop;
        options.on_thread_stop = [&, stop_hook](int worker) {
            stop_hook(worker);
            if (worker == 1 && !rescheduled.load()) {
                const int threaded = use_caller ? 2 : 3;
                const auto deadline = std::chrono::steady_clock::now() + 10s;
                while (log.stops.load() < threaded && std::chrono::steady_clock::now() < deadline) {
                    std::this_thread::yield();
                }
                rescheduled = true;
                scheduler->schedule([&] {
                    log.task_ran();
                    late_ran++;
                });
            }
        };
        {
            Scheduler s(options);
            scheduler = &s;
            s.start();
            s.schedule([&] { log.task_ran(); });
            s.stop();
            CHECK(late_ran == 1);
            // Worker 1 and 2's threads twice; with use_caller worker 0 is that thread (once).
            const int threaded = use_caller ? 2 : 3;
            if (use_caller) {
                CHECK((log.starts.load() == 3 || log.starts.load() == 5));
            } else {
                CHECK(log.starts.load() == 2 * threaded);
            }
            CHECK(log.stops.load() == log.starts.load());
        }
        CHECK(log.paired());
        CHECK(log.tasks_outside == 0);
    }
}

TEST_CASE("thread hooks: a worker whose thread start() could not start gets them when a later call starts it") {
    HookLog log;
    SchedulerOptions options;
    options.threads = 3;
    options.use_caller = false;
    log.hooks(options);
    Scheduler s(options);
    {
        Fault fault(FaultSite::ThreadStart, 2);  // the second worker's thread fails
        CHECK_THROWS_AS(s.start(), std::system_error);
    }
    CHECK(log.starts.load() <= 1);  // worker 0's thread may be there already
    for (int w = 0; w < 3; ++w) s.schedule([&] { log.task_ran(); }, w);
    s.stop();  // starts workers 1 and 2
    CHECK(log.starts == 3);
    CHECK(log.stops == 3);
    CHECK(log.paired());
    CHECK(log.tasks_outside == 0);
}

TEST_CASE("thread hooks: workers without a thread get none; the stopping thread runs their tasks") {
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        HookLog log;
        std::atomic<int> ran{0};
        {
            Fault fault(FaultSite::ThreadStart, 1);  // no thread can be started at all
            SchedulerOptions options;
            options.threads = 3;
            options.use_caller = use_caller;
            log.hooks(options);
            Scheduler s(options);
            for (int w = 0; w < 3; ++w) s.schedule([&] { ran++; }, w);
            s.stop();
        }
        CHECK(ran == 3);
        // Only the use_caller thread's own pair (worker 0); no hook for a thread-less worker.
        CHECK(log.starts == (use_caller ? 1 : 0));
        CHECK(log.stops == (use_caller ? 1 : 0));
        CHECK(log.paired());
    }
}

TEST_CASE("thread hooks: what a hook throws goes to the exception handler, and the worker runs on") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        std::mutex mutex;
        std::vector<std::string> errors;
        std::atomic<int> ran{0};
        SchedulerOptions options = options_for(c, "throwing-hooks");
        // With use_caller, on_thread_start(0) throws out of the constructor (its own case).
        options.on_thread_start = [&](int worker) {
            if (!c.use_caller || worker != 0) throw std::runtime_error("start " + std::to_string(worker));
        };
        options.on_thread_stop = [](int worker) { throw std::runtime_error("stop " + std::to_string(worker)); };
        {
            Scheduler s(options);
            s.set_exception_handler([&](std::exception_ptr e) {
                try {
                    std::rethrow_exception(e);
                } catch (const std::exception& error) {
                    std::lock_guard<std::mutex> lock(mutex);
                    errors.push_back(error.what());
                }
            });
            s.start();
            for (int w = 0; w < static_cast<int>(c.threads); ++w) s.schedule([&] { ran++; }, w);
            s.stop();
        }
        CHECK(ran == static_cast<int>(c.threads));
        // Each worker thread's start and stop hook, and the use_caller thread's stop hook.
        const std::size_t threaded = c.threads - (c.use_caller ? 1 : 0);
        CHECK(errors.size() == 2 * threaded + (c.use_caller ? 1 : 0));
        const int starts = static_cast<int>(std::count_if(errors.begin(), errors.end(),
                                                          [](const std::string& e) { return e.rfind("start", 0) == 0; }));
        CHECK(starts == static_cast<int>(threaded));
    });
}

TEST_CASE("thread hooks: on_thread_start(0) throwing leaves the constructor with nothing left behind") {
    for (const std::size_t threads : {1u, 4u}) {
        CAPTURE(threads);
#if defined(__linux__)
        fsched::detail::quiesce_watch();  // no watch thread coming or going meanwhile
        const int threads_before = thread_count_now();
#endif
        std::atomic<int> stops{0};
        SchedulerOptions options;
        options.threads = threads;
        options.use_caller = true;
        options.on_thread_start = [](int) { throw std::runtime_error("no start"); };
        options.on_thread_stop = [&](int) { stops++; };
        CHECK_THROWS_WITH_AS(Scheduler{options}, "no start", std::runtime_error);
        CHECK(stops == 0);
        CHECK(Scheduler::current() == nullptr);
#if defined(__linux__)
        // No thread left behind. At most as many as before: a watch thread that had ended by
        // itself (detached) may still have been on its way out when threads_before was
        // counted (seen under qemu).
        CHECK(thread_count_now() <= threads_before);
#endif
        // This thread helps the next use_caller scheduler as before (the failed one is not
        // linked as its caller's any more): a sleep here runs the new scheduler's task.
        Scheduler next(2, true, "next");
        std::atomic<bool> ran{false};
        next.schedule([&] { ran = true; }, 0);  // pinned to worker 0: only this thread runs it
        const auto deadline = std::chrono::steady_clock::now() + 5s;
        while (!ran && std::chrono::steady_clock::now() < deadline) fsched::this_fiber::sleep_for(1ms);
        CHECK(ran);
        next.stop();
    }
}

// ---- timer slack --------------------------------------------------------------------------

TEST_CASE("timer_slack: negative is a FIBER_SCHED_ASSERT at construction") {
    FSCHED_CHECK_ABORTS_WITH([] {
        SchedulerOptions options;
        options.timer_slack = std::chrono::nanoseconds(-1);
        Scheduler s(options);
    }, "Scheduler(): timer_slack is negative");
}

// ---- timer spin ---------------------------------------------------------------------------

TEST_CASE("timer_spin: negative is a FIBER_SCHED_ASSERT at construction") {
    FSCHED_CHECK_ABORTS_WITH([] {
        SchedulerOptions options;
        options.timer_spin = std::chrono::nanoseconds(-1);
        Scheduler s(options);
    }, "Scheduler(): timer_spin is negative");
}

TEST_CASE("timer_spin: an idle worker spins the last of its sleep to a timer, never past it; 0 never spins") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        // A spin of 20 ms: longer than a loaded machine's late wake-ups, and than Windows'
        // timer tick, so that the kernel's wait ends before the timer and leaves a spin.
        for (const std::chrono::nanoseconds spin : {std::chrono::nanoseconds(0), std::chrono::nanoseconds(20ms)}) {
            CAPTURE(spin.count());
            SchedulerOptions options = options_for(c, "spin");
            options.timer_spin = spin;
            Scheduler s(options);
            s.start();
            constexpr int sleeps = 2;
            std::atomic<int> early{0};
            fsched::WaitGroup wg;
            wg.add(1);
            s.schedule([&] {
                for (int i = 0; i < sleeps; ++i) {
                    const auto deadline = std::chrono::steady_clock::now() + 80ms;
                    fsched::this_fiber::sleep_until(deadline);
                    if (std::chrono::steady_clock::now() < deadline) early++;
                }
                wg.done();
            });
            wg.wait();
            s.stop();
            const SchedulerStats stats = s.stats();
            CHECK(early == 0);
            if (spin.count() == 0) {
                CHECK(stats.timer_spins == 0);
                CHECK(stats.timer_spin_time.count() == 0);
            } else {
                // Each sleep ends in a spin of about 20 ms, unless its wake-up came too late
                // for one, and a spin never lasts the whole 80 ms: 50 ms on average leaves
                // room for a spinner preempted past its timer.
                CHECK(stats.timer_spins >= 1);
                CHECK(stats.timer_spins <= static_cast<std::uint64_t>(sleeps) * 4);
                CHECK(stats.timer_spin_time.count() > 0);
                CHECK(stats.timer_spin_time <= stats.timer_spins * 50ms);
            }
        }
    });
}

TEST_CASE("timer_spin: the use_caller thread's own sleep spins to its deadline too") {
    SchedulerOptions options;
    options.threads = 1;
    options.use_caller = true;
    options.timer_spin = 20ms;
    Scheduler s(options);
    const auto deadline = std::chrono::steady_clock::now() + 60ms;
    fsched::this_fiber::sleep_until(deadline);  // the use_caller thread helps until then
    CHECK(std::chrono::steady_clock::now() >= deadline);
    CHECK(s.stats().timer_spins >= 1);
    s.stop();
}

TEST_CASE("timer_spin: a worker spinning to a timer takes a task scheduled meanwhile at once; a huge spin does not overflow") {
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        Scheduler s(spinning_options(use_caller ? 2 : 1, use_caller));  // one worker thread either way
        s.start();
        using Clock = std::chrono::steady_clock;
        std::atomic<Clock::rep> waiter_deadline{0};
        std::atomic<Clock::rep> task_ran_at{0};
        fsched::Mutex m;
        fsched::ConditionVariable cv;
        bool done = false;
        s.schedule([&] {
            const Clock::time_point deadline = Clock::now() + 2s;
            waiter_deadline = deadline.time_since_epoch().count();
            std::unique_lock<fsched::Mutex> lock(m);
            cv.wait_until(lock, deadline, [&] { return done; });
        });
        wait_until_spinning(s);  // the worker thread spins until the waiter's deadline from here on
        REQUIRE(s.stats().timer_spins >= 1);
        const auto limit = Clock::now() + 20s;
        s.schedule([&] { task_ran_at = Clock::now().time_since_epoch().count(); });
        // Waited for here, not in stop(), where the use_caller thread would help.
        while (task_ran_at == 0 && Clock::now() < limit) std::this_thread::sleep_for(1ms);
        {
            std::lock_guard<fsched::Mutex> lock(m);
            done = true;
        }
        cv.notify_one();  // ends the wait, and the spin to its deadline: no 2 s of CPU
        s.stop();
        // Run within the spin, not after the 2 s it had left: a spin that a push did not
        // end would last until the waiter's deadline.
        REQUIRE(task_ran_at != 0);
        CHECK(task_ran_at < waiter_deadline);
    }
}

TEST_CASE("timer_spin: a timed wait that was satisfied leaves no timer to spin to") {
    using Clock = std::chrono::steady_clock;
    Scheduler s(spinning_options());
    s.start();
    fsched::Mutex m;
    fsched::ConditionVariable cv;
    bool go = false;
    std::atomic<bool> woke{false};
    s.schedule([&] {
        std::unique_lock<fsched::Mutex> lock(m);
        cv.wait_for(lock, 30s, [&] { return go; });
        woke = true;
    });
    wait_until_spinning(s);
    REQUIRE(s.stats().timer_spins >= 1);  // to the wait's deadline, 30 s away
    const auto limit = Clock::now() + 20s;
    {
        std::lock_guard<fsched::Mutex> lock(m);
        go = true;
    }
    cv.notify_one();
    while (!woke && Clock::now() < limit) std::this_thread::sleep_for(1ms);
    REQUIRE(woke);
    std::this_thread::sleep_for(20ms);
    // The wait is over, its timer left in the heap: the worker sleeps in the kernel (its
    // idle time grows), not spinning to that timer's deadline.
    const auto before = s.stats().idle_time[0];
    std::this_thread::sleep_for(150ms);
    CHECK(s.stats().idle_time[0] - before >= 50ms);
    s.stop();
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
TEST_CASE("timer_spin: the poller looks at the fds while it spins") {
    using Clock = std::chrono::steady_clock;
    int fds[2];
    REQUIRE(pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    Scheduler s(spinning_options());
    s.start();
    std::atomic<long> got{-2};
    std::atomic<Clock::rep> read_at{0};
    s.schedule([&] {
        char c = 0;
        got = static_cast<long>(fsched::io::read(fds[0], &c, 1, 10s));  // the worker spins to this timeout
        read_at = Clock::now().time_since_epoch().count();
    });
    wait_until_spinning(s);
    REQUIRE(s.stats().timer_spins >= 1);
    const auto limit = Clock::now() + 20s;
    const Clock::time_point written = Clock::now();
    REQUIRE(::write(fds[1], "x", 1) == 1);
    while (got == -2 && Clock::now() < limit) std::this_thread::sleep_for(1ms);
    s.stop();
    CHECK(got == 1);
    // Within the spin, not at the timeout 10 s on.
    CHECK(Clock::time_point(Clock::duration(read_at.load())) - written < 5s);
    ::close(fds[0]);
    ::close(fds[1]);
}
#endif

#if defined(__linux__)
TEST_CASE("timer_slack: each worker thread has it before its hook and tasks; 0 leaves the inherited one; the use_caller thread keeps its own") {
    const int caller_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    REQUIRE(caller_slack > 0);
    for (const long long slack_ns : {1000LL, 0LL, 70000LL}) {
        for (const bool use_caller : {false, true}) {
            CAPTURE(slack_ns);
            CAPTURE(use_caller);
            const long long expected = slack_ns > 0 ? slack_ns : caller_slack;
            std::atomic<int> wrong{0};
            std::atomic<int> checked{0};
            SchedulerOptions options;
            options.threads = 3;
            options.use_caller = use_caller;
            options.timer_slack = std::chrono::nanoseconds(slack_ns);
            options.on_thread_start = [&](int worker) {
                if (use_caller && worker == 0) return;
                if (prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) != expected) wrong++;
            };
            {
                Scheduler s(options);
                s.start();
                for (int w = use_caller ? 1 : 0; w < 3; ++w) {
                    s.schedule([&] {
                        if (prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) != expected) wrong++;
                        checked++;
                    }, w);
                }
                s.stop();
            }
            CHECK(wrong == 0);
            CHECK(checked == (use_caller ? 2 : 3));
            CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == caller_slack);  // never the constructing thread's
        }
    }
}
#endif

// ---- CPU affinity -------------------------------------------------------------------------

TEST_CASE("cpu_affinity: an index that is negative or beyond the CPUs is a FIBER_SCHED_ASSERT at construction") {
    FSCHED_CHECK_ABORTS_WITH([] {
        SchedulerOptions options;
        options.cpu_affinity.push_back(0);
        options.cpu_affinity.push_back(-1);
        Scheduler s(options);
    }, "Scheduler(): a cpu_affinity entry is negative or not below the number of CPUs");
    FSCHED_CHECK_ABORTS_WITH([] {
        SchedulerOptions options;
        options.cpu_affinity = {1 << 20};
        Scheduler s(options);
    }, "Scheduler(): a cpu_affinity entry is negative or not below the number of CPUs");
}

#if defined(__linux__)
TEST_CASE("cpu_affinity: a worker pinned to a CPU runs its tasks there; the use_caller thread stays unpinned") {
    const int cpu = first_allowed_cpu();
    REQUIRE(cpu >= 0);
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        cpu_set_t caller_before;
        CPU_ZERO(&caller_before);
        REQUIRE(sched_getaffinity(0, sizeof caller_before, &caller_before) == 0);
        std::atomic<int> elsewhere{0};
        std::atomic<int> checked{0};
        std::atomic<int> errors{0};
        std::atomic<int> hook_elsewhere{0};
        SchedulerOptions options;
        options.threads = 3;
        options.use_caller = use_caller;
        options.cpu_affinity = {cpu};  // every worker (i % 1) on that CPU
        options.on_thread_start = [&](int worker) {
            if (!(use_caller && worker == 0) && sched_getcpu() != cpu) hook_elsewhere++;  // pinned before the hook
        };
        {
            Scheduler s(options);
            s.set_exception_handler([&](std::exception_ptr) { errors++; });
            s.start();
            for (int round = 0; round < 20; ++round) {
                for (int w = use_caller ? 1 : 0; w < 3; ++w) {
                    s.schedule([&] {
                        if (sched_getcpu() != cpu) elsewhere++;
                        fsched::this_fiber::yield();  // parked and resumed: still there
                        if (sched_getcpu() != cpu) elsewhere++;
                        checked++;
                    }, w);
                }
            }
            s.stop();
        }
        CHECK(errors == 0);
        CHECK(elsewhere == 0);
        CHECK(hook_elsewhere == 0);
        CHECK(checked == 20 * (use_caller ? 2 : 3));
        cpu_set_t caller_after;
        CPU_ZERO(&caller_after);
        REQUIRE(sched_getaffinity(0, sizeof caller_after, &caller_after) == 0);
        CHECK(CPU_EQUAL(&caller_before, &caller_after));  // the constructing thread is never pinned
    }
}

TEST_CASE("cpu_affinity: worker i takes cpu_affinity[i % size()]") {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
    std::vector<int> cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
        if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
    }
    if (cpus.size() < 2) return;  // one CPU: nothing to tell apart
    SchedulerOptions options;
    options.threads = 4;
    options.use_caller = false;
    options.cpu_affinity = cpus;
    std::vector<std::atomic<int>> wrong(4);
    std::atomic<int> errors{0};
    {
        Scheduler s(options);
        s.set_exception_handler([&](std::exception_ptr) { errors++; });
        s.start();
        for (int w = 0; w < 4; ++w) {
            s.schedule([&, w] {
                if (sched_getcpu() != cpus[static_cast<std::size_t>(w) % 2]) wrong[static_cast<std::size_t>(w)]++;
            }, w);
        }
    }
    CHECK(errors == 0);
    for (auto& n : wrong) CHECK(n == 0);
}
#endif

TEST_CASE("cpu_affinity: a pin that fails sends a std::system_error to the handler, and the worker runs unpinned") {
    std::mutex mutex;
    std::vector<std::string> errors;
    std::atomic<int> ran{0};
    {
        Fault fault(FaultSite::CpuPin, 1);  // every pin fails
        SchedulerOptions options;
        options.threads = 3;
        options.use_caller = false;
        options.name = "unpinned";
        options.cpu_affinity = {0};
        Scheduler s(options);
        s.set_exception_handler([&](std::exception_ptr e) {
            try {
                std::rethrow_exception(e);
            } catch (const std::system_error& error) {
                std::lock_guard<std::mutex> lock(mutex);
                errors.push_back(error.what());
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex);
                errors.push_back("not a std::system_error");
            }
        });
        s.start();
        for (int w = 0; w < 3; ++w) s.schedule([&] { ran++; }, w);
        s.stop();
    }
    CHECK(ran == 3);
    REQUIRE(errors.size() == 3);  // one per worker thread
    for (const std::string& e : errors) {
        CHECK(e.find("cannot pin worker") != std::string::npos);
        CHECK(e.find("'unpinned' to CPU 0") != std::string::npos);
    }
}

// ---- stack sizes --------------------------------------------------------------------------

TEST_CASE("ScheduleTask::stack_size: the task's fiber has at least that much stack, and can use it") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        constexpr std::size_t big = 4u << 20;
        std::atomic<int> small_stack{0};
        std::atomic<int> used{0};
        std::atomic<int> default_size_wrong{0};
        Scheduler s(options_for(c, "big-stacks"));
        s.start();
        for (int i = 0; i < 8; ++i) {
            ScheduleTask task;
            task.cb = [&] {
                if (Fiber::current()->stack_size() < big) small_stack++;
                if (use_stack(1u << 20)) used++;
                fsched::this_fiber::yield();  // it may move: the stack goes with it
                if (use_stack(1u << 20)) used++;
            };
            task.stack_size = big;
            task.name = "big";
            s.schedule(std::move(task));
        }
        // Callbacks without a size keep the default size (the pool holds only that size).
        for (int i = 0; i < 50; ++i) {
            s.schedule([&] {
                const std::size_t size = Fiber::current()->stack_size();
                if (size >= big || size + 4096 < FIBER_SCHED_DEFAULT_STACK_SIZE) default_size_wrong++;
            });
        }
        s.stop();
        CHECK(small_stack == 0);
        CHECK(used == 16);
        CHECK(default_size_wrong == 0);
    });
}

TEST_CASE("SchedulerOptions::stack_size: every callback's fiber has at least that much stack") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        constexpr std::size_t size = 2u << 20;
        SchedulerOptions options = options_for(c, "sized");
        options.stack_size = size;
        std::atomic<int> small_stack{0};
        std::atomic<int> used{0};
        std::atomic<int> own_size_wrong{0};
        Scheduler s(options);
        s.start();
        for (int i = 0; i < 100; ++i) {
            s.schedule([&] {
                if (Fiber::current()->stack_size() < size) small_stack++;
                if (use_stack(1u << 20)) used++;
            });
        }
        // A task's own size overrides it, smaller too.
        ScheduleTask task;
        task.cb = [&] {
            const std::size_t own = Fiber::current()->stack_size();
            if (own < 64 * 1024 || own >= size) own_size_wrong++;
        };
        task.stack_size = 64 * 1024;
        s.schedule(std::move(task));
        s.stop();
        CHECK(small_stack == 0);
        CHECK(used == 100);
        CHECK(own_size_wrong == 0);
    });
}

TEST_CASE("stack sizes: above the limit, the constructor and schedule() throw std::length_error") {
    SchedulerOptions options;
    options.stack_size = fsched::detail::max_stack_size + 1;
    CHECK_THROWS_AS(Scheduler{options}, std::length_error);
    options.stack_size = SIZE_MAX;
    CHECK_THROWS_AS(Scheduler{options}, std::length_error);

    Scheduler s(2, false, "too-big");
    s.start();
    for (const std::size_t size : {fsched::detail::max_stack_size + 1, static_cast<std::size_t>(SIZE_MAX)}) {
        ScheduleTask task;
        task.cb = [] {};
        task.stack_size = size;
        CHECK_THROWS_AS(s.schedule(std::move(task)), std::length_error);
    }
    std::atomic<bool> ran{false};
    s.schedule([&] { ran = true; });
    s.stop();  // nothing of the refused tasks was left counted
    CHECK(ran);
}

TEST_CASE("ScheduleTask::stack_size with a fiber is a FIBER_SCHED_ASSERT naming the rule") {
    FSCHED_CHECK_ABORTS_WITH([] {
        Scheduler s(1, false);
        ScheduleTask task;
        task.fiber = std::make_shared<Fiber>([] {});
        task.stack_size = 1u << 20;
        s.schedule(std::move(task));
    }, "schedule(): a ScheduleTask with a fiber cannot have a stack_size");
    FSCHED_CHECK_ABORTS_WITH([] {
        Scheduler s(1, false);
        ScheduleTask task;  // neither fiber nor callback: the usual rule
        task.stack_size = 1u << 20;
        s.schedule(std::move(task));
    }, "schedule(): the task has neither a fiber nor a callback");
}

// ---- stats() ------------------------------------------------------------------------------

TEST_CASE("stats: tasks_run counts each task's run; queued counts what waits") {
    SUBCASE("1000 tasks on one worker") {
        Scheduler s(1, false, "count");
        s.start();
        for (int i = 0; i < 1000; ++i) s.schedule([] {});
        s.stop();
        const SchedulerStats stats = s.stats();
        CHECK(stats.tasks_run == 1000);
        CHECK(stats.parks == 0);
        CHECK(stats.wakes == 0);
        CHECK(stats.steals == 0);
        CHECK(stats.timers_fired == 0);
        REQUIRE(stats.queued.size() == 1);
        CHECK(stats.queued[0] == 0);
        REQUIRE(stats.idle_time.size() == 1);
    }
    SUBCASE("every configuration") {
        FSCHED_FOR_EACH_CONFIG([](test::Config c) {
            Scheduler s(options_for(c, "count"));
            const SchedulerStats before = s.stats();
            CHECK(before.tasks_run == 0);
            CHECK(before.idle_time.size() == c.threads);
            CHECK(before.queued.size() == c.threads);
            s.start();
            for (int i = 0; i < 1000; ++i) s.schedule([] {});
            s.stop();
            const SchedulerStats after = s.stats();
            CHECK(after.tasks_run == 1000);
            CHECK(after.tasks_stolen >= after.steals);
            for (const std::size_t q : after.queued) CHECK(q == 0);
        });
    }
    SUBCASE("queued: tasks waiting for the use_caller thread") {
        Scheduler s(1, true, "waiting");
        for (int i = 0; i < 10; ++i) s.schedule([] {});
        s.schedule([] {}, 0);
        REQUIRE(s.stats().queued.size() == 1);
        CHECK(s.stats().queued[0] == 11);
        s.stop();
        CHECK(s.stats().queued[0] == 0);
        CHECK(s.stats().tasks_run == 11);
    }
}

TEST_CASE("stats: sleeps fire timers; parks and wakes pair up") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        constexpr int sleepers = 50;
        Scheduler s(options_for(c, "sleep"));
        s.start();
        for (int i = 0; i < sleepers; ++i) s.schedule([] { fsched::this_fiber::sleep_for(1ms); });
        s.stop();
        const SchedulerStats stats = s.stats();
        CHECK(stats.timers_fired == sleepers);
        CHECK(stats.parks == sleepers);
        CHECK(stats.wakes == sleepers);
        CHECK(stats.tasks_run == 2 * sleepers);
    });
}

TEST_CASE("stats: a channel ping-pong parks and wakes at least once per round") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        constexpr int rounds = 1000;
        fsched::Channel<int> ping, pong;
        Scheduler s(options_for(c, "ping-pong"));
        s.start();
        s.schedule([&] {
            for (int i = 0; i < rounds; ++i) {
                ping.send(i);
                pong.receive();
            }
        });
        s.schedule([&] {
            for (int i = 0; i < rounds; ++i) {
                ping.receive();
                pong.send(i);
            }
        });
        s.stop();
        const SchedulerStats stats = s.stats();
        CHECK(stats.parks >= rounds);
        CHECK(stats.wakes >= rounds);
        CHECK(stats.parks == stats.wakes);  // every park ended in a wake, all finished
        CHECK(stats.tasks_run == 2 + stats.wakes);
        CHECK(stats.timers_fired == 0);
    });
}

TEST_CASE("stats: a thread waking a parked fiber is counted as a wake by the worker") {
    Scheduler s(2, false, "plain-waker");
    s.start();
    fsched::Channel<int> channel;
    constexpr int rounds = 200;
    s.schedule([&] {
        for (int i = 0; i < rounds; ++i) channel.receive();
    });
    for (int i = 0; i < rounds; ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));  // let it park
        channel.send(i);  // from a plain thread
    }
    s.stop();
    const SchedulerStats stats = s.stats();
    CHECK(stats.parks == stats.wakes);
    CHECK(stats.parks >= 1);
}

TEST_CASE("stats: steals are counted by the thief") {
    Scheduler s(2, false, "steal");
    s.start();
    constexpr int tasks = 100;
    std::atomic<int> ran{0};
    std::atomic<bool> timed_out{false};
    s.schedule([&] {
        // Worker 0 queues the tasks on itself, then stays busy until worker 1 has run them.
        for (int i = 0; i < tasks; ++i) s.schedule([&] { ran++; });
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        while (ran < tasks) {
            if (std::chrono::steady_clock::now() > deadline) {
                timed_out = true;
                return;
            }
        }
    }, 0);
    s.stop();
    CHECK(!timed_out);
    const SchedulerStats stats = s.stats();
    CHECK(stats.steals >= 1);
    CHECK(stats.tasks_stolen == tasks);
    CHECK(stats.steals <= stats.tasks_stolen);
}

TEST_CASE("stats: idle_time grows while workers sleep, the sleep going on included") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(options_for(c, "idle"));
        s.start();
        s.schedule([] {});
        // The worker threads go to sleep (the use_caller thread is not helping): each one's
        // idle time reaches 20 ms, though no sleep ends. Up to 10 s: a thread starts late
        // under wine on a loaded machine (60 ms after start() was once too short).
        const std::size_t first_worker = c.use_caller ? 1 : 0;
        auto each_slept = [&](const SchedulerStats& stats, std::chrono::nanoseconds at_least) {
            REQUIRE(stats.idle_time.size() == c.threads);
            for (std::size_t w = first_worker; w < c.threads; ++w) {
                if (stats.idle_time[w] < at_least) return false;
            }
            return true;
        };
        SchedulerStats first = s.stats();
        const auto until = std::chrono::steady_clock::now() + 10s;
        while (!each_slept(first, 20ms) && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(5ms);
            first = s.stats();
        }
        CHECK(each_slept(first, 20ms));
        std::this_thread::sleep_for(60ms);
        const SchedulerStats second = s.stats();
        REQUIRE(second.idle_time.size() == c.threads);
        for (std::size_t w = first_worker; w < c.threads; ++w) {
            CAPTURE(w);
            CHECK(second.idle_time[w] >= first.idle_time[w] + 20ms);  // asleep most of the 60 ms
        }
        CHECK(second.sleeps >= c.threads - (c.use_caller ? 1u : 0u));
        s.stop();
    });
}

TEST_CASE("stats: any thread may call stats() while the scheduler runs") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(options_for(c, "watched"));
        std::atomic<bool> done{false};
        std::atomic<int> went_back{0};
        std::atomic<int> snapshots{0};
        std::thread watcher([&] {
            SchedulerStats last = s.stats();
            while (!done) {
                const SchedulerStats now = s.stats();
                if (now.tasks_run < last.tasks_run || now.parks < last.parks || now.wakes < last.wakes ||
                    now.steals < last.steals || now.timers_fired < last.timers_fired) {
                    went_back++;
                }
                last = now;
                snapshots++;
                std::this_thread::yield();
            }
        });
        s.start();
        fsched::WaitGroup wg;
        fsched::Mutex m;
        int shared = 0;
        for (int i = 0; i < 64; ++i) {
            wg.add(1);
            s.schedule([&] {
                for (int k = 0; k < 50; ++k) {
                    std::lock_guard<fsched::Mutex> lock(m);
                    ++shared;
                    if (k % 10 == 0) fsched::this_fiber::sleep_for(100us);
                    fsched::this_fiber::yield();
                }
                wg.done();
            });
        }
        s.schedule([&] {
            // stats() from a task too.
            if (s.stats().idle_time.size() != c.threads) went_back++;
        });
        while (snapshots < 10) std::this_thread::yield();
        s.stop();
        done = true;
        watcher.join();
        CHECK(shared == 64 * 50);
        CHECK(went_back == 0);
        CHECK(s.stats().tasks_run >= 65);
    });
}
