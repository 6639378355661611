// A seeded, randomised soak test of the whole public API at once: spawning from tasks and
// from plain threads (callbacks, Fiber::ptr, batches; pinned and not), this_fiber::yield and
// sleep_for, suspend-and-put with Fiber::yield, Mutex, ConditionVariable with timed waits,
// WaitGroup, Channel<T> at capacities 0, 1 and N with close, select() over two channels
// with a timeout, exceptions, testing::simulate() on a plain thread, fsched::io over
// socketpairs with timeouts and cancel, and stop() while outside threads still feed the
// scheduler; at 1, 2, 4 and 8 workers, with and without use_caller (with 2, the workers spin
// to their timers: SchedulerOptions::timer_spin). At the end: every task ran exactly once,
// every message a send accepted was received exactly once (and no other), mutex-guarded
// counters are exact, and no fiber stack and no fd is left over.
//
// Choices are deterministic given the seed: each task draws from its own PRNG, seeded from
// the seed and the task's key (derived from its parent's key), and draws before it looks at
// any outcome. The interleaving is not deterministic. Each run is a fixed number of
// operations, and every wait has a timeout or is certain to be satisfied (channels are
// closed once all work is done; receivers count until nullopt), so the test stops by itself.
//
// A short run by default. A long run, or a replay of one seed:
//   FIBER_SCHED_SOAK_OPS=10000000 FIBER_SCHED_SOAK_SEED=42 fiber_sched_tests.asm-O2 -tc='*soak*'
// FIBER_SCHED_SOAK_OPS is shared out evenly over the eight configurations; add
// -sc='4 workers, use_caller' to run one of them.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#if !defined(_WIN32)
#include <sys/socket.h>
#include <sys/wait.h>
#endif
#if defined(FIBER_SCHED_HAVE_EPOLL)
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/un.h>
#endif
#include <unistd.h>

using fsched::Fiber;
using fsched::Scheduler;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

#if defined(FIBER_SCHED_TSAN)
constexpr std::uint64_t short_run_ops = 1000;  // per configuration
#else
constexpr std::uint64_t short_run_ops = 4000;
#endif
// fork() from the soak's tasks and threads: not under TSan (no threads in a child of a
// threaded process), qemu-user, nor an AddressSanitizer that takes none of its locks across
// fork() (helpers.hpp); never on Windows.
#if defined(_WIN32) || defined(FIBER_SCHED_TSAN) || defined(FIBER_SCHED_TEST_EMULATED) || \
    defined(FSCHED_TEST_ASAN_UNSAFE_FORK)
constexpr bool soak_forks = false;
#else
constexpr bool soak_forks = true;
#endif
constexpr unsigned lane_count = 8;      // chains of work tasks started by the main thread
constexpr unsigned outsider_count = 2;  // plain threads that work alongside the scheduler
// A wait that is certain to be satisfied gets this as its timeout: reaching it is a failure.
constexpr auto must_not_take = 10s;

// splitmix64: tiny, good from any seed (consecutive ones included), and the same on every
// platform, unlike the std:: distributions.
class Rng {
public:
    explicit Rng(std::uint64_t seed) noexcept : state_(seed) {}
    std::uint64_t next() noexcept {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform enough in [0, n); n > 0.
    std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }
    bool percent(unsigned p) noexcept { return below(100) < p; }

private:
    std::uint64_t state_;
};

std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept { return Rng(a ^ Rng(b).next()).next(); }

// What went wrong, by kind, from any thread or fiber; the main thread reports it at the end
// (doctest's assertions are not made for eight workers at once).
class Violations {
public:
    struct Entry {
        std::uint64_t count = 0;
        std::string example;  // the first one seen
    };
    void add(const std::string& kind, const std::string& example = {}) {
        std::lock_guard<std::mutex> lock(mutex_);
        Entry& entry = kinds_[kind];
        if (entry.count++ == 0) entry.example = example;
    }
    std::map<std::string, Entry> snapshot() {
        std::lock_guard<std::mutex> lock(mutex_);
        return kinds_;
    }

private:
    std::mutex mutex_;
    std::map<std::string, Entry> kinds_;
};

// Two event counts per id ("sent" / "received", "delivered" / "verified"), in one atomic
// word each. Ids are dense; the ledger is sized so that it cannot run out. Relaxed: it is
// read only after stop() and the joins, which order everything before them.
class Ledger {
public:
    explicit Ledger(std::size_t capacity) : marks_(capacity) {
        for (auto& m : marks_) m.store(0, std::memory_order_relaxed);
    }
    std::uint64_t issue() noexcept { return next_.fetch_add(1, std::memory_order_relaxed); }
    void first(std::uint64_t id) noexcept { add(id, 1); }
    void second(std::uint64_t id) noexcept { add(id, 1u << 16); }
    std::uint64_t issued() const noexcept { return next_.load(std::memory_order_relaxed); }
    bool overflowed() const noexcept { return issued() > marks_.size(); }
    std::uint32_t firsts(std::uint64_t id) const noexcept { return word(id) & 0xffffu; }
    std::uint32_t seconds(std::uint64_t id) const noexcept { return word(id) >> 16; }

private:
    void add(std::uint64_t id, std::uint32_t unit) noexcept {
        if (id < marks_.size()) marks_[id].fetch_add(unit, std::memory_order_relaxed);
    }
    std::uint32_t word(std::uint64_t id) const noexcept {
        return id < marks_.size() ? marks_[id].load(std::memory_order_relaxed) : 0;
    }
    std::vector<std::atomic<std::uint32_t>> marks_;
    std::atomic<std::uint64_t> next_{0};
};

struct Message {
    std::uint64_t id = 0;
    std::uint64_t channel = 0;  // the tag of the channel it was sent on
    std::string payload;        // empty, or payload_for(id): a heap block that moves with it
};

std::string payload_for(std::uint64_t id) {
    std::string s(24 + id % 40, ' ');
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>('a' + (id * 7 + i) % 26);
    return s;
}

// A channel and what went through it: sends that returned true, and what receivers got.
struct CountedChannel {
    CountedChannel(std::size_t capacity, std::uint64_t tag_) : channel(capacity), tag(tag_) {}
    fsched::Channel<Message> channel;
    const std::uint64_t tag;
    std::atomic<std::uint64_t> sent{0}, refused{0}, received{0}, sent_sum{0}, received_sum{0};
};

// A short-lived channel with its own producers and consumers (the pipeline operation).
struct Pipe {
    Pipe(std::size_t capacity, std::uint64_t tag) : line(capacity, tag) {}
    CountedChannel line;
    fsched::WaitGroup producers;
    fsched::WaitGroup everyone;  // producers and consumers
};

struct Guarded {
    fsched::Mutex mutex;
    std::int64_t value = 0;  // under mutex; deliberately not atomic
};

// Tokens handed from producers to consumers that wait with a timeout.
struct Bank {
    fsched::Mutex mutex;
    fsched::ConditionVariable cv;
    std::int64_t tokens = 0, produced = 0, consumed = 0;  // under mutex
};

// Two parties taking turns through a condition variable.
struct PingPong {
    explicit PingPong(unsigned r) : rounds(r) {}
    fsched::Mutex mutex;
    fsched::ConditionVariable cv;
    int turn = 0;         // under mutex
    bool failed = false;  // under mutex
    const unsigned rounds;
    fsched::WaitGroup partner_done{1};
};

using test::Mailbox;

struct Thrown {
    std::uint64_t id;
};
struct CaughtHere {
    std::uint64_t id;
};

// Who runs operations: a work task (in a fiber) or an outside thread. Its PRNG is seeded
// from the run's seed and its key; its children's keys derive from its key and their number.
struct Actor {
    Actor(std::uint64_t seed, std::uint64_t key_, int pin_, bool in_fiber_)
        : rng(mix(seed, key_)), key(key_), pin(pin_), in_fiber(in_fiber_) {}
    Rng rng;
    const std::uint64_t key;
    int pin;  // the worker it must run on, -1: any (or not known)
    const bool in_fiber;
    std::uint64_t children = 0;
    std::uint64_t delegated = 0;  // operations handed to children, out of its own budget
    std::uint64_t child_key() noexcept { return mix(key, ++children); }
};

enum class Op {
    yield, sleep, spin, spawn, spawn_batch, fan_out, suspend, put_back,
    lock, try_lock, transfer, cv_produce, cv_consume, cv_wait, ping_pong,
    send, extra_consumer, select_channels, pipeline, throw_from_task, catch_across_yield, weak_ref, fork_child, report,
    future_parallel,
    io_echo, io_bulk, io_timeout, io_cancel, io_cancel_race, io_pinned_fresh,
    io_cancel_close, io_low_water, io_full_backlog, toolbox, fiber_local, simulation,
};

struct OpWeight {
    Op op;
    unsigned weight;
};

constexpr OpWeight op_weights[] = {
    {Op::yield, 10}, {Op::sleep, 5}, {Op::spin, 4}, {Op::spawn, 10}, {Op::spawn_batch, 2},
    {Op::fan_out, 3}, {Op::suspend, 3}, {Op::put_back, 3}, {Op::lock, 10}, {Op::try_lock, 3},
    {Op::transfer, 4}, {Op::cv_produce, 5}, {Op::cv_consume, 4}, {Op::cv_wait, 1}, {Op::ping_pong, 2},
    {Op::send, 10}, {Op::extra_consumer, 1}, {Op::select_channels, 3}, {Op::pipeline, 3}, {Op::throw_from_task, 1},
    {Op::catch_across_yield, 1}, {Op::weak_ref, 2}, {Op::fork_child, soak_forks ? 1u : 0u}, {Op::report, 1},
    {Op::toolbox, 2},
    {Op::future_parallel, 2}, {Op::fiber_local, 2}, {Op::simulation, 1},
#if defined(FIBER_SCHED_HAVE_EPOLL)
    {Op::io_echo, 2}, {Op::io_bulk, 1}, {Op::io_timeout, 1}, {Op::io_cancel, 1}, {Op::io_cancel_race, 1},
    {Op::io_pinned_fresh, 1}, {Op::io_cancel_close, 1}, {Op::io_low_water, 1}, {Op::io_full_backlog, 1},
#endif
};

