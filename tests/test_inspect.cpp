// Seeing inside (issue 23): the registry of live fibers and fiber_report() — every wait kind
// named with what it holds, backtraces of parked fibers, safety while fibers wake, run and
// die on other threads — and the reports nobody asks for: lock-order deadlocks, a hung
// stop() (FIBER_SCHED_HANG_REPORT_S) and the dump-on-signal handler.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <sys/socket.h>
#include <unistd.h>
#endif

using test::contains;
using test::report_line;
using fsched::Fiber;
using fsched::Scheduler;
using namespace std::chrono_literals;

namespace {

// The backtrace lines under fiber `id`'s line.
std::string frames_of(const std::string& report, std::uint64_t id) {
    const std::string line = report_line(report, id);
    if (line.empty()) return "";
    std::size_t at = report.find(line) + line.size() + 1;
    std::string frames;
    while (at < report.size() && report.compare(at, 5, "    #") == 0) {
        const std::size_t end = report.find('\n', at);
        frames += report.substr(at, end - at + 1);
        at = end + 1;
    }
    return frames;
}

// The count in the report's first line, "fiber_sched: N live fibers: ...".
long live_count(const std::string& report) {
    const char* head = "fiber_sched: ";
    if (report.compare(0, std::strlen(head), head) != 0) return -1;
    return std::strtol(report.c_str() + std::strlen(head), nullptr, 10);
}

// Polls fiber_report() until pred(report) holds (or 20 s pass, for the slowest variants).
template <class Pred>
std::string report_when(Pred pred) {
    std::string report;
    for (int i = 0; i < 4000; ++i) {
        report = fsched::fiber_report();
        if (pred(report)) return report;
        std::this_thread::sleep_for(5ms);
    }
    return report;
}

// Under qemu-user (tests/cross: FIBER_SCHED_TEST_EMULATED off Windows) a fork()ed child
// that starts threads aborts in qemu itself, and the programs are linked -static (dladdr
// names nothing there): those checks are left to the native variants.
#if defined(FIBER_SCHED_TEST_EMULATED) && !defined(_WIN32)
constexpr bool qemu_user = true;
#else
constexpr bool qemu_user = false;
#endif

// Backtraces need the asm backends' saved frames (or ucontext's on x86-64/AArch64 Linux).
bool backtraces_expected() {
    const std::string backend = fsched::backend();
    if (backend == "winfiber") return false;
#if !(defined(__x86_64__) || defined(__aarch64__))
    if (backend == "ucontext") return false;
#endif
    return true;
}

// FIBER_SCHED_HANG_REPORT_S unset (on Windows, set to a blank: _putenv_s cannot unset).
void without_hang_variable() {
#if defined(_WIN32)
    _putenv_s("FIBER_SCHED_HANG_REPORT_S", " ");
#else
    unsetenv("FIBER_SCHED_HANG_REPORT_S");
#endif
}

}  // namespace

// Parks in a function the backtrace must show (external linkage: -rdynamic exports it).
FIBER_SCHED_NOINLINE void fsched_test_parked_here(fsched::Channel<int>& ch);
FIBER_SCHED_NOINLINE void fsched_test_parked_here(fsched::Channel<int>& ch) {
    auto v = ch.receive();
    (void)v;
    __asm__ volatile("" ::: "memory");  // keeps the call from becoming a tail call
}

TEST_CASE("report: lists fibers made and forgets destroyed ones, across threads") {
    const long before = live_count(fsched::fiber_report());
    REQUIRE(before >= 0);
    std::vector<std::unique_ptr<Fiber>> fibers;
    for (int i = 0; i < 300; ++i) fibers.push_back(std::make_unique<Fiber>([] { Fiber::yield(); }));
    fibers[7]->set_name("seventh");
    std::string report = fsched::fiber_report();
    CHECK(live_count(report) == before + 300);
    const std::string seventh = report_line(report, fibers[7]->id());
    CHECK(contains(seventh, "(seventh): ready (never run)"));
    fibers[8]->resume();
    CHECK(contains(report_line(fsched::fiber_report(), fibers[8]->id()), ": suspended (Fiber::yield)"));
    // Destroyed on another thread than the one that made them.
    std::thread([&] {
        for (int i = 0; i < 150; ++i) fibers[static_cast<std::size_t>(i)].reset();
    }).join();
    report = fsched::fiber_report();
    CHECK(live_count(report) == before + 150);
    CHECK(report_line(report, fibers[200]->id()) != "");
    fibers.clear();
    CHECK(live_count(fsched::fiber_report()) == before);
    // Threads that exit hand their segment on; fibers they made stay listed until destroyed.
    std::vector<std::unique_ptr<Fiber>> made_elsewhere;
    for (int t = 0; t < 4; ++t) {
        std::thread([&] {
            for (int i = 0; i < 10; ++i) made_elsewhere.push_back(std::make_unique<Fiber>([] {}));
        }).join();
    }
    CHECK(live_count(fsched::fiber_report()) == before + 40);
    made_elsewhere.clear();
    CHECK(live_count(fsched::fiber_report()) == before);
}

