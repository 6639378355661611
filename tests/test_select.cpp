// Channel<T>'s non-blocking and timed operations (try_send, try_receive, send_for/until,
// receive_for/until, size, capacity, closed) and select() over channel cases (receive, send,
// default, timeout): fibers over 1/2/4/8 workers with and without use_caller, plain threads,
// the use_caller thread; timeouts that never end early, a hand-over racing a timeout decided
// once, the fairness of select's random choice (a chi-squared bound), lost races that leave
// their channels untouched, the report's word for a parked select, and a timed select that
// cannot allocate.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using test::contains;
using test::report_line;
using fsched::Channel;
using fsched::Scheduler;
using fsched::WaitGroup;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

#if defined(FIBER_SCHED_TSAN)
constexpr int scale = 1;
#else
constexpr int scale = 4;
#endif

// Runs `body` in a scheduler task or on a plain thread, and waits for it.
template <class Body>
void in_task(Scheduler& s, Body body) {
    WaitGroup done(1);
    s.schedule([&] {
        body();
        done.done();
    });
    done.wait();
}

}  // namespace

// ---- Channel: try_send, try_receive, size, capacity, closed ---------------------------------

TEST_CASE("Channel: try_send and try_receive never wait, and move only on success") {
    for (std::size_t capacity : {0u, 1u, 3u}) {
        CAPTURE(capacity);
        Channel<std::unique_ptr<int>> ch(capacity);
        CHECK(ch.capacity() == capacity);
        CHECK(ch.size() == 0);
        CHECK_FALSE(ch.closed());
        CHECK_FALSE(ch.try_receive().has_value());
        for (std::size_t i = 0; i < capacity; ++i) {
            auto v = std::make_unique<int>(static_cast<int>(i));
            CHECK(ch.try_send(v));
            CHECK(v == nullptr);  // moved from: sent
            CHECK(ch.size() == i + 1);
        }
        auto extra = std::make_unique<int>(99);
        CHECK_FALSE(ch.try_send(extra));  // full (unbuffered: no receiver waits)
        REQUIRE(extra != nullptr);        // still ours
        CHECK(*extra == 99);
        for (std::size_t i = 0; i < capacity; ++i) {
            auto v = ch.try_receive();
            REQUIRE(v.has_value());
            CHECK(**v == static_cast<int>(i));
        }
        CHECK(ch.size() == 0);
        CHECK_FALSE(ch.try_receive().has_value());
        // Closed: try_send refuses and keeps the value; try_receive drains, then nullopt.
        if (capacity > 0) {
            auto v = std::make_unique<int>(7);
            CHECK(ch.try_send(v));
        }
        ch.close();
        CHECK(ch.closed());
        auto refused = std::make_unique<int>(8);
        CHECK_FALSE(ch.try_send(refused));
        CHECK(refused != nullptr);
        if (capacity > 0) {
            auto v = ch.try_receive();
            REQUIRE(v.has_value());
            CHECK(**v == 7);
        }
        CHECK_FALSE(ch.try_receive().has_value());
        CHECK(ch.size() == 0);
    }
}

TEST_CASE("Channel: try_send meets a blocked receiver, try_receive a blocked sender") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        for (std::size_t capacity : {0u, 1u, 4u}) {
            CAPTURE(capacity);
            Channel<int> ch(capacity);
            std::atomic<int> got{0};
            std::atomic<bool> receiving{false};
            s.schedule([&] {
                receiving = true;
                got = *ch.receive();
            });
            while (!receiving) fsched::this_fiber::yield();
            int v = 5;
            // A receiver parks (or is about to): try_send succeeds once it is queued, or
            // the value went into the buffer.
            while (!ch.try_send(v)) fsched::this_fiber::yield();
            while (got.load() == 0) fsched::this_fiber::yield();
            CHECK(got == 5);
            // A sender blocked on a full buffer (or, unbuffered, waiting): try_receive takes
            // the oldest value and lets it in.
            for (std::size_t i = 0; i < capacity; ++i) ch.send(static_cast<int>(10 + i));
            std::atomic<bool> sent{false};
            s.schedule([&] { sent = ch.send(100); });
            std::vector<int> out;
            while (out.size() < capacity + 1) {
                if (auto r = ch.try_receive()) out.push_back(*r);
                else fsched::this_fiber::yield();
            }
            while (!sent) fsched::this_fiber::yield();
            std::vector<int> expected;
            for (std::size_t i = 0; i < capacity; ++i) expected.push_back(static_cast<int>(10 + i));
            expected.push_back(100);
            CHECK(out == expected);
            CHECK(ch.size() == 0);
        }
        s.stop();
    });
}

// ---- Channel: timed operations ------------------------------------------------------------