constexpr unsigned total_weight() {
    unsigned sum = 0;
    for (const OpWeight& w : op_weights) sum += w.weight;
    return sum;
}

Op draw_op(Rng& rng) {
    unsigned pick = static_cast<unsigned>(rng.below(total_weight()));
    for (const OpWeight& w : op_weights) {
        if (pick < w.weight) return w.op;
        pick -= w.weight;
    }
    return Op::yield;
}

// The process's open fds (what the io waits and the schedulers' epoll and eventfds hold).
// 0 on Windows: no fds there, and under wine /proc/self/fd is wine's own (its threads').
std::size_t open_fd_count() {
    std::size_t n = 0;
#if defined(_WIN32)
    return n;
#endif
    if (DIR* dir = opendir("/proc/self/fd")) {
        while (dirent* entry = readdir(dir)) n += entry->d_name[0] != '.';
        closedir(dir);
    }
    return n;
}

#if defined(FIBER_SCHED_HAVE_EPOLL)
std::string errno_text(int error) { return std::to_string(error) + " (" + std::strerror(error) + ")"; }

bool open_socketpair(int fds[2]) {
    return socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0;
}

bool write_all(int fd, const char* data, std::size_t n) {
    while (n > 0) {
        const ssize_t w = fsched::io::write(fd, data, n, must_not_take);
        if (w <= 0) return false;
        data += w;
        n -= static_cast<std::size_t>(w);
    }
    return true;
}

// 1: read all `n` bytes; 0: EOF before the first; -1: an error, a timeout, or EOF midway.
int read_exactly(int fd, char* data, std::size_t n) {
    bool any = false;
    while (n > 0) {
        const ssize_t r = fsched::io::read(fd, data, n, must_not_take);
        if (r <= 0) return r == 0 && !any ? 0 : -1;
        any = true;
        data += r;
        n -= static_cast<std::size_t>(r);
    }
    return 1;
}

// An io frame: id, length, then `length` bytes of a pattern derived from the id.
std::vector<char> io_frame(std::uint32_t id, std::uint32_t length) {
    std::vector<char> frame(8 + length);
    std::memcpy(frame.data(), &id, 4);
    std::memcpy(frame.data() + 4, &length, 4);
    for (std::uint32_t i = 0; i < length; ++i) frame[8 + i] = static_cast<char>((id * 31 + i) & 0xff);
    return frame;
}

char bulk_byte(std::uint64_t i) { return static_cast<char>((i * 131 + (i >> 9)) & 0xff); }
#endif

// One run: a scheduler, the shared objects every operation works on, and the books.
class Soak {
public:
    Soak(Scheduler& scheduler, std::uint64_t seed, std::uint64_t ops)
        : scheduler_(scheduler), seed_(seed), ops_(ops), workers_(scheduler.thread_count()),
          tasks_(4 * ops + 4096), messages_(ops + 1024), io_messages_(ops + 1024), thrown_(ops + 1024) {
        // Capacities 0, 1 and N, each with consumers that receive until it is closed.
        const std::size_t capacities[] = {0, 1, 0, 1, 16};
        for (std::size_t i = 0; i < std::size(capacities); ++i) {
            channels_.push_back(std::make_unique<CountedChannel>(capacities[i], i));
        }
        for (Guarded& account : accounts_) account.value = initial_balance;
    }

    // Schedules the consumers, the closer and the lanes, and starts the outside threads.
    void begin() {
        Actor main_actor(seed_, 0x6d61696e, -1, false);
        // Right after start(), from the thread that started it (with use_caller, the caller).
        if (main_actor.rng.percent(50)) fork_child_op("the main thread right after start()");
        // Held until everything is scheduled, so the closer cannot see zero too early.
        live_work_.fetch_add(1);
        for (std::size_t c = 0; c < channels_.size(); ++c) {
            for (int k = 0; k < 2; ++k) spawn_helper(main_actor, [this, c] { consume(*channels_[c], ~0u); });
        }
        spawn_helper(main_actor, [this] { close_when_done(); });
        const std::uint64_t share = ops_ / (lane_count + outsider_count);
        for (unsigned i = 0; i < outsider_count; ++i) {
            const std::uint64_t budget = share;
            const std::uint64_t key = main_actor.child_key();
            live_work_.fetch_add(1);
            outsiders_.emplace_back([this, budget, key] { outsider(key, budget); });
        }
        std::vector<std::pair<std::uint32_t, std::uint64_t>> lanes;
        std::uint64_t left = ops_ - share * outsider_count;
        for (unsigned i = 0; i < lane_count; ++i) {
            const std::uint64_t lane = i + 1 == lane_count ? left : std::min(left, share);
            left -= lane;
            if (lane == 0) continue;
            const auto own = static_cast<std::uint32_t>(std::min<std::uint64_t>(lane, 16 + main_actor.rng.below(49)));
            lanes.emplace_back(own, lane - own);
        }
        // Half the lanes one by one, the other half as one batch.
        const std::size_t half = lanes.size() / 2;
        for (std::size_t i = 0; i < half; ++i) spawn_work(main_actor, lanes[i].first, lanes[i].second, nullptr);
        spawn_batch(main_actor, std::vector<std::pair<std::uint32_t, std::uint64_t>>(lanes.begin() + static_cast<std::ptrdiff_t>(half), lanes.end()));
        live_work_.fetch_sub(1);
    }

    void join_outsiders() {
        for (std::thread& t : outsiders_) t.join();
        outsiders_.clear();
    }

    void on_exception(std::exception_ptr error) {
        try {
            std::rethrow_exception(error);
        } catch (const Thrown& t) {
            thrown_.second(t.id);
        } catch (...) {
            violations_.add("an unexpected exception reached the exception handler");
        }
    }

    // The books, checked on the main thread once the scheduler has stopped.
    void check();

    std::uint64_t tasks_run() const { return tasks_.issued(); }
    std::uint64_t messages() const { return messages_.issued(); }
    std::uint64_t io_messages() const { return io_messages_.issued(); }
    std::uint64_t ops_done() const { return ops_done_.load(); }

private:
    static constexpr std::int64_t initial_balance = 1000;

    // ---- tasks ------------------------------------------------------------------------

    int draw_pin(Rng& rng) { return rng.percent(50) ? -1 : static_cast<int>(rng.below(workers_)); }

    // A work task: `own` operations itself, then `carry` more handed to a successor.
    std::function<void()> work_body(Actor& parent, std::uint32_t own, std::uint64_t carry, int pin,
                                    fsched::WaitGroup* done) {
        const std::uint64_t key = parent.child_key();
        const std::uint64_t slot = tasks_.issue();
        parent.delegated += own + carry;
        live_work_.fetch_add(1);
        return [this, key, own, carry, pin, done, slot] { work(key, own, carry, pin, done, slot); };
    }

    void work(std::uint64_t key, std::uint32_t own, std::uint64_t carry, int pin, fsched::WaitGroup* done,
              std::uint64_t slot) {
        tasks_.first(slot);
        Actor self(seed_, key, pin, true);
        check_placement(self.pin, self.in_fiber);
        std::uint64_t left = own;
        while (left > 0) {
            left -= run_op(self, left);
            check_placement(self.pin, self.in_fiber);
        }
        ops_done_.fetch_add(own - self.delegated);
        if (carry > 0) {
            const auto next = static_cast<std::uint32_t>(std::min<std::uint64_t>(carry, 16 + self.rng.below(49)));
            spawn_work(self, next, carry - next, nullptr);
        }
        if (done) done->done();
        live_work_.fetch_sub(1);
    }

    // Schedules a work task as a callback or a Fiber::ptr, pinned or not.
    void spawn_work(Actor& parent, std::uint32_t own, std::uint64_t carry, fsched::WaitGroup* done) {
        const bool as_fiber = parent.rng.percent(40);
        const int pin = draw_pin(parent.rng);
        const bool keep = as_fiber && parent.rng.percent(25);
        std::function<void()> body = work_body(parent, own, carry, pin, done);
        if (!as_fiber) {
            scheduler_.schedule(std::move(body), pin);
            return;
        }
        auto fiber = std::make_shared<Fiber>(std::move(body));
        if (keep) {
            std::lock_guard<std::mutex> lock(kept_mutex_);
            kept_.push_back(fiber);
        }
        scheduler_.schedule(std::move(fiber), pin);
    }

    // Schedules work tasks in one batch of ScheduleTask, mixed callbacks and fibers and pins.
    void spawn_batch(Actor& parent, const std::vector<std::pair<std::uint32_t, std::uint64_t>>& budgets) {
        std::vector<fsched::ScheduleTask> batch;
        for (const auto& b : budgets) {
            const bool as_fiber = parent.rng.percent(40);
            const int pin = draw_pin(parent.rng);
            fsched::ScheduleTask task;
            task.thread = pin;
            std::function<void()> body = work_body(parent, b.first, b.second, pin, nullptr);
            if (as_fiber) {
                task.fiber = std::make_shared<Fiber>(std::move(body));
            } else {
                task.cb = std::move(body);
            }
            batch.push_back(std::move(task));
        }
        scheduler_.schedule(batch.begin(), batch.end());
    }

