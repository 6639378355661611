// testing::simulate() and explore(): one seed is one schedule (twice the same trace), seeds
// differ, virtual time (an hour's sleep in no time, every timed wait exact), deadlock and
// runaway reports, planted races found by explore() under both strategies and replayed,
// wait_until_blocked(), schedulers made inside, exceptions and failed asserts as failures,
// plain threads outside, misuse.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(FIBER_SCHED_HAVE_EPOLL)
#include <fcntl.h>
#include <unistd.h>
#endif

using fsched::Scheduler;
using fsched::ScheduleTask;
using fsched::testing::SimulationOptions;
using fsched::testing::SimulationResult;
using fsched::testing::Strategy;
using namespace std::chrono_literals;

namespace {

Scheduler& here() { return *Scheduler::current(); }

void spawn(const char* name, std::function<void()> fn) {
    here().schedule(ScheduleTask{nullptr, std::move(fn), -1, fsched::Priority::Normal, name});
}

// Four tasks that meet on a mutex, a channel, a select, a sleep and yields, and write down
// the order in which they got there: the schedule, as the program sees it.
std::string mixed_workload() {
    std::string log;
    fsched::Mutex m;
    fsched::Channel<int> a(1), b(0);
    fsched::WaitGroup wg;
    for (int t = 0; t < 4; ++t) {
        wg.add(1);
        spawn("worker", [&, t] {
            for (int round = 0; round < 3; ++round) {
                {
                    std::lock_guard<fsched::Mutex> lock(m);
                    log += static_cast<char>('a' + t);
                }
                fsched::this_fiber::yield();
                if (t == 0) a.send(round);
                if (t == 1) b.send(round);
                if (t == 2 || t == 3) {
                    int got = -1;
                    fsched::select(a.on_receive([&](std::optional<int> v) { got = *v; }),
                                   b.on_receive([&](std::optional<int> v) { got = 10 + *v; }));
                    std::lock_guard<fsched::Mutex> lock(m);
                    log += std::to_string(got);
                }
                fsched::this_fiber::sleep_for(std::chrono::milliseconds(1 + t));
            }
            wg.done();
        });
    }
    wg.wait();
    return log;
}

}  // namespace

TEST_CASE("simulate: one seed gives one schedule, twice; other seeds give others") {
    std::string first_log, second_log;
    const SimulationResult first = fsched::testing::simulate(42, [&] { first_log = mixed_workload(); });
    const SimulationResult second = fsched::testing::simulate(42, [&] { second_log = mixed_workload(); });
    REQUIRE(first.completed);
    REQUIRE(second.completed);
    CHECK_FALSE(first.failed());
    CHECK(first.report.empty());
    CHECK(first.switches > 20);
    CHECK(first.switches == second.switches);
    CHECK(first.trace_hash == second.trace_hash);
    CHECK(first_log == second_log);
    CHECK(first.virtual_time == second.virtual_time);

    std::set<std::string> logs;
    std::set<std::uint64_t> hashes;
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
        std::string log;
        const SimulationResult r = fsched::testing::simulate(seed, [&] { log = mixed_workload(); });
        REQUIRE(r.completed);
        logs.insert(log);
        hashes.insert(r.trace_hash);
    }
    MESSAGE(logs.size() << " different orders seen by the program, " << hashes.size() << " different traces in 20 seeds");
    CHECK(logs.size() >= 5);
    CHECK(hashes.size() >= 10);
}

