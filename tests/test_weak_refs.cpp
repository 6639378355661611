// A callback task's fiber belongs to that task (issue 20, item 2): every shared_ptr or
// weak_ptr to it that user code can obtain (Fiber::current_ptr(), shared_from_this(),
// weak_from_this()) refers to that task's fiber only, a weak_ptr expires once the task has
// ended, and a fiber that no one asked for is still pooled for the worker's next task.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

using fsched::Fiber;
using fsched::Scheduler;

namespace {

// How a callback gets at its fiber.
enum class Way { WeakFromThis, SharedFromThis, CurrentPtr };

std::weak_ptr<Fiber> weak_to_current(Way way) {
    switch (way) {
    case Way::WeakFromThis: return Fiber::current()->weak_from_this();
    case Way::SharedFromThis: return Fiber::current()->shared_from_this();  // the shared_ptr goes here
    case Way::CurrentPtr: return Fiber::current_ptr();
    }
    return {};
}

Fiber::ptr shared_to_current(Way way) {
    switch (way) {
    case Way::WeakFromThis: return Fiber::current()->weak_from_this().lock();
    case Way::SharedFromThis: return Fiber::current()->shared_from_this();
    case Way::CurrentPtr: return Fiber::current_ptr();
    }
    return {};
}

// Runs `first` as a callback task on worker 0, then `second` as another one there, which
// `first`'s task schedules: it starts only after that task has ended on the same worker,
// where it would get the first task's fiber if that was pooled. Returns once both ended
// and the scheduler has stopped and gone (its workers' pooled fibers with it); calls
// `stopped` between the two, when the workers' pooled fibers still hold their stacks.
template <class First, class Second, class Stopped = void (*)()>
void two_tasks_on_worker_0(const test::Config& config, First first, Second second, Stopped stopped = [] {}) {
    Scheduler s(config.threads, config.use_caller);
    s.start();
    fsched::WaitGroup both(2);
    s.schedule([&] {
        first();
        Scheduler::current()->schedule([&] {
            second();
            both.done();
        }, 0);
        both.done();
    }, 0);
    both.wait();
    s.stop();
    stopped();
}

// Runs two tasks as two_tasks_on_worker_0 does, each calling `look`, and returns how many
// fibers the scheduler kept pooled at the end: 1 when a task that did `look` gives its fiber
// back to the pool (2 would mean the second task did not take the first one's from there),
// 0 when it does not.
template <class Look>
std::size_t fibers_pooled_after_two_tasks(const test::Config& config, Look look) {
    const std::size_t in_use_before = fsched::stack_stats().in_use;
    std::size_t pooled = 0;
    two_tasks_on_worker_0(config, look, look, [&] { pooled = fsched::stack_stats().in_use - in_use_before; });
    CHECK(fsched::stack_stats().in_use == in_use_before);  // and none is left behind
    return pooled;
}

// The common check of the weak_ptr cases: a weak_ptr taken in one task is live during it
// and expired in the next task on the same worker, where lock() gives nothing.
void weak_ptr_expires_with_its_task(const test::Config& config, Way way) {
    std::weak_ptr<Fiber> weak;
    bool live_in_first = false;
    bool expired_in_second = false;
    Fiber::ptr locked_in_second;
    std::uint64_t second_id = 0;
    two_tasks_on_worker_0(config, [&] {
        weak = weak_to_current(way);
        live_in_first = !weak.expired() && weak.lock().get() == Fiber::current();
    }, [&] {
        expired_in_second = weak.expired();
        locked_in_second = weak.lock();
        second_id = fsched::this_fiber::id();
    });
    CHECK(live_in_first);
    CHECK(expired_in_second);
    CHECK_FALSE(locked_in_second);
    if (locked_in_second) CHECK(locked_in_second->id() != second_id);
    CHECK(weak.expired());
}

}  // namespace

