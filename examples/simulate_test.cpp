// Testing concurrent code with fsched::testing: a doctest case explores a bank transfer
// with a race in it, prints the seed that breaks it and the report of that run, replays
// the seed, and checks that the fixed transfer survives every seed tried.
//
//   cmake --build build --target example.simulate_test && build/examples/simulate_test
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

namespace {

struct Account {
    fsched::Mutex lock;
    int balance = 0;
};

// The bug: the balance is checked under the lock, then the lock is let go (to log, to ask
// a fraud service) and taken again to debit, so two transfers can both pass the check.
void transfer_racy(Account& from, Account& to, int amount) {
    bool enough;
    {
        std::lock_guard<fsched::Mutex> guard(from.lock);
        enough = from.balance >= amount;
    }
    fsched::this_fiber::yield();  // the fraud check, which waits for another service
    if (!enough) return;
    {
        std::lock_guard<fsched::Mutex> guard(from.lock);
        from.balance -= amount;
        if (from.balance < 0) throw std::logic_error("overdrawn: " + std::to_string(from.balance));
    }
    std::lock_guard<fsched::Mutex> guard(to.lock);
    to.balance += amount;
}

// The fix: check and debit under one hold of the lock.
void transfer_fixed(Account& from, Account& to, int amount) {
    fsched::this_fiber::yield();
    {
        std::lock_guard<fsched::Mutex> guard(from.lock);
        if (from.balance < amount) return;
        from.balance -= amount;
    }
    std::lock_guard<fsched::Mutex> guard(to.lock);
    to.balance += amount;
}

// Two customers pay out of one account of 100 at once; the bank must never go negative
// and must neither make nor lose money.
void bank_day(void (*transfer)(Account&, Account&, int)) {
    Account alice, bob, carol;
    alice.balance = 100;
    fsched::WaitGroup wg;
    wg.add(2);
    fsched::Scheduler& s = *fsched::Scheduler::current();
    s.schedule(fsched::ScheduleTask{nullptr, [&] { transfer(alice, bob, 70); wg.done(); }, -1,
                                    fsched::Priority::Normal, "pay-bob"});
    s.schedule(fsched::ScheduleTask{nullptr, [&] { transfer(alice, carol, 60); wg.done(); }, -1,
                                    fsched::Priority::Normal, "pay-carol"});
    wg.wait();
    if (alice.balance < 0) throw std::logic_error("alice is overdrawn: " + std::to_string(alice.balance));
    if (alice.balance + bob.balance + carol.balance != 100) throw std::logic_error("money was made or lost");
}

}  // namespace

TEST_CASE("the racy transfer: explore() finds a seed that overdraws, and the seed replays") {
    const fsched::testing::ExploreResult found =
        fsched::testing::explore([] { bank_day(&transfer_racy); }, 1000, 0, fsched::testing::SimulationOptions{});
    REQUIRE(found.seed.has_value());
    std::printf("explore: seed %llu fails after %llu runs: %s threw \"%s\"\n",
                static_cast<unsigned long long>(*found.seed), static_cast<unsigned long long>(found.runs),
                found.result.error_task.c_str(), found.result.error_message.c_str());
    std::printf("the fibers when the exception left its task:\n%s\n", found.result.report.c_str());
    // Replay: the same seed, the same schedule, the same failure (a debugger can stop in it).
    const fsched::testing::SimulationResult replay =
        fsched::testing::simulate(*found.seed, [] { bank_day(&transfer_racy); });
    CHECK(replay.failed());
    CHECK(replay.error_message == found.result.error_message);
    CHECK(replay.trace_hash == found.result.trace_hash);
    std::printf("replay of seed %llu: %s (%llu switches)\n", static_cast<unsigned long long>(*found.seed),
                replay.error_message.c_str(), static_cast<unsigned long long>(replay.switches));
}

TEST_CASE("the fixed transfer passes every seed") {
    const std::optional<std::uint64_t> seed = fsched::testing::explore([] { bank_day(&transfer_fixed); }, 1000);
    CHECK_FALSE(seed.has_value());
    std::printf("the fixed transfer: no failure in 1000 seeds\n");
}