TEST_CASE("Channel: send_for and receive_for time out, never early, and keep the value") {
    auto check = [](Channel<std::unique_ptr<int>>& ch) {
        for (auto d : {0ms, 1ms, 15ms}) {
            auto v = std::make_unique<int>(3);
            auto t0 = Clock::now();
            CHECK_FALSE(ch.send_for(v, d));
            CHECK(Clock::now() - t0 >= d);
            CHECK(v != nullptr);
            CHECK_FALSE(ch.closed());  // a timeout, not a closed channel
            t0 = Clock::now();
            CHECK_FALSE(ch.receive_for(d).has_value());
            CHECK(Clock::now() - t0 >= d);
            t0 = Clock::now();
            CHECK_FALSE(ch.send_until(v, t0 + d));
            CHECK(Clock::now() - t0 >= d);
            CHECK(v != nullptr);
            t0 = Clock::now();
            CHECK_FALSE(ch.receive_until(t0 + d).has_value());
            CHECK(Clock::now() - t0 >= d);
        }
        // Another clock goes through steady_clock.
        auto v = std::make_unique<int>(4);
        const auto t0 = Clock::now();
        CHECK_FALSE(ch.send_until(v, std::chrono::system_clock::now() + 10ms));
        CHECK(Clock::now() - t0 >= 9ms);  // the clocks' conversion may round by a tick
        CHECK(v != nullptr);
    };
    SUBCASE("plain thread, unbuffered") {
        Channel<std::unique_ptr<int>> ch;
        check(ch);
    }
    SUBCASE("plain thread, full buffer") {
        Channel<std::unique_ptr<int>> ch(1);
        ch.send(std::make_unique<int>(1));
        auto v = std::make_unique<int>(3);
        const auto t0 = Clock::now();
        CHECK_FALSE(ch.send_for(v, 10ms));
        CHECK(Clock::now() - t0 >= 10ms);
        CHECK(v != nullptr);
        CHECK(ch.size() == 1);
    }
    FSCHED_FOR_EACH_CONFIG([&](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<std::unique_ptr<int>> ch;
        in_task(s, [&] { check(ch); });
        if (c.use_caller) check(ch);  // the caller thread helps while it waits
        s.stop();
    });
}

TEST_CASE("Channel: closed ends timed operations at once, and close wakes timed waiters") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> ch(1);
        std::atomic<int> woken{0};
        WaitGroup parked(4);
        for (int i = 0; i < 4; ++i) {
            s.schedule([&] {
                parked.done();
                if (!ch.receive_for(30s).has_value()) woken++;
            });
        }
        parked.wait();
        fsched::this_fiber::sleep_for(2ms);
        ch.close();
        s.stop();
        CHECK(woken == 4);
        CHECK(ch.closed());
        int v = 1;
        const auto t0 = Clock::now();
        CHECK_FALSE(ch.send_for(v, 30s));
        CHECK_FALSE(ch.receive_for(30s).has_value());
        CHECK(Clock::now() - t0 < 20s);
    });
    // A blocked timed sender: close() fails it (false, closed() true, the value kept).
    Scheduler s(2, false);
    s.start();
    Channel<std::unique_ptr<int>> full(1);
    full.send(std::make_unique<int>(0));
    std::atomic<bool> result{true}, kept{false}, saw_closed{false};
    std::atomic<bool> started{false};
    s.schedule([&] {
        auto v = std::make_unique<int>(1);
        started = true;
        result = full.send_for(v, 30s);
        kept = v != nullptr;
        saw_closed = full.closed();
    });
    while (!started) fsched::this_fiber::yield();
    fsched::this_fiber::sleep_for(2ms);
    full.close();
    s.stop();
    CHECK_FALSE(result);
    CHECK(kept);
    CHECK(saw_closed);
}

TEST_CASE("Channel: timed operations that succeed before their deadline") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        for (std::size_t capacity : {0u, 1u, 4u}) {
            CAPTURE(capacity);
            Scheduler s(c.threads, c.use_caller);
            s.start();
            Channel<int> ch(capacity);
            const int n = 50 * scale;
            std::atomic<long> sum{0};
            s.schedule([&] {
                for (int i = 1; i <= n; ++i) {
                    int v = i;
                    while (!ch.send_for(v, 30s)) {
                    }
                }
                ch.close();
            });
            std::thread receiver([&] {
                while (auto v = ch.receive_for(30s)) sum += *v;
            });
            s.stop();
            receiver.join();
            CHECK(sum == static_cast<long>(n) * (n + 1) / 2);
        }
    });
}

