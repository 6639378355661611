// Migration checking (SchedulerOptions::debug_migrate, FIBER_SCHED_DEBUG_MIGRATE): every
// unpinned fiber resumes on another worker after each wait of every kind, so a thread id
// cached across a yield is caught every time; pinned fibers stay; the use_caller thread
// takes none; one worker, and the environment variable; FiberLocal values stay the fiber's.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using fsched::Scheduler;
using fsched::SchedulerOptions;
using fsched::WaitGroup;
using namespace std::chrono_literals;

namespace {

SchedulerOptions migrating(std::size_t threads, bool use_caller) {
    SchedulerOptions o;
    o.threads = threads;
    o.use_caller = use_caller;
    o.name = "migrating";
    o.debug_migrate = true;
    return o;
}

// The kind of wait a round of the test below makes.
enum class Wait { yield, sleep, channel, mutex, future, semaphore, count };

// The bug the option is for: a thread id kept across a wait (the OS's id: see os_thread_id).
bool cached_thread_id_still_right() {
    const long cached = test::os_thread_id();
    fsched::this_fiber::yield();
    return cached == test::os_thread_id();
}

}  // namespace

TEST_CASE("debug_migrate: after every kind of wait an unpinned fiber resumes on another worker's thread") {
    for (std::size_t threads : {2u, 4u}) {
        for (bool use_caller : {false, true}) {
            if (use_caller && threads < 3) continue;  // one worker thread: nowhere to move to
            CAPTURE(threads);
            CAPTURE(use_caller);
            Scheduler s(migrating(threads, use_caller));
            constexpr int fibers = 8, rounds = 60;
            std::atomic<int> waits{0}, stayed{0}, on_caller{0}, single_waits{0}, single_stayed{0};
            fsched::Channel<int> ch(0);
            fsched::Mutex m;
            fsched::Semaphore sem(0);
            WaitGroup done(fibers + 1);
            // A partner for the channel and semaphore rounds, pinned so it never migrates.
            s.schedule([&] {
                for (int i = 0; i < rounds / static_cast<int>(Wait::count); ++i) {  // what fiber 0 takes
                    ch.send(i);
                    sem.release();
                }
                done.done();
            }, static_cast<int>(threads) - 1);
            for (int f = 0; f < fibers; ++f) {
                s.schedule([&, f] {
                    for (int r = 0; r < rounds; ++r) {
                        const auto kind = static_cast<Wait>((r + f) % static_cast<int>(Wait::count));
                        if (kind == Wait::channel || kind == Wait::semaphore) {
                            if (f != 0) continue;  // one fiber takes what the partner makes
                        }
                        const long before = test::os_thread_id();
                        switch (kind) {
                        case Wait::yield: fsched::this_fiber::yield(); break;
                        case Wait::sleep: fsched::this_fiber::sleep_for(10us); break;
                        case Wait::channel: ch.receive(); break;
                        case Wait::mutex: {
                            // Held across a yield: the others park in lock().
                            std::lock_guard<fsched::Mutex> lock(m);
                            fsched::this_fiber::yield();
                            break;
                        }
                        case Wait::future:
                            fsched::async(s, [] { return 1; }).get();
                            break;
                        case Wait::semaphore: sem.acquire(); break;
                        case Wait::count: break;
                        }
                        waits++;
                        const bool same = test::os_thread_id() == before;
                        if (same) stayed++;
                        // A yield and a sleep always park once: each must have moved.
                        if (kind == Wait::yield || kind == Wait::sleep) {
                            single_waits++;
                            if (same) single_stayed++;
                        }
                        if (use_caller && Scheduler::worker_index() == 0) on_caller++;
                    }
                    done.done();
                });
            }
            s.start();
            if (use_caller) {
                std::thread waiter([&] { done.wait(); });  // the caller must not help meanwhile
                waiter.join();
            } else {
                done.wait();
            }
            s.stop();
            CHECK(waits > fibers * rounds / 2);
            CHECK(single_waits > fibers * rounds / 4);
            CHECK(single_stayed == 0);
            // The others may end where they began: a lock or a future already free does
            // not park, and a lock() that parked and the yield under it move twice.
            MESSAGE(stayed.load() << " of " << waits.load() << " waits ended on the thread they began on");
            CHECK(on_caller == 0);
        }
    }
}

