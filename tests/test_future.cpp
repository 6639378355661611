// Future<T>, Promise<T>, async(), when_all(), and the move-only callables they need
// (Fiber, Fiber::reset, Scheduler::schedule, ScheduleTask::cb): tasks on 1/2/4/8 workers
// with and without use_caller, plain threads, the use_caller thread, timed waits, misuse.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using test::contains;
using test::report_line;
using fsched::Fiber;
using fsched::Future;
using fsched::Promise;
using fsched::ScheduleTask;
using fsched::Scheduler;
using namespace std::chrono_literals;

namespace {

bool has_code(const std::future_error& e, std::future_errc code) { return e.code() == std::make_error_code(code); }

template <class F>
std::future_errc future_errc_of(F&& f) {
    try {
        f();
    } catch (const std::future_error& e) {
        if (has_code(e, std::future_errc::broken_promise)) return std::future_errc::broken_promise;
        if (has_code(e, std::future_errc::promise_already_satisfied)) {
            return std::future_errc::promise_already_satisfied;
        }
        if (has_code(e, std::future_errc::future_already_retrieved)) return std::future_errc::future_already_retrieved;
        if (has_code(e, std::future_errc::no_state)) return std::future_errc::no_state;
    }
    return std::future_errc{};
}

}  // namespace

// ---- move-only callables -------------------------------------------------------------------

TEST_CASE("move-only callables whose captures claim to be copyable: schedule(), Fiber and reset() never copy them") {
    // std::vector<std::unique_ptr<int>> says it is copy-constructible, but its copy does not
    // compile: a callable holding one must never have a copy made for it (this test compiles
    // only then).
    std::vector<std::unique_ptr<int>> owned;
    owned.push_back(std::make_unique<int>(5));
    std::map<int, std::unique_ptr<int>> keyed;
    keyed.emplace(1, std::make_unique<int>(6));
    Scheduler s(2, false);
    s.start();
    std::atomic<int> sum{0};
    fsched::WaitGroup done(1);
    s.schedule([v = std::move(owned), &sum, &done] {
        sum += *v[0];
        done.done();
    });
    done.wait();
    std::vector<std::unique_ptr<int>> more;
    more.push_back(std::make_unique<int>(7));
    Fiber f([v = std::move(more), &sum] { sum += *v[0]; });
    f.resume();
    f.reset([m = std::move(keyed), &sum] { sum += *m.at(1); });
    f.resume();
    s.stop();
    CHECK(sum.load() == 18);
}

TEST_CASE("move-only callables: Fiber, Fiber::reset, schedule() and ScheduleTask::cb take them") {
    auto owned = std::make_unique<int>(7);
    int seen = 0;
    Fiber f([p = std::move(owned), &seen] { seen = *p; });
    f.resume();
    CHECK(seen == 7);
    CHECK(f.state() == Fiber::State::Term);
    f.reset([p = std::make_unique<int>(8), &seen] { seen = *p; });
    f.resume();
    CHECK(seen == 8);
    // A std::function still converts, to both.
    std::function<void()> plain = [&seen] { seen = 9; };
    Fiber g(plain);
    g.resume();
    CHECK(seen == 9);
    f.reset(plain);
    seen = 0;
    f.resume();
    CHECK(seen == 9);
    CHECK(static_cast<bool>(plain));  // copied, not moved from

    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        std::atomic<int> sum{0};
        s.start();
        s.schedule([p = std::make_unique<int>(1), &sum] { sum += *p; });
        s.schedule([p = std::make_unique<int>(2), &sum] { sum += *p; }, -1, fsched::Priority::High);
        ScheduleTask task;
        task.cb = [p = std::make_unique<int>(4), &sum] { sum += *p; };
        task.name = "move-only";
        s.schedule(std::move(task));
        s.schedule(ScheduleTask{nullptr, [p = std::make_unique<int>(8), &sum] { sum += *p; }, -1});
        // A batch of move-only tasks goes through move iterators.
        std::vector<ScheduleTask> batch;
        for (int i = 0; i < 3; ++i) {
            ScheduleTask t;
            t.cb = [p = std::make_unique<int>(16), &sum] { sum += *p; };
            batch.push_back(std::move(t));
        }
        s.schedule(std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
        // A Promise in a lambda is move-only too.
        Promise<int> promise;
        Future<int> future = promise.get_future();
        s.schedule([promise = std::move(promise)]() mutable { promise.set_value(100); });
        CHECK(future.get() == 100);
        s.stop();
        CHECK(sum == 1 + 2 + 4 + 8 + 48);
    });
}

