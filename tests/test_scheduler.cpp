// Scheduler: the API of ../shared/API.md at 1, 2, 4 and 8 workers, use_caller on and off.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2(): heap bytes in use
#endif

using fsched::Fiber;
using fsched::ScheduleTask;
using fsched::Scheduler;
using namespace std::chrono_literals;

namespace {

long thread_id() { return test::os_thread_id(); }

double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace

TEST_CASE("every scheduled callback runs exactly once") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        constexpr int tasks = 2000;
        std::vector<std::atomic<int>> runs(tasks);
        Scheduler s(c.threads, c.use_caller, "once");
        s.start();
        for (int i = 0; i < tasks; ++i) s.schedule([&runs, i] { runs[static_cast<std::size_t>(i)]++; });
        s.stop();
        int wrong = 0;
        for (auto& r : runs) wrong += r.load() != 1;
        CHECK(wrong == 0);
    });
}

TEST_CASE("name, thread_count, current and worker_index") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller, "named");
        CHECK(s.name() == "named");
        CHECK(s.thread_count() == c.threads);
        CHECK(Scheduler::current() == nullptr);
        CHECK(Scheduler::worker_index() == -1);
        std::mutex m;
        std::set<int> indexes;
        bool all_current = true;
        s.start();
        for (int i = 0; i < 200; ++i) {
            s.schedule([&] {
                std::lock_guard<std::mutex> lock(m);
                all_current = all_current && Scheduler::current() == &s;
                indexes.insert(Scheduler::worker_index());
                CHECK(Fiber::current() != nullptr);
            });
        }
        s.stop();
        CHECK(all_current);
        CHECK(!indexes.empty());
        CHECK(*indexes.begin() >= 0);
        CHECK(*indexes.rbegin() < static_cast<int>(c.threads));
        CHECK(Scheduler::current() == nullptr);
    });
}

TEST_CASE("tasks scheduled before start() run; with use_caller and 1 thread only inside stop()") {
    std::atomic<int> count{0};
    Scheduler s(1, true);
    for (int i = 0; i < 10; ++i) s.schedule([&] { count++; });
    s.start();  // no threads to start: the caller is the only worker
    std::this_thread::sleep_for(10ms);
    CHECK(count == 0);
    s.stop();
    CHECK(count == 10);
}

TEST_CASE("use_caller: the constructing thread is worker 0 and runs its tasks inside stop()") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        const long caller = thread_id();
        long ran_on = 0;
        int index = -2;
        Scheduler s(threads, true);
        s.start();
        s.schedule([&] {
            ran_on = thread_id();
            index = Scheduler::worker_index();
        }, 0);
        s.stop();
        CHECK(ran_on == caller);
        CHECK(index == 0);
    }
}

TEST_CASE("pinned tasks run on their worker, also after yielding and sleeping") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::atomic<int> wrong{0};
        std::atomic<int> done{0};
        s.start();
        for (int k = 0; k < static_cast<int>(c.threads); ++k) {
            for (int j = 0; j < 5; ++j) {
                s.schedule([&, k] {
                    wrong += Scheduler::worker_index() != k;
                    fsched::this_fiber::yield();
                    wrong += Scheduler::worker_index() != k;
                    fsched::this_fiber::sleep_for(1ms);
                    wrong += Scheduler::worker_index() != k;
                    done++;
                }, k);
            }
        }
        s.stop();
        CHECK(wrong == 0);
        CHECK(done == static_cast<int>(c.threads) * 5);
    });
}

TEST_CASE("ScheduleTask and batches: fibers, callbacks and pins in one call") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::atomic<int> callbacks{0};
        std::atomic<int> wrong_worker{0};
        std::atomic<int> fiber_runs{0};
        std::vector<ScheduleTask> batch;
        for (int i = 0; i < 300; ++i) {
            ScheduleTask t;
            if (i % 3 == 0) {
                t.fiber = std::make_shared<Fiber>([&] { fiber_runs++; });
            } else {
                const int pin = i % 2 == 0 ? i % static_cast<int>(c.threads) : -1;
                t.cb = [&, pin] {
                    callbacks++;
                    if (pin >= 0 && Scheduler::worker_index() != pin) wrong_worker++;
                };
                t.thread = pin;
            }
            batch.push_back(std::move(t));
        }
        std::vector<std::function<void()>> plain(50, [&] { callbacks++; });
        s.schedule(batch.begin(), batch.end());
        s.start();
        s.schedule(plain.begin(), plain.end());
        s.schedule(ScheduleTask{nullptr, [&] { callbacks++; }, -1});
        s.stop();
        CHECK(fiber_runs == 100);
        CHECK(callbacks == 200 + 50 + 1);
        CHECK(wrong_worker == 0);
    });
}

TEST_CASE("a fiber that calls Fiber::yield() leaves the scheduler; schedule(fiber) puts it back") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::atomic<int> step{0};
        auto fiber = std::make_shared<Fiber>([&] {
            step = 1;
            Fiber::yield();  // Tars' yield(false): no automatic wake-up
            step = 2;
        });
        std::atomic<int> step_seen_by_putter{0};
        s.start();
        s.schedule(fiber);
        // Another task waits until the fiber's task is over, then puts it back (Tars' put).
        s.schedule([&] {
            while (fiber->state() != Fiber::State::Suspended) fsched::this_fiber::yield();
            step_seen_by_putter = step.load();
            Scheduler::current()->schedule(fiber);
        });
        s.stop();
        CHECK(step_seen_by_putter == 1);
        CHECK(step == 2);
        CHECK(fiber->state() == Fiber::State::Term);
    });
}

