// The toolbox's synchronisation (issue 24): Semaphore, Latch, Barrier, SharedMutex, Event,
// ConditionVariableAny and Mutex::try_lock_for/until — fibers in every scheduler
// configuration, plain threads and the use_caller thread; timeouts that never return early
// and that a racing notification decides once; FIFO hand-over, writer preference, thousands
// of barrier phases, a throwing completion, misuse, no allocation per operation, and the
// report naming each wait.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using test::contains;
using test::report_line;
using fsched::Barrier;
using fsched::ConditionVariableAny;
using fsched::Event;
using fsched::Latch;
using fsched::Mutex;
using fsched::Scheduler;
using fsched::Semaphore;
using fsched::SharedMutex;
using namespace std::chrono_literals;

// ---- Counting allocations: the global operator new, replaced for this test program -----
namespace {
// Runs `body` on this plain thread, then as a task of a 2-worker scheduler (two subcases).
template <class Body>
void on_a_thread_and_in_a_task(Body& body) {
    SUBCASE("a plain thread") { body(); }
    SUBCASE("a task") {
        Scheduler s(2, false);
        s.start();
        fsched::WaitGroup done(1);
        s.schedule([&] {
            body();
            done.done();
        });
        done.wait();
        s.stop();
    }
}

std::atomic<bool> counting_allocations{false};
std::atomic<long> allocations{0};
}  // namespace

// Not inlined: g++ would otherwise see free() of operator new's pointer and warn.
FIBER_SCHED_NOINLINE void* operator new(std::size_t size) {
    if (counting_allocations.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(size ? size : 1)) return p;
    throw std::bad_alloc();
}
FIBER_SCHED_NOINLINE void operator delete(void* p) noexcept { std::free(p); }
FIBER_SCHED_NOINLINE void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// Every other form that pairs with these, so that no block goes from one allocator to the
// other: under AddressSanitizer its own nothrow new (std::stable_sort's buffer) met the
// free() above and aborted the suite (alloc-dealloc-mismatch). The aligned forms stay
// the library's: they pair with each other.
FIBER_SCHED_NOINLINE void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    if (counting_allocations.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(size ? size : 1);
}
FIBER_SCHED_NOINLINE void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
FIBER_SCHED_NOINLINE void* operator new[](std::size_t size) { return ::operator new(size); }
FIBER_SCHED_NOINLINE void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
    return ::operator new(size, tag);
}
FIBER_SCHED_NOINLINE void operator delete[](void* p) noexcept { std::free(p); }
FIBER_SCHED_NOINLINE void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
FIBER_SCHED_NOINLINE void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

#if defined(FIBER_SCHED_TSAN)
constexpr int scale = 1;
#else
constexpr int scale = 4;
#endif

using Clock = std::chrono::steady_clock;

// Elapsed since `start` is at least `d` (a timed wait that gave up never did so early).
bool not_early(Clock::time_point start, Clock::duration d) { return Clock::now() - start >= d; }

// A small deterministic generator for the stress loops.
struct Rng {
    std::uint64_t s;
    std::uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
};

// Polls until `pred` holds or 20 s pass: a task yields, a use_caller thread runs its
// scheduler's tasks meanwhile (this_fiber::sleep_for), a plain thread sleeps.
template <class Pred>
bool eventually(Pred pred) {
    const auto until = Clock::now() + 20s;
    while (!pred()) {
        if (Clock::now() > until) return false;
        if (fsched::Fiber::current()) {
            fsched::this_fiber::yield();
        } else {
            fsched::this_fiber::sleep_for(100us);
        }
    }
    return true;
}

}  // namespace

// ---- Semaphore -----------------------------------------------------------------------------

TEST_CASE("Semaphore: try_acquire, release(n), on plain threads") {
    Semaphore sem(2);
    CHECK(sem.try_acquire());
    CHECK(sem.try_acquire());
    CHECK_FALSE(sem.try_acquire());
    sem.release(3);
    for (int i = 0; i < 3; ++i) CHECK(sem.try_acquire());
    CHECK_FALSE(sem.try_acquire());
    sem.release(0);
    CHECK_FALSE(sem.try_acquire());
    CHECK((Semaphore::max)() == PTRDIFF_MAX);
    std::thread other([&] { sem.acquire(); });  // blocks the thread until the release
    std::this_thread::sleep_for(5ms);
    sem.release();
    other.join();
    CHECK_FALSE(sem.try_acquire());
}

TEST_CASE("Semaphore: at most K inside, every fiber gets through, the caller thread too") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        constexpr int units = 3;
        Semaphore sem(units);
        std::atomic<int> inside{0}, most{0}, done{0};
        auto section = [&] {
            const int now = ++inside;
            int seen = most.load();
            while (now > seen && !most.compare_exchange_weak(seen, now)) {
            }
            fsched::this_fiber::yield();
            --inside;
        };
        s.start();
        for (int f = 0; f < 40; ++f) {
            s.schedule([&] {
                for (int i = 0; i < 5 * scale; ++i) {
                    sem.acquire();
                    section();
                    sem.release();
                }
                ++done;
            });
        }
        // The main thread (the use_caller thread, or a plain one) competes too.
        for (int i = 0; i < 20; ++i) {
            if (i % 2) {
                REQUIRE(sem.try_acquire_for(20s));
            } else {
                sem.acquire();
            }
            section();
            sem.release();
        }
        s.stop();
        CHECK(done == 40);
        CHECK(most.load() <= units);
        CHECK(most.load() >= 1);
        for (int i = 0; i < units; ++i) CHECK(sem.try_acquire());
        CHECK_FALSE(sem.try_acquire());
    });
}

TEST_CASE("Semaphore: units go to the oldest waiters; a newcomer does not take one from them") {
    Scheduler s(1, false);
    Semaphore sem(0);
    std::vector<int> arrived, served;
    bool newcomer_got_one = true;
    s.schedule([&] {
        for (int i = 1; i <= 4; ++i) {
            Scheduler::current()->schedule([&, i] {
                arrived.push_back(i);  // one worker: nothing runs between this and acquire()
                sem.acquire();
                served.push_back(i);
            });
        }
        for (int i = 0; i < 10; ++i) fsched::this_fiber::yield();  // all four queue up
        sem.release(2);
        newcomer_got_one = sem.try_acquire();  // both units were handed to waiters
        while (served.size() < 2) fsched::this_fiber::yield();
        // One unit at a time: who was served shows the order (not when each ran).
        for (std::size_t n = 3; n <= 4; ++n) {
            sem.release();
            while (served.size() < n) fsched::this_fiber::yield();
        }
    });
    s.start();
    s.stop();
    CHECK_FALSE(newcomer_got_one);
    REQUIRE(arrived.size() == 4);
    REQUIRE(served.size() == 4);
    // The first two were released together and may run in either order; the rest in turn.
    CHECK(((served[0] == arrived[0] && served[1] == arrived[1]) || (served[0] == arrived[1] && served[1] == arrived[0])));
    CHECK(served[2] == arrived[2]);
    CHECK(served[3] == arrived[3]);
    CHECK_FALSE(sem.try_acquire());
}