TEST_CASE("simulate: the same seed and workers under pct replay too; workers count") {
    SimulationOptions o;
    o.strategy = Strategy::pct;
    o.pct_steps = 50;
    o.workers = 3;
    std::set<int> seen_workers;
    const auto body = [&] {
        fsched::WaitGroup wg;
        for (int i = 0; i < 6; ++i) {
            wg.add(1);
            spawn("w", [&] {
                for (int k = 0; k < 3; ++k) {
                    seen_workers.insert(here().worker_index());
                    fsched::this_fiber::yield();
                }
                wg.done();
            });
        }
        wg.wait();
    };
    const SimulationResult a = fsched::testing::simulate(7, body, o);
    const SimulationResult b = fsched::testing::simulate(7, body, o);
    REQUIRE(a.completed);
    CHECK(a.trace_hash == b.trace_hash);
    CHECK(a.switches == b.switches);
    CHECK(seen_workers == std::set<int>{0, 1, 2});  // every logical worker ran tasks, no other
}

TEST_CASE("simulate: virtual time: an hour's sleep costs no wall time, and every timed wait is exact") {
    const auto wall = std::chrono::steady_clock::now();
    std::vector<std::chrono::steady_clock::duration> waited;
    const SimulationResult r = fsched::testing::simulate(1, [&] {
        CHECK(fsched::testing::in_simulation());
        auto t0 = fsched::testing::now();
        fsched::this_fiber::sleep_for(1h);
        waited.push_back(fsched::testing::now() - t0);

        fsched::Mutex m;
        fsched::ConditionVariable cv;
        t0 = fsched::testing::now();
        {
            std::unique_lock<fsched::Mutex> lock(m);
            CHECK(cv.wait_for(lock, 250ms) == std::cv_status::timeout);
        }
        waited.push_back(fsched::testing::now() - t0);

        fsched::Channel<int> ch;
        t0 = fsched::testing::now();
        CHECK_FALSE(ch.receive_for(3s).has_value());
        waited.push_back(fsched::testing::now() - t0);

        fsched::Semaphore sem(0);
        t0 = fsched::testing::now();
        CHECK_FALSE(sem.try_acquire_for(7ms));
        waited.push_back(fsched::testing::now() - t0);

        fsched::Event ev;
        t0 = fsched::testing::now();
        CHECK_FALSE(ev.wait_for(11min));
        waited.push_back(fsched::testing::now() - t0);

        fsched::Promise<int> p;
        fsched::Future<int> f = p.get_future();
        t0 = fsched::testing::now();
        CHECK(f.wait_for(2s) == std::future_status::timeout);
        waited.push_back(fsched::testing::now() - t0);

        t0 = fsched::testing::now();
        int which = -1;
        fsched::select(ch.on_receive([&](std::optional<int>) { which = 0; }), fsched::select_timeout(40ms, [&] { which = 1; }));
        CHECK(which == 1);
        waited.push_back(fsched::testing::now() - t0);

        fsched::Mutex held;
        fsched::WaitGroup wg;
        wg.add(1);
        held.lock();
        spawn("try-lock", [&] {
            const auto s = fsched::testing::now();
            CHECK_FALSE(held.try_lock_for(90s));
            waited.push_back(fsched::testing::now() - s);
            wg.done();
        });
        wg.wait();
        held.unlock();
        p.set_value(1);
    });
    const auto spent = std::chrono::steady_clock::now() - wall;
    REQUIRE(r.completed);
    CHECK_FALSE(r.failed());
    const std::vector<std::chrono::steady_clock::duration> expected{1h, 250ms, 3s, 7ms, 11min, 2s, 40ms, 90s};
    CHECK(waited == expected);
    CHECK(r.virtual_time >= std::chrono::nanoseconds(1h + 11min));
    CHECK(spent < 10s);  // an hour and more of virtual time (well under a second, alone)
    MESSAGE("virtual " << std::chrono::duration_cast<std::chrono::seconds>(r.virtual_time).count() << " s in "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(spent).count() << " ms of wall time");
    // Outside a simulation, now() is the steady clock.
    const auto before = std::chrono::steady_clock::now();
    const auto now = fsched::testing::now();
    CHECK(now >= before);
    CHECK(now <= std::chrono::steady_clock::now());
    CHECK_FALSE(fsched::testing::in_simulation());
}