    // Runs `waiter` here and `other` in a helper task, or the other way round, and returns
    // once both are done (`helper_done` starts at 1 and the helper's side counts it down).
    template <class Waiter, class Other>
    void run_as_pair(Actor& a, bool we_wait, Waiter waiter, Other other, fsched::WaitGroup& helper_done) {
        if (we_wait) {
            spawn_helper(a, [other, &helper_done] {
                other();
                helper_done.done();
            });
            waiter();
        } else {
            spawn_helper(a, [waiter, &helper_done] {
                waiter();
                helper_done.done();
            });
            other();
        }
        helper_done.wait();
    }

    // A helper task (a producer, a consumer, a server...): counted in the task ledger, not
    // in live work, since whoever spawns it waits for it (or it needs no waiting for).
    template <class Fn>
    void spawn_helper(Actor& parent, Fn fn) {
        const bool as_fiber = parent.rng.percent(30);
        const int pin = draw_pin(parent.rng);
        const std::uint64_t slot = tasks_.issue();
        std::function<void()> body = [this, slot, pin, fn = std::move(fn)]() mutable {
            tasks_.first(slot);
            check_placement(pin, true);
            fn();
        };
        if (as_fiber) {
            scheduler_.schedule(std::make_shared<Fiber>(std::move(body)), pin);
        } else {
            scheduler_.schedule(std::move(body), pin);
        }
    }

    // Where a task runs: on a worker of this scheduler, and on its pinned worker if it has one.
    void check_placement(int pin, bool in_fiber) {
        if (!in_fiber) {
            if (Scheduler::current() != nullptr || Fiber::current() != nullptr) {
                violations_.add("an outside thread looks like a scheduler worker");
            }
            return;
        }
        if (Scheduler::current() != &scheduler_) {
            violations_.add("Scheduler::current() is not the scheduler running the task");
            return;
        }
        const int w = Scheduler::worker_index();
        if (w < 0 || w >= static_cast<int>(workers_)) {
            violations_.add("Scheduler::worker_index() out of range", std::to_string(w));
        } else if (pin >= 0 && w != pin) {
            violations_.add("a pinned task ran on another worker",
                            "pinned to " + std::to_string(pin) + ", ran on " + std::to_string(w));
        }
    }

    // An outside thread: its share of operations, as a plain thread.
    void outsider(std::uint64_t key, std::uint64_t budget) {
        Actor self(seed_, key, -1, false);
        check_placement(self.pin, self.in_fiber);
        std::uint64_t left = budget;
        while (left > 0) left -= run_op(self, left);
        ops_done_.fetch_add(budget - self.delegated);
        live_work_.fetch_sub(1);
    }

    // Puts suspended fibers back until all work is done, then closes the shared channels.
    void close_when_done() {
        while (live_work_.load() > 0) {
            while (Fiber::ptr fiber = mailbox_.take()) {
                put_back_.fetch_add(1);
                scheduler_.schedule(std::move(fiber));
            }
            fsched::this_fiber::sleep_for(200us);
        }
        if (Fiber::ptr fiber = mailbox_.take()) {
            violations_.add("a fiber suspended itself after all work had finished");
            scheduler_.schedule(std::move(fiber));
        }
        for (auto& c : channels_) c->channel.close();
    }

    // ---- operations -------------------------------------------------------------------

    // Runs one operation drawn from the actor's PRNG; returns its cost, 1 .. budget.
    std::uint64_t run_op(Actor& a, std::uint64_t budget);

    void consume(CountedChannel& c, unsigned at_most) {
        for (unsigned i = 0; i < at_most; ++i) {
            std::optional<Message> m = c.channel.receive();
            if (!m) return;
            received(c, *m);
        }
    }

    void received(CountedChannel& c, const Message& m) {
        if (m.channel != c.tag) {
            violations_.add("a message arrived on another channel than it was sent on",
                            "sent on " + std::to_string(m.channel) + ", received on " + std::to_string(c.tag));
        }
        if (!m.payload.empty() && m.payload != payload_for(m.id)) {
            violations_.add("a message's payload changed on the way", "message " + std::to_string(m.id));
        }
        messages_.second(m.id);
        c.received.fetch_add(1);
        c.received_sum.fetch_add(m.id);
    }

    void send_one(CountedChannel& c, bool heavy) {
        Message m;
        m.id = messages_.issue();
        m.channel = c.tag;
        if (heavy) m.payload = payload_for(m.id);
        const std::uint64_t id = m.id;
        if (c.channel.send(std::move(m))) {
            messages_.first(id);
            c.sent.fetch_add(1);
            c.sent_sum.fetch_add(id);
        } else {
            c.refused.fetch_add(1);
        }
    }

    void timed(const char* what, Clock::time_point start, Clock::duration asked) {
        if (Clock::now() - start < asked) violations_.add(std::string(what) + " returned before its time");
    }

    void lock_op(Actor& a);
    void select_op(Actor& a);
    void transfer_op(Actor& a);
    void cv_consume_op(Actor& a);
    void play(PingPong& pp, int me);
    std::uint64_t pipeline_op(Actor& a, std::uint64_t budget);
    void suspend_op(Actor& a);
    void catch_across_yield_op(Actor& a);
    void weak_ref_op(Actor& a);
    void fork_child_op(const char* where);
    void toolbox_op(Actor& a);
    void toolbox_section(bool write);
#if defined(FIBER_SCHED_HAVE_EPOLL)
    void io_echo_op(Actor& a, unsigned count);
    void serve_echo(int fd);
    void io_bulk_op(Actor& a);
    void io_timeout_op(Actor& a);
    void io_cancel_op(Actor& a);
    void io_cancel_race_op(Actor& a);
    void io_pinned_fresh_op(Actor& a);
    void io_cancel_close_op(Actor& a);
    void io_low_water_op(Actor& a);
    void io_full_backlog_op(Actor& a);
    void expect_no_stale_cancel(const char* after);
#endif

    Scheduler& scheduler_;
    const std::uint64_t seed_;
    const std::uint64_t ops_;
    const std::size_t workers_;
    Violations violations_;
    fsched::FiberLocal<std::uint64_t> local_;  // each actor's fiber (or thread) keeps its own

    Ledger tasks_;        // first: the task started (ran)
    Ledger messages_;     // first: send() returned true; second: received
    Ledger io_messages_;  // first: the echo server got it; second: the client got it back intact
    Ledger thrown_;       // first: thrown out of a task; second: seen by the exception handler

    std::atomic<std::int64_t> live_work_{0};  // work tasks and outsiders not finished yet
    std::atomic<std::uint64_t> ops_done_{0};
    std::atomic<std::uint64_t> suspended_{0}, resumed_{0}, put_back_{0};
    std::atomic<std::uint64_t> pipe_tags_{1000};
    std::atomic<std::uint64_t> caught_ids_{0};
    std::atomic<std::uint64_t> timeouts_{0};  // timed waits that timed out, as they may

    std::vector<std::unique_ptr<CountedChannel>> channels_;
    std::array<Guarded, 4> counters_;
    std::array<std::atomic<std::int64_t>, 4> counter_expected_{};
    std::array<Guarded, 8> accounts_;
    Bank bank_;
    Mailbox mailbox_;
    std::mutex kept_mutex_;
    std::vector<Fiber::ptr> kept_;  // some Fiber::ptr tasks, to check they end Term
    // weak_ptrs to callbacks' fibers kept past their tasks (weak_ref_op), with the id of
    // the fiber each was taken from; under kept_mutex_.
    std::vector<std::pair<std::weak_ptr<Fiber>, std::uint64_t>> kept_weak_;
    std::vector<std::thread> outsiders_;
    // toolbox_op: at most two sections at once, each reading or writing a pair under a
    // SharedMutex (pair_a_ == pair_b_ for any reader; both == toolbox_writes_ at the end).
    fsched::Semaphore toolbox_units_{2};
    std::atomic<int> toolbox_inside_{0};
    fsched::SharedMutex toolbox_rw_;
    std::int64_t pair_a_ = 0, pair_b_ = 0;  // under toolbox_rw_
    std::atomic<std::int64_t> toolbox_writes_{0};
};