TEST_CASE("Channel: a hand-over racing a timeout is decided once") {
    // Timed senders and timed receivers with short timeouts on one unbuffered channel (and a
    // buffered one): every value a send_for reported sent was received exactly once, and
    // every value it reported not sent is still in the sender's hands (checked by the
    // sender), so sent == received and the channel is empty at the end.
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        for (std::size_t capacity : {0u, 1u}) {
            CAPTURE(capacity);
            Scheduler s(c.threads, c.use_caller);
            s.start();
            Channel<std::unique_ptr<int>> ch(capacity);
            const int per_sender = 100 * scale;
            std::vector<std::atomic<int>> received(static_cast<std::size_t>(4 * per_sender));
            std::atomic<int> sent{0}, got{0}, kept{0}, lost{0};
            std::atomic<int> senders_left{4};
            for (int p = 0; p < 4; ++p) {
                s.schedule([&, p] {
                    for (int i = 0; i < per_sender; ++i) {
                        auto v = std::make_unique<int>(p * per_sender + i);
                        if (ch.send_for(v, std::chrono::microseconds(50 * (i % 5)))) {
                            sent++;
                        } else if (v && *v == p * per_sender + i) {
                            kept++;
                        } else {
                            lost++;
                        }
                    }
                    if (--senders_left == 0) ch.close();
                });
            }
            for (int r = 0; r < 3; ++r) {
                s.schedule([&, r] {
                    for (int i = 0;; ++i) {
                        if (auto v = ch.receive_for(std::chrono::microseconds(40 * ((i + r) % 4)))) {
                            received[static_cast<std::size_t>(**v)]++;
                            got++;
                        } else if (ch.closed() && ch.size() == 0) {
                            break;
                        }
                    }
                });
            }
            s.stop();
            int twice = 0;
            for (auto& n : received) twice += n.load() > 1;
            CHECK(twice == 0);
            CHECK(lost == 0);
            CHECK(sent == got);
            CHECK(sent + kept == 4 * per_sender);
            CHECK_FALSE(ch.try_receive().has_value());
        }
    });
}

TEST_CASE("Channel: a plain send takes its value back from a receiver that timed out") {
    // Receivers that give up at once keep timing out while send() hands values to them:
    // each value must reach exactly one receiver that returned it.
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> ch;
        const int n = 200 * scale;
        std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
        std::atomic<bool> done{false};
        for (int r = 0; r < 3; ++r) {
            s.schedule([&] {
                while (!done) {
                    if (auto v = ch.receive_for(std::chrono::microseconds(20))) seen[static_cast<std::size_t>(*v)]++;
                }
                while (auto v = ch.try_receive()) seen[static_cast<std::size_t>(*v)]++;
            });
        }
        std::thread sender([&] {
            for (int i = 0; i < n; ++i) ch.send(i);
            done = true;
        });
        s.stop();  // with use_caller and one worker, the receivers run only in here
        sender.join();
        int wrong = 0;
        for (auto& k : seen) wrong += k.load() != 1;
        CHECK(wrong == 0);
    });
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("Channel: a timed operation that cannot allocate throws and leaves no waiter") {
    using fsched::detail::FaultSite;
    Scheduler s(2, false);
    s.start();
    Channel<std::unique_ptr<int>> ch;
    std::atomic<int> threw{0};
    std::atomic<bool> kept{false}, no_receiver{false}, no_sender{false}, later{false};
    in_task(s, [&] {
        auto v = std::make_unique<int>(1);
        {
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                ch.send_for(v, 10s);
            } catch (const std::bad_alloc&) {
                threw++;
            }
        }
        kept = v != nullptr;
        no_sender = !ch.try_receive().has_value();  // no stale sender left queued
        {
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                (void)ch.receive_for(10s);
            } catch (const std::bad_alloc&) {
                threw++;
            }
        }
        no_receiver = !ch.try_send(v);  // no stale receiver would take it
        // And the channel works on: a timed receive that a sender meets.
        s.schedule([&] { ch.send(std::make_unique<int>(2)); });
        auto r = ch.receive_for(20s);
        later = r && **r == 2;
    });
    s.stop();
    CHECK(threw == 2);
    CHECK(kept);
    CHECK(no_sender);
    CHECK(no_receiver);
    CHECK(later);
}
#endif

// ---- select: ready cases, default, closed ----------------------------------------------------

TEST_CASE("select: a ready case runs, and returns its index; channels of different types") {
    Channel<int> numbers(1);
    Channel<std::string> words(1);
    numbers.send(4);
    int got_number = 0;
    std::string got_word;
    std::size_t i = fsched::select(numbers.on_receive([&](std::optional<int> v) { got_number = *v; }),
                                   words.on_receive([&](std::optional<std::string> v) { got_word = *v; }));
    CHECK(i == 0);
    CHECK(got_number == 4);
    words.send("four");
    i = fsched::select(numbers.on_receive([&](std::optional<int> v) { got_number = *v; }),
                       words.on_receive([&](std::optional<std::string> v) { got_word = *v; }));
    CHECK(i == 1);
    CHECK(got_word == "four");
    // A send case on a buffered channel with room.
    bool sent = false;
    i = fsched::select(numbers.on_receive({}), words.on_send("five", [&](bool ok) { sent = ok; }));
    CHECK(i == 1);
    CHECK(sent);
    CHECK(words.try_receive() == std::optional<std::string>("five"));
    // An empty fn is allowed: the index says what ran.
    numbers.send(1);
    CHECK(fsched::select(words.on_receive({}), numbers.on_receive({})) == 1);
    CHECK(numbers.size() == 0);
}