TEST_CASE("simulate: simultaneous timers fire in an order the seed chooses") {
    std::set<std::string> orders;
    for (std::uint64_t seed = 0; seed < 30; ++seed) {
        std::string order;
        const SimulationResult r = fsched::testing::simulate(seed, [&] {
            fsched::WaitGroup wg;
            for (int i = 0; i < 3; ++i) {
                wg.add(1);
                spawn("sleeper", [&, i] {
                    fsched::this_fiber::sleep_for(5ms);
                    order += static_cast<char>('0' + i);
                    wg.done();
                });
            }
            wg.wait();
        });
        REQUIRE(r.completed);
        orders.insert(order);
    }
    CHECK(orders.size() >= 4);  // of the 6 orders
}

TEST_CASE("simulate: a lock-order deadlock is reported with both fibers named, and replays") {
    const auto lock_order = [] {
        fsched::Mutex a, b;
        fsched::WaitGroup wg;
        wg.add(2);
        spawn("takes-a-then-b", [&] {
            std::lock_guard<fsched::Mutex> first(a);
            fsched::this_fiber::yield();
            std::lock_guard<fsched::Mutex> second(b);
            wg.done();
        });
        spawn("takes-b-then-a", [&] {
            std::lock_guard<fsched::Mutex> first(b);
            fsched::this_fiber::yield();
            std::lock_guard<fsched::Mutex> second(a);
            wg.done();
        });
        wg.wait();
    };
    const std::optional<std::uint64_t> seed = fsched::testing::explore(lock_order, 200);
    REQUIRE(seed.has_value());
    const SimulationResult r = fsched::testing::simulate(*seed, lock_order);
    CHECK(r.deadlock);
    CHECK_FALSE(r.completed);
    CHECK_FALSE(r.runaway);
    CHECK(r.failed());
    CHECK(test::contains(r.report, "lock-order deadlock"));
    CHECK(test::contains(r.report, "(takes-a-then-b): parked"));
    CHECK(test::contains(r.report, "(takes-b-then-a): parked"));
    CHECK(test::contains(r.report, "(simulate): parked"));
    // The same seed again: the same schedule, the same end.
    const SimulationResult again = fsched::testing::simulate(*seed, lock_order);
    CHECK(again.deadlock);
    CHECK(again.trace_hash == r.trace_hash);
    // What the run left is out of every later report.
    CHECK_FALSE(test::contains(fsched::fiber_report(), "takes-a-then-b"));
}