TEST_CASE("schedule() of a fiber still switching out resumes it exactly once, after the switch") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        Scheduler s(threads, false);
        constexpr int fibers = 300;
        std::vector<std::atomic<int>> resumed(fibers);
        std::mutex published_mutex;
        std::vector<Fiber*> published;
        std::vector<Fiber::ptr> all;
        for (int i = 0; i < fibers; ++i) {
            all.push_back(std::make_shared<Fiber>([&, i] {
                {
                    std::lock_guard<std::mutex> lock(published_mutex);
                    published.push_back(Fiber::current());
                }
                // Linger so that the putter's schedule() often lands while this fiber is
                // still running or switching out, and another worker tries to resume it.
                const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 4 * 40);
                while (std::chrono::steady_clock::now() < until) {
                }
                Fiber::yield();  // another thread schedules us as soon as it sees the pointer
                resumed[static_cast<std::size_t>(i)]++;
            }));
        }
        s.start();
        std::thread putter([&] {
            for (int put = 0; put < fibers;) {
                Fiber* f = nullptr;
                {
                    std::lock_guard<std::mutex> lock(published_mutex);
                    if (!published.empty()) {
                        f = published.back();
                        published.pop_back();
                    }
                }
                if (!f) continue;
                s.schedule(f->shared_from_this());
                ++put;
            }
        });
        for (auto& f : all) s.schedule(f);
        putter.join();
        s.stop();
        int wrong = 0;
        for (int i = 0; i < fibers; ++i) wrong += resumed[static_cast<std::size_t>(i)] != 1;
        CHECK(wrong == 0);
        for (auto& f : all) CHECK(f->state() == Fiber::State::Term);
    }
}

TEST_CASE("a fiber that schedules itself and then yields is resumed exactly once") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        constexpr int fibers = 200;
        constexpr int rounds = 5;
        std::vector<std::atomic<int>> resumed(fibers);
        s.start();
        for (int i = 0; i < fibers; ++i) {
            s.schedule(std::make_shared<Fiber>([&, i] {
                for (int r = 0; r < rounds; ++r) {
                    // Put ourselves back while still running (Tars' put + yield(false)); an
                    // idle worker may pick the task up before the switch-out completes.
                    Scheduler::current()->schedule(Fiber::current_ptr());
                    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 3 * 20);
                    while (std::chrono::steady_clock::now() < until) {
                    }
                    Fiber::yield();
                    resumed[static_cast<std::size_t>(i)]++;
                }
            }));
        }
        s.stop();
        int wrong = 0;
        for (auto& r : resumed) wrong += r.load() != rounds;
        CHECK(wrong == 0);
    });
}

TEST_CASE("schedule() of a fiber a plain thread is running by hand resumes it once it has yielded") {
    // The fiber runs by hand (Fiber::resume) while the scheduler's worker takes its task:
    // the worker must wait for the switch-out, not mark the fiber (the hand resumer's plain
    // store would wipe the mark: the resume was lost and stop() hung). Also when the fiber
    // schedules itself, the Tars way, while it runs by hand.
    for (bool itself : {false, true}) {
        CAPTURE(itself);
        auto* s = new Scheduler(1, false);  // leaked if the resume is lost: its stop() would hang
        s->start();
        std::atomic<int> stage{0};
        std::atomic<bool> on_worker{false};
        auto fiber = std::make_shared<Fiber>([&] {
            if (itself) s->schedule(Fiber::current_ptr());
            stage = 1;
            // Long enough for the worker to find the fiber still running by hand.
            while (stage.load() < 2) std::this_thread::sleep_for(1ms);
            std::this_thread::sleep_for(50ms);
            Fiber::yield();
            on_worker = Scheduler::current() == s;
        });
        std::thread hand([&] { fiber->resume(); });
        while (stage.load() < 1) std::this_thread::sleep_for(1ms);
        if (!itself) s->schedule(fiber);
        stage = 2;
        hand.join();
        bool resumed = false;
        for (int i = 0; i < 4000 && !resumed; ++i) {
            resumed = fiber->state() == Fiber::State::Term;
            if (!resumed) std::this_thread::sleep_for(5ms);
        }
        CHECK(resumed);
        CHECK(on_worker.load());
        if (resumed) {
            s->stop();
            delete s;
        }
    }
}

TEST_CASE("a High task waiting for a fiber's long hand run neither spins a worker nor holds up Normal tasks") {
    // The worker that finds the fiber still running by hand leaves its task to a helper
    // that sleeps until the switch-out. Queued again at once instead, the task spun the
    // worker (a full core for the hand run's second) and, at High priority, came before
    // every Normal task until the hand run ended.
    for (std::size_t threads : {1u, 2u}) {
        CAPTURE(threads);
        Scheduler s(threads, false);
        s.start();
        std::atomic<int> stage{0};
        std::atomic<bool> hand_done{false}, normal_ran{false}, normal_ran_during_hand_run{false};
        auto fiber = std::make_shared<Fiber>([&] {
            s.schedule(Fiber::current_ptr(), -1, fsched::Priority::High);
            stage = 1;
            std::this_thread::sleep_for(1s);  // the hand run goes on
            hand_done = true;
            Fiber::yield();
        });
        std::thread hand([&] { fiber->resume(); });
        while (stage.load() < 1) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(20ms);  // the worker has found the fiber busy by now
        const double before = process_cpu_seconds();
        s.schedule([&] {
            normal_ran_during_hand_run = !hand_done.load();
            normal_ran = true;
        });
        hand.join();
        const double used = process_cpu_seconds() - before;
        s.stop();
        CHECK(normal_ran.load());
        CHECK(normal_ran_during_hand_run.load());
        INFO("CPU seconds used during the hand run's last 0.98 s: " << used);
        CHECK(used < 0.4);  // about 1 s when a worker spun
        CHECK(fiber->state() == Fiber::State::Term);
    }
}