TEST_CASE("weak refs: a weak_ptr from weak_from_this() expires with its task, never locking onto the next task's fiber") {
    FSCHED_FOR_EACH_CONFIG([](const test::Config& config) { weak_ptr_expires_with_its_task(config, Way::WeakFromThis); });
}

TEST_CASE("weak refs: a weak_ptr from shared_from_this() expires with its task once the shared_ptr is gone") {
    FSCHED_FOR_EACH_CONFIG([](const test::Config& config) { weak_ptr_expires_with_its_task(config, Way::SharedFromThis); });
}

TEST_CASE("weak refs: a weak_ptr from current_ptr() expires with its task once the shared_ptr is gone") {
    FSCHED_FOR_EACH_CONFIG([](const test::Config& config) { weak_ptr_expires_with_its_task(config, Way::CurrentPtr); });
}

TEST_CASE("weak refs: a shared_ptr kept past its task stays that task's Term fiber, never reused") {
    for (Way way : {Way::WeakFromThis, Way::SharedFromThis, Way::CurrentPtr}) {
        CAPTURE(static_cast<int>(way));
        FSCHED_FOR_EACH_CONFIG([way](const test::Config& config) {
            Fiber::ptr kept;
            std::weak_ptr<Fiber> weak;
            std::uint64_t first_id = 0, second_id = 0, kept_id_in_second = 0;
            Fiber* second_fiber = nullptr;
            Fiber::State kept_state_in_second = Fiber::State::Ready;
            bool weak_gives_kept = false;
            two_tasks_on_worker_0(config, [&] {
                kept = shared_to_current(way);
                weak = Fiber::current()->weak_from_this();
                first_id = fsched::this_fiber::id();
            }, [&] {
                second_fiber = Fiber::current();
                second_id = fsched::this_fiber::id();
                kept_id_in_second = kept->id();
                kept_state_in_second = kept->state();
                weak_gives_kept = weak.lock() == kept;
            });
            REQUIRE(kept);
            CHECK(kept.get() != second_fiber);
            CHECK(kept_id_in_second == first_id);
            CHECK(second_id != first_id);
            CHECK(kept_state_in_second == Fiber::State::Term);
            CHECK(weak_gives_kept);
            // After its scheduler too: the same Term fiber, and the weak_ptr still reaches it.
            CHECK(kept->id() == first_id);
            CHECK(kept->state() == Fiber::State::Term);
            CHECK(weak.lock() == kept);
            kept.reset();
            CHECK(weak.expired());
        });
    }
}

TEST_CASE("weak refs: a weak_ptr kept past its task and its scheduler stays expired, and its stack goes back with it") {
    const std::size_t in_use_before = fsched::stack_stats().in_use;
    std::weak_ptr<Fiber> weak;
    bool expired_in_second = false;
    two_tasks_on_worker_0({1, false}, [&] { weak = Fiber::current()->weak_from_this(); },
                          [&] { expired_in_second = weak.expired(); });
    CHECK(expired_in_second);
    CHECK(weak.expired());
    CHECK_FALSE(weak.lock());
    weak.reset();
    CHECK(fsched::stack_stats().in_use == in_use_before);
}

TEST_CASE("weak refs: a callback that takes no reference to its fiber still gets a pooled one") {
    FSCHED_FOR_EACH_CONFIG([](const test::Config& config) {
        CHECK(fibers_pooled_after_two_tasks(config, [] {}) == 1);
        // Nor do the library's own looks at the running fiber count as taking one.
        fsched::Mutex mutex;
        std::atomic<int> ids{0};
        CHECK(fibers_pooled_after_two_tasks(config, [&] {
            std::lock_guard<fsched::Mutex> lock(mutex);
            ids += fsched::this_fiber::id() != 0;
        }) == 1);
        CHECK(ids == 2);
        // Fiber::current() shows the fiber to user code, which may keep a weak_ptr from it:
        // that fiber is never pooled.
        CHECK(fibers_pooled_after_two_tasks(config, [] { (void)Fiber::current(); }) == 0);
    });
}