TEST_CASE("Semaphore: try_acquire_for times out never early, and succeeds when released in time") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Semaphore sem(0);
        std::atomic<bool> fiber_early{false}, fiber_got{false}, last_wait{false};
        s.start();
        s.schedule([&] {
            const auto start = Clock::now();
            if (sem.try_acquire_for(5ms) || !not_early(start, 5ms)) fiber_early = true;
            const auto start2 = Clock::now();
            if (sem.try_acquire_until(start2 + 3ms) || !not_early(start2, 3ms)) fiber_early = true;
            last_wait = true;
            fiber_got = sem.try_acquire_for(20s);
        });
        // The main thread: the use_caller thread (running tasks meanwhile) or a plain one.
        const auto start = Clock::now();
        CHECK_FALSE(sem.try_acquire_for(4ms));
        CHECK(not_early(start, 4ms));
        CHECK_FALSE(sem.try_acquire_until(std::chrono::system_clock::now() - 1s));  // past: a try
        CHECK(eventually([&] { return last_wait.load(); }));
        fsched::this_fiber::sleep_for(1ms);
        sem.release();
        s.stop();
        CHECK_FALSE(fiber_early);
        CHECK(fiber_got);
        CHECK_FALSE(sem.try_acquire());
    });
}

TEST_CASE("Semaphore: timed acquires racing releases: each unit is taken exactly once") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Semaphore sem(0);
        constexpr int released_total = 300 * scale;
        std::atomic<long> got{0}, released{0};
        std::atomic<bool> stop{false};
        s.start();
        for (int f = 0; f < 6; ++f) {
            s.schedule([&, f] {
                Rng rng{0x9e3779b97f4a7c15ull + static_cast<unsigned>(f)};
                while (!stop) {
                    if (sem.try_acquire_for(std::chrono::microseconds(rng.below(200)))) ++got;
                }
            });
        }
        std::thread plain([&] {  // a plain thread takes part
            Rng rng{42};
            while (!stop) {
                if (sem.try_acquire_for(std::chrono::microseconds(rng.below(300)))) ++got;
            }
        });
        s.schedule([&] {
            Rng rng{7};
            for (int i = 0; i < released_total;) {
                const int n = 1 + rng.below(3);
                released += n;
                sem.release(n);
                i += n;
                if (rng.below(4) == 0) fsched::this_fiber::yield();
            }
        });
        // Released units are all taken (a timed-out waiter never swallows one).
        const bool drained = eventually([&] { return got.load() >= released_total; });
        stop = true;
        plain.join();
        s.stop();
        long left = 0;
        while (sem.try_acquire()) ++left;
        CHECK(drained);
        CHECK(released.load() >= released_total);
        CHECK(got.load() + left == released.load());  // never twice, never lost
    });
}

TEST_CASE("Semaphore: misuse is loud") {
    FSCHED_CHECK_ABORTS_WITH([] { Semaphore sem(-1); }, "Semaphore(): the initial count must not be negative");
    FSCHED_CHECK_ABORTS_WITH([] {
        Semaphore sem(0);
        sem.release(-1);
    }, "Semaphore::release(): the update must not be negative");
    FSCHED_CHECK_ABORTS_WITH([] {
        Semaphore sem((Semaphore::max)());
        sem.release();
    }, "Semaphore::release(): the count would exceed max()");
}

// ---- Latch ---------------------------------------------------------------------------------

TEST_CASE("Latch: waiters in fibers and threads are released once the count reaches zero") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        constexpr int workers = 12;
        Latch ready(workers + 1);  // the workers, then the main thread
        Latch done(workers);
        std::atomic<int> before{0}, early{0};
        s.start();
        for (int f = 0; f < workers; ++f) {
            s.schedule([&, f] {
                ++before;
                if (f % 2) {
                    ready.arrive_and_wait();
                } else {
                    ready.count_down();
                    ready.wait();
                }
                if (before.load() != workers) ++early;
                done.count_down();
            });
        }
        std::thread plain([&] { done.wait(); });
        CHECK(eventually([&] { return before.load() == workers; }));
        CHECK_FALSE(ready.try_wait());
        ready.arrive_and_wait();  // the last arrival opens it
        CHECK(ready.try_wait());
        done.wait();  // the use_caller thread helps meanwhile
        plain.join();
        s.stop();
        CHECK(early == 0);
        CHECK(done.try_wait());
        ready.wait();  // open: returns at once
        done.count_down(0);
    });
}

TEST_CASE("Latch: count_down(n) and a latch that starts at zero") {
    Latch open(0);
    CHECK(open.try_wait());
    open.wait();
    Latch l(5);
    l.count_down(2);
    CHECK_FALSE(l.try_wait());
    std::thread t([&] { l.arrive_and_wait(2); });
    std::this_thread::sleep_for(2ms);
    CHECK_FALSE(l.try_wait());
    l.count_down();
    t.join();
    CHECK(l.try_wait());
}

TEST_CASE("Latch: misuse is loud") {
    FSCHED_CHECK_ABORTS_WITH([] { Latch l(-1); }, "Latch(): the count must not be negative");
    FSCHED_CHECK_ABORTS_WITH([] {
        Latch l(1);
        l.count_down(2);
    }, "Latch::count_down(): the count went below zero");
    FSCHED_CHECK_ABORTS_WITH([] {
        Latch l(1);
        l.count_down(-1);
    }, "Latch::count_down(): the update must not be negative");
    FSCHED_CHECK_ABORTS_WITH([] {
        Latch l(1);
        l.arrive_and_wait(3);
    }, "Latch::arrive_and_wait(): the count went below zero");
}

// ---- Barrier -------------------------------------------------------------------------------