TEST_CASE("ScheduleTask::cb: a std::function still converts, and a copyable task still copies") {
    Scheduler s(2, false);
    std::atomic<int> runs{0};
    std::function<void()> fn = [&] { runs++; };
    ScheduleTask task;
    task.cb = fn;  // a std::function converts
    ScheduleTask copy = task;  // copyable callbacks keep ScheduleTask copyable
    ScheduleTask small{nullptr, [&runs] { runs++; }, -1};                      // inline
    ScheduleTask boxed{nullptr, [&runs, text = std::string(40, 'x')] { runs += text.size() == 40 ? 1 : 0; }, -1};
    std::vector<ScheduleTask> batch{task, copy, ScheduleTask{nullptr, fn, -1}, small, boxed};
    s.start();
    s.schedule(task);
    s.schedule(copy);
    s.schedule(batch.begin(), batch.end());  // copied from the range
    s.schedule(batch.begin(), batch.end());
    std::function<void()> empty;
    ScheduleTask none;
    none.cb = empty;
    CHECK_FALSE(static_cast<bool>(none.cb));  // an empty std::function makes an empty callback
    CHECK(none.cb == nullptr);
    CHECK(task.cb != nullptr);
    std::function<void()> back = task.cb;  // and a copyable callback converts back
    back();
    s.stop();
    CHECK(runs == 1 + 2 + 5 + 5);
    CHECK(static_cast<bool>(task.cb));  // copies left it as it was
}

TEST_CASE("ScheduleTask: copying one whose callback is move-only is a FIBER_SCHED_ASSERT naming the rule") {
    FSCHED_CHECK_ABORTS_WITH([] {
        ScheduleTask task;
        task.cb = [p = std::make_unique<int>(1)] { (void)p; };
        ScheduleTask copy = task;
        (void)copy;
    }, "ScheduleTask: its callback is move-only and cannot be copied");
}

// ---- Promise and Future --------------------------------------------------------------------

TEST_CASE("Future: get() waits for set_value in a task, a plain thread and the use_caller thread") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        // Tasks waiting for tasks, one chain per worker, each link parked on the next.
        std::vector<Promise<int>> promises(32);
        std::vector<Future<int>> futures;
        for (auto& p : promises) futures.push_back(p.get_future());
        std::atomic<int> sum{0};
        for (int i = 0; i < 31; ++i) {
            s.schedule([&, i] {
                const int v = futures[static_cast<std::size_t>(i) + 1].get();
                CHECK_FALSE(futures[static_cast<std::size_t>(i) + 1].valid());
                sum += v;
                promises[static_cast<std::size_t>(i)].set_value(i);
            });
        }
        s.schedule([&] {
            fsched::this_fiber::sleep_for(1ms);
            promises[31].set_value(31);
        });
        // This thread (the use_caller thread when c.use_caller: it runs tasks meanwhile).
        CHECK(futures[0].valid());
        CHECK(futures[0].get() == 0);
        CHECK_FALSE(futures[0].valid());
        CHECK(sum == (31 * 32) / 2);
        // A plain thread.
        Promise<std::string> text;
        Future<std::string> text_future = text.get_future();
        std::string got;
        std::thread plain([&] { got = text_future.get(); });
        // (Waited for here: on one use_caller worker, the task runs only while this thread helps.)
        fsched::async(s, [&] { text.set_value("from a task"); }).get();
        plain.join();
        CHECK(got == "from a task");
        s.stop();
    });
}