TEST_CASE("this_fiber::yield goes to the back of the queue") {
    Scheduler s(1, false);
    std::vector<std::string> log;
    for (const char* name : {"a", "b"}) {
        s.schedule([&log, name] {
            for (int i = 1; i <= 3; ++i) {
                log.push_back(std::string(name) + std::to_string(i));
                fsched::this_fiber::yield();
            }
        });
    }
    s.start();
    s.stop();
    CHECK(log == std::vector<std::string>{"a1", "b1", "a2", "b2", "a3", "b3"});
}

TEST_CASE("a worker's queue keeps first-in first-out order as it grows and drains, reusing its blocks") {
    // 3,000 tasks queued before start() grow the queue; each of them queues two more behind
    // the rest while the front is taken, so blocks freed at the front are taken again at the
    // back (TaskBlockSlabs); then it drains. The order the tasks run in is the order they
    // were queued in.
    Scheduler s(1, false);
    std::vector<int> ran;
    std::vector<int> queued;
    constexpr int first = 3000;
    int next = first;
    std::function<void(int)> task = [&](int id) {
        ran.push_back(id);
        for (int k = 0; k < 2 && id < first; ++k) {
            const int spawned = next++;
            queued.push_back(spawned);
            s.schedule([&task, spawned] { task(spawned); });
        }
    };
    for (int i = 0; i < first; ++i) {
        queued.push_back(i);
        s.schedule([&task, i] { task(i); });
    }
    s.start();
    s.stop();
    CHECK(ran.size() == static_cast<std::size_t>(3 * first));
    CHECK(ran == queued);
}

TEST_CASE("a queue that held a burst of tasks gives its memory back once drained, and keeps its order after") {
    Scheduler s(1, false);
    const std::size_t idle_slabs = fsched::detail::queue_slabs(s);  // a first block per queue
    constexpr int burst = 20000;  // more than TaskQueue::shrink_after
    std::vector<int> ran;
    for (int i = 0; i < burst; ++i) s.schedule([&ran, i] { ran.push_back(i); });
    const std::size_t burst_slabs = fsched::detail::queue_slabs(s);
    s.start();
    fsched::WaitGroup wg(1);
    s.schedule([&] { wg.done(); });
    wg.wait();
    // Drained, and once the worker has slept a while (10 ms) the queue keeps the slab of its
    // current block and one spare; the limit is generous for a loaded machine.
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while (fsched::detail::queue_slabs(s) > idle_slabs + 1 && std::chrono::steady_clock::now() < limit) {
        std::this_thread::sleep_for(5ms);
    }
    const std::size_t drained_slabs = fsched::detail::queue_slabs(s);
    for (int i = burst; i < burst + 3000; ++i) s.schedule([&ran, i] { ran.push_back(i); });
    s.stop();
    INFO("slabs: idle " << idle_slabs << ", with the burst queued " << burst_slabs << ", drained " << drained_slabs);
    CHECK(burst_slabs >= idle_slabs + 10);
    CHECK(drained_slabs <= idle_slabs + 1);
    REQUIRE(ran.size() == static_cast<std::size_t>(burst + 3000));
    bool in_order = true;
    for (int i = 0; i < burst + 3000; ++i) in_order = in_order && ran[static_cast<std::size_t>(i)] == i;
    CHECK(in_order);
}

TEST_CASE("sleeping fibers wake in deadline order, not before their deadline") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::mutex m;
        std::vector<int> order;
        std::atomic<int> early{0};
        s.start();
        // Absolute deadlines from one base, 120 ms apart: however late each task starts on a
        // loaded machine (TSan beside qemu in CI), the order is the deadlines' as long as all
        // three have parked before the first one.
        const auto base = std::chrono::steady_clock::now();
        for (int step : {3, 1, 2}) {
            s.schedule([&, step] {
                const auto deadline = base + step * 120ms;
                fsched::this_fiber::sleep_until(deadline);
                if (std::chrono::steady_clock::now() < deadline) early++;
                std::lock_guard<std::mutex> lock(m);
                order.push_back(step);
            }, 0);
        }
        s.stop();
        CHECK(early == 0);
        CHECK(order == std::vector<int>{1, 2, 3});
    });
}

TEST_CASE("a sleeping scheduler wakes at the next deadline, not later") {
    for (bool use_caller : {true, false}) {
        Scheduler s(2, use_caller);
        std::vector<double> lateness_ms;
        s.start();
        s.schedule([&] {
            for (int i = 0; i < 10; ++i) {
                const auto deadline = std::chrono::steady_clock::now() + 5ms;
                fsched::this_fiber::sleep_until(deadline);
                lateness_ms.push_back(
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - deadline).count());
            }
        });
        s.stop();
        std::sort(lateness_ms.begin(), lateness_ms.end());
        CHECK(lateness_ms.front() >= 0.0);
        // Median: a worker sleeping in the kernel wakes within a few milliseconds of the deadline.
        CHECK(lateness_ms[lateness_ms.size() / 2] < 20.0);
    }
}

TEST_CASE("sleep_until with system_clock and sleep_for with odd durations") {
    Scheduler s(2, false);
    std::atomic<int> done{0};
    s.start();
    s.schedule([&] {
        fsched::this_fiber::sleep_until(std::chrono::system_clock::now() + 2ms);
        fsched::this_fiber::sleep_for(std::chrono::duration<double, std::milli>(1.5));
        fsched::this_fiber::sleep_for(-5ms);  // in the past: returns soon
        fsched::this_fiber::sleep_for(0s);
        done++;
    });
    s.stop();
    CHECK(done == 1);
}