TEST_CASE("Barrier: thousands of phases, the completion once per phase before anyone goes on") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        constexpr int fibers = 5;  // and the main thread: 6 participants
        const int phases = c.threads >= 4 ? 500 * scale : 250 * scale;
        std::atomic<int> arrived_this_phase{0};
        std::atomic<long> completions{0};
        std::atomic<int> bad_completion{0}, bad_phase{0};
        Barrier barrier(fibers + 1, [&] {
            if (arrived_this_phase.exchange(0) != fibers + 1) ++bad_completion;
            ++completions;
        });
        auto participant = [&] {
            for (int p = 0; p < phases; ++p) {
                ++arrived_this_phase;
                barrier.arrive_and_wait();
                // This phase's completion ran, the next one's cannot yet: we have not arrived.
                if (completions.load() != p + 1) ++bad_phase;
            }
        };
        s.start();
        for (int f = 0; f < fibers; ++f) s.schedule(participant);
        participant();  // the use_caller thread or a plain thread
        s.stop();
        CHECK(completions.load() == phases);
        CHECK(bad_completion == 0);
        CHECK(bad_phase == 0);
    });
}

TEST_CASE("Barrier: arrive_and_drop leaves; later phases wait for fewer") {
    Scheduler s(2, false);
    std::atomic<int> completions{0};
    Barrier barrier(3, [&] { ++completions; });
    std::atomic<int> finished{0};
    s.start();
    s.schedule([&] {
        barrier.arrive_and_wait();   // phase 0
        barrier.arrive_and_drop();   // phase 1: arrives and leaves
        ++finished;
    });
    s.schedule([&] {
        for (int p = 0; p <= 100; ++p) barrier.arrive_and_wait();  // phases 0..100
        ++finished;
    });
    std::thread plain([&] {
        for (int p = 0; p < 100; ++p) barrier.arrive_and_wait();
        barrier.arrive_and_drop();  // phase 100: the last arrival completes it
        ++finished;
    });
    plain.join();
    s.stop();
    CHECK(finished == 3);
    CHECK(completions == 101);
}

TEST_CASE("Barrier: a throwing completion propagates from the last arriver; the phase completes") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        constexpr int participants = 4;
        std::atomic<int> phase{0};
        Barrier barrier(participants, [&] {
            if (phase++ % 3 == 1) throw std::runtime_error("completion failed");
        });
        std::atomic<int> caught{0}, other{0}, passed{0};
        auto participant = [&] {
            for (int p = 0; p < 30; ++p) {
                try {
                    barrier.arrive_and_wait();
                } catch (const std::runtime_error&) {
                    ++caught;
                } catch (...) {
                    ++other;
                }
                ++passed;
            }
        };
        s.start();
        for (int f = 0; f < participants - 1; ++f) s.schedule(participant);
        participant();
        s.stop();
        CHECK(phase == 30);
        CHECK(caught == 10);  // once per throwing phase: only the last arriver sees it
        CHECK(other == 0);
        CHECK(passed == 30 * participants);
    });
}

TEST_CASE("Barrier: misuse is loud") {
    FSCHED_CHECK_ABORTS_WITH([] { Barrier b(-1); }, "Barrier(): the count must not be negative");
    FSCHED_CHECK_ABORTS_WITH([] {
        Barrier b(1);
        b.arrive_and_drop();
        b.arrive_and_wait();  // nobody is left to arrive
    }, "Barrier::arrive_and_wait(): more arrivals in a phase than participants");
    FSCHED_CHECK_ABORTS_WITH([] {
        Barrier b(0);
        b.arrive_and_drop();
    }, "Barrier::arrive_and_drop(): more arrivals in a phase than participants");
}

// ---- SharedMutex ---------------------------------------------------------------------------

TEST_CASE("SharedMutex: readers share, a writer excludes all, with std::shared_lock and unique_lock") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        SharedMutex m;
        std::atomic<int> readers{0}, writers{0}, bad{0}, most_readers{0};
        long value = 0;  // written under the exclusive lock only
        s.start();
        for (int f = 0; f < 24; ++f) {
            s.schedule([&, f] {
                for (int i = 0; i < 10 * scale; ++i) {
                    if ((f + i) % 4 == 0) {
                        std::unique_lock<SharedMutex> lock(m);
                        if (++writers != 1 || readers.load() != 0) ++bad;
                        const long seen = value;
                        fsched::this_fiber::yield();
                        value = seen + 1;
                        --writers;
                    } else {
                        std::shared_lock<SharedMutex> lock(m);
                        const int now = ++readers;
                        if (writers.load() != 0) ++bad;
                        int seen = most_readers.load();
                        while (now > seen && !most_readers.compare_exchange_weak(seen, now)) {
                        }
                        fsched::this_fiber::yield();
                        --readers;
                    }
                }
            });
        }
        for (int i = 0; i < 10; ++i) {  // the main thread too
            std::lock_guard<SharedMutex> lock(m);
            ++value;
        }
        s.stop();
        long writes = 0;
        for (int f = 0; f < 24; ++f)
            for (int i = 0; i < 10 * scale; ++i) writes += (f + i) % 4 == 0;
        CHECK(bad == 0);
        CHECK(value == writes + 10);
        CHECK(m.try_lock());
        m.unlock();
    });
}

TEST_CASE("SharedMutex: try_ forms, and a waiting writer closes the door to new readers") {
    SharedMutex m;
    CHECK(m.try_lock_shared());
    CHECK(m.try_lock_shared());
    CHECK_FALSE(m.try_lock());
    std::atomic<bool> writer_in{false};
    std::thread writer([&] {
        m.lock();
        writer_in = true;
        m.unlock();
    });
    // Once the writer waits (it cannot get in while we read), new readers are refused.
    CHECK(eventually([&] { return !m.try_lock_shared() || (m.unlock_shared(), false); }));
    std::atomic<bool> late_reader_in{false};
    std::thread late_reader([&] {
        m.lock_shared();  // queues behind the writer
        late_reader_in = true;
        CHECK(writer_in.load());
        m.unlock_shared();
    });
    std::this_thread::sleep_for(5ms);
    CHECK_FALSE(writer_in.load());
    CHECK_FALSE(late_reader_in.load());
    m.unlock_shared();
    m.unlock_shared();  // the last reader out hands the lock to the writer
    writer.join();
    late_reader.join();
    CHECK(writer_in);
    CHECK(late_reader_in);
    CHECK(m.try_lock());
    CHECK_FALSE(m.try_lock_shared());
    m.unlock();
}

