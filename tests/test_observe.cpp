// Seeing inside (issue 23), the first steps: fiber names (Fiber::set_name, this_fiber::set_name,
// ScheduleTask::name) and the profiler hooks (set_hooks). The hooks are checked as Tracy's
// fiber API needs them: on each thread, switch-ins and switch-outs alternate and name the
// same fiber, also when fibers migrate between workers, when the use_caller thread runs
// tasks, and when a task resumes a fiber by hand.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using fsched::Fiber;
using fsched::Scheduler;

TEST_CASE("names: Fiber::set_name, name, name_c_str") {
    Fiber fiber([] {});
    CHECK(fiber.name().empty());
    CHECK(fiber.name_c_str() == nullptr);
    fiber.set_name("net-reader");
    CHECK(fiber.name() == "net-reader");
    const char* first = fiber.name_c_str();
    REQUIRE(first != nullptr);
    CHECK(std::strcmp(first, "net-reader") == 0);
    // Interned: the same name is the same pointer, in another fiber too, and a rename
    // leaves the old pointer valid.
    Fiber other([] {});
    other.set_name(std::string("net-") + "reader");
    CHECK(other.name_c_str() == first);
    fiber.set_name("db-writer");
    CHECK(fiber.name() == "db-writer");
    CHECK(std::strcmp(first, "net-reader") == 0);
    fiber.set_name("");
    CHECK(fiber.name_c_str() == nullptr);
    fiber.resume();
}

TEST_CASE("names: this_fiber::set_name inside a fiber, from another thread while it runs") {
    Fiber fiber([] {
        fsched::this_fiber::set_name("inside");
        Fiber::yield();
    });
    fiber.resume();
    CHECK(fiber.name() == "inside");
    std::thread renamer([&] { fiber.set_name("renamed"); });
    renamer.join();
    CHECK(fiber.name() == "renamed");
    fiber.resume();
    CHECK(fiber.state() == Fiber::State::Term);
}

TEST_CASE("names: a task's name is its fiber's while it runs, and goes with it") {
    for (const bool use_caller : {false, true}) {
        CAPTURE(use_caller);
        Scheduler scheduler(1, use_caller, "names");
        scheduler.start();
        std::mutex mutex;
        std::vector<std::string> seen;
        auto record = [&] {
            std::lock_guard<std::mutex> lock(mutex);
            seen.push_back(Fiber::current()->name());
        };
        // One worker runs them in order, reusing its pooled fiber: a named task, then an
        // unnamed one on the same fiber (it must not inherit the name), then a named one that
        // renames itself, then an unnamed one again.
        fsched::ScheduleTask named;
        named.cb = record;
        named.name = "job-a";
        fsched::ScheduleTask renames;
        renames.cb = [&] {
            fsched::this_fiber::set_name("job-c");
            record();
        };
        renames.name = "job-b";
        std::vector<fsched::ScheduleTask> batch;
        batch.push_back(named);
        batch.push_back(fsched::ScheduleTask{nullptr, record});
        batch.push_back(renames);
        batch.push_back(fsched::ScheduleTask{nullptr, record});
        for (auto& task : batch) scheduler.schedule(task, 0);
        scheduler.stop();
        CHECK(seen == std::vector<std::string>{"job-a", "", "job-c", ""});
    }
}

TEST_CASE("names: a ScheduleTask naming a Fiber::ptr names that fiber") {
    Scheduler scheduler(2, false, "names");
    scheduler.start();
    auto fiber = std::make_shared<Fiber>([] {});
    fsched::ScheduleTask task;
    task.fiber = fiber;
    task.name = "given";
    scheduler.schedule(task);
    scheduler.stop();
    CHECK(fiber->name() == "given");
}

namespace {

// What Tracy requires of TracyFiberEnter / TracyFiberLeave, checked per thread: an enter
// is followed by a leave of the same fiber before the next enter.
struct HookRecorder {
    std::mutex mutex;
    std::map<std::thread::id, Fiber*> inside;  // the fiber each thread is in
    std::set<Fiber*> live;                    // on_create seen, on_destroy not yet
    std::map<std::uint64_t, std::set<int>> workers_of;  // which workers each fiber ran on
    std::vector<std::string> errors;
    std::atomic<long> switch_ins{0}, switch_outs{0}, creates{0}, destroys{0}, wakes{0}, wakes_by_fiber{0};

