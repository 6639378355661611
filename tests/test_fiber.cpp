// Fiber: states, nesting, reset, current, ids, exceptions, threads, misuse.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>


using fsched::Fiber;
using State = Fiber::State;

TEST_CASE("a fiber runs as a generator and passes through every state") {
    std::vector<int> seen;
    int value = 0;
    Fiber fiber([&] {
        for (int i = 1; i <= 3; ++i) {
            value = i;
            Fiber::yield();
        }
    });
    CHECK(fiber.state() == State::Ready);
    for (int i = 1; i <= 3; ++i) {
        fiber.resume();
        CHECK(fiber.state() == State::Suspended);
        seen.push_back(value);
    }
    fiber.resume();
    CHECK(fiber.state() == State::Term);
    CHECK(seen == std::vector<int>{1, 2, 3});
}

TEST_CASE("fiber ids are unique, non-zero and increasing") {
    Fiber a([] {});
    Fiber b([] {});
    auto c = std::make_shared<Fiber>([] {});
    CHECK(a.id() != 0);
    CHECK(a.id() < b.id());
    CHECK(b.id() < c->id());
}

TEST_CASE("current() and current_ptr() name the running fiber") {
    CHECK(Fiber::current() == nullptr);
    CHECK(Fiber::current_ptr() == nullptr);
    Fiber* seen_raw = nullptr;
    Fiber::ptr seen_shared;
    auto fiber = std::make_shared<Fiber>([&] {
        seen_raw = Fiber::current();
        seen_shared = Fiber::current_ptr();
    });
    fiber->resume();
    CHECK(seen_raw == fiber.get());
    CHECK(seen_shared == fiber);
    CHECK(Fiber::current() == nullptr);

    bool empty_for_unshared = false;
    Fiber unshared([&] { empty_for_unshared = Fiber::current() != nullptr && Fiber::current_ptr() == nullptr; });
    unshared.resume();
    CHECK(empty_for_unshared);
}

TEST_CASE("fibers nest: yield returns to the resumer, innermost first") {
    std::vector<std::string> log;
    Fiber* outer_ptr = nullptr;
    Fiber inner([&] {
        log.push_back("inner 1");
        CHECK(Fiber::current() != outer_ptr);
        Fiber::yield();
        log.push_back("inner 2");
    });
    Fiber outer([&] {
        log.push_back("outer 1");
        inner.resume();
        CHECK(Fiber::current() == outer_ptr);
        log.push_back("outer 2");
        Fiber::yield();
        inner.resume();
        log.push_back("outer 3");
    });
    outer_ptr = &outer;
    outer.resume();
    CHECK(inner.state() == State::Suspended);
    CHECK(outer.state() == State::Suspended);
    CHECK(Fiber::current() == nullptr);
    outer.resume();
    CHECK(inner.state() == State::Term);
    CHECK(outer.state() == State::Term);
    CHECK(log == std::vector<std::string>{"outer 1", "inner 1", "outer 2", "inner 2", "outer 3"});
}

TEST_CASE("an exception escaping a fiber is rethrown by resume() and the fiber is Term") {
    Fiber fiber([] {
        Fiber::yield();
        throw std::runtime_error("boom");
    });
    fiber.resume();
    CHECK_THROWS_WITH_AS(fiber.resume(), "boom", std::runtime_error);
    CHECK(fiber.state() == State::Term);
    // The exception was handed over once; a reset fiber starts clean.
    fiber.reset([] {});
    CHECK_NOTHROW(fiber.resume());
    CHECK(fiber.state() == State::Term);
}

TEST_CASE("an exception from a nested fiber reaches the fiber that resumed it") {
    bool caught = false;
    Fiber outer([&] {
        Fiber inner([] { throw 7; });
        try {
            inner.resume();
        } catch (int v) {
            caught = v == 7;
        }
    });
    outer.resume();
    CHECK(caught);
    CHECK(outer.state() == State::Term);
}

TEST_CASE("reset() reuses the stack with a new function") {
    int runs = 0;
    const char* first_stack = nullptr;
    const char* second_stack = nullptr;
    Fiber fiber([&] {
        char probe = 0;
        first_stack = &probe;
        ++runs;
    });
    fiber.reset([&] {  // from Ready: only the function changes
        char probe = 0;
        first_stack = &probe;
        runs += 10;
    });
    fiber.resume();
    CHECK(runs == 10);
    CHECK(fiber.state() == State::Term);
    fiber.reset([&] {
        char probe = 0;
        second_stack = &probe;
        runs += 100;
        Fiber::yield();
    });
    CHECK(fiber.state() == State::Ready);
    fiber.resume();
    CHECK(fiber.state() == State::Suspended);
    CHECK(runs == 110);
    // Both functions' first frames sit at the top of the same stack.
    // (A difference, not std::labs: on Windows a long is 32 bits.)
    CHECK((first_stack > second_stack ? first_stack - second_stack : second_stack - first_stack) < 1024);
    fiber.resume();
    CHECK(fiber.state() == State::Term);
}