TEST_CASE("SharedMutex: a stream of overlapping readers does not starve a writer") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        SharedMutex m;
        std::atomic<bool> stop{false}, writer_done{false};
        std::atomic<long> reads{0};
        std::atomic<bool> writer_done_while_reading{false};
        s.start();
        for (int f = 0; f < 4; ++f) {
            s.schedule([&] {
                // Readers overlap: someone always holds it shared, so without writer
                // preference a writer would never see it free.
                const auto until = Clock::now() + 20s;
                while (!stop && Clock::now() < until) {
                    std::shared_lock<SharedMutex> lock(m);
                    ++reads;
                    fsched::this_fiber::yield();
                    if (writer_done) writer_done_while_reading = true;
                }
            });
        }
        CHECK(eventually([&] { return reads.load() > 100; }));
        std::thread writer([&] {
            for (int i = 0; i < 20; ++i) {
                std::unique_lock<SharedMutex> lock(m);
            }
            writer_done = true;
        });
        // (Not join() at once: a use_caller thread must run the readers meanwhile.)
        CHECK(eventually([&] { return writer_done_while_reading.load(); }));
        writer.join();
        stop = true;
        s.stop();
        CHECK(writer_done_while_reading);
    });
}

TEST_CASE("SharedMutex: unlock() lets the readers queued behind it in before the next writer") {
    Scheduler s(1, false);
    SharedMutex m;
    std::vector<std::string> order;
    s.schedule([&] {
        m.lock();
        auto* sched = Scheduler::current();
        sched->schedule([&] {
            m.lock_shared();
            order.push_back("reader");
            fsched::this_fiber::yield();
            m.unlock_shared();
        });
        sched->schedule([&] {
            m.lock();
            order.push_back("writer");
            m.unlock();
        });
        sched->schedule([&] {
            m.lock_shared();
            order.push_back("reader");
            fsched::this_fiber::yield();
            m.unlock_shared();
        });
        for (int i = 0; i < 10; ++i) fsched::this_fiber::yield();  // all three queue up
        m.unlock();
    });
    s.start();
    s.stop();
    CHECK(order == std::vector<std::string>{"reader", "reader", "writer"});
}

TEST_CASE("SharedMutex: misuse is loud") {
    FSCHED_CHECK_ABORTS_WITH([] {
        SharedMutex m;
        m.unlock();
    }, "SharedMutex::unlock(): the mutex is not held exclusively by the caller");
    FSCHED_CHECK_ABORTS_WITH([] {
        SharedMutex m;
        m.lock();
        std::thread([&] { m.unlock(); }).join();
    }, "SharedMutex::unlock(): the mutex is not held exclusively by the caller");
    FSCHED_CHECK_ABORTS_WITH([] {
        SharedMutex m;
        m.unlock_shared();
    }, "SharedMutex::unlock_shared(): no shared lock is held");
    FSCHED_CHECK_ABORTS_WITH([] {
        SharedMutex m;
        m.lock();
        m.lock();
    }, "SharedMutex::lock(): the caller already holds this mutex (it is not recursive)");
    FSCHED_CHECK_ABORTS_WITH([] {
        SharedMutex m;
        m.lock();
        m.lock_shared();
    }, "SharedMutex::lock_shared(): the caller holds this mutex exclusively");
    FSCHED_CHECK_ABORTS_WITH([] {
        auto* m = new SharedMutex;
        m->lock_shared();
        delete m;
    }, "~SharedMutex(): the mutex is still locked");
}

// ---- Event ---------------------------------------------------------------------------------

TEST_CASE("Event: Auto — a signal with no waiter stays set until one wait consumes it") {
    Event e;  // Auto, clear
    CHECK_FALSE(e.test());
    e.signal();
    e.signal();  // still one signal
    CHECK(e.is_set());
    e.wait();
    CHECK_FALSE(e.is_set());
    const auto start = Clock::now();
    CHECK_FALSE(e.wait_for(3ms));
    CHECK(not_early(start, 3ms));
    e.signal();
    CHECK(e.test());        // test() consumes an Auto event's signal (as marl's)
    CHECK_FALSE(e.test());
    e.signal();
    e.clear();
    CHECK_FALSE(e.wait_until(Clock::now() + 1ms));
    Event set(Event::Mode::Auto, true);
    CHECK(set.wait_for(0ms));
    CHECK_FALSE(set.is_set());
}

TEST_CASE("Event: Manual — stays set and wakes every waiter, until clear()") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Event go(Event::Mode::Manual);
        std::atomic<int> through{0}, waiting{0};
        s.start();
        for (int f = 0; f < 16; ++f) {
            s.schedule([&, f] {
                ++waiting;
                if (f % 2) {
                    go.wait();
                } else {
                    CHECK(go.wait_for(20s));
                }
                ++through;
            });
        }
        std::thread plain([&] {
            go.wait();
            ++through;
        });
        CHECK(eventually([&] { return waiting.load() == 16; }));
        go.signal();
        plain.join();
        CHECK(eventually([&] { return through.load() == 17; }));
        CHECK(go.test());  // a Manual event's test() consumes nothing
        CHECK(go.is_set());
        go.wait();         // set: returns at once
        go.clear();
        CHECK_FALSE(go.wait_for(1ms));
        s.stop();
        CHECK(through == 17);
    });
}

TEST_CASE("Event: Auto — each signal releases exactly one wait, timed waits racing it decided once") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Event e;
        constexpr int signals = 150 * scale;
        std::atomic<long> got{0};
        std::atomic<bool> stop{false};
        s.start();
        for (int f = 0; f < 5; ++f) {
            s.schedule([&, f] {
                Rng rng{1234u + static_cast<unsigned>(f)};
                while (!stop) {
                    if (f == 0) {
                        if (e.test()) ++got;  // a non-blocking consumer too
                        fsched::this_fiber::yield();
                    } else if (e.wait_for(std::chrono::microseconds(rng.below(150)))) {
                        ++got;
                    }
                }
            });
        }
        std::thread plain([&] {
            Rng rng{99};
            while (!stop) {
                if (e.wait_for(std::chrono::microseconds(rng.below(200)))) ++got;
            }
        });
        bool every_signal_taken = true;
        for (long i = 1; i <= signals && every_signal_taken; ++i) {
            e.signal();
            // Handed to a waiter or left set for the next one: either way taken exactly once.
            every_signal_taken = eventually([&] { return got.load() >= i; });
        }
        stop = true;
        plain.join();
        s.stop();
        CHECK(every_signal_taken);
        CHECK(got.load() == signals);
        CHECK_FALSE(e.is_set());
    });
}

// ---- ConditionVariableAny ------------------------------------------------------------------