TEST_CASE("report: every wait kind, with what it waits for, on which worker, for how long") {
    Scheduler s(2, false, "inspected");
    s.start();
    fsched::Mutex m;
    fsched::ConditionVariable cv;
    fsched::WaitGroup wg(3);
    fsched::Channel<int> empty(4);   // a receiver waits
    fsched::Channel<int> full(1);    // a sender waits
    full.send(1);
    fsched::Channel<int> release_all;
    std::atomic<std::uint64_t> holder_id{0}, mutex_id{0}, cv_id{0}, wg_id{0}, recv_id{0}, send_id{0}, sleep_id{0},
        yield_id{0}, parked_fn_id{0};
    std::atomic<bool> stop_yielding{false};
    std::atomic<bool> cv_go{false};
    std::atomic<bool> holding{false};

    s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                        holder_id = fsched::this_fiber::id();
                                        std::lock_guard<fsched::Mutex> lock(m);
                                        holding = true;
                                        release_all.receive();
                                    },
                                    -1, fsched::Priority::Normal, "holder"});
    while (!holding) std::this_thread::sleep_for(1ms);
    s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                        mutex_id = fsched::this_fiber::id();
                                        std::lock_guard<fsched::Mutex> lock(m);
                                    },
                                    -1, fsched::Priority::Normal, "mutex-waiter"});
    s.schedule([&] {
        cv_id = fsched::this_fiber::id();
        fsched::Mutex local;
        std::unique_lock<fsched::Mutex> lock(local);
        cv.wait(lock, [&] { return cv_go.load(); });
    });
    s.schedule([&] {
        wg_id = fsched::this_fiber::id();
        wg.wait();
    });
    s.schedule([&] {
        recv_id = fsched::this_fiber::id();
        empty.receive();
    });
    s.schedule([&] {
        send_id = fsched::this_fiber::id();
        full.send(2);
    });
    s.schedule([&] {
        sleep_id = fsched::this_fiber::id();
        while (!stop_yielding) fsched::this_fiber::sleep_for(200ms);
    });
    s.schedule([&] {
        parked_fn_id = fsched::this_fiber::id();
        fsched_test_parked_here(empty);
    });
    // Two fibers yield to each other on worker 1, each busy a while between yields: either
    // is queued (runnable after a yield) about half the time.
    for (int i = 0; i < 2; ++i) {
        s.schedule(
            [&, i] {
                if (i == 0) yield_id = fsched::this_fiber::id();
                while (!stop_yielding) {
                    const auto until = std::chrono::steady_clock::now() + 200us;
                    while (std::chrono::steady_clock::now() < until) {
                    }
                    fsched::this_fiber::yield();
                }
            },
            1);
    }

    auto all_parked = [&](const std::string& r) {
        for (auto* id : {&mutex_id, &cv_id, &wg_id, &recv_id, &send_id, &sleep_id, &parked_fn_id}) {
            if (id->load() == 0 || !contains(report_line(r, id->load()), ": parked ")) return false;
        }
        return true;
    };
    const std::string report = report_when(all_parked);
    INFO(report);
    REQUIRE(all_parked(report));
    const std::string mutex_line = report_line(report, mutex_id);
    CHECK(contains(mutex_line, "(mutex-waiter): parked"));
    CHECK(contains(mutex_line, " on Mutex 0x"));
    CHECK(contains(mutex_line, "held by fiber " + std::to_string(holder_id.load()) + " (holder)"));
    CHECK(contains(mutex_line, "of \"inspected\""));
    CHECK(contains(mutex_line, "; stack "));
    CHECK(contains(mutex_line, " KiB touched"));
    CHECK(contains(report_line(report, cv_id), " on ConditionVariable 0x"));
    CHECK(contains(report_line(report, wg_id), " on WaitGroup 0x"));
    CHECK(contains(report_line(report, wg_id), "(count 3)"));
    CHECK(contains(report_line(report, recv_id), " on Channel receive 0x"));
    CHECK(contains(report_line(report, recv_id), "(length 0, capacity 4)"));
    CHECK(contains(report_line(report, send_id), " on Channel send 0x"));
    CHECK(contains(report_line(report, send_id), "(length 1, capacity 1)"));
    const std::string sleep_line = report_line(report, sleep_id);
    CHECK(contains(sleep_line, " on sleep"));
    CHECK(contains(sleep_line, " ms left"));
    CHECK(contains(report_line(report, holder_id), ": parked "));  // the holder waits on release_all
    // The yielding fiber: runnable (queued) or running at the instant it was read.
    const std::string yield_report =
        report_when([&](const std::string& r) { return contains(report_line(r, yield_id), "runnable (yield)"); });
    CHECK(contains(report_line(yield_report, yield_id), ": runnable (yield)"));

    // The backtrace of a parked fiber goes through the function it parked in.
    const std::string frames = frames_of(report, parked_fn_id);
    if (backtraces_expected()) {
        INFO(frames);
        CHECK(contains(frames, "    #0  0x"));
#if !defined(_WIN32)
        if (!qemu_user) {
            CHECK(contains(frames, "fsched_test_parked_here"));
            CHECK(contains(frames, " ["));
        }
#endif
    }
    // Running and suspended fibers have no backtrace.
    CHECK(frames_of(report, yield_id).empty());

    stop_yielding = true;
    cv_go = true;
    {
        fsched::Mutex dummy;
        cv.notify_all();
    }
    wg.add(-3);
    empty.send(1);
    empty.send(1);
    full.receive();
    release_all.send(0);
    s.stop();
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
TEST_CASE("report: an io wait shows its fd and direction") {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    Scheduler s(1, false, "io-inspected");
    s.start();
    std::atomic<std::uint64_t> id{0};
    s.schedule([&] {
        id = fsched::this_fiber::id();
        fsched::io::wait(fds[0], fsched::io::Ready::Read);
    });
    const std::string report =
        report_when([&](const std::string& r) { return id != 0 && contains(report_line(r, id), ": parked "); });
    INFO(report);
    CHECK(contains(report_line(report, id), " on io on fd " + std::to_string(fds[0]) + " for reading"));
    char c = 'x';
    REQUIRE(::write(fds[1], &c, 1) == 1);
    s.stop();
    ::close(fds[0]);
    ::close(fds[1]);
}
#endif

