// Fault injection (FIBER_SCHED_FAULT_INJECTION, set for every test build): each place where
// the library acquires a stack, memory or an fd is made to fail, and the failure must reach
// the caller or the exception handler with nothing lost or leaked.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#if defined(FIBER_SCHED_HAVE_EPOLL)
#include <sys/socket.h>
#endif

using fsched::Fiber;
using fsched::Scheduler;
using fsched::detail::FaultSite;
using namespace std::chrono_literals;

namespace {

using test::Fault;

[[maybe_unused]] int open_fds() {
    int n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (readdir(d)) ++n;
        closedir(d);
    }
    return n;
}

using test::Failures;

}  // namespace

TEST_CASE("a stack that cannot be mapped is std::bad_alloc to whoever asked, and costs nothing") {
    const auto before = fsched::stack_stats();
    {
        Fault fault(FaultSite::StackMap, 1);
        // A size no cache or pool holds, so the stack must be mapped.
        CHECK_THROWS_AS(Fiber([] {}, 333 * 4096), std::bad_alloc);
        CHECK_THROWS_AS(std::make_shared<Fiber>([] {}, 334 * 4096), std::bad_alloc);
    }
    const auto after = fsched::stack_stats();
    CHECK(after.in_use == before.in_use);
    Fiber works([] {}, 333 * 4096);  // the pool is intact once the kernel gives memory again
    works.resume();
    CHECK(works.state() == Fiber::State::Term);
}

TEST_CASE("a worker that cannot make a fiber for a callback reports it and runs the rest") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        CAPTURE(threads);
        Scheduler s(threads, false, "no-fiber");
        Failures failures;
        s.set_exception_handler(failures.handler());
        std::atomic<int> ran{0};
        constexpr int tasks = 200;
        {
            // From the 50th fiber a worker makes (or takes from its pool) on, every one fails.
            Fault fault(FaultSite::FiberAlloc, 50);
            for (int i = 0; i < tasks; ++i) {
                s.schedule([&] {
                    fsched::this_fiber::yield();
                    ran++;
                });
            }
            s.start();
            const auto end = std::chrono::steady_clock::now() + 20s;
            while (ran + failures.bad_alloc < tasks && std::chrono::steady_clock::now() < end) {
                std::this_thread::yield();
            }
        }
        CHECK(failures.other == 0);
        CHECK(failures.bad_alloc > 0);
        CHECK(ran + failures.bad_alloc == tasks);
        // The scheduler keeps running once memory is there again.
        for (int i = 0; i < 10; ++i) s.schedule([&] { ran++; });
        s.stop();
        CHECK(ran + failures.bad_alloc == tasks + 10);
    }
}

TEST_CASE("schedule() that cannot queue a task throws std::bad_alloc and stop() still returns") {
    Scheduler s(2, false, "no-queue");
    std::atomic<int> ran{0};
    s.start();
    s.schedule([&] { ran++; });
    {
        Fault fault(FaultSite::TaskQueue, 1);
        CHECK_THROWS_AS(s.schedule([&] { ran++; }), std::bad_alloc);
        std::vector<std::function<void()>> batch(10, [&] { ran++; });
        CHECK_THROWS_AS(s.schedule(batch.begin(), batch.end()), std::bad_alloc);
    }
    {
        // A batch spread over both workers that fails half way: what was queued runs, what
        // was not is not counted (stop() would otherwise wait for it forever).
        Fault fault(FaultSite::TaskQueue, 8);
        std::vector<std::function<void()>> batch(10, [&] { ran++; });
        CHECK_THROWS_AS(s.schedule(batch.begin(), batch.end()), std::bad_alloc);
    }
    s.schedule([&] { ran++; });
    s.stop();
    CHECK(ran >= 2);
    CHECK(ran <= 2 + 10);
}