TEST_CASE("ConditionVariableAny: with unique_lock<Mutex>, shared_lock<SharedMutex>, SharedMutex, std::mutex") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Mutex mutex;
        SharedMutex shared;
        std::mutex plain_mutex;  // a user's lock (a thread's: fibers only hold it briefly)
        ConditionVariableAny cv;
        int stage = 0;  // under `mutex`, or `shared` exclusively, per step below
        std::atomic<int> woke{0};
        s.start();
        s.schedule([&] {
            std::unique_lock<Mutex> lock(mutex);
            cv.wait(lock, [&] { return stage >= 1; });
            ++woke;
        });
        s.schedule([&] {
            std::shared_lock<SharedMutex> lock(shared);
            CHECK(cv.wait_for(lock, 20s, [&] { return woke.load() >= 1; }));
            ++woke;
        });
        s.schedule([&] {
            shared.lock();
            cv.wait(shared, [&] { return woke.load() >= 2; });
            shared.unlock();
            ++woke;
        });
        std::thread thread_waiter([&] {
            std::unique_lock<std::mutex> lock(plain_mutex);
            CHECK(cv.wait_until(lock, Clock::now() + 20s, [&] { return woke.load() >= 3; }));
            ++woke;
        });
        bool all = true;
        for (int target = 1; target <= 4 && all; ++target) {
            {
                std::lock_guard<Mutex> m(mutex);
                std::lock_guard<SharedMutex> sh(shared);
                std::lock_guard<std::mutex> p(plain_mutex);
                stage = 1;
            }
            cv.notify_all();
            all = eventually([&] {
                cv.notify_all();
                return woke.load() >= target;
            });
        }
        thread_waiter.join();
        s.stop();
        CHECK(all);
        CHECK(woke == 4);
    });
}

TEST_CASE("ConditionVariableAny: a timed wait returns with the lock held, never early; notify_one wakes one") {
    Scheduler s(2, true);
    SharedMutex m;
    ConditionVariableAny cv;
    std::atomic<int> woken{0};
    std::atomic<int> waiting{0};
    s.start();
    {
        std::unique_lock<SharedMutex> lock(m);
        const auto start = Clock::now();
        CHECK(cv.wait_for(lock, 3ms) == std::cv_status::timeout);  // the use_caller thread
        CHECK(not_early(start, 3ms));
        CHECK(lock.owns_lock());
        CHECK_FALSE(m.try_lock_shared());
    }
    for (int f = 0; f < 3; ++f) {
        s.schedule([&] {
            std::shared_lock<SharedMutex> lock(m);
            ++waiting;
            const auto start = Clock::now();
            if (cv.wait_for(lock, 300ms) == std::cv_status::no_timeout) {
                ++woken;
            } else {
                CHECK(not_early(start, 300ms));
            }
        });
    }
    std::this_thread::sleep_for(1ms);
    CHECK(eventually([&] { return waiting.load() == 3; }));
    {
        std::lock_guard<SharedMutex> lock(m);  // the waiters are all listed once this is ours
    }
    cv.notify_one();
    s.stop();
    CHECK(woken == 1);
}

TEST_CASE("ConditionVariableAny: a user's own lock type") {
    // A BasicLockable of the user's (here a tiny spin lock): lock() and unlock() are all
    // the condition variable needs.
    struct UserLock {
        std::atomic<bool> held{false};
        void lock() {
            while (held.exchange(true, std::memory_order_acquire)) fsched::this_fiber::yield();
        }
        void unlock() { held.store(false, std::memory_order_release); }
    };
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        UserLock user_lock;
        ConditionVariableAny cv;
        int items = 0;  // under user_lock
        std::atomic<int> consumed{0};
        s.start();
        for (int f = 0; f < 4; ++f) {
            s.schedule([&] {
                for (int i = 0; i < 10; ++i) {
                    std::unique_lock<UserLock> lock(user_lock);
                    cv.wait(lock, [&] { return items > 0; });
                    --items;
                    ++consumed;
                }
            });
        }
        for (int i = 0; i < 40; ++i) {
            {
                std::lock_guard<UserLock> lock(user_lock);
                ++items;
            }
            cv.notify_one();
            if (i % 8 == 0) fsched::this_fiber::yield();
        }
        CHECK(eventually([&] { return consumed.load() == 40; }));
        s.stop();
        CHECK(consumed == 40);
        CHECK(items == 0);
    });
}

TEST_CASE("ConditionVariableAny: a lock whose unlock() throws: the exception comes out, the condition variable stays usable") {
    // A std::unique_lock that owns no mutex throws from unlock(). The waiter had joined the
    // list with the condition variable's own lock held, and both stayed: the next notify
    // spun on that lock for good.
    ConditionVariableAny cv;
    fsched::Mutex m;
    for (bool timed : {false, true}) {
        CAPTURE(timed);
        std::unique_lock<fsched::Mutex> not_owned(m, std::defer_lock);
        bool threw = false;
        try {
            if (timed) {
                cv.wait_for(not_owned, 10ms);
            } else {
                cv.wait(not_owned);
            }
        } catch (const std::system_error&) {
            threw = true;
        }
        CHECK(threw);
        CHECK_FALSE(not_owned.owns_lock());
        cv.notify_all();  // hung here before
        cv.notify_one();
    }
    // And it still works: a timed wait with a lock that is held times out and relocks.
    std::unique_lock<fsched::Mutex> held(m);
    CHECK(cv.wait_for(held, 1ms) == std::cv_status::timeout);
    CHECK(held.owns_lock());
}

// ---- Mutex::try_lock_for / try_lock_until --------------------------------------------------

TEST_CASE("Mutex::try_lock_for: free, held past the deadline (never early), released in time") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Mutex m;
        CHECK(m.try_lock_for(1ms));
        std::atomic<bool> fiber_ok{true}, fiber_got{false};
        std::atomic<bool> go{false};
        s.start();
        s.schedule([&] {
            const auto start = Clock::now();
            if (m.try_lock_for(5ms) || !not_early(start, 5ms)) fiber_ok = false;
            const auto start2 = Clock::now();
            if (m.try_lock_until(std::chrono::system_clock::now() + 3ms) || !not_early(start2, 3ms)) fiber_ok = false;
            go = true;
            fiber_got = m.try_lock_for(20s);
            if (fiber_got) m.unlock();
        });
        CHECK(eventually([&] { return go.load(); }));
        std::this_thread::sleep_for(5ms);
        m.unlock();
        s.stop();
        CHECK(fiber_ok);
        CHECK(fiber_got);
    });
}