TEST_CASE("outside scheduler tasks this_fiber yields and sleeps the thread") {
    CHECK(fsched::this_fiber::id() == 0);
    fsched::this_fiber::yield();
    auto start = std::chrono::steady_clock::now();
    fsched::this_fiber::sleep_for(5ms);
    CHECK(std::chrono::steady_clock::now() - start >= 5ms);

    // A hand-resumed fiber is not a scheduler task: its sleep blocks the thread and it
    // stays Running throughout.
    std::uint64_t seen_id = 0;
    Fiber fiber([&] {
        seen_id = fsched::this_fiber::id();
        fsched::this_fiber::sleep_for(2ms);
        fsched::this_fiber::yield();
    });
    fiber.resume();
    CHECK(fiber.state() == Fiber::State::Term);
    CHECK(seen_id == fiber.id());

    // The use_caller thread outside stop() is a plain thread too.
    Scheduler s(2, true);
    s.start();
    start = std::chrono::steady_clock::now();
    fsched::this_fiber::sleep_for(2ms);
    CHECK(std::chrono::steady_clock::now() - start >= 2ms);
    s.stop();
}

TEST_CASE("stop() waits for queued, sleeping, parked and newly scheduled work") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        std::atomic<int> done{0};
        {
            Scheduler s(c.threads, c.use_caller);
            s.start();
            for (int i = 0; i < 20; ++i) {
                s.schedule([&] {
                    fsched::this_fiber::sleep_for(5ms);
                    // Work scheduled by a task while stop() runs.
                    Scheduler::current()->schedule([&] {
                        fsched::this_fiber::sleep_for(2ms);
                        done++;
                    });
                    done++;
                });
            }
            s.stop();
            CHECK(done == 40);
            s.stop();  // twice is harmless
            CHECK(done == 40);
        }
        // The destructor stops a scheduler that was never stopped (or even started).
        {
            Scheduler s(c.threads, c.use_caller);
            s.schedule([&] { done++; });
        }
        CHECK(done == 41);
    });
}

TEST_CASE("exceptions escaping tasks go to the exception handler") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::mutex m;
        std::vector<std::string> messages;
        s.set_exception_handler([&](std::exception_ptr e) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                std::lock_guard<std::mutex> lock(m);
                messages.push_back(ex.what());
            }
        });
        std::atomic<int> after{0};
        s.start();
        s.schedule([] { throw std::runtime_error("from a callback"); });
        s.schedule(std::make_shared<Fiber>([] {
            fsched::this_fiber::yield();
            throw std::logic_error("from a fiber");
        }));
        s.schedule([&] { after++; });
        s.stop();
        std::sort(messages.begin(), messages.end());
        CHECK(messages == std::vector<std::string>{"from a callback", "from a fiber"});
        CHECK(after == 1);
    });
}

TEST_CASE("the default exception handler prints the exception and terminates") {
    test::ChildResult r = test::run_in_child([] {
        Scheduler s(2, false, "loud");
        s.schedule([] { throw std::runtime_error("unhandled in a task"); });
        s.stop();
    });
    CHECK(r.signaled);
    CHECK(r.signal == SIGABRT);
    CHECK(r.err.find("unhandled in a task") != std::string::npos);
    CHECK(r.err.find("loud") != std::string::npos);
}

TEST_CASE("Fiber::current, Scheduler::current and worker_index stay right as a fiber changes threads") {
    for (std::size_t threads : {2u, 4u, 8u}) {
        Scheduler s(threads, false);
        // Learn which thread is which worker with pinned probes.
        std::mutex m;
        std::map<long, int> worker_of_thread;
        s.start();
        for (int k = 0; k < static_cast<int>(threads); ++k) {
            s.schedule([&, k] {
                std::lock_guard<std::mutex> lock(m);
                worker_of_thread[thread_id()] = k;
            }, k);
        }
        while (true) {
            std::this_thread::sleep_for(1ms);
            std::lock_guard<std::mutex> lock(m);
            if (worker_of_thread.size() == threads) break;
        }
        std::atomic<int> wrong{0};
        std::atomic<int> moves{0};
        // All fibers start in worker 0's queue; the other workers steal them (and the
        // fibers they yield) so fibers do change threads between yields.
        s.schedule([&] {
            for (int f = 0; f < 16; ++f) {
                Scheduler::current()->schedule([&] {
                    Fiber* self = Fiber::current();
                    long last = thread_id();
                    for (int i = 0; i < 200; ++i) {
                        if (i % 20 == 0) {
                            fsched::this_fiber::sleep_for(100us);
                        } else if (i % 20 == 10) {
                            // Hop: put ourselves on the next worker and leave this one, so
                            // every fiber changes threads at least this way.
                            const int next = (Scheduler::worker_index() + 1) % static_cast<int>(threads);
                            Scheduler::current()->schedule(Fiber::current_ptr(), next);
                            Fiber::yield();
                        } else {
                            fsched::this_fiber::yield();
                        }
                        const long now = thread_id();
                        moves += now != last;
                        last = now;
                        int expected;
                        {
                            std::lock_guard<std::mutex> lock(m);
                            expected = worker_of_thread.at(now);
                        }
                        wrong += Fiber::current() != self;
                        wrong += Scheduler::current() != &s;
                        wrong += Scheduler::worker_index() != expected;
                    }
                });
            }
        }, 0);
        s.stop();
        CHECK(wrong == 0);
        INFO("thread changes seen: " << moves.load());
        CHECK(moves >= 16 * 10);  // at least every hop moved a fiber to another thread
    }
}