TEST_CASE("Future<void>, Future<T&> and a move-only T") {
    Scheduler s(2, false);
    s.start();
    Promise<void> done;
    Future<void> done_future = done.get_future();
    int target = 1;
    Promise<int&> ref;
    Future<int&> ref_future = ref.get_future();
    Promise<std::unique_ptr<int>> owned;
    Future<std::unique_ptr<int>> owned_future = owned.get_future();
    s.schedule([&] {
        done.set_value();
        ref.set_value(target);
        owned.set_value(std::make_unique<int>(5));
    });
    done_future.get();
    int& r = ref_future.get();
    CHECK(&r == &target);
    std::unique_ptr<int> p = owned_future.get();
    REQUIRE(p);
    CHECK(*p == 5);
    s.stop();
}

TEST_CASE("Promise: set_exception, broken promise, satisfied twice, retrieved twice, no state") {
    Scheduler s(2, false);
    s.start();
    {
        Promise<int> p;
        Future<int> f = p.get_future();
        s.schedule([&] {
            // Made first: the temporary runtime_error (whose string libstdc++ shares with the
            // copy, counted where TSan cannot see) is gone before the waiter can read it.
            std::exception_ptr error = std::make_exception_ptr(std::runtime_error("boom"));
            p.set_exception(std::move(error));
        });
        CHECK_THROWS_WITH_AS(f.get(), "boom", std::runtime_error);
        CHECK_FALSE(f.valid());
    }
    {
        Future<int> f;
        {
            Promise<int> p;
            f = p.get_future();
            s.schedule([p = std::move(p)] {});  // dropped unset by the task
        }
        CHECK(future_errc_of([&] { f.get(); }) == std::future_errc::broken_promise);
    }
    {
        Promise<int> p;
        Future<int> f = p.get_future();
        p.set_value(1);
        CHECK(future_errc_of([&] { p.set_value(2); }) == std::future_errc::promise_already_satisfied);
        CHECK(future_errc_of([&] { p.set_exception(std::make_exception_ptr(1)); }) ==
              std::future_errc::promise_already_satisfied);
        CHECK(future_errc_of([&] { p.get_future(); }) == std::future_errc::future_already_retrieved);
        CHECK(f.get() == 1);
        CHECK(future_errc_of([&] { f.get(); }) == std::future_errc::no_state);
        CHECK(future_errc_of([&] { f.wait(); }) == std::future_errc::no_state);
        CHECK(future_errc_of([&] { f.wait_for(1ms); }) == std::future_errc::no_state);
        Promise<int> moved = std::move(p);
        CHECK(future_errc_of([&] { p.set_value(3); }) == std::future_errc::no_state);  // NOLINT: moved from
        CHECK(future_errc_of([&] { p.get_future(); }) == std::future_errc::no_state);
    }
    {
        // A value whose constructor throws leaves the promise unset.
        struct Picky {
            explicit Picky(int v) : v(v) {}
            Picky(const Picky& other) : v(other.v) {
                if (v < 0) throw std::runtime_error("copy");
            }
            int v;
        };
        Promise<Picky> p;
        Future<Picky> f = p.get_future();
        const Picky bad(-1);
        CHECK_THROWS_AS(p.set_value(bad), std::runtime_error);
        CHECK_FALSE(f.is_ready());
        p.set_value(Picky(3));
        CHECK(f.get().v == 3);
    }
    {
        // A promise assigned over delivers broken_promise to its first future.
        Promise<int> p;
        Future<int> f = p.get_future();
        p = Promise<int>();
        CHECK(future_errc_of([&] { f.get(); }) == std::future_errc::broken_promise);
    }
    s.stop();
}