TEST_CASE("Mutex::try_lock_for on the use_caller thread and on a plain thread") {
    for (bool use_caller : {true, false}) {
        Scheduler s(1, use_caller);
        Mutex m;
        std::atomic<bool> holding{false};
        std::atomic<int> ran{0};
        s.start();
        s.schedule([&] {
            m.lock();
            holding = true;
            fsched::this_fiber::sleep_for(30ms);
            m.unlock();
        });
        for (int i = 0; i < 4; ++i) s.schedule([&] { ++ran; });
        REQUIRE(eventually([&] { return holding.load(); }));
        const auto start = Clock::now();
        CHECK_FALSE(m.try_lock_for(2ms));  // held by the sleeping task
        CHECK(not_early(start, 2ms));
        CHECK(m.try_lock_for(20s));  // the use_caller thread runs the tasks meanwhile
        m.unlock();
        s.stop();
        CHECK(ran == 4);
    }
}

TEST_CASE("Mutex::try_lock_for: held past the deadline by a plain thread, released in time") {
    Mutex m;
    std::atomic<bool> holding{false};
    std::thread holder([&] {
        m.lock();
        holding = true;
        std::this_thread::sleep_for(20ms);
        m.unlock();
    });
    while (!holding) std::this_thread::sleep_for(100us);
    const auto start = Clock::now();
    CHECK_FALSE(m.try_lock_for(1ms));
    CHECK(not_early(start, 1ms));
    CHECK(m.try_lock_for(20s));
    m.unlock();
    holder.join();
}

TEST_CASE("Mutex::try_lock_for under contention: never held by two, never lost") {
    FSCHED_FOR_EACH_CONFIG([](test::Config c) {
        Scheduler s(c.threads, c.use_caller);
        Mutex m;
        int inside = 0;      // under m
        long counter = 0;    // under m
        std::atomic<long> acquired{0}, timeouts{0};
        std::atomic<int> overlap{0};
        auto body = [&](std::uint64_t seed, int rounds, bool fiber) {
            Rng rng{seed};
            for (int i = 0; i < rounds; ++i) {
                const int kind = rng.below(4);
                bool got = true;
                if (kind == 0) {
                    m.lock();
                } else {
                    got = m.try_lock_for(std::chrono::microseconds(rng.below(kind == 3 ? 3000 : 100)));
                }
                if (!got) {
                    ++timeouts;
                    continue;
                }
                overlap += inside++ != 0;
                ++counter;
                ++acquired;
                // Holds now and then past 1 ms: waiters switch the mutex to hand-off, and
                // timeouts race the hand-offs.
                if (rng.below(16) == 0) {
                    const auto until = Clock::now() + std::chrono::microseconds(1200);
                    while (Clock::now() < until) {
                        if (fiber) fsched::this_fiber::yield();
                    }
                } else if (fiber && rng.below(2) == 0) {
                    fsched::this_fiber::yield();
                }
                --inside;
                m.unlock();
            }
        };
        s.start();
        for (int f = 0; f < 8; ++f) s.schedule([&, f] { body(100u + static_cast<unsigned>(f), 40 * scale, true); });
        std::atomic<bool> plain_done{false};
        std::thread plain([&] {
            body(7, 20 * scale, false);
            plain_done = true;
        });
        body(9, 20 * scale, false);  // the use_caller thread or a plain one
        CHECK(eventually([&] { return plain_done.load(); }));  // (running tasks meanwhile)
        plain.join();
        s.stop();
        CHECK(overlap == 0);
        CHECK(counter == acquired.load());
        CHECK(acquired.load() + timeouts.load() == 8 * 40 * scale + 2 * 20 * scale);
        // Not lost: free, and a plain lock and unlock still work (no stale waiter count).
        CHECK(m.try_lock());
        m.unlock();
        std::thread t([&] {
            m.lock();
            m.unlock();
        });
        t.join();
        CHECK(m.try_lock());
        m.unlock();
    });
}

TEST_CASE("Mutex::try_lock_for: timed-out waiters leave the mutex usable, hand-off mode included") {
    // A plain thread holds the lock 1.1 ms at a time and relocks at once: a woken waiter
    // loses the race, queues again and, past 1 ms, turns the mutex to hand-off; the timed
    // waiters time out (or get it handed over) around those hand-offs. Afterwards the mutex
    // must be free and not left in hand-off mode with no one to hand it to.
    Scheduler s(2, false);
    Mutex m;
    std::atomic<int> tries{0}, got{0};
    s.start();
    for (int round = 0; round < 10; ++round) {
        const int before = tries.load();
        std::atomic<bool> stop{false};
        std::thread holder([&] {
            while (!stop) {
                std::lock_guard<Mutex> lock(m);
                const auto until = Clock::now() + std::chrono::microseconds(1100);
                while (Clock::now() < until) {
                }
            }
        });
        for (int f = 0; f < 3; ++f) {
            s.schedule([&, f] {
                for (int i = 0; i < 4; ++i) {
                    if (m.try_lock_for(std::chrono::microseconds(500 + 700 * ((f + i) % 4)))) {
                        ++got;
                        m.unlock();
                    }
                    ++tries;
                }
            });
        }
        CHECK(eventually([&] { return tries.load() == before + 12; }));
        stop = true;
        holder.join();
        CHECK(m.try_lock());  // free, and not left starving
        m.unlock();
    }
    s.stop();
    MESSAGE("timed acquires that succeeded: " << got.load() << " of " << tries.load());
}

TEST_CASE("Mutex::try_lock_until: misuse is loud") {
    FSCHED_CHECK_ABORTS_WITH([] {
        Mutex m;
        m.lock();
        (void)m.try_lock_for(1ms);
    }, "Mutex::try_lock_until(): the caller already holds this mutex (it is not recursive)");
}

// ---- Faults: a timed wait that cannot allocate ---------------------------------------------

#if defined(FIBER_SCHED_FAULT_INJECTION)
TEST_CASE("timed waits that cannot allocate throw and leave nothing behind") {
    using fsched::detail::FaultSite;
    Scheduler s(2, false, "no-wait-extra");
    Semaphore sem(0);
    Event ev;
    Mutex m;
    SharedMutex sm;
    ConditionVariableAny cv;
    std::atomic<int> threw{0};
    std::atomic<bool> later_sem{false}, later_event{false}, later_mutex{false}, cv_lock_held{false};
    std::atomic<bool> attempted{false};
    s.start();
    m.lock();
    s.schedule([&] {
        {
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                (void)sem.try_acquire_for(10s);
            } catch (const std::bad_alloc&) {
                ++threw;
            }
        }
        {
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                (void)ev.wait_for(10s);
            } catch (const std::bad_alloc&) {
                ++threw;
            }
        }
        {
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                (void)m.try_lock_for(10s);
            } catch (const std::bad_alloc&) {
                ++threw;
            }
        }
        {
            std::unique_lock<SharedMutex> lock(sm);
            test::Fault fault(FaultSite::WaitAlloc, 1);
            try {
                (void)cv.wait_for(lock, 10s);
            } catch (const std::bad_alloc&) {
                ++threw;
                cv_lock_held = lock.owns_lock();
            }
        }
        attempted = true;
        // A stale waiter would swallow these.
        later_sem = sem.try_acquire_for(20s);
        later_event = ev.wait_for(20s);
        later_mutex = m.try_lock_for(20s);
        if (later_mutex) m.unlock();
    });
    REQUIRE(eventually([&] { return attempted.load(); }));
    sem.release();
    ev.signal();
    m.unlock();
    s.stop();
    CHECK(threw == 4);
    CHECK(cv_lock_held);
    CHECK(later_sem);
    CHECK(later_event);
    CHECK(later_mutex);
    CHECK_FALSE(sem.try_acquire());
}
#endif