TEST_CASE("stack sizes are rounded up to pages and 0 means the default") {
    const std::size_t page = test::page_size();
    Fiber by_default([] {});
    CHECK(by_default.stack_size() == FIBER_SCHED_DEFAULT_STACK_SIZE);
    Fiber odd([] {}, 20 * page + 1);
    CHECK(odd.stack_size() == 21 * page);
    Fiber tiny([] {}, 1);
    CHECK(tiny.stack_size() >= page);
    CHECK(tiny.stack_size() % page == 0);
    // The fiber really has that much: fill most of it.
    Fiber deep([] {
        volatile char block[48 * 1024];
        for (std::size_t i = 0; i < sizeof(block); i += 512) block[i] = static_cast<char>(i);
    }, 64 * 1024);
    deep.resume();
    CHECK(deep.state() == State::Term);
}

TEST_CASE("what the function captured is released when it returns") {
    auto token = std::make_shared<int>(1);
    std::weak_ptr<int> watch = token;
    Fiber fiber([token = std::move(token)] { Fiber::yield(); });
    fiber.resume();
    CHECK(!watch.expired());
    fiber.resume();
    CHECK(watch.expired());
}

TEST_CASE("a fiber resumed on another thread sees the right current() and thread") {
    Fiber* before = nullptr;
    Fiber* after = nullptr;
    // The OS's thread id, not std::this_thread::get_id() (see test::os_thread_id()).
    long thread_before = 0;
    long thread_after = 0;
    auto fiber = std::make_shared<Fiber>([&] {
        before = Fiber::current();
        thread_before = test::os_thread_id();
        Fiber::yield();
        after = Fiber::current();
        thread_after = test::os_thread_id();
    });
    // The first thread stays alive until the second is done, so their ids differ.
    std::atomic<bool> second_done{false};
    std::atomic<bool> first_resumed{false};
    std::thread first([&] {
        fiber->resume();
        first_resumed = true;
        while (!second_done) std::this_thread::yield();
    });
    while (!first_resumed) std::this_thread::yield();
    CHECK(fiber->state() == State::Suspended);
    std::thread second([&] {
        fiber->resume();
        CHECK(Fiber::current() == nullptr);
    });
    second.join();
    second_done = true;
    first.join();
    CHECK(before == fiber.get());
    CHECK(after == fiber.get());
    CHECK(thread_before != thread_after);
    CHECK(thread_after != 0);
}

TEST_CASE("many fibers ping-pong between two threads without losing count") {
    constexpr int fibers = 64;
    constexpr int rounds = 50;
    std::vector<std::unique_ptr<Fiber>> all;
    std::vector<int> counts(fibers, 0);
    for (int i = 0; i < fibers; ++i) {
        all.push_back(std::make_unique<Fiber>([&counts, i] {
            for (int r = 0; r < rounds; ++r) {
                ++counts[static_cast<std::size_t>(i)];
                Fiber::yield();
            }
        }, 32 * 1024));
    }
    for (int r = 0; r <= rounds; ++r) {
        std::thread worker([&] {
            for (auto& f : all) f->resume();
        });
        worker.join();
    }
    for (int i = 0; i < fibers; ++i) {
        CHECK(counts[static_cast<std::size_t>(i)] == rounds);
        CHECK(all[static_cast<std::size_t>(i)]->state() == State::Term);
    }
}

TEST_CASE("misuse of a Fiber is a FIBER_SCHED_ASSERT naming the rule") {
    SUBCASE("resume() on a running fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber* self = nullptr;
            Fiber fiber([&] { self->resume(); });
            self = &fiber;
            fiber.resume();
        }, "resume(): fiber is already running");
    }
    SUBCASE("resume() on a terminated fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber fiber([] {});
            fiber.resume();
            fiber.resume();
        }, "resume(): fiber has terminated");
    }
    SUBCASE("reset() on a running fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber* self = nullptr;
            Fiber fiber([&] { self->reset([] {}); });
            self = &fiber;
            fiber.resume();
        }, "reset(): fiber is running");
    }
    SUBCASE("reset() on a suspended fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber fiber([] { Fiber::yield(); });
            fiber.resume();
            fiber.reset([] {});
        }, "reset(): fiber is suspended");
    }
    SUBCASE("destroying a running fiber") {
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber* self = nullptr;
            self = new Fiber([&] { delete self; });
            self->resume();
        }, "~Fiber(): a running fiber must not be destroyed");
    }
    SUBCASE("yield() outside a fiber") {
        FSCHED_CHECK_ABORTS_WITH([] { Fiber::yield(); }, "yield(): called outside a fiber");
    }
    SUBCASE("an empty function") {
        FSCHED_CHECK_ABORTS_WITH([] { Fiber fiber(std::function<void()>{}); }, "Fiber(): the function is empty");
        FSCHED_CHECK_ABORTS_WITH([] {
            Fiber fiber([] {});
            fiber.reset(nullptr);
        }, "reset(): the function is empty");
    }
}