TEST_CASE("report: a long fiber name and scheduler name are shown whole, the line around them intact") {
    // Lines were formatted in 512 bytes: a 600-byte name cut the text after it, and the
    // next line ran on into it.
    const std::string scheduler_name = "S" + std::string(600, 's') + "S";
    const std::string fiber_name = "F" + std::string(600, 'f') + "F";
    Scheduler s(1, false, scheduler_name);
    s.start();
    fsched::Channel<int> release;
    s.schedule(fsched::ScheduleTask{nullptr, [&] { release.receive(); }, -1, fsched::Priority::Normal, fiber_name});
    const std::string line_part = "(" + fiber_name + "): parked ";
    const std::string worker_part = "; worker 0 of \"" + scheduler_name + "\"";
    const std::string report = report_when([&](const std::string& r) { return contains(r, line_part); });
    INFO(report);
    CHECK(contains(report, line_part));
    CHECK(contains(report, worker_part));
    // The fiber's line ends where it should: each line of the report has its newline.
    const std::size_t at = report.find(line_part);
    REQUIRE(at != std::string::npos);
    const std::size_t end = report.find('\n', at);
    REQUIRE(end != std::string::npos);
    CHECK(report.find(worker_part, at) < end);
    release.send(1);
    s.stop();
}

TEST_CASE("report: safe while fibers are woken, run, made and destroyed on other threads") {
    // Channel ping-pong pairs keep waking parked fibers (each wake meets a report's hold
    // now and then), short tasks come and go (pooled fibers get new ids), and plain threads
    // make and destroy fibers, while this thread reports in a loop. Every task must finish,
    // and every parked fiber the report shows must be named by its wait.
    Scheduler s(3, false, "churn");
    s.start();
    constexpr int pairs = 6;
    constexpr int rounds = 3000;
    std::atomic<int> finished{0};
    std::vector<std::unique_ptr<fsched::Channel<int>>> channels;
    for (int i = 0; i < 2 * pairs; ++i) channels.push_back(std::make_unique<fsched::Channel<int>>(0));
    for (int p = 0; p < pairs; ++p) {
        auto& ping = *channels[static_cast<std::size_t>(2 * p)];
        auto& pong = *channels[static_cast<std::size_t>(2 * p + 1)];
        s.schedule([&] {
            for (int r = 0; r < rounds; ++r) {
                ping.send(r);
                pong.receive();
            }
            ++finished;
        });
        s.schedule([&] {
            for (int r = 0; r < rounds; ++r) {
                ping.receive();
                pong.send(r);
            }
            ++finished;
        });
    }
    std::atomic<bool> done{false};
    std::thread maker([&] {
        while (!done) {
            std::vector<std::unique_ptr<Fiber>> batch;
            for (int i = 0; i < 32; ++i) batch.push_back(std::make_unique<Fiber>([] { Fiber::yield(); }));
            for (auto& f : batch) f->resume();
            std::thread([&] { batch.clear(); }).join();
            s.schedule([] { fsched::this_fiber::sleep_for(1ms); });
        }
    });
    int reports = 0;
    bool every_parked_named = true;
    do {
        const std::string r = fsched::fiber_report();
        ++reports;
        for (std::size_t at = 0; (at = r.find(": parked ", at)) != std::string::npos; ++at) {
            const std::size_t end = r.find('\n', at);
            const std::string rest = r.substr(at, end - at);
            if (!contains(rest, " on Channel ") && !contains(rest, " on sleep")) every_parked_named = false;
        }
    } while (finished.load() < 2 * pairs);
    done = true;
    maker.join();
    s.stop();
    CHECK(finished.load() == 2 * pairs);
    CHECK(reports > 0);
    CHECK(every_parked_named);
}