    void error(std::string what) { errors.push_back(std::move(what)); }
};
HookRecorder* recorder = nullptr;

void on_create(Fiber& f) {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    ++recorder->creates;
    if (!recorder->live.insert(&f).second) recorder->error("created twice");
}
void on_destroy(Fiber& f) {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    ++recorder->destroys;
    if (recorder->live.erase(&f) != 1) recorder->error("destroyed without create, or twice");
}
void on_switch_in(Fiber& f, int worker) {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    ++recorder->switch_ins;
    Fiber*& inside = recorder->inside[std::this_thread::get_id()];
    if (inside) recorder->error("switch-in while another fiber is in (nested)");
    inside = &f;
    if (worker != fsched::Scheduler::worker_index()) recorder->error("worker index is not this thread's");
    recorder->workers_of[f.id()].insert(worker);
}
void on_switch_out(Fiber& f, int worker) {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    ++recorder->switch_outs;
    Fiber*& inside = recorder->inside[std::this_thread::get_id()];
    if (inside != &f) recorder->error("switch-out of a fiber that is not in (zone ended twice)");
    inside = nullptr;
    if (worker != fsched::Scheduler::worker_index()) recorder->error("worker index is not this thread's");
}
void on_wake(Fiber&, Fiber* by) {
    ++recorder->wakes;
    if (by) ++recorder->wakes_by_fiber;
}

struct HooksOn {
    explicit HooksOn(HookRecorder& r) {
        recorder = &r;
        fsched::Hooks hooks;
        hooks.on_create = on_create;
        hooks.on_destroy = on_destroy;
        hooks.on_switch_in = on_switch_in;
        hooks.on_switch_out = on_switch_out;
        hooks.on_wake = on_wake;
        fsched::set_hooks(hooks);
    }
    ~HooksOn() { fsched::set_hooks(fsched::Hooks{}); }
};

void check_balanced(HookRecorder& r) {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& e : r.errors) FAIL_CHECK(e);
    CHECK(r.errors.empty());
    for (const auto& [thread, fiber] : r.inside) CHECK_MESSAGE(fiber == nullptr, "a thread was left inside a fiber");
    CHECK(r.switch_ins.load() == r.switch_outs.load());
}

}  // namespace

TEST_CASE("hooks: balanced per thread under migration, channels, sleeps, the caller's help and nesting") {
    HookRecorder r;
    {
        HooksOn on(r);
        for (const bool use_caller : {false, true}) {
            CAPTURE(use_caller);
            Scheduler scheduler(3, use_caller, "hooks");
            scheduler.start();
            constexpr int pairs = 8, rounds = 200;
            std::atomic<int> done{0};
            for (int p = 0; p < pairs; ++p) {
                auto ping = std::make_shared<fsched::Channel<int>>();
                auto pong = std::make_shared<fsched::Channel<int>>();
                scheduler.schedule([ping, pong] {
                    for (int i = 0; i < rounds; ++i) {
                        ping->send(i);
                        pong->receive();
                        if (i % 50 == 0) fsched::this_fiber::sleep_for(std::chrono::microseconds(100));
                    }
                });
                scheduler.schedule([ping, pong, &done] {
                    for (int i = 0; i < rounds; ++i) {
                        ping->receive();
                        if (i % 7 == 0) fsched::this_fiber::yield();
                        pong->send(i);
                    }
                    // A fiber resumed by hand inside a task: the task is switched out around it.
                    Fiber inner([] { Fiber::yield(); });
                    inner.resume();
                    inner.resume();
                    ++done;
                });
            }
            scheduler.stop();
            CHECK(done.load() == pairs);
        }
        // A fiber resumed on a plain thread.
        Fiber plain([] { Fiber::yield(); });
        plain.resume();
        plain.resume();
    }
    check_balanced(r);
    CHECK(r.switch_ins.load() > 8 * 2 * 200);
    CHECK(r.wakes_by_fiber.load() > 0);
    // Every fiber the hooks saw made was seen gone (pooled callback fibers too).
    CHECK(r.creates.load() == r.destroys.load());
    CHECK(r.live.empty());
    // Fibers migrated: some ran on more than one worker (three workers, hand-offs and steals).
    std::size_t migrated = 0;
    for (const auto& [id, workers] : r.workers_of) migrated += workers.size() > 1;
    MESSAGE("fibers that ran on more than one worker: " << migrated);
}

TEST_CASE("hooks: Hooks{} turns them off") {
    HookRecorder r;
    { HooksOn on(r); }
    Fiber fiber([] {});
    fiber.resume();
    CHECK(r.switch_ins.load() == 0);
    CHECK(r.creates.load() == 0);
}