TEST_CASE("select: the default case runs only when no case is ready") {
    Channel<int> empty;       // unbuffered, nobody sends
    Channel<int> full(1);     // no room for a send case
    full.send(1);
    bool defaulted = false;
    std::size_t i = fsched::select(empty.on_receive([](std::optional<int>) { FAIL_CHECK("not ready"); }),
                                   full.on_send(2, [](bool) { FAIL_CHECK("not ready"); }),
                                   fsched::select_default([&] { defaulted = true; }));
    CHECK(i == 2);
    CHECK(defaulted);
    CHECK(full.size() == 1);
    // Put in front or behind, a ready case wins over the default.
    i = fsched::select(fsched::select_default([] { FAIL_CHECK("a case was ready"); }), full.on_receive({}));
    CHECK(i == 1);
    CHECK(full.size() == 0);
    // A default-only select runs it.
    CHECK(fsched::select(fsched::select_default()) == 0);
    // Nothing was left queued on the channels: a try_send finds no receiver.
    int v = 3;
    CHECK_FALSE(empty.try_send(v));
}

TEST_CASE("select: closed channels make their cases ready (nullopt, false)") {
    Channel<int> in;
    Channel<int> out;
    in.close();
    bool got_nullopt = false;
    CHECK(fsched::select(in.on_receive([&](std::optional<int> v) { got_nullopt = !v; }),
                         fsched::select_default([] { FAIL_CHECK("closed is ready"); })) == 0);
    CHECK(got_nullopt);
    out.close();
    bool sent = true;
    CHECK(fsched::select(out.on_send(1, [&](bool ok) { sent = ok; }), fsched::select_timeout(10s)) == 0);
    CHECK_FALSE(sent);
    // A buffered channel closed with values left: its receive case drains it first.
    Channel<int> rest(2);
    rest.send(1);
    rest.send(2);
    rest.close();
    std::vector<std::optional<int>> seen;
    for (int k = 0; k < 3; ++k) fsched::select(rest.on_receive([&](std::optional<int> v) { seen.push_back(v); }));
    CHECK(seen == std::vector<std::optional<int>>{1, 2, std::nullopt});
}

TEST_CASE("select: closing a channel wakes a parked select with that case") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> a, b;
        Channel<std::string> c2;
        std::atomic<std::size_t> ran{99};
        std::atomic<int> outcome{0};
        std::atomic<bool> started{false};
        s.schedule([&] {
            started = true;
            ran = fsched::select(a.on_receive([&](std::optional<int> v) { outcome = v ? 1 : -1; }),
                                 c2.on_send("x", [&](bool ok) { outcome = ok ? 2 : -2; }),
                                 b.on_receive([&](std::optional<int> v) { outcome = v ? 3 : -3; }));
        });
        while (!started) fsched::this_fiber::yield();
        fsched::this_fiber::sleep_for(1ms);
        c2.close();
        s.stop();
        CHECK(ran == 1);
        CHECK(outcome == -2);
        // The other channels hold no stale waiter.
        int v = 1;
        CHECK_FALSE(a.try_send(v));
        CHECK_FALSE(b.try_send(v));
    });
}

// ---- select: fairness ----------------------------------------------------------------------