namespace {

// In a child whose fibers are deadlocked: gives the watch 1.5 s (about seventy looks, so a
// report made more than once would show), prints fiber_report() after a line "REPORT", and
// leaves without stopping the scheduler, which cannot stop.
[[noreturn]] void report_deadlock_and_exit() {
    std::this_thread::sleep_for(1500ms);
    const std::string report = fsched::fiber_report();
    std::fprintf(stderr, "REPORT\n%s", report.c_str());
    std::fflush(stderr);
    std::_Exit(0);
}

// The watch's sentence in such a child's stderr, which must be there once ("" if absent).
std::string deadlock_sentence(const std::string& out) {
    const std::size_t first = out.find("fiber_sched: lock-order deadlock: fiber ");
    if (first == std::string::npos) return "";
    CHECK(out.find("fiber_sched: lock-order deadlock:", first + 1) == std::string::npos);  // once
    return out.substr(first, out.find('\n', first) - first);
}

}  // namespace

TEST_CASE("deadlock: a lock-order cycle is reported once, naming both fibers and the mutexes") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::detail::set_watch_timing(20ms, 100ms);
        auto* s = new Scheduler(2, false, "deadlocked");
        s->start();
        auto* a = new fsched::Mutex;
        auto* b = new fsched::Mutex;
        auto* ready = new fsched::WaitGroup(2);
        auto body = [=](fsched::Mutex* first, fsched::Mutex* second) {
            return [=] {
                std::lock_guard<fsched::Mutex> one(*first);
                ready->done();
                ready->wait();
                std::lock_guard<fsched::Mutex> two(*second);  // never
            };
        };
        s->schedule(fsched::ScheduleTask{nullptr, body(a, b), -1, fsched::Priority::Normal, "net-reader"});
        s->schedule(fsched::ScheduleTask{nullptr, body(b, a), -1, fsched::Priority::Normal, "db-writer"});
        report_deadlock_and_exit();
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    const std::string& out = r.err;
    const std::string sentence = deadlock_sentence(out);
    REQUIRE(!sentence.empty());
    // It starts at the smaller id, either of the two.
    CHECK((contains(sentence, "(net-reader) waits for Mutex 0x") || contains(sentence, "(db-writer) waits for Mutex 0x")));
    CHECK(contains(sentence, "(net-reader)"));
    CHECK(contains(sentence, "(db-writer)"));
    CHECK(contains(sentence, ", which waits for Mutex 0x"));
    // "... held by fiber N (x), which waits for ... held by M", M the first fiber.
    const std::string first_id = sentence.substr(std::strlen("fiber_sched: lock-order deadlock: fiber "));
    const std::string id = first_id.substr(0, first_id.find(' '));
    const std::string tail = "held by " + id;
    CHECK(sentence.size() > tail.size());
    CHECK(sentence.compare(sentence.size() - tail.size(), std::string::npos, tail) == 0);
    // The manual report shows the cycle too, and both parked on a Mutex held by the other.
    const std::string report = out.substr(out.find("REPORT\n"));
    CHECK(contains(report, "lock-order deadlock: fiber "));
    CHECK(contains(report, "(net-reader): parked "));
    CHECK(contains(report, "(db-writer): parked "));
}

TEST_CASE("deadlock: a cycle through a SharedMutex held exclusively is reported, for a writer and a reader") {
    if (qemu_user) return;  // (see qemu_user)
    for (bool shared : {false, true}) {
        CAPTURE(shared);
        test::ChildResult r = test::run_in_child([shared] {
            fsched::detail::set_watch_timing(20ms, 100ms);
            auto* s = new Scheduler(2, false, "deadlocked");
            s->start();
            auto* a = new fsched::Mutex;
            auto* b = new fsched::SharedMutex;
            auto* ready = new fsched::WaitGroup(2);
            s->schedule(fsched::ScheduleTask{nullptr, [=] {
                                                 std::lock_guard<fsched::Mutex> one(*a);
                                                 ready->done();
                                                 ready->wait();
                                                 if (shared) {
                                                     b->lock_shared();  // never
                                                 } else {
                                                     b->lock();  // never
                                                 }
                                             },
                                             -1, fsched::Priority::Normal, "mutex-holder"});
            s->schedule(fsched::ScheduleTask{nullptr, [=] {
                                                 std::lock_guard<fsched::SharedMutex> one(*b);
                                                 ready->done();
                                                 ready->wait();
                                                 std::lock_guard<fsched::Mutex> two(*a);  // never
                                             },
                                             -1, fsched::Priority::Normal, "shared-holder"});
            report_deadlock_and_exit();
        }, 60);
        INFO(r.err);
        CHECK(r.exited);
        const std::string& out = r.err;
        const std::string sentence = deadlock_sentence(out);
        // Not REQUIRE: on Windows the child runs this test case from its start, and an abort
        // of it at the first call's (empty) result would never reach the second call.
        CHECK(!sentence.empty());
        if (sentence.empty()) continue;
        CHECK(contains(sentence, shared ? "waits for SharedMutex shared 0x" : "waits for SharedMutex 0x"));
        CHECK(contains(sentence, "waits for Mutex 0x"));
        CHECK(contains(sentence, "(mutex-holder)"));
        CHECK(contains(sentence, "(shared-holder)"));
        // The report's line names the exclusive holder.
        const std::string report = out.substr(out.find("REPORT\n"));
        const std::size_t line_at = report.find("(mutex-holder): parked ");
        CHECK(line_at != std::string::npos);
        if (line_at == std::string::npos) continue;
        const std::string line = report.substr(line_at, report.find('\n', line_at) - line_at);
        CHECK(contains(line, " held by fiber "));
        CHECK(contains(line, "(shared-holder)"));
    }
}

