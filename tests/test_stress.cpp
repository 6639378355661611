// A randomized stress run of the scheduler: yield, sleep, spawn from tasks and from plain
// threads, and suspend-and-put across threads, all at once. Meant to run clean under TSan.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using fsched::Fiber;
using fsched::Scheduler;

namespace {

using test::Mailbox;

struct Stress {
    Scheduler& scheduler;
    Mailbox mailbox;
    std::atomic<int> started{0};
    std::atomic<int> finished{0};
    std::atomic<int> put_back{0};
    std::atomic<int> suspended{0};
    int budget;  // tasks that may still be spawned, under spawn_mutex
    std::mutex spawn_mutex;

    Stress(Scheduler& s, int tasks) : scheduler(s), budget(tasks) {}

    bool take_budget() {
        std::lock_guard<std::mutex> lock(spawn_mutex);
        if (budget == 0) return false;
        --budget;
        return true;
    }

    void spawn(unsigned seed) {
        if (!take_budget()) return;
        started++;
        scheduler.schedule([this, seed] { body(seed); });
    }

    void body(unsigned seed) {
        std::mt19937 rng(seed);
        const int steps = static_cast<int>(rng() % 6);
        for (int i = 0; i < steps; ++i) {
            switch (rng() % 6) {
            case 0:
                fsched::this_fiber::yield();
                break;
            case 1:
                fsched::this_fiber::sleep_for(std::chrono::microseconds(rng() % 300));
                break;
            case 2:
                spawn(static_cast<unsigned>(rng()));
                break;
            case 3: {
                // Suspend-and-put: whoever takes us from the mailbox schedules us again.
                suspended++;
                mailbox.post(Fiber::current_ptr());
                Fiber::yield();
                break;
            }
            case 4:
                if (Fiber::ptr other = mailbox.take()) {
                    put_back++;
                    scheduler.schedule(other);
                }
                break;
            default: {
                volatile int sink = 0;
                for (int k = 0; k < 200; ++k) sink = sink + k;
                break;
            }
            }
        }
        finished++;
    }
};

}  // namespace

TEST_CASE("randomized stress: yield, sleep, spawn from anywhere, suspend and put across threads") {
#if defined(FIBER_SCHED_TSAN)
    constexpr int tasks = 600;
#else
    constexpr int tasks = 4000;
#endif
    for (std::size_t threads : {1u, 2u, 4u, 8u}) {
        for (bool use_caller : {true, false}) {
            CAPTURE(threads);
            CAPTURE(use_caller);
            Scheduler s(threads, use_caller, "stress");
            Stress stress(s, tasks);
            s.start();
            // Plain threads spawn tasks and put suspended fibers back, concurrently.
            std::atomic<bool> outsiders_done{false};
            std::vector<std::thread> outsiders;
            for (unsigned t = 0; t < 2; ++t) {
                outsiders.emplace_back([&stress, t] {
                    std::mt19937 rng(1000 + t);
                    for (int i = 0; i < tasks / 8; ++i) {
                        stress.spawn(static_cast<unsigned>(rng()));
                        if (Fiber::ptr f = stress.mailbox.take()) {
                            stress.put_back++;
                            stress.scheduler.schedule(f);
                        }
                        if (i % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
                    }
                });
            }
            for (auto& t : outsiders) t.join();
            outsiders_done = true;
            // Drain: spawn the rest, and keep putting suspended fibers back until all finished.
            while (stress.take_budget()) {
                stress.started++;
                s.schedule([&stress] { stress.body(42); });
            }
            while (stress.finished.load() < stress.started.load()) {
                if (Fiber::ptr f = stress.mailbox.take()) {
                    stress.put_back++;
                    s.schedule(f);
                } else {
                    std::this_thread::sleep_for(std::chrono::microseconds(100));
                }
                if (use_caller && threads == 1) break;  // nothing runs before stop(); see below
            }
            if (use_caller && threads == 1) {
                // Only stop() runs tasks here: put fibers back from a task instead.
                s.schedule([&stress, &s] {
                    while (stress.finished.load() < stress.started.load()) {
                        if (Fiber::ptr f = stress.mailbox.take()) {
                            stress.put_back++;
                            s.schedule(f);
                        }
                        fsched::this_fiber::yield();
                    }
                });
            }
            s.stop();
            CHECK(stress.started == tasks);
            CHECK(stress.finished == stress.started);
            CHECK(stress.put_back == stress.suspended);
        }
    }
}