TEST_CASE("select: a ready case is chosen uniformly at random (chi-squared)") {
    // Three buffered channels that are always ready: each round one runs, and is refilled.
    // For a uniform pick the statistic over 3 bins has 2 degrees of freedom, whose tail is
    // P(chi2 > x) = exp(-x / 2): a uniform pick exceeds 27.7 with probability below 1e-6.
    // A pick that gives one case 10500 of the 30000 rounds (the others 9750) scores 37.5,
    // and one that always takes the first ready case 60000: they fail.
    Channel<int> ch[3] = {Channel<int>(1), Channel<int>(1), Channel<int>(1)};
    for (auto& c : ch) c.send(0);
    constexpr int rounds = 30000;
    long counts[3] = {0, 0, 0};
    for (int r = 0; r < rounds; ++r) {
        const std::size_t i = fsched::select(ch[0].on_receive({}), ch[1].on_receive({}), ch[2].on_receive({}));
        REQUIRE(i < 3);
        counts[i]++;
        ch[i].send(0);
    }
    const double expected = rounds / 3.0;
    double chi2 = 0;
    for (long n : counts) chi2 += (n - expected) * (n - expected) / expected;
    INFO("counts " << counts[0] << " " << counts[1] << " " << counts[2] << ", chi2 " << chi2);
    CHECK(chi2 < 27.7);
    // Mixed kinds: a ready receive case and a ready send case on other channels, in a fiber.
    Scheduler s(2, false);
    s.start();
    long mixed[2] = {0, 0};
    in_task(s, [&] {
        Channel<int> in(1), out(1);
        in.send(0);
        for (int r = 0; r < rounds / 3; ++r) {
            const std::size_t i = fsched::select(in.on_receive({}), out.on_send(1, {}));
            mixed[i]++;
            if (i == 0) in.send(0);
            else out.receive();
        }
    });
    s.stop();
    const double half = rounds / 6.0;
    const double chi2_mixed = ((mixed[0] - half) * (mixed[0] - half) + (mixed[1] - half) * (mixed[1] - half)) / half;
    INFO("mixed " << mixed[0] << " " << mixed[1] << ", chi2 " << chi2_mixed);
    // One degree of freedom: P(chi2 > 23.9) < 1e-6.
    CHECK(chi2_mixed < 23.9);
}

TEST_CASE("select_pick: uniform over small ranges") {
    long counts[5] = {0, 0, 0, 0, 0};
    for (int r = 0; r < 50000; ++r) {
        const std::size_t k = fsched::detail::select_pick(5);
        REQUIRE(k < 5);
        counts[k]++;
    }
    double chi2 = 0;
    for (long n : counts) chi2 += (n - 10000.0) * (n - 10000.0) / 10000.0;
    INFO(chi2);
    CHECK(chi2 < 38.0);  // 4 degrees of freedom: P(chi2 > 38) < 1e-6
    CHECK(fsched::detail::select_pick(1) == 0);
}

// ---- select: timeouts ----------------------------------------------------------------------

TEST_CASE("select: the timeout case runs when nothing completes in time, never early") {
    auto check = [] {
        Channel<int> a;
        Channel<std::string> b(1);
        b.send("full");
        for (auto d : {0ms, 1ms, 20ms}) {
            bool timed_out = false;
            const auto t0 = Clock::now();
            const std::size_t i = fsched::select(a.on_receive([](std::optional<int>) { FAIL_CHECK("nothing sent"); }),
                                                 b.on_send("more", [](bool) { FAIL_CHECK("no room"); }),
                                                 fsched::select_timeout(d, [&] { timed_out = true; }));
            CHECK(Clock::now() - t0 >= d);
            CHECK(i == 2);
            CHECK(timed_out);
        }
        // select_until, and the earliest of several timeouts.
        auto t0 = Clock::now();
        CHECK(fsched::select(a.on_receive({}), fsched::select_until(t0 + 10ms)) == 1);
        CHECK(Clock::now() - t0 >= 10ms);
        t0 = Clock::now();
        CHECK(fsched::select(fsched::select_timeout(10s), a.on_receive({}), fsched::select_timeout(5ms)) == 2);
        CHECK(Clock::now() - t0 >= 5ms);
        // A timeout alone is a sleep.
        t0 = Clock::now();
        CHECK(fsched::select(fsched::select_timeout(3ms)) == 0);
        CHECK(Clock::now() - t0 >= 3ms);
        // Nothing was left queued: a try_send finds no receiver, b still holds one value.
        int v = 1;
        CHECK_FALSE(a.try_send(v));
        CHECK(b.size() == 1);
    };
    SUBCASE("plain thread") { check(); }
    FSCHED_FOR_EACH_CONFIG([&](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        in_task(s, check);
        if (c.use_caller) check();
        s.stop();
    });
}

TEST_CASE("select: a parked select is woken by the first case to complete, before its timeout") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> a;
        Channel<std::string> b;
        Channel<int> out;
        for (int round = 0; round < 3; ++round) {
            std::atomic<bool> parked{false};
            std::atomic<std::size_t> ran{99};
            std::string word;
            int number = 0;
            bool sent = false;
            s.schedule([&] {
                parked = true;
                ran = fsched::select(a.on_receive([&](std::optional<int> v) { number = *v; }),
                                     b.on_receive([&](std::optional<std::string> v) { word = *v; }),
                                     out.on_send(7, [&](bool ok) { sent = ok; }), fsched::select_timeout(30s));
            });
            while (!parked) fsched::this_fiber::yield();
            fsched::this_fiber::sleep_for(1ms);
            if (round == 0) CHECK(a.send(5));
            if (round == 1) CHECK(b.send("five"));
            if (round == 2) CHECK(out.receive() == 7);
            while (ran == 99) fsched::this_fiber::yield();
            CHECK(ran == static_cast<std::size_t>(round));
            if (round == 0) CHECK(number == 5);
            if (round == 1) CHECK(word == "five");
            if (round == 2) CHECK(sent);
            // The losers' waiters are gone: nothing takes a try_send, nothing is offered.
            int v = 1;
            std::string w = "w";
            CHECK_FALSE(a.try_send(v));
            CHECK_FALSE(b.try_send(w));
            CHECK_FALSE(out.try_receive().has_value());
        }
        s.stop();
    });
}