TEST_CASE("a task waiting for a fiber's hand run is not lost when its sleeping helper cannot be queued") {
    // The worker that finds the fiber still running by hand queues a helper task; with no
    // room for it, it queues the fiber's task again at once, and tries again.
    Scheduler s(1, false, "busy-no-helper");
    s.start();
    std::atomic<int> stage{0};
    auto fiber = std::make_shared<Fiber>([&] {
        s.schedule(Fiber::current_ptr());
        stage = 1;
        while (stage.load() < 2) std::this_thread::sleep_for(1ms);
        Fiber::yield();
    });
    std::thread hand;
    {
        // The fiber's own schedule() is the next hit and passes; the helpers' fail.
        Fault fault(FaultSite::TaskQueue, 2);
        hand = std::thread([&] { fiber->resume(); });
        while (stage.load() < 1) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);  // the worker finds it busy; every helper is refused
    }
    stage = 2;
    hand.join();
    s.stop();  // hung had the task been dropped
    CHECK(fiber->state() == Fiber::State::Term);
}

TEST_CASE("a sleep with no room for its timer throws std::bad_alloc in the fiber, before it parks") {
    Scheduler s(1, false, "no-timer");
    Failures failures;
    s.set_exception_handler(failures.handler());
    std::atomic<bool> caught{false}, later_sleep_ok{false};
    s.start();
    s.schedule([&] {
        {
            Fault fault(FaultSite::TimerAlloc, 1);
            try {
                fsched::this_fiber::sleep_for(1ms);
            } catch (const std::bad_alloc&) {
                caught = true;
            }
        }
        fsched::this_fiber::sleep_for(1ms);
        later_sleep_ok = true;
    });
    s.schedule([&] {
        Fault fault(FaultSite::TimerAlloc, 1);
        fsched::this_fiber::sleep_for(1ms);  // uncaught: the handler gets it
    });
    s.stop();
    CHECK(caught);
    CHECK(later_sleep_ok);
    CHECK(failures.bad_alloc == 1);
}