std::uint64_t Soak::run_op(Actor& a, std::uint64_t budget) {
    switch (draw_op(a.rng)) {
    case Op::fiber_local: {
        // A FiberLocal value survives a wait, on whatever worker the fiber resumes; a fresh
        // one (a new task's fiber) starts at zero.
        const std::uint64_t mine = a.key | 1;
        if (*local_ != 0 && *local_ != mine) violations_.add("a FiberLocal holds another fiber's value");
        *local_ = mine;
        if (a.rng.percent(50)) {
            fsched::this_fiber::yield();
        } else {
            fsched::this_fiber::sleep_for(microseconds(a.rng.below(100)));
        }
        if (*local_ != mine) violations_.add("a FiberLocal changed across a wait");
        return 1;
    }
    case Op::simulation: {
        // testing::simulate() on a plain thread beside the real schedulers: one seed, run
        // twice, is one schedule twice, and the run's own checks hold.
        const std::uint64_t seed = a.rng.next();
        std::uint64_t hashes[2] = {0, 0};
        bool ok[2] = {false, false};
        std::thread simulator([&] {
            for (int i = 0; i < 2; ++i) {
                const fsched::testing::SimulationResult r = fsched::testing::simulate(seed, [] {
                    fsched::Mutex m;
                    fsched::Channel<int> ch(1);
                    fsched::WaitGroup wg;
                    int sum = 0;
                    for (int k = 0; k < 3; ++k) {
                        wg.add(1);
                        Scheduler::current()->schedule([&, k] {
                            ch.send(k);
                            fsched::this_fiber::sleep_for(std::chrono::milliseconds(k));
                            const int got = *ch.receive();
                            std::lock_guard<fsched::Mutex> lock(m);
                            sum += got;
                            wg.done();
                        });
                    }
                    wg.wait();
                    if (sum != 3) throw std::logic_error("a value was lost or doubled");
                }, 2);
                hashes[i] = r.trace_hash;
                ok[i] = !r.failed();
            }
        });
        simulator.join();
        if (!ok[0] || !ok[1]) violations_.add("a simulation beside the schedulers failed");
        if (hashes[0] != hashes[1]) violations_.add("one simulation seed gave two schedules");
        return 1;
    }
    case Op::yield: {
        const auto n = 1 + a.rng.below(3);
        for (std::uint64_t i = 0; i < n; ++i) fsched::this_fiber::yield();
        return 1;
    }
    case Op::sleep: {
        const microseconds d(a.rng.below(200));
        const auto start = Clock::now();
        fsched::this_fiber::sleep_for(d);
        timed("this_fiber::sleep_for", start, d);
        return 1;
    }
    case Op::spin: {
        const auto n = 50 + a.rng.below(500);
        volatile std::uint64_t sink = 0;
        for (std::uint64_t i = 0; i < n; ++i) sink = sink + i;
        return 1;
    }
    case Op::spawn: {
        if (budget < 2) break;
        const auto own = static_cast<std::uint32_t>(1 + a.rng.below(std::min<std::uint64_t>(budget - 1, 12)));
        spawn_work(a, own, 0, nullptr);
        return own + 1;
    }
    case Op::spawn_batch: {
        const std::uint64_t n = 2 + a.rng.below(3);
        if (budget < n + 1) break;
        std::vector<std::pair<std::uint32_t, std::uint64_t>> budgets;
        std::uint64_t cost = 1;
        for (std::uint64_t i = 0; i < n; ++i) {
            const auto own = static_cast<std::uint32_t>(1 + a.rng.below(std::min<std::uint64_t>((budget - 1) / n, 6)));
            budgets.emplace_back(own, 0);
            cost += own;
        }
        spawn_batch(a, budgets);
        return cost;
    }
    case Op::fan_out: {
        // Go's pattern: add, spawn, wait for done() from each child.
        const std::uint64_t n = 2 + a.rng.below(3);
        if (budget < n + 1) break;
        const bool add_each = a.rng.percent(50);
        fsched::WaitGroup group;
        if (!add_each) group.add(static_cast<std::int64_t>(n));
        std::uint64_t cost = 1;
        for (std::uint64_t i = 0; i < n; ++i) {
            const auto own = static_cast<std::uint32_t>(1 + a.rng.below(std::min<std::uint64_t>((budget - 1) / n, 8)));
            if (add_each) group.add();
            spawn_work(a, own, 0, &group);
            cost += own;
        }
        group.wait();
        return cost;
    }
    case Op::suspend:
        suspend_op(a);
        return 1;
    case Op::put_back: {
        const int pin = draw_pin(a.rng);
        if (Fiber::ptr fiber = mailbox_.take()) {
            put_back_.fetch_add(1);
            scheduler_.schedule(std::move(fiber), pin);
        }
        return 1;
    }
    case Op::lock:
        lock_op(a);
        return 1;
    case Op::try_lock: {
        const auto i = a.rng.below(counters_.size());
        Guarded& g = counters_[i];
        if (g.mutex.try_lock()) {
            g.value = g.value + 1;
            g.mutex.unlock();
            counter_expected_[i].fetch_add(1);
        }
        return 1;
    }
    case Op::transfer:
        transfer_op(a);
        return 1;
    case Op::cv_produce: {
        const bool all = a.rng.percent(30);
        {
            std::lock_guard<fsched::Mutex> lock(bank_.mutex);
            ++bank_.tokens;
            ++bank_.produced;
        }
        if (all) {
            bank_.cv.notify_all();
        } else {
            bank_.cv.notify_one();
        }
        return 1;
    }
    case Op::cv_consume:
        cv_consume_op(a);
        return 1;
    case Op::cv_wait: {
        // No predicate: a notify, a spurious wake or the timeout; only lateness is wrong.
        const microseconds d(10 + a.rng.below(500));
        std::unique_lock<fsched::Mutex> lock(bank_.mutex);
        const auto start = Clock::now();
        if (bank_.cv.wait_for(lock, d) == std::cv_status::timeout) {
            timeouts_.fetch_add(1);
            timed("ConditionVariable::wait_for (timeout)", start, d);
        }
        return 1;
    }
    case Op::ping_pong: {
        if (budget < 2) break;
        const auto rounds = static_cast<unsigned>(1 + a.rng.below(std::min<std::uint64_t>(budget - 1, 8)));
        auto pp = std::make_shared<PingPong>(rounds);
        spawn_helper(a, [this, pp] {
            play(*pp, 1);
            pp->partner_done.done();
        });
        play(*pp, 0);
        pp->partner_done.wait();
        return rounds + 1;
    }
    case Op::send: {
        CountedChannel& c = *channels_[a.rng.below(channels_.size())];
        send_one(c, a.rng.percent(30));
        return 1;
    }
    case Op::extra_consumer: {
        CountedChannel& c = *channels_[a.rng.below(channels_.size())];
        const unsigned at_most = a.rng.percent(50) ? ~0u : static_cast<unsigned>(1 + a.rng.below(8));
        spawn_helper(a, [this, &c, at_most] { consume(c, at_most); });
        return 1;
    }
    case Op::select_channels:
        select_op(a);
        return 1;
    case Op::pipeline:
        if (budget < 3) break;
        return pipeline_op(a, budget);
    case Op::future_parallel: {
        // async() a small parallel_for (nested in that task), get() its sum here; sometimes
        // fn throws at one index and get() must rethrow exactly that.
        const std::size_t n = static_cast<std::size_t>(a.rng.below(48));
        const std::size_t grain = static_cast<std::size_t>(a.rng.below(6));
        const bool throws = n > 0 && a.rng.percent(20);
        const std::size_t bad = throws ? static_cast<std::size_t>(a.rng.below(n)) : n;
        fsched::Future<std::uint64_t> f = fsched::async(scheduler_, [this, n, grain, bad] {
            std::atomic<std::uint64_t> sum{0};
            fsched::parallel_for(scheduler_, 0, n, grain, [&](std::size_t i) {
                if (i == bad) throw Thrown{i};
                sum.fetch_add(i + 1);
            });
            return sum.load();
        });
        try {
            const std::uint64_t sum = f.get();
            if (throws || sum != static_cast<std::uint64_t>(n) * (n + 1) / 2) {
                violations_.add("async + parallel_for: a wrong result", std::to_string(sum));
            }
        } catch (const Thrown& t) {
            if (!throws || t.id != bad) violations_.add("async + parallel_for: a wrong exception");
        }
        if (f.valid()) violations_.add("a Future is still valid after get()");
        return 1;
    }
    case Op::throw_from_task:
        spawn_helper(a, [this] {
            const std::uint64_t id = thrown_.issue();
            thrown_.first(id);
            throw Thrown{id};
        });
        return 1;
    case Op::catch_across_yield:
        catch_across_yield_op(a);
        return 1;
    case Op::weak_ref:
        weak_ref_op(a);
        return 1;
    case Op::fork_child:
        fork_child_op(a.in_fiber ? "a task" : "a plain thread");
        return 1;
    case Op::toolbox:
        if (budget < 2) break;
        toolbox_op(a);
        return 2;
    case Op::report: {
        // fiber_report() from a task or a plain thread while every other operation runs:
        // it reads parked fibers that others wake and fibers that others destroy.
        const std::string report = fsched::fiber_report();
        if (report.compare(0, 13, "fiber_sched: ") != 0 || report.find(" live fibers: ") == std::string::npos) {
            violations_.add("fiber_report() is not a report", report.substr(0, 80));
        }
        return 1;
    }
#if defined(FIBER_SCHED_HAVE_EPOLL)
    case Op::io_echo: {
        const auto count = static_cast<unsigned>(1 + a.rng.below(std::min<std::uint64_t>(budget, 6)));
        io_echo_op(a, count);
        return count;
    }
    case Op::io_bulk:
        if (budget < 4) break;
        io_bulk_op(a);
        return 4;
    case Op::io_timeout:
        io_timeout_op(a);
        return 1;
    case Op::io_cancel:
        io_cancel_op(a);
        return 1;
    case Op::io_cancel_race:
        io_cancel_race_op(a);
        return 1;
    case Op::io_pinned_fresh:
        if (budget < 2) break;
        io_pinned_fresh_op(a);
        return 2;
    case Op::io_cancel_close:
        io_cancel_close_op(a);
        return 1;
    case Op::io_low_water:
        io_low_water_op(a);
        return 1;
    case Op::io_full_backlog:
        io_full_backlog_op(a);
        return 1;
#else
    case Op::io_echo:
    case Op::io_bulk:
    case Op::io_timeout:
    case Op::io_cancel:
    case Op::io_cancel_race:
    case Op::io_pinned_fresh:
    case Op::io_cancel_close:
    case Op::io_low_water:
    case Op::io_full_backlog:
        break;
#endif
    }
    // Too little budget left for the operation drawn: a yield instead.
    fsched::this_fiber::yield();
    return 1;
}

// The actor and a helper meet at a Barrier (whose completion runs once), each does a
// section under the shared Semaphore and SharedMutex, the actor signals a manual Event the
// helper waits for, and the helper counts a Latch down that the actor waits for. Every wait
// is certain: the other party is on its way.
void Soak::toolbox_op(Actor& a) {
    struct Meeting {
        std::atomic<int> completions{0};
        fsched::Barrier barrier{2, [this] { completions.fetch_add(1); }};
        fsched::Event go{fsched::Event::Mode::Manual};
        fsched::Latch finished{1};
    };
    auto m = std::make_shared<Meeting>();
    const bool actor_writes = a.rng.percent(40);
    const bool helper_writes = a.rng.percent(40);
    spawn_helper(a, [this, m, helper_writes] {
        m->barrier.arrive_and_wait();
        toolbox_section(helper_writes);
        m->go.wait();
        m->finished.count_down();
    });
    m->barrier.arrive_and_wait();
    if (m->completions.load() != 1) violations_.add("a Barrier's completion did not run once before the release");
    toolbox_section(actor_writes);
    m->go.signal();
    m->finished.wait();
}