// ---- select: lost races ----------------------------------------------------------------------

TEST_CASE("select: two selectors racing on one sender receive every value exactly once") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        for (std::size_t capacity : {0u, 1u, 8u}) {
            CAPTURE(capacity);
            Scheduler s(c.threads, c.use_caller);
            s.start();
            Channel<int> data(capacity);
            Channel<int> other;  // never sent on: each selector's second case always loses
            const int n = 300 * scale;
            std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
            std::atomic<int> timeouts{0};
            WaitGroup selectors(2);
            for (int k = 0; k < 2; ++k) {
                s.schedule([&, k] {
                    for (bool open = true; open;) {
                        fsched::select(data.on_receive([&](std::optional<int> v) {
                                           if (v) seen[static_cast<std::size_t>(*v)]++;
                                           else open = false;
                                       }),
                                       other.on_receive([](std::optional<int>) { FAIL_CHECK("never sent"); }),
                                       fsched::select_timeout(std::chrono::microseconds(k == 0 ? 30 : 5000),
                                                              [&] { timeouts++; }));
                    }
                    selectors.done();
                });
            }
            std::thread sender([&] {
                for (int i = 0; i < n; ++i) data.send(i);
                data.close();
            });
            selectors.wait();  // helps, on the use_caller thread
            sender.join();
            s.stop();
            int wrong = 0;
            for (auto& k : seen) wrong += k.load() != 1;
            CHECK(wrong == 0);
            CHECK_FALSE(data.try_receive().has_value());  // none left behind
            int v = 1;
            CHECK_FALSE(other.try_send(v));               // no stale selector waiter
        }
    });
}

TEST_CASE("select: send cases that lost keep their values") {
    // Each round a selector offers a value on each of two unbuffered channels; timed
    // receivers on both race for them. Exactly one value goes (or none, on a timeout); the
    // other stays in its case (SendCase::value()).
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<std::unique_ptr<int>> left, right;
        const int rounds = 200 * scale;
        std::atomic<int> received{0}, kept{0}, sent{0}, wrong{0}, timeouts{0};
        std::atomic<bool> done{false};
        for (auto* ch : {&left, &right}) {
            s.schedule([&, ch] {
                while (!done) {
                    if (auto v = ch->receive_for(std::chrono::microseconds(30))) {
                        if (*v) received++;
                        else wrong++;
                    }
                }
            });
        }
        s.schedule([&] {
            for (int r = 0; r < rounds; ++r) {
                auto to_left = left.on_send(std::make_unique<int>(2 * r), [&](bool ok) { sent += ok; });
                auto to_right = right.on_send(std::make_unique<int>(2 * r + 1), [&](bool ok) { sent += ok; });
                const std::size_t i =
                    fsched::select(to_left, to_right, fsched::select_timeout(200us, [&] { timeouts++; }));
                const bool left_kept = to_left.value() && *to_left.value() == 2 * r;
                const bool right_kept = to_right.value() && *to_right.value() == 2 * r + 1;
                if (i == 0) wrong += left_kept || !right_kept;
                if (i == 1) wrong += right_kept || !left_kept;
                if (i == 2) wrong += !left_kept || !right_kept;
                kept += left_kept + right_kept;
            }
            done = true;
        });
        s.stop();
        CHECK(wrong == 0);
        CHECK(sent == received);
        CHECK(kept + sent == 2 * rounds);
        CHECK(sent + timeouts == rounds);
    });
}