TEST_CASE("Future: wait_for and wait_until never return early, and a value set in time is ready") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        std::atomic<int> early{0};
        Promise<int> never;
        Future<int> never_future = never.get_future();
        fsched::WaitGroup wg(4);
        for (int i = 0; i < 4; ++i) {
            s.schedule([&, i] {
                const auto d = std::chrono::milliseconds(5 + i * 3);
                const auto start = std::chrono::steady_clock::now();
                const bool timed_out = i % 2 == 0 ? never_future.wait_for(d) == std::future_status::timeout
                                                  : never_future.wait_until(start + d) == std::future_status::timeout;
                if (!timed_out || std::chrono::steady_clock::now() - start < d) early++;
                wg.done();
            });
        }
        // This thread (and the use_caller thread's help) too.
        const auto start = std::chrono::steady_clock::now();
        CHECK(never_future.wait_for(10ms) == std::future_status::timeout);
        CHECK(std::chrono::steady_clock::now() - start >= 10ms);
        CHECK(never_future.wait_until(std::chrono::system_clock::now() + 5ms) == std::future_status::timeout);
        wg.wait();
        CHECK(early == 0);
        // A value set before the deadline: ready, with a generous limit.
        Promise<int> soon;
        Future<int> soon_future = soon.get_future();
        std::atomic<bool> ready_in_task{false};
        fsched::WaitGroup both(1);
        s.schedule([&] {
            ready_in_task = soon_future.wait_for(60s) == std::future_status::ready;
            both.done();
        });
        s.schedule([&] { soon.set_value(1); });
        both.wait();
        CHECK(ready_in_task);
        CHECK(soon_future.wait_for(0ms) == std::future_status::ready);
        CHECK(soon_future.get() == 1);
        never.set_value(0);
        s.stop();
    });
}

TEST_CASE("Future: a timed wait racing set_value is decided once") {
    Scheduler s(4, false);
    s.start();
    std::atomic<int> bad{0};
    for (int round = 0; round < 200; ++round) {
        Promise<int> p;
        Future<int> f = p.get_future();
        fsched::WaitGroup wg(2);
        s.schedule([&] {
            const std::future_status status = f.wait_for(std::chrono::microseconds(round % 50));
            // Whatever it says, the value is there once set, and get() returns it.
            if (status == std::future_status::ready && !f.is_ready()) bad++;
            wg.done();
        });
        s.schedule([&] {
            p.set_value(round);
            wg.done();
        });
        wg.wait();
        if (f.get() != round) bad++;
    }
    s.stop();
    CHECK(bad == 0);
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("Future: a timed wait that cannot allocate throws and leaves no waiter behind") {
    using fsched::detail::FaultSite;
    for (FaultSite site : {FaultSite::WaitAlloc, FaultSite::TimerAlloc}) {
        Scheduler s(2, false, "no-wait");
        Promise<int> p;
        Future<int> f = p.get_future();
        std::atomic<bool> threw{false}, attempted{false}, later{false};
        s.start();
        s.schedule([&] {
            {
                test::Fault fault(site, 1);
                try {
                    f.wait_for(10s);
                } catch (const std::bad_alloc&) {
                    threw = true;
                }
            }
            attempted = true;
            later = f.wait_for(20s) == std::future_status::ready && f.get() == 9;
        });
        s.schedule([&] {
            while (!attempted) fsched::this_fiber::yield();
            p.set_value(9);
        });
        s.stop();
        CHECK(threw);
        CHECK(later);
    }
}
#endif

TEST_CASE("fiber_report() names a fiber parked in Future::get()") {
    Scheduler s(2, false, "futures");
    s.start();
    Promise<int> p;
    Future<int> f = p.get_future();
    std::atomic<std::uint64_t> id{0};
    s.schedule([&] {
        id = fsched::this_fiber::id();
        (void)f.get();
    });
    std::string line;
    for (int i = 0; i < 4000; ++i) {
        if (id != 0) {
            line = report_line(fsched::fiber_report(), id);
            if (contains(line, ": parked ")) break;
        }
        std::this_thread::sleep_for(5ms);
    }
    INFO(line);
    CHECK(contains(line, " on Future 0x"));
    CHECK(contains(line, "(no value yet)"));
    p.set_value(1);
    s.stop();
}

// ---- async and when_all --------------------------------------------------------------------

TEST_CASE("async: runs fn(args...) as a task; results, exceptions, move-only fn and args") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Future<int> sum = fsched::async(s, [](int a, int b) { return a + b; }, 2, 3);
        Future<void> nothing = fsched::async(s, [] {});
        Future<int> owned = fsched::async(s, [p = std::make_unique<int>(6)](std::unique_ptr<int> q) { return *p * *q; },
                                          std::make_unique<int>(7));
        Future<int> thrown = fsched::async(s, []() -> int { throw std::logic_error("nope"); });
        Future<std::string> nested = fsched::async(s, [&s] {
            // A task waiting for another task's future parks.
            return fsched::async(s, [] { return std::string("inner"); }).get() + "+outer";
        });
        CHECK(sum.get() == 5);
        nothing.get();
        CHECK(owned.get() == 42);
        CHECK_THROWS_WITH_AS(thrown.get(), "nope", std::logic_error);
        CHECK(nested.get() == "inner+outer");
        // From a plain thread too.
        int from_thread = 0;
        Promise<void> joined;
        Future<void> joined_future = joined.get_future();
        std::thread plain([&] {
            from_thread = fsched::async(s, [] { return 11; }).get();
            joined.set_value();
        });
        joined_future.get();  // helps, on the use_caller thread: its worker may be the only one
        plain.join();
        CHECK(from_thread == 11);
        s.stop();
    });
}