void Soak::toolbox_section(bool write) {
    if (!toolbox_units_.try_acquire_for(must_not_take)) {
        violations_.add("Semaphore::try_acquire_for() timed out with units coming back");
        return;
    }
    if (toolbox_inside_.fetch_add(1) + 1 > 2) violations_.add("more holders of a Semaphore than its units");
    if (write) {
        std::unique_lock<fsched::SharedMutex> lock(toolbox_rw_);
        ++pair_a_;
        fsched::this_fiber::yield();
        ++pair_b_;
        toolbox_writes_.fetch_add(1);
    } else {
        std::shared_lock<fsched::SharedMutex> lock(toolbox_rw_);
        const std::int64_t seen = pair_a_;
        fsched::this_fiber::yield();
        if (seen != pair_a_ || pair_a_ != pair_b_) violations_.add("a SharedMutex reader saw a write under way");
    }
    toolbox_inside_.fetch_sub(1);
    toolbox_units_.release();
}

void Soak::lock_op(Actor& a) {
    const auto i = a.rng.below(counters_.size());
    const auto mode = a.rng.below(4);
    Guarded& g = counters_[i];
    if (mode == 3) {
        // unique_lock, unlocked and relocked around a yield.
        std::unique_lock<fsched::Mutex> lock(g.mutex);
        g.value = g.value + 1;
        lock.unlock();
        fsched::this_fiber::yield();
        lock.lock();
        g.value = g.value + 1;
        counter_expected_[i].fetch_add(2);
        return;
    }
    std::lock_guard<fsched::Mutex> lock(g.mutex);
    // Read, let others run, write back: a second holder would lose an increment.
    const std::int64_t v = g.value;
    if (mode == 1) fsched::this_fiber::yield();
    if (mode == 2) fsched::this_fiber::sleep_for(20us);
    g.value = v + 1;
    counter_expected_[i].fetch_add(1);
}

void Soak::transfer_op(Actor& a) {
    const auto from = a.rng.below(accounts_.size());
    const auto to = (from + 1 + a.rng.below(accounts_.size() - 1)) % accounts_.size();
    const auto amount = static_cast<std::int64_t>(a.rng.below(100));
    const bool pause = a.rng.percent(30);
    // std::scoped_lock's deadlock avoidance goes through lock() and try_lock().
    std::scoped_lock lock(accounts_[from].mutex, accounts_[to].mutex);
    accounts_[from].value -= amount;
    if (pause) fsched::this_fiber::yield();
    accounts_[to].value += amount;
}

// select() over two shared channels (perhaps the same one twice): a receive case on one, a
// receive or a send case on the other, and a timeout. What it receives counts as received;
// a send case counts as sent only if it ran.
void Soak::select_op(Actor& a) {
    CountedChannel& from = *channels_[a.rng.below(channels_.size())];
    CountedChannel& other = *channels_[a.rng.below(channels_.size())];
    const bool with_send = a.rng.percent(50);
    const bool heavy = a.rng.percent(30);
    const microseconds d(a.rng.below(500));
    auto receive_into = [this](CountedChannel& c) {
        return [this, &c](std::optional<Message> m) {
            if (m) received(c, *m);
        };
    };
    bool timed_out = false;
    auto on_timeout = [&timed_out] { timed_out = true; };
    const auto start = Clock::now();
    if (with_send) {
        Message m;
        m.id = messages_.issue();
        m.channel = other.tag;
        if (heavy) m.payload = payload_for(m.id);
        const std::uint64_t id = m.id;
        fsched::select(from.channel.on_receive(receive_into(from)),
                       other.channel.on_send(std::move(m),
                                             [this, &other, id](bool sent) {
                                                 if (!sent) {
                                                     other.refused.fetch_add(1);
                                                     return;
                                                 }
                                                 messages_.first(id);
                                                 other.sent.fetch_add(1);
                                                 other.sent_sum.fetch_add(id);
                                             }),
                       fsched::select_timeout(d, on_timeout));
    } else {
        fsched::select(from.channel.on_receive(receive_into(from)), other.channel.on_receive(receive_into(other)),
                       fsched::select_timeout(d, on_timeout));
    }
    if (timed_out) {
        timeouts_.fetch_add(1);
        timed("select with a timeout", start, d);
    }
}

void Soak::cv_consume_op(Actor& a) {
    const microseconds d(20 + a.rng.below(1000));
    std::unique_lock<fsched::Mutex> lock(bank_.mutex);
    const auto start = Clock::now();
    if (bank_.cv.wait_for(lock, d, [this] { return bank_.tokens > 0; })) {
        --bank_.tokens;
        ++bank_.consumed;
    } else {
        timeouts_.fetch_add(1);
        timed("ConditionVariable::wait_for with a predicate (timeout)", start, d);
    }
}

void Soak::play(PingPong& pp, int me) {
    for (unsigned r = 0; r < pp.rounds; ++r) {
        std::unique_lock<fsched::Mutex> lock(pp.mutex);
        if (!pp.cv.wait_for(lock, must_not_take, [&] { return pp.turn == me || pp.failed; })) {
            violations_.add("ping-pong through a ConditionVariable: the partner's notify never came");
            pp.failed = true;
        }
        if (pp.failed) {
            lock.unlock();
            pp.cv.notify_all();
            return;
        }
        pp.turn = 1 - me;
        lock.unlock();
        pp.cv.notify_one();
    }
}

std::uint64_t Soak::pipeline_op(Actor& a, std::uint64_t budget) {
    const auto kind = a.rng.below(3);
    const std::size_t capacity = kind == 0 ? 0 : kind == 1 ? 1 : 2 + a.rng.below(15);
    const auto producers = static_cast<unsigned>(1 + a.rng.below(3));
    const auto consumers = static_cast<unsigned>(1 + a.rng.below(3));
    const std::uint64_t per_producer = 1 + a.rng.below(std::max<std::uint64_t>(1, std::min<std::uint64_t>((budget - 1) / producers, 8)));
    const bool early_close = a.rng.percent(30);
    const microseconds close_after(a.rng.below(100));
    const bool close_twice = a.rng.percent(10);
    const std::uint64_t cost = std::min<std::uint64_t>(budget, 1 + producers * per_producer);

    auto pipe = std::make_shared<Pipe>(capacity, pipe_tags_.fetch_add(1));
    pipe->producers.add(producers);
    pipe->everyone.add(producers + consumers);
    for (unsigned p = 0; p < producers; ++p) {
        const bool heavy = a.rng.percent(30);
        spawn_helper(a, [this, pipe, per_producer, heavy] {
            for (std::uint64_t i = 0; i < per_producer; ++i) send_one(pipe->line, heavy);
            pipe->producers.done();
            pipe->everyone.done();
        });
    }
    for (unsigned c = 0; c < consumers; ++c) {
        spawn_helper(a, [this, pipe] {
            consume(pipe->line, ~0u);
            pipe->everyone.done();
        });
    }
    if (!early_close) {
        pipe->producers.wait();
    } else if (close_after.count() > 0) {
        fsched::this_fiber::sleep_for(close_after);
    } else {
        fsched::this_fiber::yield();
    }
    pipe->line.channel.close();  // early: racing the producers, whose sends then fail
    if (close_twice) pipe->line.channel.close();
    pipe->everyone.wait();
    const CountedChannel& line = pipe->line;
    if (line.sent != line.received || line.sent_sum != line.received_sum) {
        std::ostringstream detail;
        detail << "capacity " << capacity << ", " << producers << "x" << per_producer << " sends, "
               << consumers << " consumers, " << (early_close ? "early" : "late") << " close: sent "
               << line.sent << ", refused " << line.refused << ", received " << line.received;
        violations_.add("a closed channel: accepted sends and receives differ", detail.str());
    }
    if (!early_close && line.refused != 0) {
        violations_.add("a send refused before the channel was closed");
    }
    return cost;
}

void Soak::suspend_op(Actor& a) {
    if (!a.in_fiber) {
        fsched::this_fiber::yield();  // a plain thread has no fiber to suspend
        return;
    }
    Fiber::ptr self = Fiber::current_ptr();
    if (!self) {
        violations_.add("Fiber::current_ptr() is empty inside a task");
        return;
    }
    suspended_.fetch_add(1);
    // From here another thread may schedule us, even before the yield below has finished.
    mailbox_.post(std::move(self));
    Fiber::yield();
    resumed_.fetch_add(1);
    a.pin = -1;  // whoever put us back chose the worker
}

void Soak::catch_across_yield_op(Actor& a) {
    const bool sleep = a.rng.percent(50);
    const std::uint64_t id = caught_ids_.fetch_add(1);
    try {
        throw CaughtHere{id};
    } catch (const CaughtHere& caught) {
        const std::exception_ptr before = std::current_exception();
        // Other fibers throw and catch on this thread meanwhile, and we may come back on
        // another thread: the handled exception belongs to the fiber.
        if (sleep) {
            fsched::this_fiber::sleep_for(50us);
        } else {
            fsched::this_fiber::yield();
        }
        if (std::current_exception() != before) {
            violations_.add("std::current_exception() changed across a yield inside a catch block");
        }
        if (caught.id != id) violations_.add("a caught exception object changed across a yield");
    }
}