// ---- No allocation per operation -----------------------------------------------------------

TEST_CASE("no heap allocation per blocking operation") {
    Scheduler s(2, false);
    constexpr int rounds = 2000;
    Semaphore ping(0), pong(0);
    Event ev_ping, ev_pong;
    Barrier barrier(2);
    SharedMutex sm;
    ConditionVariableAny cv;
    Mutex m;
    int turn = 0;  // under m
    Latch start_line(1);
    std::atomic<int> finished{0};
    s.start();
    // Warm up: the workers' queues, stacks and the fibers themselves are made here.
    Latch warmed(2);
    auto a = [&] {
        warmed.count_down();
        start_line.wait();
        for (int i = 0; i < rounds; ++i) {
            ping.release();
            pong.acquire();
            ev_ping.signal();
            ev_pong.wait();
            barrier.arrive_and_wait();
            {
                std::unique_lock<SharedMutex> lock(sm);
                fsched::this_fiber::yield();
            }
            std::unique_lock<Mutex> lock(m);
            turn = 1;
            cv.notify_one();
            cv.wait(lock, [&] { return turn == 0; });
        }
        ++finished;
    };
    auto b = [&] {
        warmed.count_down();
        start_line.wait();
        for (int i = 0; i < rounds; ++i) {
            ping.acquire();
            pong.release();
            ev_ping.wait();
            ev_pong.signal();
            barrier.arrive_and_wait();
            {
                std::shared_lock<SharedMutex> lock(sm);
                fsched::this_fiber::yield();
            }
            std::unique_lock<Mutex> lock(m);
            cv.wait(lock, [&] { return turn == 1; });
            turn = 0;
            cv.notify_one();
        }
        ++finished;
    };
    s.schedule(a);
    s.schedule(b);
    warmed.wait();
    std::this_thread::sleep_for(10ms);
    allocations = 0;
    counting_allocations = true;
    start_line.count_down();
    const bool done = eventually([&] { return finished.load() == 2; });
    counting_allocations = false;
    const long counted = allocations.load();
    // The counter does see allocations: scheduling a task and a timed wait in it allocate.
    std::atomic<bool> timed_done{false};
    allocations = 0;
    counting_allocations = true;
    s.schedule([&] {
        (void)ping.try_acquire_for(1ms);
        timed_done = true;
    });
    CHECK(eventually([&] { return timed_done.load(); }));
    counting_allocations = false;
    CHECK(allocations.load() >= 1);
    allocations = counted;
    s.stop();
    CHECK(done);
    // Thousands of parks, each on a stack-allocated Waiter: a few allocations at most (a
    // queue growing, the watch thread's first look), never one per operation.
    MESSAGE("allocations during " << rounds << " rounds of 14 blocking operations: " << allocations.load());
    CHECK(allocations.load() < rounds / 10);
}

// ---- The report ----------------------------------------------------------------------------

TEST_CASE("report: each new wait is named, with what it holds") {
    Scheduler s(2, false, "toolbox");
    s.start();
    Semaphore sem(0);
    Latch latch(2);
    Barrier barrier(3);
    SharedMutex held, held_shared;
    Event event(Event::Mode::Manual);
    ConditionVariableAny cv;
    Mutex cv_mutex, timed;
    std::atomic<std::uint64_t> sem_id{0}, latch_id{0}, barrier_id{0}, writer_id{0}, reader_id{0}, event_id{0},
        cv_id{0}, timed_id{0};
    std::atomic<bool> cv_go{false};
    held.lock_shared();   // a writer waits
    held_shared.lock();   // a reader waits
    timed.lock();
    s.schedule([&] { sem_id = fsched::this_fiber::id(); sem.acquire(); });
    s.schedule([&] { latch_id = fsched::this_fiber::id(); latch.arrive_and_wait(); });
    s.schedule([&] { barrier_id = fsched::this_fiber::id(); barrier.arrive_and_wait(); });
    s.schedule([&] { writer_id = fsched::this_fiber::id(); held.lock(); held.unlock(); });
    s.schedule([&] { reader_id = fsched::this_fiber::id(); held_shared.lock_shared(); held_shared.unlock_shared(); });
    s.schedule([&] { event_id = fsched::this_fiber::id(); event.wait(); });
    s.schedule([&] {
        cv_id = fsched::this_fiber::id();
        std::unique_lock<Mutex> lock(cv_mutex);
        cv.wait(lock, [&] { return cv_go.load(); });
    });
    s.schedule([&] {
        timed_id = fsched::this_fiber::id();
        if (timed.try_lock_for(60s)) timed.unlock();
    });
    auto all_parked = [&](const std::string& r) {
        for (auto* id : {&sem_id, &latch_id, &barrier_id, &writer_id, &reader_id, &event_id, &cv_id, &timed_id}) {
            if (id->load() == 0 || !contains(report_line(r, id->load()), ": parked ")) return false;
        }
        return true;
    };
    std::string report;
    for (int i = 0; i < 4000 && !all_parked(report); ++i) {
        report = fsched::fiber_report();
        if (!all_parked(report)) std::this_thread::sleep_for(5ms);
    }
    INFO(report);
    REQUIRE(all_parked(report));
    CHECK(contains(report_line(report, sem_id), " on Semaphore 0x"));
    CHECK(contains(report_line(report, sem_id), "count 0, 1 waiting"));
    CHECK(contains(report_line(report, latch_id), " on Latch 0x"));
    CHECK(contains(report_line(report, latch_id), "count 1"));
    CHECK(contains(report_line(report, barrier_id), " on Barrier 0x"));
    CHECK(contains(report_line(report, barrier_id), "phase 0, 1 of 3 arrived"));
    CHECK(contains(report_line(report, writer_id), " on SharedMutex 0x"));
    CHECK(contains(report_line(report, writer_id), "1 readers, 1 writers and 0 readers waiting"));
    CHECK(contains(report_line(report, reader_id), " on SharedMutex shared 0x"));
    CHECK(contains(report_line(report, reader_id), "held exclusively"));
    CHECK(contains(report_line(report, event_id), " on Event 0x"));
    CHECK(contains(report_line(report, event_id), "manual, clear, 1 waiting"));
    CHECK(contains(report_line(report, cv_id), " on ConditionVariableAny 0x"));
    CHECK(contains(report_line(report, timed_id), " on Mutex 0x"));
    sem.release();
    latch.count_down();
    barrier.arrive_and_drop();
    barrier.arrive_and_drop();
    held.unlock_shared();
    held_shared.unlock();
    event.signal();
    {
        std::lock_guard<Mutex> lock(cv_mutex);
        cv_go = true;
    }
    cv.notify_all();
    timed.unlock();
    s.stop();
}