TEST_CASE("select: the same channel in two cases") {
    Scheduler s(2, false);
    s.start();
    SUBCASE("two receive cases: one runs, the other's waiter is gone") {
        Channel<int> ch;
        long counts[2] = {0, 0};
        for (int r = 0; r < 200; ++r) {
            std::atomic<bool> parked{false};
            std::atomic<std::size_t> ran{99};
            s.schedule([&] {
                parked = true;
                ran = fsched::select(ch.on_receive({}), ch.on_receive({}));
            });
            while (!parked) fsched::this_fiber::yield();
            CHECK(ch.send(r));
            while (ran == 99) fsched::this_fiber::yield();
            counts[ran]++;
            int v = 0;
            CHECK_FALSE(ch.try_send(v));  // the second waiter did not linger
        }
        CHECK(counts[0] + counts[1] == 200);
        // Buffered and ready: both cases get chosen.
        Channel<int> buffered(1);
        long ready[2] = {0, 0};
        for (int r = 0; r < 400; ++r) {
            buffered.send(r);
            ready[fsched::select(buffered.on_receive({}), buffered.on_receive({}))]++;
        }
        CHECK(ready[0] > 0);
        CHECK(ready[1] > 0);
    }
    SUBCASE("a send and a receive case never meet each other") {
        Channel<int> ch;
        // Alone: neither can complete, so the timeout runs.
        in_task(s, [&] { CHECK(fsched::select(ch.on_send(1, {}), ch.on_receive({}), fsched::select_timeout(5ms)) == 2); });
        // A receiver elsewhere takes the send case; a sender elsewhere feeds the receive case.
        for (int round = 0; round < 2; ++round) {
            std::atomic<std::size_t> ran{99};
            std::atomic<int> got{0};
            std::atomic<bool> parked{false};
            s.schedule([&] {
                parked = true;
                ran = fsched::select(ch.on_send(11, {}), ch.on_receive([&](std::optional<int> v) { got = *v; }),
                                     fsched::select_timeout(30s));
            });
            while (!parked) fsched::this_fiber::yield();
            fsched::this_fiber::sleep_for(1ms);
            if (round == 0) {
                CHECK(ch.receive() == 11);
            } else {
                CHECK(ch.send(22));
            }
            while (ran == 99) fsched::this_fiber::yield();
            CHECK(ran == static_cast<std::size_t>(round));
            if (round == 1) CHECK(got == 22);
            int v = 0;
            CHECK_FALSE(ch.try_send(v));
            CHECK_FALSE(ch.try_receive().has_value());
        }
    }
    s.stop();
}

// ---- select: many at once -------------------------------------------------------------------

TEST_CASE("select: many selectors and senders conserve every message") {
    // Senders use send, send_for, try_send and select send cases over four channels of
    // capacities 0, 1, 4, 0; selectors receive with select over all four (with and without
    // a timeout), plain receivers and a plain thread join in. Every value a send reported
    // sent is received exactly once; no other value appears.
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> ch[4] = {Channel<int>(0), Channel<int>(1), Channel<int>(4), Channel<int>(0)};
        constexpr int senders = 6;
        const int per_sender = 100 * scale;
        std::vector<std::atomic<int>> sent(static_cast<std::size_t>(senders * per_sender));
        std::vector<std::atomic<int>> got(static_cast<std::size_t>(senders * per_sender));
        WaitGroup sending(senders);
        auto receive_all = [&](bool timed) {
            bool closed[4] = {false, false, false, false};
            auto take = [&](int k) {
                return [&, k](std::optional<int> v) {
                    if (v) got[static_cast<std::size_t>(*v)]++;
                    else closed[k] = true;
                };
            };
            while (!(closed[0] && closed[1] && closed[2] && closed[3])) {
                if (timed) {
                    fsched::select(ch[0].on_receive(take(0)), ch[1].on_receive(take(1)), ch[2].on_receive(take(2)),
                                   ch[3].on_receive(take(3)), fsched::select_timeout(100us));
                } else {
                    fsched::select(ch[3].on_receive(take(3)), ch[2].on_receive(take(2)), ch[1].on_receive(take(1)),
                                   ch[0].on_receive(take(0)));
                }
            }
        };
        for (int p = 0; p < senders; ++p) {
            s.schedule([&, p] {
                for (int i = 0; i < per_sender; ++i) {
                    const int id = p * per_sender + i;
                    auto& mark = sent[static_cast<std::size_t>(id)];
                    Channel<int>& to = ch[(p + i) % 4];
                    switch ((p + 3 * i) % 4) {
                    case 0:
                        if (to.send(id)) mark++;
                        break;
                    case 1: {
                        int v = id;
                        while (!to.send_for(v, 200us)) {
                        }
                        mark++;
                        break;
                    }
                    case 2: {
                        int v = id;
                        while (!to.try_send(v)) fsched::this_fiber::yield();
                        mark++;
                        break;
                    }
                    default: {
                        Channel<int>& also = ch[(p + i + 1) % 4];
                        auto a = to.on_send(id, [&](bool ok) { mark += ok; });
                        auto b = also.on_send(id, [&](bool ok) { mark += ok; });
                        fsched::select(a, b);
                        break;
                    }
                    }
                }
                sending.done();
            });
        }
        WaitGroup receiving(5);
        for (int k = 0; k < 4; ++k) {
            s.schedule([&, k] {
                receive_all(k % 2 == 0);
                receiving.done();
            });
        }
        s.schedule([&] {
            while (auto v = ch[2].receive()) got[static_cast<std::size_t>(*v)]++;
            receiving.done();
        });
        std::thread outsider([&] { receive_all(true); });
        sending.wait();
        for (auto& k : ch) k.close();
        receiving.wait();
        outsider.join();
        s.stop();
        int wrong = 0;
        for (std::size_t id = 0; id < sent.size(); ++id) wrong += sent[id].load() != 1 || got[id].load() != 1;
        CHECK(wrong == 0);
    });
}