// A callback takes weak and strong references to its own fiber and lets them go past its
// end: a weak_ptr locked later must be that fiber (its id), never a later task's, and at the
// end every one of them has expired (check()).
void Soak::weak_ref_op(Actor& a) {
    const int how = static_cast<int>(a.rng.below(3));
    auto done = std::make_shared<fsched::WaitGroup>(1);
    spawn_helper(a, [this, how, done] {
        Fiber* self = Fiber::current();
        std::weak_ptr<Fiber> weak = how == 0   ? self->weak_from_this()
                                    : how == 1 ? std::weak_ptr<Fiber>(self->shared_from_this())
                                               : std::weak_ptr<Fiber>(Fiber::current_ptr());
        {
            std::lock_guard<std::mutex> lock(kept_mutex_);
            kept_weak_.emplace_back(std::move(weak), self->id());
        }
        done->done();
    });
    done->wait();
    // The helper's task may still be ending; whatever the earlier ones' weak_ptrs lock now
    // is theirs or nothing.
    std::lock_guard<std::mutex> lock(kept_mutex_);
    for (const auto& [weak, id] : kept_weak_) {
        if (const Fiber::ptr f = weak.lock(); f && f->id() != id) {
            violations_.add("a weak_ptr kept past its task locked onto another fiber");
        }
    }
}

// fork(): the child (one thread: this one, a worker or a plain thread) makes a Fiber and a
// scheduler of its own, sleeps and locks, as a plain thread, and exits; the parent waits for
// it without blocking its worker. A hang in the child ends with SIGALRM, a failure.
void Soak::fork_child_op(const char* where) {
#if !defined(_WIN32)
    if (!soak_forks) return;
    const pid_t pid = ::fork();
    if (pid < 0) return;  // out of processes: nothing to check
    if (pid == 0) {
        alarm(20);
        int ran = 0;
        auto fiber = std::make_shared<Fiber>([&] { ++ran; });
        fiber->resume();
        fsched::this_fiber::sleep_for(1ms);  // a plain thread's sleep now
        fsched::Mutex m;
        m.lock();
        m.unlock();
        {
            Scheduler child(2, false, "soak-child");
            child.schedule([&] { fsched::this_fiber::sleep_for(1ms); ++ran; });
            child.start();
            child.stop();
        }
        _exit(ran == 2 ? 0 : 3);
    }
    int status = 0;
    const auto give_up = Clock::now() + 30s;
    pid_t got = 0;
    while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up) {
        fsched::this_fiber::sleep_for(1ms);
    }
    if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        violations_.add("a child forked from " + std::string(where) + " did not exit cleanly",
                        "wait " + std::to_string(got) + ", status " + std::to_string(status));
    }
#else
    (void)where;
#endif
}

#if defined(FIBER_SCHED_HAVE_EPOLL)

void Soak::serve_echo(int fd) {
    for (;;) {
        char header[8];
        const int got = read_exactly(fd, header, sizeof header);
        if (got == 0) return;  // the client is done
        std::uint32_t id, length;
        std::memcpy(&id, header, 4);
        std::memcpy(&length, header + 4, 4);
        std::vector<char> frame(8 + length);
        std::memcpy(frame.data(), header, 8);
        if (got < 0 || read_exactly(fd, frame.data() + 8, length) != 1) {
            violations_.add("io echo server: a read failed", errno_text(fsched::io::last_error()));
            return;
        }
        io_messages_.first(id);
        if (!write_all(fd, frame.data(), frame.size())) {
            violations_.add("io echo server: a write failed", errno_text(fsched::io::last_error()));
            return;
        }
    }
}

void Soak::io_echo_op(Actor& a, unsigned count) {
    std::vector<std::uint32_t> lengths;
    for (unsigned i = 0; i < count; ++i) {
        lengths.push_back(static_cast<std::uint32_t>(a.rng.percent(10) ? a.rng.below(16384) : a.rng.below(512)));
    }
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    auto server_done = std::make_shared<fsched::WaitGroup>(1);
    const int server_fd = fds[1];
    spawn_helper(a, [this, server_fd, server_done] {
        serve_echo(server_fd);
        ::close(server_fd);
        server_done->done();
    });
    for (std::uint32_t length : lengths) {
        const auto id = static_cast<std::uint32_t>(io_messages_.issue());
        const std::vector<char> frame = io_frame(id, length);
        std::vector<char> echoed(frame.size());
        if (!write_all(fds[0], frame.data(), frame.size())) {
            violations_.add("io echo client: a write failed", errno_text(fsched::io::last_error()));
            break;
        }
        if (read_exactly(fds[0], echoed.data(), echoed.size()) != 1) {
            violations_.add("io echo client: a read failed", errno_text(fsched::io::last_error()));
            break;
        }
        if (echoed != frame) {
            violations_.add("io echo: the reply differs from the message", "message " + std::to_string(id));
            break;
        }
        io_messages_.second(id);
    }
    shutdown(fds[0], SHUT_WR);
    char c;
    const ssize_t eof = fsched::io::read(fds[0], &c, 1, must_not_take);
    if (eof != 0) violations_.add("io echo client: no EOF once the server closed", errno_text(fsched::io::last_error()));
    server_done->wait();
    ::close(fds[0]);
}

// A fresh scheduler of 4 or 8 workers (with or without use_caller) whose fiber pinned to
// worker 0 ping-pongs a byte with an unpinned one over a socketpair: the case where a
// wake-up pinned to a sleeping worker was lost (the count of sleepers dipped to 0).
void Soak::io_pinned_fresh_op(Actor& a) {
    const std::size_t workers = a.rng.percent(50) ? 4 : 8;
    const bool use_caller = a.rng.percent(50);
    const int exchanges = static_cast<int>(10 + a.rng.below(40));
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    std::atomic<int> done{0};
    {
        Scheduler fresh(workers, use_caller, "soak-pinned");
        auto play = [this, exchanges, &done](int fd, bool serve) {
            char byte = 'p';
            for (int i = 0; i < exchanges; ++i) {
                for (int step = 0; step < 2; ++step) {
                    const bool reading = (step == 0) == serve;
                    const ssize_t rc = reading ? fsched::io::read(fd, &byte, 1, must_not_take)
                                               : fsched::io::write(fd, &byte, 1, must_not_take);
                    if (rc == 1) continue;
                    violations_.add(serve ? "pinned io ping-pong: the pinned fiber's io call failed"
                                          : "pinned io ping-pong: the unpinned fiber's io call failed",
                                    errno_text(fsched::io::last_error()));
                    ::shutdown(fd, SHUT_RDWR);  // ends the partner's wait
                    return;
                }
            }
            done.fetch_add(1);
        };
        fresh.schedule([&play, &fds] { play(fds[1], true); }, 0);
        fresh.schedule([&play, &fds] { play(fds[0], false); });
        fresh.start();
        fresh.stop();
    }
    if (done.load() != 2) violations_.add("pinned io ping-pong: a player did not finish");
    ::close(fds[0]);
    ::close(fds[1]);
}

void Soak::io_bulk_op(Actor& a) {
    // Enough to fill the socket buffers, so the writer waits for room (Ready::Write).
    const std::uint64_t total = 32768 + a.rng.below(480 * 1024);
    const std::size_t write_chunk = 1024 + a.rng.below(64 * 1024);
    const std::size_t read_chunk = 1024 + a.rng.below(64 * 1024);
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    auto writer_done = std::make_shared<fsched::WaitGroup>(1);
    const int out = fds[1];
    spawn_helper(a, [this, out, total, write_chunk, writer_done] {
        std::vector<char> buf(write_chunk);
        for (std::uint64_t at = 0; at < total;) {
            const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(write_chunk, total - at));
            for (std::size_t i = 0; i < n; ++i) buf[i] = bulk_byte(at + i);
            if (!write_all(out, buf.data(), n)) {
                violations_.add("io bulk writer: a write failed", errno_text(fsched::io::last_error()));
                break;
            }
            at += n;
        }
        shutdown(out, SHUT_WR);  // ends a reader that lost count
        writer_done->done();
    });
    std::vector<char> buf(read_chunk);
    std::uint64_t at = 0;
    bool intact = true;
    while (at < total) {
        const ssize_t r = fsched::io::read(fds[0], buf.data(), std::min<std::uint64_t>(read_chunk, total - at), must_not_take);
        if (r <= 0) {
            violations_.add("io bulk reader: a read failed or ended early", errno_text(fsched::io::last_error()));
            break;
        }
        for (ssize_t i = 0; i < r; ++i) intact = intact && buf[static_cast<std::size_t>(i)] == bulk_byte(at + static_cast<std::uint64_t>(i));
        at += static_cast<std::uint64_t>(r);
    }
    if (!intact) violations_.add("io bulk: the bytes read differ from the bytes written");
    writer_done->wait();
    ::close(fds[0]);
    ::close(fds[1]);
}