TEST_CASE("timed waits until a far past or far future time of another clock neither overflow nor hang") {
    using std::chrono::system_clock;
    using Hours = std::chrono::time_point<system_clock, std::chrono::hours>;
    auto body = [] {
        // Far past: each gives up at once (it used to wrap into a far-future deadline).
        Mutex m;
        std::atomic<bool> held{false}, release{false};
        std::thread holder([&] {
            m.lock();
            held = true;
            while (!release) std::this_thread::sleep_for(1ms);
            m.unlock();
        });
        while (!held) std::this_thread::sleep_for(1ms);
        const auto start = Clock::now();
        CHECK(!m.try_lock_until((system_clock::time_point::min)()));
        CHECK(!m.try_lock_until((Hours::min)()));
        Semaphore none(0);
        CHECK(!none.try_acquire_until((system_clock::time_point::min)()));
        Event event;
        CHECK(!event.wait_until((system_clock::time_point::min)()));
        fsched::Channel<int> empty(1);
        CHECK(!empty.receive_until((system_clock::time_point::min)()).has_value());
        CHECK(Clock::now() - start < 10s);  // at once, with any load's margin
        release = true;
        holder.join();
        // Far future: a wait that is satisfied returns true, without a timer going off.
        Semaphore one(0);
        std::thread releaser([&] {
            for (int i = 0; i < 2; ++i) {
                std::this_thread::sleep_for(2ms);
                one.release();
            }
        });
        CHECK(one.try_acquire_until((system_clock::time_point::max)()));
        CHECK(one.try_acquire_until((Hours::max)()));
        releaser.join();
    };
    on_a_thread_and_in_a_task(body);
}

TEST_CASE("timed waits until a steady_clock time of a coarser or floating duration near its max() block") {
    using std::chrono::steady_clock;
    using Seconds = std::chrono::time_point<steady_clock, std::chrono::seconds>;
    using Micros = std::chrono::time_point<steady_clock, std::chrono::microseconds>;
    using Floating = std::chrono::time_point<steady_clock, std::chrono::duration<double>>;
    auto body = [] {
        // Each is "no deadline": it returns true once released (it used to overflow into the
        // past and return false at once).
        Semaphore sem(0);
        Event event;
        std::thread releaser([&] {
            std::this_thread::sleep_for(20ms);
            sem.release(2);
            event.signal();
        });
        CHECK(sem.try_acquire_until((Seconds::max)()));
        CHECK(sem.try_acquire_until((Floating::max)()));
        CHECK(event.wait_until((Micros::max)()));
        releaser.join();
        // A floating time is rounded up, never early.
        Semaphore none(0);
        const auto start = steady_clock::now();
        const Floating soon = Floating(std::chrono::duration<double>(start.time_since_epoch()) +
                                       std::chrono::duration<double>(0.0300000001));
        CHECK(!none.try_acquire_until(soon));
        CHECK(steady_clock::now() >= soon);
    };
    on_a_thread_and_in_a_task(body);
}

TEST_CASE("destroying a primitive that a thread or fiber still waits on is a FIBER_SCHED_ASSERT") {
    // The waiter (a plain thread, parked for good) lives on; the primitive goes away under it.
    auto destroyed_under = [](auto make, auto wait) {
        auto* primitive = make();
        std::atomic<bool> started{false};
        std::thread([&] {
            started = true;
            wait(*primitive);
        }).detach();
        while (!started) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);  // it waits now
        delete primitive;
    };
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new Semaphore(0); }, [](Semaphore& p) { p.acquire(); });
    }, "~Semaphore(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new Latch(1); }, [](Latch& p) { p.wait(); });
    }, "~Latch(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new Barrier(2); }, [](Barrier& p) { p.arrive_and_wait(); });
    }, "~Barrier(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new Event(); }, [](Event& p) { p.wait(); });
    }, "~Event(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        static Mutex m;
        destroyed_under([] { return new ConditionVariableAny(); }, [](ConditionVariableAny& p) {
            std::unique_lock<Mutex> lock(m);
            p.wait(lock);
        });
    }, "~ConditionVariableAny(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        static Mutex m;
        destroyed_under([] { return new fsched::ConditionVariable(); }, [](fsched::ConditionVariable& p) {
            std::unique_lock<Mutex> lock(m);
            p.wait(lock);
        });
    }, "~ConditionVariable(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new fsched::WaitGroup(1); }, [](fsched::WaitGroup& p) { p.wait(); });
    }, "~WaitGroup(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new fsched::Channel<int>(); }, [](fsched::Channel<int>& p) { p.receive(); });
    }, "~Channel(): fibers or threads still wait on it");
    FSCHED_CHECK_ABORTS_WITH([&] {
        destroyed_under([] { return new fsched::Channel<int>(); }, [](fsched::Channel<int>& p) { p.send(1); });
    }, "~Channel(): fibers or threads still wait on it");
    // A fiber waiting, in a scheduler: the same.
    FSCHED_CHECK_ABORTS_WITH([] {
        Scheduler s(1, false);
        s.start();
        auto* sem = new Semaphore(0);
        std::atomic<bool> started{false};
        s.schedule([&] {
            started = true;
            sem->acquire();
        });
        while (!started) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);
        delete sem;
    }, "~Semaphore(): fibers or threads still wait on it");
    // Released, then destroyed at once by the last user: fine (the releaser has let go).
    for (int i = 0; i < 200; ++i) {
        auto* sem = new Semaphore(0);
        std::thread waiter([sem] { sem->acquire(); });
        sem->release();
        waiter.join();
        delete sem;
    }
}