TEST_CASE("select: the starting thread (plain, or the use_caller thread) selects against a fiber") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        s.start();
        Channel<int> ping, pong;
        Channel<std::string> quit;
        const int n = 50 * scale;
        s.schedule([&] {
            for (int i = 0; i < n; ++i) {
                ping.send(i);
                auto r = pong.receive();
                if (r != i + 1) FAIL_CHECK("pong " << *r << " for ping " << i);
            }
            quit.send("bye");
        });
        // The starting thread answers through select: a plain thread blocks, the use_caller
        // thread runs the tasks while it waits.
        int answered = 0;
        for (bool more = true; more;) {
            fsched::select(ping.on_receive([&](std::optional<int> v) {
                               pong.send(*v + 1);
                               answered++;
                           }),
                           quit.on_receive([&](std::optional<std::string> v) { more = v != "bye"; }));
        }
        s.stop();
        CHECK(answered == n);
    });
}

TEST_CASE("select: an exception from the case's fn reaches the caller; the channel is consistent") {
    Channel<int> ch(2);
    ch.send(1);
    ch.send(2);
    CHECK_THROWS_AS(fsched::select(ch.on_receive([](std::optional<int>) { throw std::runtime_error("fn"); })),
                    std::runtime_error);
    CHECK(ch.size() == 1);
    CHECK(ch.try_receive() == 2);
}

TEST_CASE("select: misuse") {
    FSCHED_CHECK_ABORTS_WITH([] { fsched::select(fsched::select_default(), fsched::select_default()); },
                             "select(): more than one select_default case");
}

// ---- select: the report, and a timed select that cannot allocate ----------------------------

TEST_CASE("select: fiber_report() names a parked select") {
    Scheduler s(2, false, "selecting");
    s.start();
    Channel<int> a;
    Channel<std::string> b;
    Channel<int> c(1);
    c.send(0);
    std::atomic<std::uint64_t> id{0}, timed_id{0};
    s.schedule([&] {
        id = fsched::this_fiber::id();
        fsched::select(a.on_receive({}), b.on_receive({}), c.on_send(1, {}));
    });
    s.schedule([&] {
        timed_id = fsched::this_fiber::id();
        fsched::select(a.on_receive({}), fsched::select_timeout(60s));
    });
    std::string report;
    for (int i = 0; i < 4000; ++i) {
        report = fsched::fiber_report();
        if (id && timed_id && contains(report_line(report, id), ": parked ") &&
            contains(report_line(report, timed_id), ": parked ")) {
            break;
        }
        fsched::this_fiber::sleep_for(5ms);
    }
    INFO(report);
    const std::string line = report_line(report, id);
    CHECK(contains(line, " on select 0x"));
    CHECK(contains(line, "(2 receive, 1 send cases)"));
    const std::string timed = report_line(report, timed_id);
    CHECK(contains(timed, " on select 0x"));
    CHECK(contains(timed, "(1 receive, 0 send cases)"));
    CHECK(contains(timed, " left"));
    a.close();
    c.receive();
    s.stop();
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("select: a timed select that cannot allocate throws and leaves nothing behind") {
    using fsched::detail::FaultSite;
    for (FaultSite site : {FaultSite::WaitAlloc, FaultSite::TimerAlloc}) {
        Scheduler s(2, false);
        s.start();
        Channel<std::unique_ptr<int>> in, out;
        std::atomic<bool> threw{false}, clean{false}, later{false};
        in_task(s, [&] {
            {
                test::Fault fault(site, 1);
                try {
                    fsched::select(in.on_receive({}), out.on_send(std::make_unique<int>(1), {}),
                                   fsched::select_timeout(10s));
                } catch (const std::bad_alloc&) {
                    threw = true;
                }
            }
            // No waiter was left on either channel.
            auto v = std::make_unique<int>(2);
            clean = !in.try_send(v) && v && !out.try_receive().has_value();
            // A later timed select works.
            s.schedule([&] { in.send(std::make_unique<int>(3)); });
            int got = 0;
            fsched::select(in.on_receive([&](std::optional<std::unique_ptr<int>> r) { got = **r; }),
                           fsched::select_timeout(20s));
            later = got == 3;
        });
        s.stop();
        CHECK(threw);
        CHECK(clean);
        CHECK(later);
    }
}
#endif