TEST_CASE("deadlock: no report for a cycle through a timed Mutex wait, which ends by itself") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::detail::set_watch_timing(20ms, 100ms);
        Scheduler s(2, false, "timed");
        fsched::Mutex a, b;
        fsched::WaitGroup ready(2);
        std::atomic<int> timed_out{0};
        s.schedule([&] {
            std::lock_guard<fsched::Mutex> one(a);
            ready.done();
            ready.wait();
            // Waits on b's holder, which waits on a: a cycle, but this wait gives up.
            if (!b.try_lock_for(1500ms)) {
                timed_out.fetch_add(1);
            } else {
                b.unlock();
            }
        });
        s.schedule([&] {
            std::lock_guard<fsched::Mutex> one(b);
            ready.done();
            ready.wait();
            std::lock_guard<fsched::Mutex> two(a);  // once the other has given up
        });
        s.stop();
        if (timed_out.load() != 1) std::_Exit(3);
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(!contains(r.err, "lock-order deadlock"));
}

TEST_CASE("report: a fiber woken but not yet run is runnable, not parked on the wait that is over") {
    Scheduler s(1, false, "one-busy");
    s.start();
    fsched::Channel<int> ch;
    std::atomic<std::uint64_t> receiver{0};
    std::atomic<bool> busy{false}, release{false};
    s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                        receiver = fsched::this_fiber::id();
                                        ch.receive();
                                    },
                                    -1, fsched::Priority::Normal, "woken-receiver"});
    const std::string before = report_when([&](const std::string& r) {
        return receiver != 0 && contains(report_line(r, receiver), "parked ");
    });
    CHECK(contains(report_line(before, receiver), ": parked "));
    // The only worker runs a task that never waits; the receiver, woken now, stays queued.
    s.schedule([&] {
        busy = true;
        while (!release) std::this_thread::sleep_for(1ms);
    });
    while (!busy) std::this_thread::sleep_for(1ms);
    ch.send(7);  // a receiver waits: handed over at once
    const std::string after = fsched::fiber_report();
    release = true;
    s.stop();
    INFO(after);
    const std::string line = report_line(after, receiver);
    CHECK(contains(line, ": runnable (woken) from Channel receive 0x"));
    CHECK(contains(line, ", parked "));
    CHECK(contains(line, " ago; worker 0 of \"one-busy\""));
    CHECK(!contains(line, ": parked "));
}

TEST_CASE("deadlock: a Mutex handed over to a fiber that has not run yet is no cycle of one") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::detail::set_watch_timing(10ms, 0ms);
        Scheduler s(1, false, "hand-off");
        s.start();
        fsched::Mutex mu;
        fsched::WaitGroup locked(1);
        std::atomic<bool> handed{false};
        std::atomic<std::uint64_t> waiter{0};
        s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                            mu.lock();
                                            locked.done();
                                            fsched::this_fiber::sleep_for(20ms);  // the waiter parks on mu
                                            mu.unlock();  // wakes it, but it cannot run before we
                                            mu.lock();    // take the mutex again
                                            fsched::this_fiber::sleep_for(20ms);  // it fails, waits, starves
                                            mu.unlock();  // starving: handed over to the waiter
                                            handed = true;
                                            std::this_thread::sleep_for(500ms);  // the only worker, never waiting
                                        },
                                        -1, fsched::Priority::Normal, "holder"});
        s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                            waiter = fsched::this_fiber::id();
                                            locked.wait();
                                            mu.lock();
                                            mu.unlock();
                                        },
                                        -1, fsched::Priority::Normal, "handed-waiter"});
        while (!handed) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(100ms);  // the watch looks ten times meanwhile
        const std::string line = report_line(fsched::fiber_report(), waiter);
        std::fprintf(stderr, "WAITER LINE: %s\n", line.c_str());
        s.stop();
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.err, "WAITER LINE: fiber "));
    CHECK(contains(r.err, "(handed-waiter): runnable (woken) from Mutex 0x"));
    CHECK(!contains(r.err, "lock-order deadlock"));
}