void Soak::io_timeout_op(Actor& a) {
    const std::chrono::milliseconds d(1 + a.rng.below(2));
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    // Nothing to read: both time out, with ETIMEDOUT, not early.
    auto start = Clock::now();
    if (fsched::io::wait(fds[0], fsched::io::Ready::Read, d)) {
        violations_.add("io::wait(Read) on a silent socket returned true",
                        std::string(a.in_fiber ? "in a fiber" : "on a plain thread") + ", fd " + std::to_string(fds[0]));
    } else if (fsched::io::last_error() != ETIMEDOUT) {
        violations_.add("io::wait(Read) on a silent socket failed without ETIMEDOUT", errno_text(fsched::io::last_error()));
    } else {
        timed("io::wait (timeout)", start, d);
    }
    char c;
    start = Clock::now();
    const ssize_t r = fsched::io::read(fds[0], &c, 1, 1ms);
    if (r != -1 || fsched::io::last_error() != ETIMEDOUT) {
        violations_.add("io::read on a silent socket did not time out with ETIMEDOUT",
                        "returned " + std::to_string(r) + ", errno " + errno_text(fsched::io::last_error()));
    } else {
        timed("io::read (timeout)", start, 1ms);
    }
    // Now readable: a zero timeout polls and must see it, as must a long one.
    if (::write(fds[1], "x", 1) != 1) violations_.add("write() to a socketpair failed", errno_text(errno));
    if (!fsched::io::wait(fds[0], fsched::io::Ready::Read, 0ms)) {
        violations_.add(std::string("io::wait(Read, 0 ms) returned false on a readable fd, ") +
                            (a.in_fiber ? "in a fiber" : "on a plain thread"),
                        errno_text(fsched::io::last_error()));
    }
    if (!fsched::io::wait(fds[0], fsched::io::Ready::Write, 0ms)) {
        violations_.add(std::string("io::wait(Write, 0 ms) returned false on a writable fd, ") +
                            (a.in_fiber ? "in a fiber" : "on a plain thread"),
                        errno_text(fsched::io::last_error()));
    }
    if (!fsched::io::wait(fds[0], fsched::io::Ready::Read, must_not_take)) {
        violations_.add("io::wait(Read) returned false on a readable fd", errno_text(fsched::io::last_error()));
    }
    if (fsched::io::read(fds[0], &c, 1, must_not_take) != 1 || c != 'x') {
        violations_.add("io::read did not return the byte written", errno_text(fsched::io::last_error()));
    }
    ::close(fds[0]);
    ::close(fds[1]);
}

// A readable fd must be reported ready, whatever io::cancel did to other fds before.
void Soak::expect_no_stale_cancel(const char* after) {
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    if (::write(fds[1], "s", 1) != 1) violations_.add("write() to a socketpair failed", errno_text(errno));
    const bool in_fiber = Fiber::current() != nullptr;
    if (!fsched::io::wait(fds[0], fsched::io::Ready::Read, must_not_take)) {
        violations_.add(std::string("io::wait on a readable fd failed after ") + after + ", " +
                            (in_fiber ? "in a fiber" : "on a plain thread"),
                        errno_text(fsched::io::last_error()));
    }
    ::close(fds[0]);
    ::close(fds[1]);
}

struct CancelState {
    std::atomic<bool> waiter_done{false};
    bool ready = false;  // the waiter's result; read after helper_done
    int error = 0;
    fsched::WaitGroup helper_done{1};
};

void Soak::io_cancel_op(Actor& a) {
    // One side waits on a silent fd; the other cancels it until the waiter has woken.
    const bool we_wait = a.rng.percent(50);
    const microseconds pause(20 + a.rng.below(300));
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    const int fd = fds[0];
    auto state = std::make_shared<CancelState>();
    auto waiter = [fd, state] {
        state->ready = fsched::io::wait(fd, fsched::io::Ready::Read, must_not_take);
        state->error = fsched::io::last_error();
        state->waiter_done = true;
    };
    auto canceller = [fd, state, pause] {
        const auto give_up = Clock::now() + must_not_take;
        while (!state->waiter_done && Clock::now() < give_up) {
            fsched::io::cancel(fd);
            fsched::this_fiber::sleep_for(pause);
        }
    };
    run_as_pair(a, we_wait, waiter, canceller, state->helper_done);
    if (state->ready) {
        violations_.add("io::wait(Read) on a silent socket returned true",
                        std::string("while waiting to be cancelled, ") +
                            (!we_wait || a.in_fiber ? "in a fiber" : "on a plain thread"));
    } else if (state->error != ECANCELED) {
        violations_.add("io::cancel did not wake a waiter with ECANCELED",
                        std::string(!we_wait || a.in_fiber ? "in a fiber" : "on a plain thread") + ", errno " +
                            errno_text(state->error));
    }
    expect_no_stale_cancel("an io::cancel that woke a waiter");
    ::close(fds[0]);
    ::close(fds[1]);
}

void Soak::io_cancel_race_op(Actor& a) {
    // Data arrives and a cancel comes at about the same time: either outcome is right, and
    // the waiter's next wait on a readable fd must succeed.
    const bool we_wait = a.rng.percent(50);
    const microseconds delay(a.rng.below(200));
    const bool write_first = a.rng.percent(50);
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    const int in = fds[0], out = fds[1];
    auto state = std::make_shared<CancelState>();
    auto waiter = [this, in, state] {
        state->ready = fsched::io::wait(in, fsched::io::Ready::Read, must_not_take);
        state->error = fsched::io::last_error();
        if (!state->ready && state->error != ECANCELED) {
            violations_.add("io::wait raced by data and io::cancel: neither ready nor ECANCELED",
                            errno_text(state->error));
        }
        expect_no_stale_cancel("an io::wait raced by data and io::cancel");
    };
    auto poker = [this, in, out, delay, write_first] {
        if (delay.count() > 0) fsched::this_fiber::sleep_for(delay);
        if (!write_first) fsched::io::cancel(in);
        if (::write(out, "r", 1) != 1) violations_.add("write() to a socketpair failed", errno_text(errno));
        if (write_first) fsched::io::cancel(in);
    };
    run_as_pair(a, we_wait, waiter, poker, state->helper_done);
    ::close(fds[0]);
    ::close(fds[1]);
}

void Soak::io_cancel_close_op(Actor& a) {
    // The README's recipe for closing an fd under a reader: io::cancel(fd), then close(fd).
    // The reader may be anywhere in its call (before its read, between its EAGAIN and its
    // park, parked): it must end at once, ECANCELED, never by its timeout. The number is
    // then taken over by /dev/null (dup2), as a close and a reuse would do, but without
    // letting another operation's fd take it while the reader may still touch it; a reader
    // that started after the cancel finds that file (EINVAL: not non-blocking; ENOTSOCK;
    // end of file if it had passed its check on the socket already).
    const bool we_wait = a.rng.percent(50);
    const microseconds delay(a.rng.below(300));
    int fds[2];
    if (!open_socketpair(fds)) {
        violations_.add("socketpair() failed", errno_text(errno));
        return;
    }
    const int fd = fds[0];
    auto state = std::make_shared<CancelState>();
    auto reader = [fd, state] {
        char c;
        const ssize_t rc = fsched::io::read(fd, &c, 1, must_not_take);
        // 0: it started after the cancel and read /dev/null (end of file), which is right.
        state->ready = rc > 0;
        state->error = rc < 0 ? fsched::io::last_error() : 0;
        state->waiter_done = true;
    };
    auto closer = [this, fd, delay, state] {
        if (delay.count() > 0) fsched::this_fiber::sleep_for(delay);
        fsched::io::cancel(fd);
        const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null_fd < 0 || ::dup3(null_fd, fd, O_CLOEXEC) < 0) violations_.add("dup3() over a cancelled fd failed", errno_text(errno));
        if (null_fd >= 0) ::close(null_fd);
        // A reader that started after the cancel may have parked on the socket before the
        // dup3 closed it, where nothing wakes it (a close behind io's back): cancel again.
        const auto give_up = Clock::now() + must_not_take;
        while (!state->waiter_done && Clock::now() < give_up) {
            fsched::this_fiber::sleep_for(1ms);
            if (!state->waiter_done) fsched::io::cancel(fd);
        }
    };
    run_as_pair(a, we_wait, reader, closer, state->helper_done);
    if (state->ready) {
        violations_.add("io::read of a silent socket, cancelled and closed, returned data");
    } else if (state->error == ETIMEDOUT) {
        violations_.add("io::read cancelled and closed under it ran to its timeout");
    } else if (state->error != 0 && state->error != ECANCELED && state->error != EINVAL && state->error != ENOTSOCK &&
               state->error != EBADF) {
        violations_.add("io::read cancelled and closed under it: an unexpected error", errno_text(state->error));
    }
    ::close(fds[0]);
    ::close(fds[1]);
}

// A connected loopback TCP pair, both ends non-blocking; false if the machine has none.
bool tcp_pair(int& client, int& server) {
    client = server = -1;
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bool ok = ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(listener, 1) == 0 &&
              ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    if (ok) client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // A blocking connect and accept on loopback: the handshake is done inside connect().
    ok = ok && client >= 0 && ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (ok) server = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ok = ok && server >= 0 && ::fcntl(client, F_SETFL, O_NONBLOCK) == 0;
    const int one = 1;
    if (ok) ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::close(listener);
    if (!ok) {
        if (client >= 0) ::close(client);
        if (server >= 0) ::close(server);
        client = server = -1;
    }
    return ok;
}

void Soak::io_low_water_op(Actor& a) {
    // A short read (the queue emptied, so the next read may be left out), then the user
    // sets SO_RCVLOWAT above what comes next, or peeks at it with MSG_PEEK: the next
    // io::read must return the bytes recv() would, not wait for an edge that never comes.
    int client, server;
    if (!tcp_pair(client, server)) return;  // no loopback TCP here: nothing to check
    const int low_water = static_cast<int>(2 + a.rng.below(31));
    const bool peek = a.rng.percent(30);
    char buf[64];
    bool ok = ::send(client, "12345678", 8, MSG_NOSIGNAL) == 8;
    ok = ok && fsched::io::read(server, buf, sizeof buf, must_not_take) == 8;  // short: the queue is empty
    ok = ok && ::setsockopt(server, SOL_SOCKET, SO_RCVLOWAT, &low_water, sizeof low_water) == 0;
    ok = ok && ::send(client, "abcd", 4, MSG_NOSIGNAL) == 4;
    if (!ok) {
        violations_.add("io low water: the setup failed", errno_text(errno));
    } else {
        if (peek) {
            // The user's own look, which leaves the bytes queued.
            for (int tries = 0; tries < 1000 && ::recv(server, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT) < 0; ++tries) {
                fsched::this_fiber::sleep_for(microseconds(100));
            }
        }
        const auto start = Clock::now();
        const ssize_t got = fsched::io::read(server, buf, sizeof buf, must_not_take);
        // At its timeout the read makes its call once more and would return the bytes: a
        // read that needed that has waited for an edge that never came.
        if (Clock::now() - start >= must_not_take) violations_.add("io::read below SO_RCVLOWAT ran to its timeout");
        if (got != 4) {
            violations_.add("io::read left bytes that recv() would return (SO_RCVLOWAT " + std::to_string(low_water) +
                                (peek ? ", after MSG_PEEK)" : ")"),
                            "returned " + std::to_string(got) + ", " + errno_text(fsched::io::last_error()));
        }
    }
    ::close(client);
    ::close(server);
}