namespace {

// A planted check-then-act race: the balance is checked under the lock, then debited under
// it again, with a wait between (as code that calls out in between does).
void bank_withdrawals() {
    fsched::Mutex m;
    int balance = 100;
    fsched::WaitGroup wg;
    for (int i = 0; i < 2; ++i) {
        wg.add(1);
        spawn("withdraw", [&] {
            bool enough;
            {
                std::lock_guard<fsched::Mutex> lock(m);
                enough = balance >= 80;
            }
            fsched::this_fiber::yield();  // e.g. a log line, an RPC
            if (enough) {
                std::lock_guard<fsched::Mutex> lock(m);
                balance -= 80;
            }
            wg.done();
        });
    }
    wg.wait();
    if (balance < 0) throw std::logic_error("overdrawn: " + std::to_string(balance));
}

// A planted lost wake-up: the flag is read without the lock, and the wait does not look at
// it again, so a notify that lands between the two is lost and the waiter sleeps for ever.
void lost_wakeup() {
    fsched::Mutex m;
    fsched::ConditionVariable cv;
    std::atomic<bool> ready{false};
    fsched::WaitGroup wg;
    wg.add(2);
    spawn("waiter", [&] {
        if (!ready.load()) {
            fsched::this_fiber::yield();  // the window
            std::unique_lock<fsched::Mutex> lock(m);
            cv.wait(lock);
        }
        wg.done();
    });
    spawn("notifier", [&] {
        {
            std::lock_guard<fsched::Mutex> lock(m);
            ready = true;
        }
        cv.notify_one();
        wg.done();
    });
    wg.wait();
}

// A planted ordering bug of depth one: it shows only when "loader" runs all ten of its
// steps before "reader" runs its one (a reader that should have waited for the load and
// happened to see it complete). Each uniform choice between the two gives the reader a
// turn, so uniform choices rarely keep it out ten times; PCT gives the loader the higher
// priority half the time.
void complete_before_first_look() {
    int loaded = 0;
    fsched::WaitGroup wg;
    wg.add(2);
    spawn("loader", [&] {
        for (int i = 0; i < 10; ++i) {
            ++loaded;
            fsched::this_fiber::yield();
        }
        wg.done();
    });
    spawn("reader", [&] {
        if (loaded == 10) throw std::logic_error("the reader saw the whole load before its first look");
        wg.done();
    });
    wg.wait();
}

// How many seeds each strategy needed to find `fn`'s bug (the count, or 0 for not found).
std::uint64_t seeds_needed(void (*fn)(), Strategy strategy, bool& deadlock, std::string& message, int depth = 3) {
    SimulationOptions o;
    o.strategy = strategy;
    o.pct_depth = depth;
    const fsched::testing::ExploreResult e = fsched::testing::explore(fn, 20000, 1000, o);
    if (!e.seed) return 0;
    deadlock = e.result.deadlock;
    message = e.result.error_message;
    // The seed replays its failure, with the options explore() used.
    const SimulationResult replay = fsched::testing::simulate(*e.seed, fn, e.options);
    CHECK(replay.failed());
    CHECK(replay.deadlock == e.result.deadlock);
    CHECK(replay.error_message == e.result.error_message);
    CHECK(replay.trace_hash == e.result.trace_hash);
    return e.runs;
}

}  // namespace

TEST_CASE("explore: finds a planted check-then-act race and a lost wake-up, and each seed replays") {
    std::uint64_t uniform_ordering = 0;
    for (const Strategy strategy : {Strategy::uniform, Strategy::pct}) {
        const std::string name = strategy == Strategy::uniform ? "uniform" : "pct";
        CAPTURE(name);
        bool deadlock = false;
        std::string message;
        const std::uint64_t race = seeds_needed(&bank_withdrawals, strategy, deadlock, message);
        CHECK(race > 0);
        CHECK_FALSE(deadlock);
        CHECK(test::contains(message, "overdrawn: -60"));
        const std::uint64_t lost = seeds_needed(&lost_wakeup, strategy, deadlock, message);
        CHECK(lost > 0);
        CHECK(deadlock);
        const std::uint64_t ordering = seeds_needed(&complete_before_first_look, strategy, deadlock, message);
        CHECK(ordering > 0);
        CHECK(test::contains(message, "the reader saw the whole load"));
        if (strategy == Strategy::uniform) uniform_ordering = ordering;
        MESSAGE(name << ": check-then-act found after " << race << " seeds, lost wake-up after " << lost
                     << ", the depth-one ordering bug after " << ordering);
    }
    // PCT told the bug's depth (one: no change point) finds it far sooner. The seeds are
    // fixed, so these counts are too, the same on every platform.
    bool deadlock = false;
    std::string message;
    const std::uint64_t pct_ordering = seeds_needed(&complete_before_first_look, Strategy::pct, deadlock, message, 1);
    MESSAGE("pct at depth 1: the depth-one ordering bug after " << pct_ordering);
    CHECK(pct_ordering > 0);
    CHECK(pct_ordering * 10 < uniform_ordering);
    // A correct program passes every seed.
    const auto correct = [] {
        fsched::Mutex m;
        int balance = 100;
        fsched::WaitGroup wg;
        for (int i = 0; i < 2; ++i) {
            wg.add(1);
            spawn("withdraw", [&] {
                std::lock_guard<fsched::Mutex> lock(m);
                fsched::this_fiber::yield();
                if (balance >= 80) balance -= 80;
                wg.done();
            });
        }
        wg.wait();
        if (balance < 0) throw std::logic_error("overdrawn");
    };
    CHECK_FALSE(fsched::testing::explore(correct, 100).has_value());
}