TEST_CASE("an idle scheduler uses no CPU") {
    for (bool use_caller : {false, true}) {
        Scheduler s(2, use_caller);
        s.start();
        std::atomic<int> done{0};
        s.schedule([&] { done++; });
        while (done == 0) std::this_thread::sleep_for(1ms);
        const double before = process_cpu_seconds();
        std::this_thread::sleep_for(300ms);
        const double used = process_cpu_seconds() - before;
        INFO("CPU seconds used while idle for 0.3 s: " << used);
        CHECK(used < 0.03);  // a busy-waiting idle (sylar's) would use 0.3-0.6 s here
        s.stop();
    }
}

TEST_CASE("new work wakes a sleeping worker promptly") {
    Scheduler s(2, false);
    s.start();
    std::vector<double> latency_ms;
    for (int i = 0; i < 20; ++i) {
        std::this_thread::sleep_for(2ms);  // let the workers fall asleep
        std::atomic<bool> ran{false};
        const auto start = std::chrono::steady_clock::now();
        s.schedule([&] { ran = true; });
        while (!ran) std::this_thread::yield();
        latency_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    s.stop();
    std::sort(latency_ms.begin(), latency_ms.end());
    INFO("median wake-up latency " << latency_ms[latency_ms.size() / 2] << " ms");
    CHECK(latency_ms[latency_ms.size() / 2] < 10.0);
}

TEST_CASE("misuse of the Scheduler is a FIBER_SCHED_ASSERT naming the rule") {
    SUBCASE("stop() from another thread with use_caller") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(2, true);
            std::thread other([&] { s.stop(); });
            other.join();
        }, "stop(): with use_caller, call stop() from the thread (or fiber) that constructed the scheduler");
    }
    SUBCASE("stop() from one of its own tasks") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(2, false);
            s.schedule([&] { s.stop(); });
            s.stop();
        }, "stop(): called from inside one of the scheduler's own tasks");
    }
    SUBCASE("a worker index out of range") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(2, false);
            s.schedule([] {}, 2);
        }, "schedule(): thread index out of range");
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(2, false);
            s.schedule([] {}, -2);
        }, "schedule(): thread index out of range");
    }
    SUBCASE("scheduling a terminated fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            auto fiber = std::make_shared<Fiber>([] {});
            fiber->resume();
            Scheduler s(1, false);
            s.schedule(fiber);
        }, "schedule(): fiber has terminated");
    }
    SUBCASE("an empty task") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(1, false);
            s.schedule(std::function<void()>{});
        }, "schedule(): the task has neither a fiber nor a callback");
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(1, false);
            s.schedule(static_cast<void (*)()>(nullptr));
        }, "schedule(): the task has neither a fiber nor a callback");
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(1, false);
            s.schedule(std::function<int()>{});  // another signature, empty too
        }, "schedule(): the task has neither a fiber nor a callback");
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(1, false);
            fsched::ScheduleTask named;  // a name wraps no callback: still refused, not run
            named.name = "nothing-to-run";
            s.schedule(std::move(named));
        }, "schedule(): the task has neither a fiber nor a callback");
    }
    SUBCASE("zero threads") {
        FSCHED_CHECK_ABORTS_WITH([] { Scheduler s(0, false); }, "Scheduler(): threads must be at least 1");
    }
    SUBCASE("scheduling after stop()") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Scheduler s(1, false);
            s.stop();
            s.schedule([] {});
        }, "schedule(): scheduler has stopped");
    }
}

// ---------------------------------------------------------------------------------------
// The run-next slot: a fiber that a task wakes runs next on the waker's worker.
// ---------------------------------------------------------------------------------------

TEST_CASE("run-next: a fiber woken by a task runs next on that worker, before Normal tasks queued there, after High ones") {
    for (const bool high : {false, true}) {
        CAPTURE(high);
        Scheduler s(1, false);
        std::vector<std::string> order;  // one worker: no lock needed
        fsched::WaitGroup gate(1);
        s.schedule([&] {
            gate.wait();
            order.push_back("woken");
        });
        s.schedule([&] {
            s.schedule([&] { order.push_back("queued"); });
            if (high) s.schedule([&] { order.push_back("high"); }, -1, fsched::Priority::High);
            gate.done();  // the first task is parked in wait(): this wakes it
            order.push_back("waker");
        });
        s.start();
        s.stop();
        if (high) {
            CHECK(order == std::vector<std::string>{"waker", "high", "woken", "queued"});
        } else {
            CHECK(order == std::vector<std::string>{"waker", "woken", "queued"});
        }
    }
}

TEST_CASE("run-next: a second wake puts the first woken fiber in the queue, behind what is there") {
    Scheduler s(1, false);
    std::vector<std::string> order;
    fsched::WaitGroup first(1), second(1);
    s.schedule([&] {
        first.wait();
        order.push_back("first");
    });
    s.schedule([&] {
        second.wait();
        order.push_back("second");
    });
    s.schedule([&] {
        s.schedule([&] { order.push_back("queued"); });
        first.done();
        second.done();
    });
    s.start();
    s.stop();
    CHECK(order == std::vector<std::string>{"second", "queued", "first"});
}

TEST_CASE("run-next: two fibers waking each other cannot starve their worker's queue") {
    // Without the bound on run-next in a row, the queued task would never run and the pair
    // would go on until its safety limit.
    Scheduler s(1, false);
    fsched::Channel<int> ping(0), pong(0);
    std::atomic<bool> stop{false};
    std::atomic<long> rounds{0};
    const auto limit = std::chrono::steady_clock::now() + 20s;
    s.schedule([&] {
        while (!stop.load() && std::chrono::steady_clock::now() < limit) {
            ping.send(1);
            pong.receive();
            rounds.fetch_add(1);
        }
        ping.close();
    });
    s.schedule([&] {
        while (ping.receive()) pong.send(1);
    });
    s.start();
    while (rounds.load() < 100) std::this_thread::sleep_for(1ms);
    s.schedule([&] { stop.store(true); });  // queued behind the pair's run-next hand-offs
    s.stop();
    CHECK(stop.load());
    CHECK(std::chrono::steady_clock::now() < limit);
}