TEST_CASE("when_all: ready once every future is; rethrows the first exception in order; keeps the futures") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        std::vector<Future<int>> futures;
        for (int i = 0; i < 20; ++i) {
            futures.push_back(fsched::async(s, [i] {
                fsched::this_fiber::sleep_for(std::chrono::microseconds(100 * (i % 5)));
                return i;
            }));
        }
        Future<void> all = fsched::when_all(futures.begin(), futures.end());
        all.get();
        int sum = 0;
        for (auto& f : futures) {
            CHECK(f.valid());
            CHECK(f.is_ready());
            sum += f.get();
        }
        CHECK(sum == 190);
        // Exceptions: the first in the range's order, though the later one may come first.
        std::vector<Future<int>> mixed;
        mixed.push_back(fsched::async(s, [] { return 1; }));
        mixed.push_back(fsched::async(s, []() -> int {
            fsched::this_fiber::sleep_for(2ms);
            throw std::runtime_error("second");
        }));
        mixed.push_back(fsched::async(s, []() -> int { throw std::logic_error("third"); }));
        // when_all from inside a task parks there.
        Future<void> from_task = fsched::async(s, [&] { fsched::when_all(mixed.begin(), mixed.end()).get(); });
        CHECK_THROWS_WITH_AS(from_task.get(), "second", std::runtime_error);
        CHECK(mixed[0].get() == 1);
        CHECK_THROWS_AS(mixed[2].get(), std::logic_error);
        std::vector<Future<int>> none;
        fsched::when_all(none.begin(), none.end()).get();
        s.stop();
    });
}

TEST_CASE("when_all: returns at once; ready only with the last future, whatever the order they are set in") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        constexpr int n = 6;
        std::vector<Promise<int>> promises(n);
        std::vector<Future<int>> futures;
        for (auto& p : promises) futures.push_back(p.get_future());
        promises[2].set_value(2);  // one ready before the call
        Future<void> all = fsched::when_all(futures.begin(), futures.end());
        CHECK(!all.is_ready());
        CHECK(all.wait_for(5ms) == std::future_status::timeout);
        // The rest set from tasks, last to first, a later one with an exception first: the
        // first in the range's order wins, not the first set.
        fsched::WaitGroup set(1);
        s.schedule([&] {
            for (int i = n - 1; i >= 0; --i) {
                if (i == 2) continue;
                if (i == 4) {
                    promises[i].set_exception(std::make_exception_ptr(std::logic_error("four")));
                } else if (i == 1) {
                    promises[i].set_exception(std::make_exception_ptr(std::runtime_error("one")));
                } else {
                    promises[i].set_value(i);
                }
                if (i == 1) CHECK(!all.is_ready());  // promises[0] is still unset
            }
            set.done();
        });
        set.wait();
        CHECK_THROWS_WITH_AS(all.get(), "one", std::runtime_error);
        // The futures are still whole: values and exceptions each.
        CHECK(futures[0].get() == 0);
        CHECK_THROWS_WITH_AS(futures[1].get(), "one", std::runtime_error);
        CHECK(futures[2].get() == 2);
        CHECK_THROWS_WITH_AS(futures[4].get(), "four", std::logic_error);
        s.stop();
    });
}