TEST_CASE("simulate: wait_until_blocked returns only once every other fiber is parked") {
    int parked_soon = 0;
    bool all_there = false;
    std::chrono::steady_clock::duration moved{};
    const SimulationResult r = fsched::testing::simulate(3, [&] {
        fsched::Mutex m;
        fsched::ConditionVariable cv;
        fsched::Channel<int> ch;
        fsched::Semaphore sem(0);
        fsched::WaitGroup wg;
        m.lock();
        const auto t0 = fsched::testing::now();
        const auto park_after_yields = [&](int yields) {
            for (int i = 0; i < yields; ++i) fsched::this_fiber::yield();
            ++parked_soon;
        };
        wg.add(5);
        spawn("on-mutex", [&] {
            park_after_yields(3);
            m.lock();
            m.unlock();
            wg.done();
        });
        spawn("on-channel", [&] {
            park_after_yields(5);
            (void)ch.receive();
            wg.done();
        });
        spawn("asleep", [&] {
            park_after_yields(2);
            fsched::this_fiber::sleep_for(1h);
            wg.done();
        });
        spawn("on-semaphore", [&] {
            park_after_yields(7);
            sem.acquire();
            wg.done();
        });
        spawn("on-cv", [&] {
            park_after_yields(4);
            std::unique_lock<fsched::Mutex> lock(m);  // parks on the mutex first
            wg.done();
        });
        fsched::testing::wait_until_blocked();
        all_there = parked_soon == 5;
        moved = fsched::testing::now() - t0;  // the clock waits for wait_until_blocked()
        m.unlock();
        ch.send(1);
        sem.release();
        (void)cv;
        wg.wait();
    });
    REQUIRE(r.completed);
    CHECK(all_there);
    CHECK(moved == std::chrono::steady_clock::duration::zero());
    CHECK(r.virtual_time >= std::chrono::nanoseconds(1h));  // the sleeper's hour came after
}

TEST_CASE("simulate: schedulers made inside join the simulation; stop() waits in virtual time") {
    int done = 0;
    int saw_inner = 0;
    const auto body = [&] {
        fsched::SchedulerOptions o;
        o.threads = 3;
        o.name = "inner";
        Scheduler inner(o);
        inner.start();
        for (int i = 0; i < 9; ++i) {
            inner.schedule([&, i] {
                if (Scheduler::current() == &inner) ++saw_inner;
                fsched::this_fiber::sleep_for(std::chrono::seconds(i));
                ++done;
            });
        }
        inner.stop();  // parks this task until the nine are done
        if (done != 9) throw std::logic_error("stop() returned early");
    };
    const SimulationResult r = fsched::testing::simulate(11, body);
    CHECK(r.completed);
    CHECK_FALSE(r.failed());
    CHECK(done == 9);
    CHECK(saw_inner == 9);
    CHECK(r.virtual_time == std::chrono::nanoseconds(8s));
    const SimulationResult again = fsched::testing::simulate(11, [&] {
        done = 0;
        saw_inner = 0;
        body();
    });
    CHECK(again.trace_hash == r.trace_hash);
}