TEST_CASE("hang report: a hang_report_after shorter than the watch's period comes on time") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        without_hang_variable();
        fsched::detail::set_watch_timing(1000ms, 1000ms);  // the default period
        fsched::SchedulerOptions options;
        options.threads = 1;
        options.use_caller = false;
        options.name = "short-hang";
        options.hang_report_after = 150ms;
        Scheduler s(options);
        // stop() waits 900 ms: due at 150 ms, the report must not wait for the 1 s tick.
        s.schedule(fsched::ScheduleTask{nullptr, [] { fsched::this_fiber::sleep_for(900ms); }, -1,
                                        fsched::Priority::Normal, "short-sleeper"});
        s.stop();
        std::fprintf(stderr, "STOPPED\n");
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    const std::size_t at = r.err.find("fiber_sched: Scheduler \"short-hang\": stop() has waited ");
    REQUIRE(at != std::string::npos);
    CHECK(contains(r.err, "(short-sleeper): parked "));
    CHECK(r.err.find("STOPPED") > at);
}

TEST_CASE("deadlock: no report for a mutex that is only contended") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::detail::set_watch_timing(10ms, 0ms);
        Scheduler s(3, false, "contended");
        fsched::Mutex a, b;
        for (int t = 0; t < 6; ++t) {
            s.schedule([&, t] {
                for (int i = 0; i < 2000; ++i) {
                    // One order for every fiber: no cycle, however long they wait.
                    std::lock_guard<fsched::Mutex> one(a);
                    std::lock_guard<fsched::Mutex> two(b);
                    if (i % 64 == t) fsched::this_fiber::sleep_for(1ms);
                }
            });
        }
        s.stop();
    }, 120);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(!contains(r.err, "lock-order deadlock"));
}

TEST_CASE("hang report: FIBER_SCHED_HANG_REPORT_S prints the report once while stop() waits") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
#if defined(_WIN32)
        _putenv_s("FIBER_SCHED_HANG_REPORT_S", "0.2");
#else
        setenv("FIBER_SCHED_HANG_REPORT_S", "0.2", 1);
#endif
        fsched::detail::set_watch_timing(20ms, 1000ms);
        if (!fsched::trace::start_ring(64)) std::abort();  // its events go beside the report
        Scheduler s(1, false, "slow-stop");
        s.schedule(fsched::ScheduleTask{nullptr, [] { fsched::this_fiber::sleep_for(1500ms); }, -1,
                                        fsched::Priority::Normal, "slow-task"});
        s.stop();
        fsched::trace::stop();
        std::fprintf(stderr, "STOPPED\n");
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    const std::size_t at = r.err.find("fiber_sched: Scheduler \"slow-stop\": stop() has waited ");
    REQUIRE(at != std::string::npos);
    CHECK(r.err.find("stop() has waited", at + 60) == std::string::npos);
    CHECK(contains(r.err, "(slow-task): parked "));
    CHECK(contains(r.err, " on sleep"));
    CHECK(r.err.find("STOPPED") > at);
    // The flight recorder's file, named in the report.
    const std::string head = "the flight recorder's events are in ";
    const std::size_t named = r.err.find(head);
    REQUIRE(named != std::string::npos);
    const std::string path = r.err.substr(named + head.size(), r.err.find('\n', named) - named - head.size());
    std::FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f != nullptr);
    std::string json;
    char chunk[4096];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) json.append(chunk, n);
    std::fclose(f);
    CHECK(contains(json, "\"traceEvents\""));
    CHECK(contains(json, "slow-task"));
    std::remove(path.c_str());
}

TEST_CASE("hang report: off without FIBER_SCHED_HANG_REPORT_S, and for a bad value") {
    if (qemu_user) return;  // (see qemu_user)
    for (const char* value : {"", "0", "soon", "-3", "1abc", "0.1 s"}) {
        test::ChildResult r = test::run_in_child([value] {
#if defined(_WIN32)
            _putenv_s("FIBER_SCHED_HANG_REPORT_S", *value ? value : " ");
#else
            setenv("FIBER_SCHED_HANG_REPORT_S", value, 1);
#endif
            fsched::detail::set_watch_timing(10ms, 1000ms);
            Scheduler s(1, false, "quiet");
            s.schedule([] { fsched::this_fiber::sleep_for(200ms); });
            s.stop();
        }, 60);
        INFO(value, r.err);
        CHECK(r.exited);
        CHECK(!contains(r.err, "stop() has waited"));
    }
}

TEST_CASE("dump handler: the report on a signal, and the program goes on") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::install_fiber_dump_handler();
        fsched::install_fiber_dump_handler();  // again: nothing more
        Scheduler s(1, false, "dumped");
        s.start();
        fsched::Channel<int> ch;
        s.schedule(fsched::ScheduleTask{nullptr, [&] { ch.receive(); }, -1, fsched::Priority::Normal, "waiting-one"});
        std::this_thread::sleep_for(100ms);
        std::raise(FIBER_SCHED_DUMP_SIGNAL);
        // The dump thread prints meanwhile (ThreadSanitizer delivers the signal late).
        for (int i = 0; i < 2000 && fsched::detail::dump_handler_reports() == 0; ++i) std::this_thread::sleep_for(10ms);
        std::fprintf(stderr, "WENT ON\n");
        ch.send(1);
        s.stop();
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    const std::size_t at = r.err.find("fiber_sched: ");
    REQUIRE(at != std::string::npos);
    CHECK(contains(r.err, "(waiting-one): parked "));
    CHECK(contains(r.err, " on Channel receive 0x"));
    CHECK(r.err.find("WENT ON") > at);
}