TEST_CASE("debug_migrate: a thread id cached across a yield is caught every time") {
    Scheduler s(migrating(3, false));
    s.start();
    std::atomic<int> right{0}, tries{0};
    WaitGroup done(4);
    for (int f = 0; f < 4; ++f) {
        s.schedule([&] {
            for (int i = 0; i < 50; ++i) {
                tries++;
                if (cached_thread_id_still_right()) right++;
            }
            done.done();
        });
    }
    done.wait();
    s.stop();
    CHECK(tries == 200);
    CHECK(right == 0);
    // Without the option, on one worker, the same code always looks right.
    Scheduler plain(1, false);
    plain.start();
    std::atomic<int> plain_right{0};
    fsched::async(plain, [&] {
        for (int i = 0; i < 50; ++i) plain_right += cached_thread_id_still_right() ? 1 : 0;
    }).get();
    plain.stop();
    CHECK(plain_right == 50);
}

TEST_CASE("debug_migrate: pinned fibers stay on their worker; one worker migrates nothing") {
    Scheduler s(migrating(3, false));
    s.start();
    std::atomic<int> moved{0};
    WaitGroup done(3);
    for (int w = 0; w < 3; ++w) {
        s.schedule([&, w] {
            for (int i = 0; i < 30; ++i) {
                fsched::this_fiber::yield();
                fsched::this_fiber::sleep_for(10us);
                if (Scheduler::worker_index() != w) moved++;
            }
            done.done();
        }, w);
    }
    done.wait();
    s.stop();
    CHECK(moved == 0);

    Scheduler one(migrating(1, false));
    one.start();
    std::atomic<int> ran{0};
    fsched::async(one, [&] {
        for (int i = 0; i < 20; ++i) {
            fsched::this_fiber::yield();
            fsched::this_fiber::sleep_for(10us);
            ran++;
        }
    }).get();
    one.stop();
    CHECK(ran == 20);
}

TEST_CASE("debug_migrate: FiberLocal values stay each fiber's while it changes threads") {
    Scheduler s(migrating(4, false));
    s.start();
    fsched::FiberLocal<std::uint64_t> mine;
    thread_local std::uint64_t cached_here = 0;  // the bug FiberLocal avoids
    std::atomic<int> wrong{0}, thread_local_wrong{0};
    WaitGroup done(16);
    for (int f = 0; f < 16; ++f) {
        s.schedule([&] {
            const std::uint64_t id = fsched::this_fiber::id();
            *mine = id;
            for (int i = 0; i < 20; ++i) {
                cached_here = id;
                fsched::this_fiber::yield();
                if (*mine != id) wrong++;
                if (cached_here != id) thread_local_wrong++;
            }
            done.done();
        });
    }
    done.wait();
    s.stop();
    CHECK(wrong == 0);
    CHECK(thread_local_wrong > 0);  // the thread_local was another fiber's now and then
}

#if !defined(_WIN32)
TEST_CASE("debug_migrate: FIBER_SCHED_DEBUG_MIGRATE=1 in the environment turns it on") {
    test::ChildResult r = test::run_in_child([] {
        setenv("FIBER_SCHED_DEBUG_MIGRATE", "1", 1);
        Scheduler s(3, false);
        s.start();
        int right = 0;
        fsched::async(s, [&] {
            for (int i = 0; i < 20; ++i) right += cached_thread_id_still_right() ? 1 : 0;
        }).get();
        s.stop();
        std::_Exit(right == 0 ? 0 : 1);
    });
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
}
#endif