TEST_CASE("simulate: exceptions, failed asserts, a runaway and misuse make a failed run, not a dead process") {
    SUBCASE("fn throws") {
        const SimulationResult r = fsched::testing::simulate(0, [] { throw std::runtime_error("boom"); });
        CHECK(r.completed);  // every task finished
        CHECK(r.failed());
        CHECK(r.error != nullptr);
        CHECK(r.error_message == "boom");
        CHECK_FALSE(r.report.empty());
    }
    SUBCASE("a task throws; the others run on") {
        int ran = 0;
        const SimulationResult r = fsched::testing::simulate(0, [&] {
            fsched::WaitGroup wg;
            wg.add(3);
            for (int i = 0; i < 3; ++i) {
                spawn("t", [&, i] {
                    ++ran;
                    wg.done();
                    if (i == 1) throw std::logic_error("task 1");
                });
            }
            wg.wait();
        });
        CHECK(r.completed);
        CHECK(ran == 3);
        CHECK(r.error_message == "task 1");
        CHECK(test::contains(r.error_task, " (t)"));
        CHECK(test::contains(r.report, "(simulate)"));  // as it was when task 1 threw
    }
    SUBCASE("a failed FIBER_SCHED_ASSERT") {
        const SimulationResult r = fsched::testing::simulate(0, [] {
            fsched::Semaphore sem(0);
            sem.release(-1);
        });
        CHECK(r.failed());
        CHECK(test::contains(r.error_message, "Semaphore::release(): the update must not be negative"));
        CHECK(fsched::testing::explore([] { fsched::Mutex m; m.unlock(); }, 3) == std::optional<std::uint64_t>(0));
    }
    SUBCASE("a runaway: the step budget ends it") {
        SimulationOptions o;
        o.max_switches = 500;
        const SimulationResult r = fsched::testing::simulate(0, [] {
            for (;;) fsched::this_fiber::yield();
        }, o);
        CHECK(r.runaway);
        CHECK_FALSE(r.completed);
        CHECK_FALSE(r.deadlock);
        CHECK(r.switches == 500);
        CHECK(test::contains(r.report, "(simulate)"));
    }
    SUBCASE("simulations do not nest") {
        const SimulationResult r = fsched::testing::simulate(0, [] { fsched::testing::simulate(1, [] {}); });
        CHECK(r.failed());
        CHECK(test::contains(r.error_message, "already inside a simulation"));
    }
    SUBCASE("wait_until_blocked() outside a simulation") {
        const test::ChildResult child = test::run_in_child([] { fsched::testing::wait_until_blocked(); });
        CHECK(test::aborted_with(child, "testing::wait_until_blocked(): call it from a task inside testing::simulate()"));
    }
    SUBCASE("no workers") {
        const test::ChildResult child = test::run_in_child([] { fsched::testing::simulate(0, [] {}, 0); });
        CHECK(test::aborted_with(child, "testing::simulate(): workers must be at least 1"));
    }
    // Nothing was left behind by the failed runs.
    CHECK_FALSE(test::contains(fsched::fiber_report(), "(simulate)"));
}

TEST_CASE("simulate: plain threads are outside it") {
    bool thread_in_simulation = true;
    std::chrono::steady_clock::time_point thread_now{};
    std::chrono::steady_clock::duration slept{};
    const auto before = std::chrono::steady_clock::now();
    const SimulationResult r = fsched::testing::simulate(0, [&] {
        const auto t0 = fsched::testing::now();
        fsched::this_fiber::sleep_for(24h);
        slept = fsched::testing::now() - t0;
        std::thread t([&] {
            thread_in_simulation = fsched::testing::in_simulation();
            thread_now = fsched::testing::now();
        });
        t.join();
    });
    CHECK(r.completed);
    CHECK_FALSE(thread_in_simulation);
    CHECK(thread_now >= before);  // the real clock
    CHECK(thread_now <= std::chrono::steady_clock::now());
    CHECK(slept == std::chrono::steady_clock::duration(24h));  // the fiber's clock moved a day
#if !defined(_WIN32)
    // One that touches the simulation's scheduler is refused.
    const test::ChildResult child = test::run_in_child([] {
        fsched::testing::simulate(0, [] {
            Scheduler* s = Scheduler::current();
            std::thread t([s] { s->schedule([] {}); });
            t.join();
        });
    });
    CHECK(test::aborted_with(child, "a plain thread used a scheduler of the simulation"));
#endif
}