TEST_CASE("run-next: a ping-pong pair on two workers runs on one worker, not crossing at every message") {
    constexpr int messages = 20000;
    // One run: how many of the 2 * messages messages arrived on the worker that sent them.
    auto run = [] {
        Scheduler s(2, false);
        fsched::Channel<int> to_b(0), to_a(0);
        std::atomic<int> same{0};
        s.schedule([&] {
            for (int i = 0; i < messages; ++i) {
                to_b.send(Scheduler::worker_index());
                const int sender = *to_a.receive();
                if (sender == Scheduler::worker_index()) same.fetch_add(1);
            }
            to_b.close();
        });
        s.schedule([&] {
            while (auto sender = to_b.receive()) {
                if (*sender == Scheduler::worker_index()) same.fetch_add(1);
                to_a.send(Scheduler::worker_index());
            }
        });
        s.start();
        s.stop();
        return same.load();
    };
    // Without the slot a third to a half of the messages cross here (the woken fiber is
    // stolen while its waker finishes parking), now and then almost none; with it none did
    // in quiet runs. A preempted worker thread lets the other take the pair now and then:
    // the best of up to three runs counts. Where a switch is ten times slower (TSan, qemu)
    // the idle worker's 16 looks at the slot pass before its owner gets to it, as often as
    // the machine's load decides (82 % stayed in one TSan run beside busy loops, less in
    // others): there the figure is printed, not checked. The slot's rules themselves are
    // checked everywhere by the tests around this one.
    constexpr int percent = 95;
    int best = 0;
    for (int attempt = 0; attempt < 3 && best <= messages * 2 * percent / 100; ++attempt) {
        best = std::max(best, run());
    }
    MESSAGE("messages that stayed on their sender's worker, best run: " << best << " of " << messages * 2);
#if !defined(FIBER_SCHED_TSAN) && !defined(FIBER_SCHED_TEST_EMULATED)
    CHECK(best > messages * 2 * percent / 100);
#endif
}

TEST_CASE("run-next: a fiber woken by a task that runs on without parking is taken by another worker") {
    Scheduler s(2, false);
    s.start();
    int ran_elsewhere = 0;
    for (int round = 0; round < 20; ++round) {
        fsched::WaitGroup gate(1), done(2);
        std::atomic<bool> woken_ran{false};
        std::atomic<int> woken_worker{-1}, waker_worker{-1};
        s.schedule([&] {
            gate.wait();
            woken_worker.store(Scheduler::worker_index());
            woken_ran.store(true);
            done.done();
        });
        s.schedule([&] {
            fsched::this_fiber::sleep_for(2ms);  // the other task parks in wait() meanwhile
            gate.done();                          // into this worker's run-next slot
            waker_worker.store(Scheduler::worker_index());
            // Busy until the woken fiber has run: only another worker can run it now.
            const auto limit = std::chrono::steady_clock::now() + 20s;
            while (!woken_ran.load() && std::chrono::steady_clock::now() < limit) {
            }
            done.done();
        });
        done.wait();
        REQUIRE(woken_ran.load());
        if (woken_worker.load() != waker_worker.load()) ++ran_elsewhere;
    }
    s.stop();
    // Every round where the wake found the fiber parked went through the slot and was taken
    // from there; a round where it had not parked yet did not need to.
    CHECK(ran_elsewhere == 20);
    CHECK(fsched::detail::runnext_stuck_taken(s) >= 1);
}