void Soak::io_full_backlog_op(Actor& a) {
    // io::connect to an AF_UNIX listener whose backlog is full must wait until an accept
    // makes room (it used to fail with EAGAIN at once), from a fiber or a plain thread.
    static std::atomic<unsigned> names{0};
    const bool we_connect = a.rng.percent(50);
    const microseconds accept_after(a.rng.below(3000));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string name = "fsched-soak-" + std::to_string(::getpid()) + "-" + std::to_string(names.fetch_add(1));
    std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: nothing on disk
    const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || ::listen(listener, 0) != 0) {
        violations_.add("io full backlog: the listener failed", errno_text(errno));
        if (listener >= 0) ::close(listener);
        return;
    }
    std::vector<int> fillers;  // connections that fill the backlog
    for (int i = 0; i < 8; ++i) {
        const int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c < 0) break;
        fillers.push_back(c);
        if (::connect(c, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) break;  // EAGAIN: full
    }
    const int client = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    auto state = std::make_shared<CancelState>();
    auto connector = [client, &addr, addr_len, state] {
        state->ready = fsched::io::connect(client, reinterpret_cast<sockaddr*>(&addr), addr_len, must_not_take) == 0;
        state->error = fsched::io::last_error();
        state->waiter_done = true;
    };
    auto acceptor = [listener, accept_after, state] {
        if (accept_after.count() > 0) fsched::this_fiber::sleep_for(accept_after);
        const auto give_up = Clock::now() + must_not_take;
        while (!state->waiter_done && Clock::now() < give_up) {
            const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
            if (accepted >= 0) {
                ::close(accepted);
            } else {
                fsched::this_fiber::sleep_for(microseconds(200));
            }
        }
    };
    run_as_pair(a, we_connect, connector, acceptor, state->helper_done);
    if (!state->ready) violations_.add("io::connect to a full AF_UNIX backlog did not wait to connect", errno_text(state->error));
    for (const int c : fillers) ::close(c);
    if (client >= 0) ::close(client);
    ::close(listener);
}

#endif  // FIBER_SCHED_HAVE_EPOLL

void Soak::check() {
    // Every task ran exactly once.
    std::uint64_t never_ran = 0, ran_twice = 0;
    for (std::uint64_t id = 0; id < tasks_.issued(); ++id) {
        never_ran += tasks_.firsts(id) == 0;
        ran_twice += tasks_.firsts(id) > 1;
    }
    CHECK_FALSE(tasks_.overflowed());
    CHECK(never_ran == 0);
    CHECK(ran_twice == 0);
    CHECK(ops_done_.load() == ops_);
    CHECK(live_work_.load() == 0);

    // Every accepted message was received exactly once; no refused one was received.
    std::uint64_t lost = 0, phantom = 0, duplicated = 0;
    for (std::uint64_t id = 0; id < messages_.issued(); ++id) {
        const std::uint32_t sent = messages_.firsts(id), got = messages_.seconds(id);
        lost += sent == 1 && got == 0;
        phantom += sent == 0 && got > 0;
        duplicated += sent > 1 || got > 1;
    }
    CHECK_FALSE(messages_.overflowed());
    CHECK(lost == 0);
    CHECK(phantom == 0);
    CHECK(duplicated == 0);
    for (const auto& c : channels_) {
        INFO("shared channel " << c->tag << ", capacity " << c->channel.capacity());
        CHECK(c->sent.load() == c->received.load());
        CHECK(c->sent_sum.load() == c->received_sum.load());
        CHECK(c->refused.load() == 0);  // closed only once every sender had finished
    }

    // Every io message reached the server once and came back intact once.
    std::uint64_t io_incomplete = 0;
    for (std::uint64_t id = 0; id < io_messages_.issued(); ++id) {
        io_incomplete += io_messages_.firsts(id) != 1 || io_messages_.seconds(id) != 1;
    }
    CHECK_FALSE(io_messages_.overflowed());
    CHECK(io_incomplete == 0);

    // Every exception thrown out of a task reached the handler once.
    std::uint64_t unhandled = 0;
    for (std::uint64_t id = 0; id < thrown_.issued(); ++id) unhandled += thrown_.seconds(id) != 1;
    CHECK(unhandled == 0);

    for (std::size_t i = 0; i < counters_.size(); ++i) {
        CHECK(counters_[i].value == counter_expected_[i].load());
    }
    std::int64_t total = 0;
    for (const Guarded& account : accounts_) total += account.value;
    CHECK(total == initial_balance * static_cast<std::int64_t>(accounts_.size()));
    CHECK(bank_.produced == bank_.consumed + bank_.tokens);
    CHECK(pair_a_ == toolbox_writes_.load());
    CHECK(pair_b_ == toolbox_writes_.load());
    CHECK(toolbox_inside_.load() == 0);
    CHECK(toolbox_units_.try_acquire());  // both units came back, and no more
    CHECK(toolbox_units_.try_acquire());
    CHECK_FALSE(toolbox_units_.try_acquire());
    toolbox_units_.release(2);
    CHECK(bank_.tokens >= 0);

    CHECK(suspended_.load() == resumed_.load());
    CHECK(put_back_.load() == suspended_.load());
    CHECK_FALSE(mailbox_.take());
    std::size_t not_term = 0;
    for (const Fiber::ptr& f : kept_) not_term += f->state() != Fiber::State::Term;
    CHECK(not_term == 0);
    kept_.clear();
    std::size_t live_weak = 0;
    for (const auto& kept : kept_weak_) live_weak += !kept.first.expired();
    CHECK(live_weak == 0);  // every task has ended, and no shared_ptr was kept
    kept_weak_.clear();

    for (const auto& [kind, entry] : violations_.snapshot()) {
        const std::string example = entry.example.empty() ? std::string() : "; first: " + entry.example;
        FAIL_CHECK(kind << ": " << entry.count << " time(s)" << example);
    }
}

struct SoakSettings {
    std::uint64_t seed;
    std::uint64_t ops_per_run;
    bool long_run;
};

const SoakSettings& soak_settings() {
    static const SoakSettings settings = [] {
        SoakSettings s{};
        if (const char* seed = std::getenv("FIBER_SCHED_SOAK_SEED")) {
            s.seed = std::strtoull(seed, nullptr, 0);
        } else {
            std::random_device device;
            s.seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
        }
        s.long_run = false;
        s.ops_per_run = short_run_ops;
        if (const char* ops = std::getenv("FIBER_SCHED_SOAK_OPS")) {
            const std::uint64_t total = std::strtoull(ops, nullptr, 0);
            s.long_run = true;
            s.ops_per_run = std::max<std::uint64_t>(100, total / test::all_configs().size());
        }
        MESSAGE("soak: FIBER_SCHED_SOAK_SEED=" << s.seed << ", " << s.ops_per_run << " operations per configuration ("
                << std::string(s.long_run ? "long" : "short") << " run)");
        return s;
    }();
    return settings;
}

}  // namespace

TEST_CASE("soak: every operation at once, seeded; every task, message and lock accounted for") {
    const SoakSettings& settings = soak_settings();
    FSCHED_FOR_EACH_CONFIG([&](const test::Config& config) {
        // With 4 and 8 workers every wake also moves the fiber (SchedulerOptions::debug_migrate).
        const bool migrate = config.threads >= 4;
        INFO("FIBER_SCHED_SOAK_SEED=" << settings.seed << ", " << settings.ops_per_run << " operations, "
             << test::config_name(config) << (migrate ? ", debug_migrate" : ""));
        const std::size_t fds_before = open_fd_count();
        const std::size_t stacks_before = fsched::stack_stats().in_use;
        Clock::duration elapsed{};
        std::uint64_t ops = 0, tasks = 0, messages = 0, io_messages = 0;
        {
            fsched::SchedulerOptions options;
            options.threads = config.threads;
            options.use_caller = config.use_caller;
            options.name = "soak";
            options.debug_migrate = migrate;
            // With 2 workers, idle workers spin the last 50 us to a timer (SchedulerOptions::timer_spin).
            if (config.threads == 2) options.timer_spin = std::chrono::microseconds(50);
            Scheduler scheduler(options);
            Soak soak(scheduler, settings.seed, settings.ops_per_run);
            scheduler.set_exception_handler([&soak](std::exception_ptr e) { soak.on_exception(e); });
            const auto start = Clock::now();
            scheduler.start();
            soak.begin();
            scheduler.stop();  // while the lanes and the outside threads are busy
            scheduler.stop();  // harmless
            elapsed = Clock::now() - start;
            soak.join_outsiders();
            soak.check();
            ops = soak.ops_done();
            tasks = soak.tasks_run();
            messages = soak.messages();
            io_messages = soak.io_messages();
        }
        // Nothing left over once the scheduler is gone and every Fiber::ptr released.
        CHECK(fsched::stack_stats().in_use == stacks_before);
        CHECK(open_fd_count() == fds_before);
        if (settings.long_run) {
            const double seconds = std::chrono::duration<double>(elapsed).count();
            MESSAGE("soak " << test::config_name(config) << ": " << ops << " ops in " << seconds << " s ("
                    << static_cast<std::uint64_t>(ops / seconds) << " ops/s), " << tasks << " tasks, " << messages
                    << " channel messages, " << io_messages << " io messages");
        }
    });
}