TEST_CASE("simulate: FiberLocal values and select stay deterministic") {
    std::vector<int> picks_a, picks_b;
    const auto body = [](std::vector<int>& picks) {
        return [&picks] {
            fsched::FiberLocal<int> local;
            fsched::Channel<int> x(8), y(8);
            for (int i = 0; i < 8; ++i) {
                x.send(i);
                y.send(100 + i);
            }
            *local = 5;
            for (int i = 0; i < 8; ++i) {
                fsched::select(x.on_receive([&](std::optional<int> v) { picks.push_back(*v); }),
                               y.on_receive([&](std::optional<int> v) { picks.push_back(*v); }));
                fsched::this_fiber::yield();
                if (*local != 5) throw std::logic_error("FiberLocal lost its value");
            }
        };
    };
    CHECK_FALSE(fsched::testing::simulate(5, body(picks_a)).failed());
    CHECK_FALSE(fsched::testing::simulate(5, body(picks_b)).failed());
    CHECK(picks_a == picks_b);
    CHECK(picks_a.size() == 8);
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
TEST_CASE("simulate: io on real fds is polled without blocking; its timeouts are virtual") {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    for (const int fd : fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);  // as fsched::io wants
    ssize_t got = -1;
    char byte = 0;
    ssize_t timed_out = 0;
    std::chrono::steady_clock::duration waited{};
    const SimulationResult r = fsched::testing::simulate(2, [&] {
        fsched::WaitGroup wg;
        wg.add(1);
        spawn("reader", [&] {
            got = fsched::io::read(fds[0], &byte, 1);
            wg.done();
        });
        fsched::this_fiber::sleep_for(5s);
        const char c = 'z';
        CHECK(fsched::io::write(fds[1], &c, 1) == 1);
        wg.wait();
        const auto t0 = fsched::testing::now();
        char again = 0;
        timed_out = fsched::io::read(fds[0], &again, 1, std::chrono::milliseconds(30000));
        waited = fsched::testing::now() - t0;
    });
    close(fds[0]);
    close(fds[1]);
    CHECK(r.completed);
    CHECK(got == 1);
    CHECK(byte == 'z');
    CHECK(timed_out == -1);
    CHECK(waited == std::chrono::steady_clock::duration(30s));
}
#endif

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("simulate: out of memory at every site a run meets: the failure reaches its caller, nothing is lost") {
    using fsched::detail::FaultSite;
    // fn's own fiber cannot be made: simulate() throws, and the thread is left as it was.
    {
        const test::Fault fault(FaultSite::FiberAlloc, 1);
        CHECK_THROWS_AS(fsched::testing::simulate(0, [] {}), std::bad_alloc);
    }
    CHECK_FALSE(fsched::testing::in_simulation());
    CHECK(fsched::testing::simulate(0, [] {}).completed);
    // Each site fails from its second hit on (the first may be fn's own); the run is the
    // same each time. (Whether a stack is mapped at all depends on the stack pool, which
    // the process keeps between runs: StackMap only has to be survived.)
    const auto body = [](std::string& log) {
        return [&log] {
            fsched::WaitGroup wg;
            int ran = 0;
            for (int i = 0; i < 3; ++i) {
                wg.add(1);
                try {
                    spawn("child", [&] {
                        ++ran;
                        try {
                            fsched::this_fiber::sleep_for(1s);
                        } catch (const std::bad_alloc&) {
                            log += "sleep:bad_alloc ";
                        }
                        fsched::Channel<int> ch;
                        try {
                            (void)ch.receive_for(1s);
                        } catch (const std::bad_alloc&) {
                            log += "receive_for:bad_alloc ";
                        }
                        wg.done();
                    });
                } catch (const std::bad_alloc&) {
                    log += "schedule:bad_alloc ";
                    wg.done();
                }
            }
            wg.wait();
            log += "ran:" + std::to_string(ran);
        };
    };
    const std::size_t stacks_before = fsched::stack_stats().in_use;
    for (const FaultSite site : {FaultSite::FiberAlloc, FaultSite::StackMap, FaultSite::TaskQueue, FaultSite::TimerAlloc,
                                 FaultSite::WaitAlloc}) {
        CAPTURE(static_cast<int>(site));
        std::string first, second;
        SimulationResult a, b;
        {
            const test::Fault fault(site, 2);
            a = fsched::testing::simulate(9, body(first));
        }
        {
            const test::Fault fault(site, 2);
            b = fsched::testing::simulate(9, body(second));
        }
        CHECK(a.completed);
        CHECK_FALSE(a.failed());
        CHECK(b.completed);
        CHECK_FALSE(b.failed());
        if (site == FaultSite::StackMap) continue;
        CHECK(first == second);
        CHECK(a.trace_hash == b.trace_hash);
        CHECK(test::contains(first, "bad_alloc"));  // the fault was met, and caught where it should be
    }
    CHECK(fsched::stack_stats().in_use == stacks_before);
}
#endif

namespace {
fsched::Channel<int>& outliving_channel() {
    static fsched::Channel<int>* ch = new fsched::Channel<int>();  // outlives every run (never freed)
    return *ch;
}
}  // namespace

TEST_CASE("simulate: a primitive that outlives a deadlocked run does not bring its fibers back") {
    const SimulationResult first = fsched::testing::simulate(0, [] { (void)outliving_channel().receive(); });
    REQUIRE(first.deadlock);
    // A later run hands a value to the abandoned receiver: the wake is dropped (and said on
    // stderr); the run goes on, and no fiber of the first run runs again.
    bool sent = false;
    const SimulationResult second = fsched::testing::simulate(0, [&] { sent = outliving_channel().send(7); });
    CHECK(second.completed);
    CHECK_FALSE(second.failed());
    CHECK(sent);
    // And so does a plain thread that closes it.
    outliving_channel().close();
    CHECK_FALSE(test::contains(fsched::fiber_report(), "(simulate)"));
}

TEST_CASE("simulate: pct lets a task that spins on yield() give way to the ones it waits for") {
    SimulationOptions o;
    o.strategy = Strategy::pct;
    o.max_switches = 20000;
    const auto spinners = [] {
        bool flags[6] = {false, false, false, false, false, false};
        fsched::WaitGroup wg;
        for (int i = 0; i < 5; ++i) {
            wg.add(1);
            spawn("spinner", [&, i] {
                while (!flags[i]) fsched::this_fiber::yield();
                flags[i + 1] = true;
                wg.done();
            });
        }
        spawn("starter", [&] { flags[0] = true; });
        wg.wait();
    };
    const fsched::testing::ExploreResult e = fsched::testing::explore(spinners, 100, 0, o);
    CHECK_FALSE(e.seed.has_value());
    CHECK(e.runs == 100);
}

TEST_CASE("simulate: a Fiber resumed by hand inside a task may not wait: it fails clearly, never hangs") {
    SUBCASE("a sleep") {
        const SimulationResult r = fsched::testing::simulate(0, [] {
            fsched::Fiber hand([] { fsched::this_fiber::sleep_for(2s); });
            hand.resume();
        });
        CHECK(r.failed());
        CHECK(test::contains(r.error_message, "a Fiber resumed by hand (not a scheduler task) slept"));
    }
    SUBCASE("a wait on a primitive") {
        const test::ChildResult child = test::run_in_child([] {
            fsched::testing::simulate(0, [] {
                fsched::Mutex m;
                m.lock();
                fsched::Fiber hand([&] { m.lock(); });
                hand.resume();
            });
        });
        CHECK(test::aborted_with(child, "a Fiber resumed by hand (not a scheduler task) waited on a primitive"));
    }
}