TEST_CASE("run-next: a fiber the use_caller thread woke while helping runs on after it stops helping") {
    Scheduler s(2, true);
    s.start();
    for (int round = 0; round < 20; ++round) {
        fsched::WaitGroup gate(1), helped(1);
        std::atomic<bool> woken_ran{false};
        s.schedule([&] {
            gate.wait();
            woken_ran.store(true);
        });
        s.schedule([&] {
            fsched::this_fiber::sleep_for(1ms);
            gate.done();    // on whichever thread runs this: maybe the caller, as worker 0
            helped.done();  // and ends the caller's help
        });
        helped.wait();  // the caller helps here
        // Blocks outside fsched: the woken fiber must run on worker 1.
        const auto limit = std::chrono::steady_clock::now() + 20s;
        while (!woken_ran.load() && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(1ms);
        REQUIRE(woken_ran.load());
    }
    s.stop();
}

TEST_CASE("run-next: a watcher that goes off to run another task hands the watch on, so the slot's fiber is not left behind its busy waker") {
    // Found by review: every worker asleep and unwatched; a task T pinned to worker 0 wakes
    // F1 into its slot and runs on, so another worker takes F1 and then sleeps as the
    // watcher; T wakes F2 into the slot (a watcher exists: no one is woken) and queues L,
    // whose wake-up claims that watcher, which runs L for long. The third worker must be
    // woken to take F2, not left asleep until T parks.
    Scheduler s(3, false);
    s.start();
    for (int round = 0; round < 5; ++round) {
        CAPTURE(round);
        std::this_thread::sleep_for(50ms);  // every worker asleep, none watching
        fsched::Channel<int> c1(0), c2(0);
        std::atomic<int> parked{0};
        std::atomic<bool> f1_ran{false}, f2_ran{false}, f2_while_t_ran{false};
        fsched::WaitGroup all(4);
        s.schedule([&] {
            parked.fetch_add(1);
            c1.receive();
            f1_ran.store(true);
            all.done();
        });
        s.schedule([&] {
            parked.fetch_add(1);
            c2.receive();
            f2_ran.store(true);
            all.done();
        });
        while (parked.load() < 2) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(20ms);  // both parked in receive()
        s.schedule([&] {
            c1.send(1);
            const auto limit = std::chrono::steady_clock::now() + 10s;
            while (!f1_ran.load() && std::chrono::steady_clock::now() < limit) {
            }
            const auto gap = std::chrono::steady_clock::now() + 150us;  // the watcher is asleep by now
            while (std::chrono::steady_clock::now() < gap) {
            }
            c2.send(2);
            s.schedule([&] {  // L
                const auto l_limit = std::chrono::steady_clock::now() + 10s;
                while (!f2_ran.load() && std::chrono::steady_clock::now() < l_limit) {
                }
                all.done();
            });
            while (!f2_ran.load() && std::chrono::steady_clock::now() < limit) {
            }
            f2_while_t_ran.store(f2_ran.load());
            all.done();
        }, 0);
        all.wait();
        CHECK(f2_while_t_ran.load());
    }
    s.stop();
}

TEST_CASE("use_caller: tasks from outside go to the other workers, not to the caller's worker 0, which runs only while the caller helps") {
    // Found by review: with worker 1 never idle (a fiber yields in a loop), a task queued on
    // worker 0 waited until the caller helped or stopped.
    Scheduler s(2, true);
    s.start();
    std::atomic<bool> stop{false};
    s.schedule([&] {
        while (!stop.load()) fsched::this_fiber::yield();
    }, 1);
    std::atomic<int> ran{0};
    std::thread outsider([&] {
        for (int i = 0; i < 10; ++i) s.schedule([&] { ran.fetch_add(1); });
        std::vector<std::function<void()>> batch(10, [&] { ran.fetch_add(1); });
        s.schedule(batch.begin(), batch.end());
    });
    for (int i = 0; i < 10; ++i) s.schedule([&] { ran.fetch_add(1); });  // the caller, not helping
    outsider.join();
    // Plain waiting: this thread does not help.
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (ran.load() < 30 && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(1ms);
    CHECK(ran.load() == 30);
    stop.store(true);
    s.stop();
}

// ---------------------------------------------------------------------------------------
// Callbacks: kept in a TaskFunction from schedule() to their end, no std::function between.
// ---------------------------------------------------------------------------------------

namespace {

// A trivially copyable callable that notes where it is when it runs.
struct WhereAmI {
    const void** seen;
    void operator()() const { *seen = this; }
};

// Counts its live copies; not trivially copyable, so a TaskFunction boxes it.
struct Counted {
    static inline std::atomic<int> alive{0};
    static inline std::atomic<int> runs{0};
    Counted() { ++alive; }
    Counted(const Counted&) { ++alive; }
    Counted(Counted&&) noexcept { ++alive; }
    ~Counted() { --alive; }
    void operator()() const { ++runs; }
};

bool inside(const void* p, const void* object, std::size_t size) {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    const auto begin = reinterpret_cast<std::uintptr_t>(object);
    return at >= begin && at < begin + size;
}

}  // namespace

TEST_CASE("TaskFunction: small trivially copyable closures and std::function inline, others boxed, each destroyed once") {
    using fsched::detail::TaskFunction;
    SUBCASE("a small trivially copyable closure is held inline and moves with its TaskFunction") {
        const void* seen = nullptr;
        TaskFunction a(WhereAmI{&seen});
        a();
        CHECK(inside(seen, &a, sizeof a));
        TaskFunction b(std::move(a));
        CHECK_FALSE(a);
        REQUIRE(b);
        b();
        CHECK(inside(seen, &b, sizeof b));
    }
    SUBCASE("a closure larger than inline_size is boxed: moves keep it where it is") {
        struct Big {
            const void** seen;
            char pad[TaskFunction::inline_size];
            void operator()() const { *seen = this; }
        };
        const void* seen = nullptr;
        TaskFunction a(Big{&seen, {}});
        a();
        const void* first = seen;
        CHECK_FALSE(inside(first, &a, sizeof a));
        TaskFunction b(std::move(a));
        b();
        CHECK(seen == first);
    }
    SUBCASE("a closure with a destructor is boxed and destroyed exactly once, after any number of moves") {
        const int before = Counted::alive.load();
        {
            TaskFunction a{Counted{}};
            CHECK(Counted::alive.load() == before + 1);
            TaskFunction b(std::move(a));
            TaskFunction c;
            c = std::move(b);
            c();
            TaskFunction& same = c;
            c = std::move(same);  // self-move: still holds it
            c();
            CHECK(Counted::alive.load() == before + 1);
            c = nullptr;
            CHECK_FALSE(c);
            CHECK(Counted::alive.load() == before);
            TaskFunction d{Counted{}};
            TaskFunction e{Counted{}};
            d = std::move(e);  // d's own callable goes first
            CHECK(Counted::alive.load() == before + 1);
        }
        CHECK(Counted::alive.load() == before);
    }
    SUBCASE("a std::function is held inline; empty ones and null pointers make an empty TaskFunction") {
        int runs = 0;
        std::function<void()> f = [&runs] { ++runs; };
        TaskFunction a(f);
        TaskFunction b(std::move(a));
        b();
        CHECK(runs == 1);
        CHECK_FALSE(TaskFunction(std::function<void()>{}));
        CHECK_FALSE(TaskFunction(std::function<int()>{}));
        CHECK_FALSE(TaskFunction(static_cast<void (*)()>(nullptr)));
        CHECK_FALSE(TaskFunction(nullptr));
        CHECK(TaskFunction([] {}));
    }
    SUBCASE("what the callable throws comes out of operator()") {
        TaskFunction a([] { throw std::runtime_error("from the callable"); });
        CHECK_THROWS_WITH(a(), "from the callable");
    }
}

TEST_CASE("schedule() takes move-only callables, and each task's captures are destroyed once it has run") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        std::atomic<int> sum{0};
        auto shared = std::make_shared<int>(3);
        const int before = Counted::runs.load();
        const int alive_before = Counted::alive.load();
        for (int i = 0; i < 200; ++i) {
            s.schedule([p = std::make_unique<int>(i), &sum] { sum += *p; });  // move-only
            s.schedule([shared, &sum] { sum += *shared; });                   // boxed: owns a shared_ptr
            s.schedule(Counted{}, -1, i % 2 ? fsched::Priority::High : fsched::Priority::Low);
        }
        s.stop();
        CHECK(sum.load() == 199 * 200 / 2 + 3 * 200);
        CHECK(shared.use_count() == 1);
        CHECK(Counted::runs.load() == before + 200);
        CHECK(Counted::alive.load() == alive_before);
    });
}