#if !defined(_WIN32)
TEST_CASE("dump handler: a fork()ed child gets the signal's default action back; the parent keeps the handler") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        fsched::install_fiber_dump_handler();
        const pid_t pid = fork();
        if (pid == 0) {
            struct sigaction now {};
            sigaction(FIBER_SCHED_DUMP_SIGNAL, nullptr, &now);
            _exit(now.sa_handler == SIG_DFL ? 0 : 3);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        std::fprintf(stderr, "GRANDCHILD %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        struct sigaction mine {};
        sigaction(FIBER_SCHED_DUMP_SIGNAL, nullptr, &mine);
        std::fprintf(stderr, "PARENT %s\n", mine.sa_handler == SIG_DFL ? "default" : "handled");
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(contains(r.err, "GRANDCHILD 0"));
    CHECK(contains(r.err, "PARENT handled"));
}
#endif

TEST_CASE("report: misuse") {
    test::ChildResult r = test::run_in_child([] { fsched::dump_fibers(nullptr); });
    CHECK(test::aborted_with(r, "dump_fibers(): the FILE is null"));
    test::ChildResult t = test::run_in_child([] { fsched::detail::set_watch_timing(0ms, 0ms); });
    CHECK(test::aborted_with(t, "set_watch_timing()"));
}

TEST_CASE("hang report: SchedulerOptions::hang_report_after, without the environment variable") {
    if (qemu_user) return;  // (see qemu_user)
    test::ChildResult r = test::run_in_child([] {
        without_hang_variable();
        fsched::detail::set_watch_timing(20ms, 1000ms);
        fsched::SchedulerOptions options;
        options.threads = 2;
        options.use_caller = false;
        options.name = "optioned";
        options.hang_report_after = 150ms;
        Scheduler s(options);
        fsched::Mutex m;
        fsched::ConditionVariable cv;
        bool go = false;
        s.schedule(fsched::ScheduleTask{nullptr, [&] {
                                            std::unique_lock<fsched::Mutex> lock(m);
                                            cv.wait_for(lock, 800ms, [&] { return go; });
                                        },
                                        -1, fsched::Priority::Normal, "cv-waiter"});
        s.stop();
    }, 60);
    INFO(r.err);
    CHECK(r.exited);
    CHECK(contains(r.err, "fiber_sched: Scheduler \"optioned\": stop() has waited "));
    CHECK(contains(r.err, "(cv-waiter): parked "));
    CHECK(contains(r.err, " on ConditionVariable 0x"));
    CHECK(contains(r.err, " left;"));
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("registry: without memory for its slots a fiber goes unlisted and works; the next is listed") {
    const long before = live_count(fsched::fiber_report());
    std::thread([&] {
        // Every chunk of slots fails from now on: once the thread's segment is full (a
        // segment handed on by an exited thread may have room), its fibers go unlisted. Made
        // 64 at a time until some are (few: a sanitizer's fibers cost megabytes each).
        constexpr std::size_t most = 3000;
        std::vector<std::unique_ptr<Fiber>> fibers;
        int ran = 0;
        long listed = 0;
        {
            test::Fault fault(fsched::detail::FaultSite::RegistryAlloc, 1);
            while (fibers.size() < most) {
                // Small stacks: the pool keeps them apart from the default size others count on.
                for (int i = 0; i < 64; ++i) fibers.push_back(std::make_unique<Fiber>([&] { ++ran; }, 16 * 1024));
                listed = live_count(fsched::fiber_report()) - before;
                if (listed < static_cast<long>(fibers.size())) break;
            }
        }
        const int count = static_cast<int>(fibers.size());
        CHECK(listed < count);
        CHECK(listed >= 0);
        for (auto& f : fibers) f->resume();
        CHECK(ran == count);
        Fiber next([&] { ++ran; });  // memory again: listed
        CHECK(!report_line(fsched::fiber_report(), next.id()).empty());
        fibers.clear();
        CHECK(live_count(fsched::fiber_report()) == before + 1);
    }).join();
    CHECK(live_count(fsched::fiber_report()) == before);
}
#endif

namespace {
FIBER_SCHED_NOINLINE void touch_stack_then_yield(std::size_t bytes) {
    auto* block = static_cast<volatile char*>(__builtin_alloca(bytes));  // never ASan's fake stack
    for (std::size_t i = 0; i < bytes; i += 512) block[i] = 1;
    Fiber::yield();
    __asm__ volatile("" ::: "memory");  // the block stays live across the yield
}

// "..., 96 KiB touched" in a report line: the figure, or -1.
long touched_kib(const std::string& line) {
    const std::size_t end = line.find(" KiB touched");
    if (end == std::string::npos) return -1;
    std::size_t begin = line.rfind(' ', end - 1);
    return std::strtol(line.c_str() + (begin == std::string::npos ? 0 : begin + 1), nullptr, 10);
}
}  // namespace

TEST_CASE("report: 'touched' counts the pages a fiber's frames used, wherever its backend keeps them") {
    // (winfiber: the OS makes the fiber's stack; the pool's holds only a record.)
    Fiber deep([] { touch_stack_then_yield(96 * 1024); }, 256 * 1024);
    deep.resume();
    const std::string line = report_line(fsched::fiber_report(), deep.id());
    INFO(line);
    CHECK(contains(line, ": suspended (Fiber::yield)"));
    CHECK(touched_kib(line) >= 96);
    CHECK(touched_kib(line) <= 2048);  // at most the stack (wine commits an OS stack whole, 1 MiB at least)
    deep.resume();
}

TEST_CASE("registry: a fiber made in the frames of a fiber destroyed while suspended goes unlisted with them") {
    const long before = live_count(fsched::fiber_report());
    std::uint64_t inner_id = 0;
    {
        // The inner Fiber object lives on the outer fiber's stack; the outer one is destroyed
        // suspended, its frames (and so the inner object) never unwound.
        auto outer = std::make_unique<Fiber>([&] {
            Fiber inner([] {});
            inner_id = inner.id();
            Fiber::yield();
        });
        outer->resume();
        CHECK(!report_line(fsched::fiber_report(), inner_id).empty());
        CHECK(live_count(fsched::fiber_report()) == before + 2);
    }
    CHECK(report_line(fsched::fiber_report(), inner_id).empty());
    CHECK(live_count(fsched::fiber_report()) == before);
    // The stack goes back to the pool and to new fibers: no report reads what was there.
    std::vector<std::unique_ptr<Fiber>> reuse;
    for (int i = 0; i < 64; ++i) reuse.push_back(std::make_unique<Fiber>([] {}));
    CHECK(live_count(fsched::fiber_report()) == before + 64);
}

TEST_CASE("report: a park no primitive recorded shows as an unnamed wait, with its backtrace") {
    Scheduler s(1, false, "bare-park");
    s.start();
    static std::atomic<fsched::Fiber::ptr*> parked{nullptr};
    static fsched::Fiber::ptr held;
    std::atomic<std::uint64_t> id{0};
    s.schedule([&] {
        // A channel wait first: its record must not be shown for the bare park after it.
        fsched::Channel<int> ch(1);
        ch.send(1);
        ch.receive();
        id = fsched::this_fiber::id();
        fsched::detail::park(
            [](Fiber*, void*) {
                held = fsched::detail::take_task_ref();
                parked.store(&held);
            },
            nullptr);
    });
    while (!parked.load()) std::this_thread::sleep_for(1ms);
    const std::string report = fsched::fiber_report();
    INFO(report);
    CHECK(contains(report_line(report, id), ": parked on an unnamed wait"));
    if (backtraces_expected()) CHECK(contains(frames_of(report, id), "    #0  0x"));
    parked.store(nullptr);
    fsched::detail::wake_fiber(std::move(held));
    s.stop();
}

#if defined(__linux__)
namespace {
// Threads of this process whose name starts with `name` now (/proc/<pid>/task/*/comm).
int threads_named(const std::string& name) {
    int n = 0;
    const std::string command = "cat /proc/" + std::to_string(getpid()) + "/task/*/comm 2>/dev/null";
    if (std::FILE* list = popen(command.c_str(), "r")) {
        char line[64];
        while (std::fgets(line, sizeof line, list)) n += std::string(line).compare(0, name.size(), name) == 0;
        pclose(list);
    }
    return n;
}
}  // namespace

TEST_CASE("deadlock watch: its thread starts with a Mutex wait and ends once nothing waits") {
    if (qemu_user) return;  // popen forks
    fsched::detail::quiesce_watch();
    fsched::detail::set_watch_timing(20ms, 1000ms);
    CHECK(threads_named("fsched-watc") == 0);
    {
        Scheduler s(2, false, "watched");
        s.start();
        fsched::Mutex m;
        std::atomic<bool> holding{false}, release{false};
        s.schedule([&] {
            std::lock_guard<fsched::Mutex> lock(m);
            holding = true;
            while (!release) fsched::this_fiber::sleep_for(1ms);
        });
        while (!holding) std::this_thread::sleep_for(1ms);
        s.schedule([&] { std::lock_guard<fsched::Mutex> lock(m); });  // parks: the watch starts
        bool seen = false;
        for (int i = 0; i < 2000 && !seen; ++i) {
            seen = threads_named("fsched-watc") == 1;
            if (!seen) std::this_thread::sleep_for(5ms);
        }
        CHECK(seen);
        release = true;
        s.stop();
    }
    bool gone = false;
    for (int i = 0; i < 2000 && !gone; ++i) {
        gone = threads_named("fsched-watc") == 0;
        if (!gone) std::this_thread::sleep_for(5ms);
    }
    CHECK(gone);
    fsched::detail::set_watch_timing(1000ms, 1000ms);
}
#endif