TEST_CASE("when_all: its futures may go before they are ready; a broken promise reaches its get()") {
    Scheduler s(2, false);
    s.start();
    auto promises = std::make_unique<std::vector<Promise<int>>>(3);
    Future<void> all;
    {
        std::vector<Future<int>> futures;
        for (auto& p : *promises) futures.push_back(p.get_future());
        all = fsched::when_all(futures.begin(), futures.end());
    }  // the futures are gone; their states live on with the promises
    (*promises)[0].set_value(1);
    (*promises)[1].set_value(2);
    CHECK(!all.is_ready());
    Future<void> waiter = fsched::async(s, [&] { all.wait(); });  // a task parks on it
    promises.reset();  // promises[2] destroyed unset: broken_promise
    waiter.get();
    try {
        all.get();
        FAIL("when_all's get() returned");
    } catch (const std::future_error& e) {
        CHECK(e.code() == std::future_errc::broken_promise);
    }
    s.stop();
}

TEST_CASE("when_all: throwing asyncs whose futures are dropped before its get(): the first exception, nothing leaked") {
    // The exceptions are copied as each future becomes ready, on the setters' threads, and
    // released before the result is published; under TSan a release that raced the reader's
    // copy was reported here.
    Scheduler s(4, false);
    s.start();
    for (int round = 0; round < 300; ++round) {
        Future<void> all;
        {
            std::vector<Future<int>> futures;
            for (int i = 0; i < 8; ++i) {
                futures.push_back(fsched::async(s, [i]() -> int {
                    if (i % 2 == 1) throw std::runtime_error("failed " + std::to_string(i));
                    return i;
                }));
            }
            all = fsched::when_all(futures.begin(), futures.end());
        }
        try {
            all.get();
            FAIL("when_all's get() returned");
        } catch (const std::runtime_error& e) {
            CHECK(std::string(e.what()) == "failed 1");
        }
    }
    s.stop();
}

TEST_CASE("when_all: many futures set from many tasks at once; every call's result ready exactly when its last is") {
    Scheduler s(4, false);
    s.start();
    for (int round = 0; round < 50; ++round) {
        std::vector<Promise<void>> promises(64);
        std::vector<Future<void>> futures;
        for (auto& p : promises) futures.push_back(p.get_future());
        Future<void> all = fsched::when_all(futures.begin(), futures.end());
        std::atomic<int> set{0};
        fsched::WaitGroup done(static_cast<std::int64_t>(promises.size()));
        for (auto& p : promises) {
            s.schedule([&, pp = &p] {
                pp->set_value();
                set.fetch_add(1);
                done.done();
            });
        }
        all.get();
        done.wait();
        CHECK(set.load() == 64);
    }
    s.stop();
}

TEST_CASE("when_all: a chain of 100,000 nested when_alls completes from one set_value without deep recursion") {
    // Each link waits on the one before: the first set_value readies them all. Firing them
    // one level deeper per link overflowed the stack at about 2,000 links.
    constexpr int links = 100000;
    Promise<void> first;
    std::vector<Future<void>> chain;
    chain.reserve(links + 1);
    chain.push_back(first.get_future());
    for (int i = 0; i < links; ++i) chain.push_back(fsched::when_all(chain.end() - 1, chain.end()));
    CHECK(!chain.back().is_ready());
    // On a fiber with a 64 KiB stack, where the recursion ran out first.
    fsched::SchedulerOptions options;
    options.threads = 1;
    options.stack_size = 64 * 1024;
    Scheduler s(options);
    s.start();
    fsched::async(s, [&] { first.set_value(); }).get();
    for (int i = 0; i <= links; i += 9999) CHECK(chain[static_cast<std::size_t>(i)].is_ready());
    CHECK_NOTHROW(chain.back().get());
    s.stop();
}

TEST_CASE("when_all with an invalid future is a FIBER_SCHED_ASSERT naming the rule") {
    FSCHED_CHECK_ABORTS_WITH([] {
        std::vector<Future<int>> futures(1);
        fsched::when_all(futures.begin(), futures.end());
    }, "when_all(): a future in the range is not valid");
}