#if defined(__GLIBC__) && !defined(FIBER_SCHED_ASAN) && !defined(FIBER_SCHED_TSAN)
TEST_CASE("a parked callback task holds no heap memory: its closure and its Fiber live at the top of its stack") {
    constexpr std::size_t fibers = 5000;
    Scheduler s(2, false);
    s.start();
    {
        fsched::WaitGroup warm(2);  // both workers set up first (thread state, arenas)
        for (int w = 0; w < 2; ++w) s.schedule([&] { warm.done(); }, w);
        warm.wait();
    }
    std::vector<const void*> marks(fibers);
    fsched::WaitGroup arrived(static_cast<std::int64_t>(fibers));
    fsched::WaitGroup gate(1);
    std::atomic<std::size_t> finished{0};
    std::atomic<std::uint64_t> sink{0};
    const std::size_t heap_before = mallinfo2().uordblks;
    for (std::size_t i = 0; i < fibers; ++i) {
        // Six captures, 48 bytes: std::function would put them on the heap.
        s.schedule([&marks, &arrived, &gate, &finished, &sink, i] {
            int local = 0;
            marks[i] = &local;
            arrived.done();
            gate.wait();
            sink += static_cast<std::uint64_t>(local);
            finished.fetch_add(1);
        });
    }
    arrived.wait();
    const std::size_t heap_parked = mallinfo2().uordblks;
    gate.done();
    s.stop();
    CHECK(finished.load() == fibers);
    const double per_fiber =
        (static_cast<double>(heap_parked) - static_cast<double>(heap_before)) / static_cast<double>(fibers);
    INFO("heap bytes in use per parked fiber: " << per_fiber);
    CHECK(per_fiber < 24.0);  // a Fiber on the heap was 256 B, a boxed closure 64 B
}
#endif

TEST_CASE("a weak_ptr to a callback's fiber expires with its task, never locking onto a later task's fiber") {
    const std::size_t in_use_before = fsched::stack_stats().in_use;
    std::weak_ptr<Fiber> first;
    Fiber* second = nullptr;
    Fiber::ptr locked_in_second;
    {
        Scheduler s(1, false);
        s.schedule([&] { first = Fiber::current_ptr(); });
        s.start();
        fsched::WaitGroup wg(1);
        // The same worker, after the first task ended: without the rule it would reuse
        // the first task's fiber, and `first` would lock onto it.
        s.schedule([&] {
            second = Fiber::current();
            locked_in_second = first.lock();
            wg.done();
        });
        wg.wait();
        s.stop();
        CHECK(first.expired());
        CHECK(locked_in_second.get() != second);
        CHECK_FALSE(locked_in_second);
    }
    // The expired weak_ptr still keeps that stack (its control block lives there) ...
    CHECK(fsched::stack_stats().in_use == in_use_before + 1);
    first.reset();
    // ... and gives it back when it goes.
    CHECK(fsched::stack_stats().in_use == in_use_before);
}

TEST_CASE("Scheduler: start() from a task while stop() runs it returns at once") {
    // stop() holds the scheduler's lifecycle lock while it runs tasks (with use_caller, or
    // standing in for a worker without a thread): a start() there, "does nothing" once
    // started, waited for that lock for good.
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        std::atomic<bool> returned{false};
        {
            Scheduler s(2, use_caller, "start-in-stop");
            s.start();
            s.schedule([&] {
                fsched::this_fiber::sleep_for(std::chrono::milliseconds(20));  // until stop() runs
                s.start();
                returned = true;
            }, use_caller ? 0 : 1);
            s.stop();
        }
        CHECK(returned);
    }
}

TEST_CASE("sleeps until the clock's minimum return at once, beside short sleeps on idle workers") {
    // Workers go in and out of the idle wait with such a deadline about. Its timeout was
    // computed as deadline - now, which overflows for time_point::min() (clang's UBSan saw
    // it; gcc's, in the asan-ubsan variant, does not): the idle wait now compares first.
    Scheduler s(4, false, "min-deadline");
    s.start();
    std::atomic<int> rounds{0};
    std::atomic<int> slow{0};
    fsched::WaitGroup wg;
    for (int f = 0; f < 3; ++f) {
        wg.add(1);
        s.schedule([&] {
            for (int i = 0; i < 200; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                fsched::this_fiber::sleep_until(std::chrono::steady_clock::time_point::min());
                // Returns without waiting for any timer: far under a second even on a loaded machine.
                if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) ++slow;
                fsched::this_fiber::sleep_for(std::chrono::microseconds(20));
                ++rounds;
            }
            wg.done();
        });
    }
    wg.wait();
    s.stop();
    CHECK(rounds.load() == 600);
    CHECK(slow.load() == 0);
}