TEST_CASE("a timed wait that cannot allocate throws with the lock held and leaves no waiter") {
    for (FaultSite site : {FaultSite::WaitAlloc, FaultSite::TimerAlloc}) {
        Scheduler s(2, false, "no-wait");
        fsched::Mutex m;
        fsched::ConditionVariable cv;
        std::atomic<bool> threw_with_lock{false}, notified_later{false}, attempted{false};
        bool ready = false;
        s.start();
        s.schedule([&] {
            std::unique_lock<fsched::Mutex> lock(m);
            {
                Fault fault(site, 1);
                try {
                    cv.wait_for(lock, 10s);
                } catch (const std::bad_alloc&) {
                    threw_with_lock = lock.owns_lock();
                }
            }
            attempted = true;
            // A stale waiter left in the list would swallow this notify.
            notified_later = cv.wait_for(lock, 20s, [&] { return ready; });
        });
        s.schedule([&] {
            // No sleep here: the fault is process-wide while armed.
            while (!attempted) fsched::this_fiber::yield();
            std::lock_guard<fsched::Mutex> lock(m);
            ready = true;
            cv.notify_one();
        });
        s.stop();
        CHECK(threw_with_lock);
        CHECK(notified_later);
    }
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
TEST_CASE("a Scheduler that cannot open its fds throws std::system_error and leaks none") {
    const int before = open_fds();
    for (long nth : {1L, 2L, 4L}) {
        Fault fault(FaultSite::FdOpen, nth);  // the nth worker's epoll instance fails
        CHECK_THROWS_AS(Scheduler(4, false), std::system_error);
    }
    CHECK(open_fds() == before);
    Scheduler works(4, false);
    std::atomic<bool> ran{false};
    works.schedule([&] { ran = true; });
    works.stop();
    CHECK(ran);
}

TEST_CASE("an idle wait whose epoll_pwait2 fails falls back to epoll_wait's milliseconds, never early") {
    // In a child: the fallback, once taken, is the process's. The fault fails the call with
    // EINVAL: any errno but EINTR (ENOSYS, EPERM, or whatever a seccomp filter returns) must
    // turn it off, or every idle worker would spin on a wait that fails at once.
    const test::ChildResult r = test::run_in_child([] {
        auto fail = [](const char* what) {
            std::fprintf(stderr, "%s\n", what);
            std::fflush(stderr);
            _exit(1);
        };
        Scheduler s(1, false);
        s.start();
        std::atomic<int> early{0}, short_fallback{0};
        std::atomic<bool> done{false};
        s.schedule([&] {
            for (int i = 0; i < 20; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                fsched::this_fiber::sleep_for(300us);
                if (std::chrono::steady_clock::now() - t0 < 300us) ++early;
            }
            Fault fault(FaultSite::TimeoutSyscall, 1);
            for (int i = 0; i < 10; ++i) {
                // 1.5 ms: epoll_wait's timeout is whole milliseconds, rounded up, so the
                // worker sleeps at least 2 ms; the spin before it is far shorter than 0.1 ms.
                const auto t0 = std::chrono::steady_clock::now();
                fsched::this_fiber::sleep_for(1500us);
                const auto took = std::chrono::steady_clock::now() - t0;
                if (took < 1500us) ++early;
                if (took < 1900us) ++short_fallback;
            }
            done = true;
        });
        s.stop();
        if (!done) fail("the sleeping fiber did not finish");
        if (early) fail("a sleep returned early");
        if (short_fallback) fail("a sleep of 1.5 ms on the fallback took under 1.9 ms: not epoll_wait's milliseconds");
        if (fsched::detail::idle_wait_resolution() != std::chrono::milliseconds(1)) fail("no fallback after EINVAL");
    });
    CHECK_MESSAGE(r.exited, r.err);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
}

TEST_CASE("timer_spin: on epoll_wait's milliseconds the wait ends early enough for a spin shorter than one, and nanoseconds::max() does not overflow") {
    // A spin of 300 us: the fallback's wait, rounded up to a whole millisecond, would end
    // after the timer most of the time (and there is nothing left to spin) unless it is
    // asked to end a millisecond sooner. In a child: the fallback is the process's.
    const test::ChildResult r = test::run_in_child([] {
        fsched::SchedulerOptions options;
        options.threads = 1;
        options.use_caller = false;
        options.timer_spin = 300us;
        Scheduler s(options);
        s.start();
        std::atomic<int> early{0};
        s.schedule([&] {
            Fault fault(FaultSite::TimeoutSyscall, 1);
            for (int i = 0; i < 10; ++i) {
                const auto deadline = std::chrono::steady_clock::now() + 20ms;
                fsched::this_fiber::sleep_until(deadline);
                if (std::chrono::steady_clock::now() < deadline) ++early;
            }
        });
        s.stop();
        FSCHED_CHILD_REQUIRE(fsched::detail::idle_wait_resolution() == std::chrono::milliseconds(1));
        FSCHED_CHILD_REQUIRE(early == 0);
        FSCHED_CHILD_REQUIRE(s.stats().timer_spins >= 1);  // ended before the timer at least once in 10
        // nanoseconds::max(): the millisecond added to it saturates (an overflow would be
        // UBSan's error, or a wait to a time long past the timer: this sleep would hang),
        // and the worker spins each sleep from its start.
        options.timer_spin = std::chrono::nanoseconds::max();
        Scheduler whole(options);
        whole.start();
        std::atomic<bool> slept{false};
        whole.schedule([&] {
            const auto deadline = std::chrono::steady_clock::now() + 5ms;
            fsched::this_fiber::sleep_until(deadline);
            if (std::chrono::steady_clock::now() < deadline) ++early;
            slept = true;
        });
        whole.stop();
        FSCHED_CHILD_REQUIRE(slept);
        FSCHED_CHILD_REQUIRE(early == 0);
        FSCHED_CHILD_REQUIRE(whole.stats().timer_spins >= 1);
    });
    CHECK_MESSAGE(r.exited, r.err);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
}

TEST_CASE("an io wait that cannot record itself fails with ENOMEM and leaves the fd usable") {
    int fds[2];
    REQUIRE(pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    Scheduler s(1, false);
    int error = 0, error_timed = 0;
    bool later = false;
    s.start();
    s.schedule([&] {
        {
            Fault fault(FaultSite::IoAlloc, 1);
            CHECK_FALSE(fsched::io::wait(fds[0], fsched::io::Ready::Read));
            error = fsched::io::last_error();
        }
        {
            Fault fault(FaultSite::WaitAlloc, 1);
            CHECK_FALSE(fsched::io::wait(fds[0], fsched::io::Ready::Read, 5s));
            error_timed = fsched::io::last_error();
        }
        const char c = 'x';
        CHECK(::write(fds[1], &c, 1) == 1);
        later = fsched::io::wait(fds[0], fsched::io::Ready::Read, 5s);
    });
    s.stop();
    close(fds[0]);
    close(fds[1]);
    CHECK(error == ENOMEM);
    CHECK(error_timed == ENOMEM);
    CHECK(later);
}
#endif

TEST_CASE("a start() that cannot start every worker thread can be retried; stop() runs every task") {
    Scheduler s(3, false, "no-thread");
    std::atomic<int> ran{0};
    for (int w = 0; w < 3; ++w) s.schedule([&] { ran++; }, w);  // one pinned to each worker
    {
        Fault fault(FaultSite::ThreadStart, 2);  // the second worker's thread fails
        CHECK_THROWS_AS(s.start(), std::system_error);
    }
    s.stop();  // starts the workers that have no thread yet
    CHECK(ran == 3);
}

TEST_CASE("a Scheduler destroyed without threads to be had runs every task on the destroying thread") {
    // ~Scheduler -> stop() -> starting the workers' threads, which fails here (as under
    // RLIMIT_NPROC): stop() must neither throw out of the noexcept destructor nor strand a
    // task. Pinned tasks, a sleep (a timer on a thread-less worker), a Mutex handed between
    // fibers and a fiber woken from another worker all finish.
    for (const bool use_caller : {false, true}) {
        for (const long nth : {1L, 2L}) {  // every start fails / the second one does
            CAPTURE(use_caller);
            CAPTURE(nth);
            std::atomic<int> ran{0};
            const std::thread::id destroyer = std::this_thread::get_id();
            std::atomic<int> on_destroyer{0};
            {
                Fault fault(FaultSite::ThreadStart, nth);
                Scheduler s(3, use_caller, "no-threads");
                fsched::Mutex m;
                int shared = 0;
                fsched::WaitGroup wg;
                wg.add(1);
                for (int w = 0; w < 3; ++w) {
                    s.schedule([&] {
                        if (std::this_thread::get_id() == destroyer) on_destroyer++;
                        ran++;
                    }, w);
                }
                for (int i = 0; i < 8; ++i) {
                    s.schedule([&] {
                        fsched::this_fiber::sleep_for(2ms);
                        for (int k = 0; k < 100; ++k) {
                            std::lock_guard<fsched::Mutex> lock(m);
                            ++shared;
                            fsched::this_fiber::yield();
                        }
                        ran++;
                    });
                }
                s.schedule([&] {
                    wg.wait();  // woken by the task below, wherever it runs
                    ran++;
                }, 2);
                s.schedule([&] {
                    fsched::this_fiber::sleep_for(5ms);
                    wg.done();
                    ran++;
                }, 1);
                // No start(): the destructor's stop() starts the threads, or runs without.
            }
            CHECK(ran == 3 + 8 + 2);
            CHECK(on_destroyer >= 1);  // at least the thread-less workers' pinned tasks
        }
    }
}

TEST_CASE("stop() whose restart for a late task finds no thread runs that task itself") {
    // The workers start; then every thread start fails. A plain thread schedules (a bounded
    // number of tasks) for as long as the scheduler takes them, so some arrive while the
    // workers leave, and stop() must start them again, which fails: the stopping thread
    // runs those tasks instead. Every task that schedule() accepted runs, and stop()
    // returns normally (before, it threw std::system_error, and out of ~Scheduler that
    // terminated the program).
    fsched::detail::set_assert_throws(true);
    struct Restore {
        ~Restore() { fsched::detail::set_assert_throws(false); }
    } restore;
    long stand_ins = 0;
    // Until the stopping thread has stood in a few times (about one round in eight).
    for (int round = 0; round < 400 && stand_ins < 3; ++round) {
        std::atomic<long> accepted{0}, ran{0}, on_stopper{0};
        std::atomic<bool> started{false};
        const std::thread::id stopper = std::this_thread::get_id();
        {
            Scheduler s(2, false, "late");
            s.start();
            Fault fault(FaultSite::ThreadStart, 1);
            std::thread feeder([&] {
                for (int i = 0; i < 5000; ++i) {
                    try {
                        s.schedule([&] {
                            if (std::this_thread::get_id() == stopper) on_stopper++;
                            ran++;
                        });
                    } catch (const std::logic_error&) {
                        return;  // "schedule(): scheduler has stopped"
                    }
                    accepted++;
                    started = true;
                    if (i % 64 == 0) std::this_thread::yield();  // let the workers drain
                }
            });
            while (!started) std::this_thread::yield();
            CHECK_NOTHROW(s.stop());
            feeder.join();
        }
        CHECK(ran == accepted);
        stand_ins += on_stopper > 0;
    }
    MESSAGE("rounds whose late tasks the stopping thread ran: " << stand_ins);
}

TEST_CASE("a thread whose wake-up is the last task does not outlive the scheduler it wakes") {
    // The waker pushes the woken fiber, then pauses before it wakes a worker; meanwhile the
    // fiber runs, finishes, and stop() would return: the scheduler must not be destroyed
    // while the waker still reads it (ASan: heap-use-after-free in after_push).
    for (int round = 0; round < 5; ++round) {
        std::thread waker;
        {
            auto s = std::make_unique<Scheduler>(1, false, "waker");
            fsched::Mutex m;
            fsched::ConditionVariable cv;
            bool ready = false;
            std::atomic<bool> waiting{false};
            s->start();
            s->schedule([&] {
                std::unique_lock<fsched::Mutex> lock(m);
                waiting = true;
                cv.wait(lock, [&] { return ready; });
            });
            while (!waiting) std::this_thread::yield();
            waker = std::thread([&] {
                Fault fault(FaultSite::EnqueuePause, 1);
                {
                    std::lock_guard<fsched::Mutex> lock(m);
                    ready = true;
                }
                cv.notify_one();
            });
            // The worker polls its queue every few microseconds while it spins, so the fiber
            // runs during the waker's pause; stop() must wait for the waker to be done.
            s->stop();
            s.reset();
        }
        waker.join();
    }
}

// A fiber waiting on a ConditionVariable for up to 30 s (bounded, so that a test ends if a
// wake-up is lost: then `woken` comes late), and a plain thread's side of it.
struct BoundedWaiter {
    fsched::Mutex m;
    fsched::ConditionVariable cv;
    bool waiting = false, signalled = false;
    std::atomic<bool> woken{false};

    void schedule_on(Scheduler& s, int worker) {
        s.schedule([this] {
            std::unique_lock<fsched::Mutex> lock(m);
            waiting = true;
            cv.wait_for(lock, 30s, [this] { return signalled; });
            woken = true;
        }, worker);
    }
    void wait_until_waiting() {
        for (;;) {
            {
                std::lock_guard<fsched::Mutex> lock(m);
                if (waiting) return;
            }
            std::this_thread::sleep_for(1ms);
        }
    }
    void signal() {
        {
            std::lock_guard<fsched::Mutex> lock(m);
            signalled = true;
        }
        cv.notify_one();
    }
};

// Holds worker 1 inside its sleep announcement until released (set_sleep_announce_hook).
struct AnnounceGate {
    static std::atomic<bool> held;      // worker 1 is inside the hook
    static std::atomic<bool> released;  // let it go
    static void hook(int worker) {
        if (worker != 1 || released.load()) return;
        held = true;
        while (!released.load()) std::this_thread::sleep_for(1ms);
    }
};
std::atomic<bool> AnnounceGate::held{false};
std::atomic<bool> AnnounceGate::released{false};

TEST_CASE("a fiber pinned to a sleeping worker is woken while another worker is claimed mid-announcement") {
    // The reported lost wake-up (a pinned io::read never woke): worker 0 asleep, its fiber's
    // wake-up queued there and no one woken, because `sleepers` read 0. A worker that set
    // `sleeping` before counting itself could be claimed in between, and the claim's
    // decrement came before its increment. Here worker 1 is held inside its announcement;
    // a task pinned to it claims it (if `sleeping` is set by then), and a plain thread then
    // wakes the fiber pinned to sleeping worker 0. It must run before worker 1 is let go.
    AnnounceGate::held = false;
    AnnounceGate::released = false;
    fsched::detail::set_sleep_announce_hook(&AnnounceGate::hook);
    struct Unhook {
        ~Unhook() {
            AnnounceGate::released = true;
            fsched::detail::set_sleep_announce_hook(nullptr);
        }
    } unhook;
    Scheduler s(2, false, "announce");
    BoundedWaiter waiter;
    waiter.schedule_on(s, 0);
    s.start();
    waiter.wait_until_waiting();
    while (!AnnounceGate::held) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);  // worker 0 goes to sleep meanwhile
    std::atomic<bool> ran{false};
    s.schedule([&] { ran = true; }, 1);  // claims held worker 1, if it can
    waiter.signal();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!waiter.woken && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(waiter.woken);  // before worker 1 was let go
    AnnounceGate::released = true;
    s.stop();
    CHECK(ran);
}

// At the end of its sleep announcement (its last look found nothing), worker 1 queues a task
// pinned to itself, as an idle worker does when it fires another worker's due timer and
// the woken fiber comes to its own queue: it claims its own wake-up and sends itself no
// signal (SchedulerCore::wake_worker). It must then not block: nothing else would wake it,
// not even stop(). In a child, so that a worker that blocks cannot hang the suite.
struct SelfWakeGate {
    static Scheduler* sched;
    static std::atomic<bool> armed;
    static std::atomic<bool> ran;
    static void hook(int worker) {
        if (worker != 1 || !armed.exchange(false)) return;
        sched->schedule([] { ran = true; }, 1);
    }
};
Scheduler* SelfWakeGate::sched = nullptr;
std::atomic<bool> SelfWakeGate::armed{false};
std::atomic<bool> SelfWakeGate::ran{false};

TEST_CASE("a worker that queues a task for itself as it is about to sleep runs it instead of blocking") {
    test::ChildResult r = test::run_in_child([] {
        Scheduler s(2, false, "selfwake");
        SelfWakeGate::sched = &s;
        fsched::detail::set_sleep_wait_hook(&SelfWakeGate::hook);
        s.start();
        std::atomic<bool> first{false};
        SelfWakeGate::armed = true;
        s.schedule([&] { first = true; }, 1);  // worker 1 runs it, then goes to sleep: the hook
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        while (!SelfWakeGate::ran && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
        FSCHED_CHILD_REQUIRE(first);
        FSCHED_CHILD_REQUIRE(SelfWakeGate::ran);  // worker 1 did not block with its task queued
        s.stop();                                // nor does it now
        fsched::detail::set_sleep_wait_hook(nullptr);
    }, 60);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(r.err == "");
}

// The same with SchedulerOptions::timer_spin: worker 1 holds a timer (a fiber pinned to it
// waits on a condition variable for up to 30 s) and, with a spin of nanoseconds::max(),
// spins all the way to it instead of sleeping. Its self-claimed wake-up must end the spin
// as it ends a sleep, and so must the notify that wakes the waiter; else the task, or the
// waiter, would wait out the 30 s.
TEST_CASE("timer_spin: a worker that queues a task for itself as it is about to spin runs it instead of spinning") {
    test::ChildResult r = test::run_in_child([] {
        fsched::SchedulerOptions options;
        options.threads = 2;
        options.use_caller = false;
        options.name = "selfspin";
        options.timer_spin = std::chrono::nanoseconds::max();
        Scheduler s(options);
        SelfWakeGate::sched = &s;
        SelfWakeGate::ran = false;
        s.start();
        BoundedWaiter waiter;
        waiter.schedule_on(s, 1);
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        waiter.wait_until_waiting();
        while (s.stats().timer_spins == 0 && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(1ms);
        }
        FSCHED_CHILD_REQUIRE(s.stats().timer_spins >= 1);  // worker 1 spins to the waiter's deadline
        fsched::detail::set_sleep_wait_hook(&SelfWakeGate::hook);
        SelfWakeGate::armed = true;
        std::atomic<bool> first{false};
        s.schedule([&] { first = true; }, 1);  // ends the spin; then the hook, as worker 1 goes back
        while (!SelfWakeGate::ran && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
        FSCHED_CHILD_REQUIRE(first);
        FSCHED_CHILD_REQUIRE(SelfWakeGate::ran);  // worker 1 did not spin with its task queued
        waiter.signal();
        while (!waiter.woken && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
        FSCHED_CHILD_REQUIRE(waiter.woken);  // the notify ended the next spin too
        s.stop();
        fsched::detail::set_sleep_wait_hook(nullptr);
    }, 60);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(r.err == "");
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
// Worker 0 takes the poller role as it announces its sleep, then its last look finds a long
// task. Giving the role up, it wakes a sleeping worker to take it over (end_sleep,
// wake_for_io), which must not be itself, still marked asleep: then no one would watch the
// fds while worker 1 sleeps, and a fiber whose read is ready would wait for worker 0's task.
struct PollerHandoffGate {
    static Scheduler* sched;
    static std::atomic<bool> armed;
    static std::atomic<bool> fired;
    static std::atomic<bool> worker1_done;
    static void hook(int worker) {
        if (worker != 0 || !armed.load() || fsched::detail::io_poller_worker(*sched) != 0) return;
        while (!worker1_done.load()) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);  // worker 1 goes to sleep meanwhile, not as the poller
        if (!armed.exchange(false)) return;
        sched->schedule([] {
            const auto end = std::chrono::steady_clock::now() + 2s;
            while (std::chrono::steady_clock::now() < end) {
            }
        }, 0);  // what worker 0's last look finds
        fired = true;
    }
};
Scheduler* PollerHandoffGate::sched = nullptr;
std::atomic<bool> PollerHandoffGate::armed{false};
std::atomic<bool> PollerHandoffGate::fired{false};
std::atomic<bool> PollerHandoffGate::worker1_done{false};

TEST_CASE("a worker that gives up the poller role to run a task hands it to a sleeping worker, not to itself") {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    REQUIRE(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK) == 0);
    Scheduler s(2, false, "handoff");
    PollerHandoffGate::sched = &s;
    PollerHandoffGate::armed = false;
    PollerHandoffGate::fired = false;
    PollerHandoffGate::worker1_done = false;
    fsched::detail::set_sleep_announce_hook(&PollerHandoffGate::hook);
    struct Unhook {
        ~Unhook() { fsched::detail::set_sleep_announce_hook(nullptr); }
    } unhook;
    s.start();
    // Worker 1 busy while the reader parks, so worker 0 is the first to sleep and polls.
    s.schedule([] {
        std::this_thread::sleep_for(200ms);
        PollerHandoffGate::worker1_done = true;
    }, 1);
    std::atomic<bool> got{false};
    std::chrono::steady_clock::time_point got_at;
    PollerHandoffGate::armed = true;
    s.schedule([&] {  // not pinned: once its byte is there, any worker may run it
        char c;
        got = fsched::io::read(sv[0], &c, 1) == 1;
        got_at = std::chrono::steady_clock::now();
    });
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!PollerHandoffGate::fired && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    REQUIRE(PollerHandoffGate::fired);
    std::this_thread::sleep_for(50ms);
    const auto sent = std::chrono::steady_clock::now();
    REQUIRE(::write(sv[1], "x", 1) == 1);
    while (!got && std::chrono::steady_clock::now() < sent + 10s) std::this_thread::sleep_for(1ms);
    CHECK(got);
    // Worker 1 took the role and ran the reader; without the hand-over it waits out the 2 s task.
    CHECK(got_at - sent < 1s);
    s.stop();
    ::close(sv[0]);
    ::close(sv[1]);
}
#endif
