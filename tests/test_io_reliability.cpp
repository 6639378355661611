// fsched::io under the conditions that used to break it: a cancel racing the end of a plain
// thread's wait, zero and expiring timeouts in a fiber, a peer that has gone (SIGPIPE),
// blocking fds, and a scheduler that runs out of file descriptors while it is built. And the
// persistent, edge-triggered registration: no epoll_ctl or fcntl per call once an fd is
// known, an edge that lands before the park, numbers closed and reused behind its back.
#include "fiber_sched.hpp"
#include "helpers.hpp"
#include "listener.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(FIBER_SCHED_HAVE_EPOLL)

using fsched::Scheduler;
using fsched::io::Ready;
using namespace std::chrono_literals;

namespace {

// A connected pair of stream sockets, non-blocking unless asked otherwise.
struct Sockets {
    int a = -1, b = -1;
    explicit Sockets(bool nonblocking = true) {
        int fds[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0, fds) == 0);
        a = fds[0];
        b = fds[1];
    }
    ~Sockets() {
        if (a >= 0) close(a);
        if (b >= 0) close(b);
    }
};

// A pipe, non-blocking unless asked otherwise.
struct Pipe {
    int read_end = -1, write_end = -1;
    explicit Pipe(bool nonblocking = true) {
        int fds[2];
        REQUIRE(pipe2(fds, nonblocking ? O_NONBLOCK : 0) == 0);
        read_end = fds[0];
        write_end = fds[1];
    }
    ~Pipe() {
        if (read_end >= 0) close(read_end);
        if (write_end >= 0) close(write_end);
    }
};


#define FSCHED_CHECK_CHILD_SUCCEEDED(result)      \
    do {                                          \
        const ::test::ChildResult& r_ = (result); \
        INFO("child stderr: " << r_.err);         \
        CHECK(r_.signal == 0);                    \
        CHECK(r_.exited);                         \
        CHECK(r_.exit_code == 0);                 \
    } while (0)

// The fds open in this process, as /proc/self/fd lists them (the listing's own fd left out).
int open_fd_count() {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int count = 0;
    while (dirent* entry = readdir(dir)) {
        if (entry->d_name[0] != '.' && std::atoi(entry->d_name) != dirfd(dir)) ++count;
    }
    closedir(dir);
    return count;
}

}  // namespace

TEST_CASE("io reliability: a cancel that lands after a plain thread's wait ended does not fail its next wait") {
    // The thread alternates between a wait on an fd that cancel() targets and one on an fd
    // that nothing cancels; both are ready, so each poll() returns at once, and a cancel
    // often lands just after it. The second wait must never see the first one's cancel.
    Sockets cancelled;  // cancelled.a: readable, and cancelled in a loop
    Sockets other;      // other.a: readable, never cancelled
    REQUIRE(::write(cancelled.b, "c", 1) == 1);
    REQUIRE(::write(other.b, "o", 1) == 1);
    std::atomic<bool> done{false};
    std::atomic<long> cancels{0};
    std::thread canceller([&] {
        while (!done.load()) {
            fsched::io::cancel(cancelled.a);
            cancels++;
        }
    });
    int failures = 0, first_errno = 0, rounds = 0;
    const auto until = std::chrono::steady_clock::now() + 2s;
    for (; rounds < 100000 && (rounds < 2000 || std::chrono::steady_clock::now() < until); ++rounds) {
        fsched::io::wait(cancelled.a, Ready::Read, 10s);  // ready or cancelled: either is fine
        if (!fsched::io::wait(other.a, Ready::Read, 10s)) {
            if (failures++ == 0) first_errno = fsched::io::last_error();
        }
    }
    done = true;
    canceller.join();
    CAPTURE(rounds);
    CAPTURE(cancels.load());
    CAPTURE(first_errno);
    CHECK(failures == 0);
}

namespace {
void ignore_signal(int) {}
}  // namespace

TEST_CASE("io reliability: a plain thread's timed wait ends on time while signals interrupt it") {
    // Each signal ends the thread's poll() with EINTR; the restarted poll() must wait for
    // the time left, not the whole timeout again, or signals every 2 ms keep a 200 ms read
    // and wait from ever ending (they did, until the signaller gave up after 5 s).
    struct sigaction handler {}, old {};
    handler.sa_handler = ignore_signal;  // no SA_RESTART (poll() is never restarted anyway)
    sigemptyset(&handler.sa_mask);
    REQUIRE(sigaction(SIGURG, &handler, &old) == 0);
    Sockets sockets;
    for (int kind = 0; kind < 2; ++kind) {
        CAPTURE(kind);  // 0: io::read, 1: io::wait
        std::atomic<bool> done{false};
        const pthread_t waiter = pthread_self();
        std::thread signaller([&] {
            const auto give_up = std::chrono::steady_clock::now() + 5s;
            while (!done.load() && std::chrono::steady_clock::now() < give_up) {
                pthread_kill(waiter, SIGURG);
                std::this_thread::sleep_for(2ms);
            }
        });
        const auto start = std::chrono::steady_clock::now();
        char c = 0;
        const bool timed_out = kind == 0 ? fsched::io::read(sockets.a, &c, 1, 200ms) == -1
                                         : !fsched::io::wait(sockets.a, Ready::Read, 200ms);
        const int error = fsched::io::last_error();
        const auto took = std::chrono::steady_clock::now() - start;
        done = true;
        signaller.join();
        CHECK(timed_out);
        CHECK(error == ETIMEDOUT);
        CHECK(took >= 200ms);
        CHECK(took < 4s);  // 5 s or more without the fix; a loaded TSan run takes well under 4
    }
    sigaction(SIGURG, &old, nullptr);
}

TEST_CASE("io reliability: a zero timeout in a fiber reports a ready fd as ready, like poll(fd, 0)") {
    for (std::size_t threads : {1u, 2u}) {
        CAPTURE(threads);
        Scheduler s(threads, false);
        Sockets pair;
        REQUIRE(::write(pair.b, "r", 1) == 1);  // pair.a: readable, and writable
        int readable = 0, writable = 0, not_ready = 0, not_ready_errno = 0;
        s.start();
        s.schedule([&] {
            for (int i = 0; i < 100; ++i) {
                readable += fsched::io::wait(pair.a, Ready::Read, 0ms);
                writable += fsched::io::wait(pair.a, Ready::Write, 0ms);
            }
            not_ready = fsched::io::wait(pair.b, Ready::Read, 0ms);  // nothing to read on b
            not_ready_errno = fsched::io::last_error();
        });
        s.stop();
        CHECK(readable == 100);
        CHECK(writable == 100);
        CHECK(not_ready == 0);
        CHECK(not_ready_errno == ETIMEDOUT);
    }
}

TEST_CASE("io reliability: a fiber whose timeout expires while its fd is ready reports ready") {
    // One worker: the fiber parks, then a second task makes the fd ready and keeps the worker
    // busy until well past the deadline, so the timer fires before anyone asks epoll.
    Scheduler s(1, false);
    Sockets pair;
    bool ready = false;
    int error = 0;
    s.start();
    s.schedule([&] {
        const auto start = std::chrono::steady_clock::now();
        Scheduler::current()->schedule([&, start] {  // runs once the waiter has parked
            CHECK(::write(pair.b, "r", 1) == 1);
            while (std::chrono::steady_clock::now() < start + 400ms) {
            }
        });
        ready = fsched::io::wait(pair.a, Ready::Read, 100ms);
        error = fsched::io::last_error();
    });
    s.stop();
    CAPTURE(error);
    CHECK(ready);
}

TEST_CASE("io reliability: writing to a peer that has gone fails with EPIPE instead of raising SIGPIPE") {
    auto write_to_closed_peers = [] {
        Sockets sockets;
        close(sockets.b);
        sockets.b = -1;
        FSCHED_CHILD_REQUIRE(fsched::io::write(sockets.a, "x", 1, 1s) == -1);
        FSCHED_CHILD_REQUIRE(fsched::io::last_error() == EPIPE);
        Pipe pipe;
        close(pipe.read_end);
        pipe.read_end = -1;
        FSCHED_CHILD_REQUIRE(fsched::io::write(pipe.write_end, "x", 1, 1s) == -1);
        FSCHED_CHILD_REQUIRE(fsched::io::last_error() == EPIPE);
        // The signal mask is as it was, with no SIGPIPE left pending.
        sigset_t mask, pending;
        FSCHED_CHILD_REQUIRE(pthread_sigmask(SIG_BLOCK, nullptr, &mask) == 0);
        FSCHED_CHILD_REQUIRE(!sigismember(&mask, SIGPIPE));
        FSCHED_CHILD_REQUIRE(sigpending(&pending) == 0);
        FSCHED_CHILD_REQUIRE(!sigismember(&pending, SIGPIPE));
    };
    const auto result = test::run_in_child([&] {
        std::signal(SIGPIPE, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        FSCHED_CHILD_REQUIRE(pthread_sigmask(SIG_SETMASK, &none, nullptr) == 0);
        write_to_closed_peers();  // from a plain thread
        {
            Scheduler s(1, false);
            s.start();
            s.schedule(write_to_closed_peers);  // and from a fiber
            s.stop();
        }
        // A SIGPIPE that was already pending (and blocked) before the write stays so.
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        FSCHED_CHILD_REQUIRE(pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr) == 0);
        FSCHED_CHILD_REQUIRE(raise(SIGPIPE) == 0);
        Pipe pipe;
        close(pipe.read_end);
        pipe.read_end = -1;
        FSCHED_CHILD_REQUIRE(fsched::io::write(pipe.write_end, "x", 1) == -1);
        FSCHED_CHILD_REQUIRE(fsched::io::last_error() == EPIPE);
        sigset_t mask, pending;
        FSCHED_CHILD_REQUIRE(pthread_sigmask(SIG_BLOCK, nullptr, &mask) == 0);
        FSCHED_CHILD_REQUIRE(sigismember(&mask, SIGPIPE));
        FSCHED_CHILD_REQUIRE(sigpending(&pending) == 0);
        FSCHED_CHILD_REQUIRE(sigismember(&pending, SIGPIPE));
        const timespec zero{0, 0};
        FSCHED_CHILD_REQUIRE(sigtimedwait(&pipe_only, nullptr, &zero) == SIGPIPE);
    });
    FSCHED_CHECK_CHILD_SUCCEEDED(result);
}

TEST_CASE("io reliability: read, write, accept and connect refuse every blocking fd with EINVAL") {
    char c = 0;
    SUBCASE("a blocking socket pair, without touching it") {
        Sockets blocking(false);
        CHECK(fsched::io::read(blocking.a, &c, 1, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
        CHECK(fsched::io::write(blocking.a, "x", 1, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
        CHECK(::recv(blocking.b, &c, 1, MSG_DONTWAIT) == -1);  // nothing was sent
        CHECK(errno == EAGAIN);
    }
    SUBCASE("a blocking pipe") {
        Pipe blocking(false);
        CHECK(fsched::io::read(blocking.read_end, &c, 1, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
        CHECK(fsched::io::write(blocking.write_end, "x", 1, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
    }
    SUBCASE("a blocking listener, and a blocking socket to connect") {
        const int listener = socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(listener >= 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0);
        REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        REQUIRE(listen(listener, 4) == 0);
        CHECK(fsched::io::accept(listener, nullptr, nullptr, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
        const int client = socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(client >= 0);
        CHECK(fsched::io::connect(client, reinterpret_cast<sockaddr*>(&addr), len, 200ms) == -1);
        CHECK(fsched::io::last_error() == EINVAL);
        close(client);
        close(listener);
    }
    SUBCASE("non-blocking ones work") {
        Sockets sockets;
        CHECK(fsched::io::write(sockets.a, "s", 1, 5s) == 1);
        CHECK(fsched::io::read(sockets.b, &c, 1, 5s) == 1);
        CHECK(c == 's');
        Pipe pipe;
        CHECK(fsched::io::write(pipe.write_end, "p", 1, 5s) == 1);
        CHECK(fsched::io::read(pipe.read_end, &c, 1, 5s) == 1);
        CHECK(c == 'p');
    }
}

TEST_CASE("io reliability: a second reader fiber on the same fd gets EBUSY, the first still reads") {
    // One worker: the second reader runs only once the first has parked.
    Scheduler s(1, false);
    Sockets pair;
    ssize_t first = 0, second = 0;
    int second_errno = 0;
    char got = 0;
    s.start();
    s.schedule([&] {
        Scheduler::current()->schedule([&] {
            char c;
            second = fsched::io::read(pair.a, &c, 1, 10s);
            second_errno = fsched::io::last_error();
            CHECK(::write(pair.b, "x", 1) == 1);  // now let the first reader have its byte
        });
        first = fsched::io::read(pair.a, &got, 1, 10s);
    });
    s.stop();
    CHECK(second == -1);
    CHECK(second_errno == EBUSY);
    CHECK(first == 1);
    CHECK(got == 'x');
}

TEST_CASE("io reliability: a Scheduler that runs out of fds while it is built closes the ones it opened") {
    const auto result = test::run_in_child([] {
        rlimit old_limit{};
        FSCHED_CHILD_REQUIRE(getrlimit(RLIMIT_NOFILE, &old_limit) == 0);
        const int before = open_fd_count();
        FSCHED_CHILD_REQUIRE(before > 0);
        // Room for exactly three more fds: below the third free fd number.
        int free_found = 0, limit = 0;
        while (free_found < 3) {
            if (fcntl(limit, F_GETFD) == -1) ++free_found;
            ++limit;
        }
        rlimit low = old_limit;
        low.rlim_cur = static_cast<rlim_t>(limit);
        for (std::size_t threads : {4u, 1u}) {
            FSCHED_CHILD_REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
            int error = 0;
            try {
                Scheduler s(threads, false);  // needs 2 + 2 per worker
            } catch (const std::system_error& e) {
                error = e.code().value();
            }
            FSCHED_CHILD_REQUIRE(setrlimit(RLIMIT_NOFILE, &old_limit) == 0);
            FSCHED_CHILD_REQUIRE(error == EMFILE);
            FSCHED_CHILD_REQUIRE(open_fd_count() == before);
        }
        std::atomic<bool> ran{false};
        {
            Scheduler s(4, false);
            s.start();
            s.schedule([&] { ran = true; });
            s.stop();
        }
        FSCHED_CHILD_REQUIRE(ran.load());
        FSCHED_CHILD_REQUIRE(open_fd_count() == before);
    });
    FSCHED_CHECK_CHILD_SUCCEEDED(result);
}

TEST_CASE("io reliability: a readiness event of a closed fd does not wake a new waiter on its reused number") {
    // A timed wait on fd N times out just as N becomes readable; a worker has already taken
    // N's event out of epoll_wait. N is closed, its number reused by a new socket that no one
    // writes to, and a new wait on it must not be woken by the old event.
#if defined(FIBER_SCHED_TSAN) || defined(FIBER_SCHED_ASAN) || defined(FIBER_SCHED_TEST_EMULATED)
    constexpr int rounds = 150;  // (1,000 took 12 s under qemu-user)
#else
    constexpr int rounds = 1000;
#endif
    std::atomic<int> spurious{0};
    Scheduler s(4, false, "stale-event");
    s.start();
    for (int f = 0; f < 4; ++f) {
        s.schedule([&spurious, f] {
            for (int i = 0; i < rounds; ++i) {
                int p[2];
                if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, p) != 0) return;
                std::thread writer([&] {
                    std::this_thread::sleep_for(std::chrono::microseconds(900 + (i * 37 + f) % 200));
                    const char c = 'x';
                    CHECK(::write(p[1], &c, 1) == 1);
                });
                fsched::io::wait(p[0], Ready::Read, 1ms);  // times out about when the byte lands
                writer.join();
                ::close(p[0]);
                ::close(p[1]);
                int q[2];  // takes the numbers just freed
                if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, q) != 0) return;
                if (fsched::io::wait(q[0], Ready::Read, 2ms)) spurious++;  // nothing was written
                ::close(q[0]);
                ::close(q[1]);
            }
        });
    }
    s.stop();
    CHECK(spurious == 0);
}

namespace {

// A fiber's io::read of one byte on `fd` that must wait: on one worker, `then` runs only once
// the reader has parked (the reader schedules it first, and it is queued behind the reader).
ssize_t read_after_park(int fd, char* c, std::chrono::milliseconds timeout, std::function<void()> then) {
    Scheduler::current()->schedule(std::move(then));
    return fsched::io::read(fd, c, 1, timeout);
}

int edge_peer = -1;  // the hook below writes here

// set_io_before_park_hook(): the reader's read has just failed with EAGAIN and it is about to
// park. Write the byte now and take its edge out of epoll while no one waits for it.
void land_edge_before_park(int) {
    fsched::detail::set_io_before_park_hook(nullptr);  // once
    CHECK(::write(edge_peer, "e", 1) == 1);
    const auto until = std::chrono::steady_clock::now() + 5s;
    int events = 0;
    while (events == 0 && std::chrono::steady_clock::now() < until) events = fsched::detail::io_poll_now();
    CHECK(events == 1);
}

}  // namespace

TEST_CASE("io reliability: waits on a known socket make no epoll_ctl or fstat call, and its reads and writes no fcntl") {
    // Ping-pong on one worker: each side's read waits for the other's write, so there are
    // about 2 x 500 waits. Re-arming per wait would make an epoll_ctl call for each.
    constexpr int rounds = 500;
    Scheduler s(1, false);
    Sockets pair;
    int a_got = 0, b_got = 0;
    long ctl_calls = 0, checks = 0, stats = 0;
    s.start();
    s.schedule([&] {
        const long ctl0 = fsched::detail::io_epoll_ctl_calls();
        const long checks0 = fsched::detail::io_fd_checks();
        const long stats0 = fsched::detail::io_fd_stats();
        Scheduler::current()->schedule([&] {
            char c = 0;
            for (int i = 0; i < rounds; ++i) {
                if (fsched::io::write(pair.b, "b", 1, 5s) != 1 || fsched::io::read(pair.b, &c, 1, 5s) != 1) break;
                b_got += c == 'a';
            }
        });
        char c = 0;
        for (int i = 0; i < rounds; ++i) {
            if (fsched::io::read(pair.a, &c, 1, 5s) != 1) break;
            a_got += c == 'b';
            if (fsched::io::write(pair.a, "a", 1, 5s) != 1) break;
        }
        while (b_got < rounds && fsched::io::wait(pair.b, Ready::Write, 0ms)) fsched::this_fiber::yield();
        ctl_calls = fsched::detail::io_epoll_ctl_calls() - ctl0;
        checks = fsched::detail::io_fd_checks() - checks0;
        stats = fsched::detail::io_fd_stats() - stats0;
    });
    s.stop();
    CHECK(a_got == rounds);
    CHECK(b_got == rounds);
    CHECK(ctl_calls == 2);  // one EPOLL_CTL_ADD for each end
    CAPTURE(checks);
    CHECK(checks <= 4);  // each end's calls before its first wait
    CHECK(stats == 2);   // each end's first wait, which finds it a socket
}

TEST_CASE("io reliability: an edge that lands between a read's EAGAIN and its park is not lost") {
    Scheduler s(1, false);
    Sockets pair;
    edge_peer = pair.b;
    ssize_t first = 0, second = 0;
    char c1 = 0, c2 = 0;
    std::chrono::steady_clock::duration second_took{};
    s.start();
    s.schedule([&] {
        // The first read registers the fd (ADD reports the present state, so the edge under
        // test must come after it) and waits for a byte written once it parked.
        first = read_after_park(pair.a, &c1, 5s, [&] { CHECK(::write(pair.b, "1", 1) == 1); });
        fsched::detail::set_io_before_park_hook(&land_edge_before_park);
        const auto t0 = std::chrono::steady_clock::now();
        // Its edge comes and goes before it parks. Lost, the read would sleep until its
        // timeout, and then find the byte (a timed-out wait asks poll()): hence the clock.
        second = fsched::io::read(pair.a, &c2, 1, 8s);
        second_took = std::chrono::steady_clock::now() - t0;
    });
    s.stop();
    fsched::detail::set_io_before_park_hook(nullptr);
    CHECK(first == 1);
    CHECK(c1 == '1');
    CHECK(second == 1);
    CHECK(c2 == 'e');
    CHECK(second_took < 4s);
}

TEST_CASE("io reliability: io::wait reports readiness as poll() does, whatever edges came before") {
    Scheduler s(1, false);
    Sockets pair;
    bool twice_a = false, twice_b = false, after_drain = true;
    int drain_errno = 0;
    std::chrono::steady_clock::duration twice_took{};
    s.start();
    s.schedule([&] {
        CHECK(::write(pair.b, "r", 1) == 1);
        // Ready, and still ready: the second wait has no new edge to wake it.
        const auto t0 = std::chrono::steady_clock::now();
        twice_a = fsched::io::wait(pair.a, Ready::Read, 10s);
        twice_b = fsched::io::wait(pair.a, Ready::Read, 10s);
        twice_took = std::chrono::steady_clock::now() - t0;
        // An edge kept with no waiter, then the data read without waiting: not ready.
        CHECK(::write(pair.b, "s", 1) == 1);
        fsched::detail::io_poll_now();
        char buf[4];
        CHECK(::read(pair.a, buf, sizeof buf) == 2);
        after_drain = fsched::io::wait(pair.a, Ready::Read, 200ms);
        drain_errno = fsched::io::last_error();
    });
    s.stop();
    CHECK(twice_a);
    CHECK(twice_b);
    CHECK(twice_took < 5s);  // not by its timeout
    CHECK_FALSE(after_drain);
    CHECK(drain_errno == ETIMEDOUT);
}

TEST_CASE("io reliability: a number closed behind io's back and reused by a new socket is registered anew") {
    Scheduler s(1, false);
    ssize_t first = 0, reused = 0;
    int bad_errno = 0;
    bool same_number = false;
    std::chrono::steady_clock::duration reused_took{};
    s.start();
    s.schedule([&] {
        int p[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p) == 0);
        char c = 0;
        first = read_after_park(p[0], &c, 5s, [&] { CHECK(::write(p[1], "1", 1) == 1); });
        const int number = p[0];
        ::close(p[0]);
        ::close(p[1]);
        int q[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q) == 0);
        same_number = q[0] == number;
        // Trusting the old registration, the read would sleep until its timeout (and then
        // find the byte, as a timed-out wait asks poll()): hence the clock.
        const auto t0 = std::chrono::steady_clock::now();
        reused = read_after_park(q[0], &c, 8s, [&] { CHECK(::write(q[1], "2", 1) == 1); });
        reused_took = std::chrono::steady_clock::now() - t0;
        ::close(q[0]);
        ::close(q[1]);
        // Closed again: EBADF (and its entry forgotten).
        fsched::io::wait(number, Ready::Read, 1s);
        bad_errno = fsched::io::last_error();
    });
    s.stop();
    CHECK(first == 1);
    CHECK(same_number);
    CHECK(reused == 1);
    CHECK(reused_took < 4s);
    CHECK(bad_errno == EBADF);
}

TEST_CASE("io reliability: a reused number's old file, still open through a dup, does not wake its new file's waiter") {
    Scheduler s(1, false);
    bool stale_woke = true, same_number = false;
    int stale_errno = 0;
    ssize_t fresh = 0;
    long ctl_calls = 0;
    s.start();
    s.schedule([&] {
        int p[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p) == 0);
        char c = 0;
        CHECK(read_after_park(p[0], &c, 5s, [&] { CHECK(::write(p[1], "1", 1) == 1); }) == 1);
        const int number = p[0];
        const int dup_of_old = ::dup(p[0]);  // keeps the old file, and its registration, alive
        REQUIRE(dup_of_old >= 0);
        ::close(p[0]);
        int q[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q) == 0);
        same_number = q[0] == number;
        const long ctl0 = fsched::detail::io_epoll_ctl_calls();
        // The old file becomes readable while the new one is waited for: its events carry
        // the old registration's generation.
        Scheduler::current()->schedule([&] { CHECK(::write(p[1], "x", 1) == 1); });
        stale_woke = fsched::io::wait(q[0], Ready::Read, 300ms);
        stale_errno = fsched::io::last_error();
        ctl_calls = fsched::detail::io_epoll_ctl_calls() - ctl0;
        fresh = read_after_park(q[0], &c, 3s, [&] { CHECK(::write(q[1], "2", 1) == 1); });
        ::close(dup_of_old);
        ::close(p[1]);
        ::close(q[0]);
        ::close(q[1]);
    });
    s.stop();
    CHECK(same_number);
    CHECK_FALSE(stale_woke);
    CHECK(stale_errno == ETIMEDOUT);
    CHECK(ctl_calls == 1);  // the new file's EPOLL_CTL_ADD
    CHECK(fresh == 1);
}

TEST_CASE("io reliability: a number reused by another eventfd (one shared inode) is re-armed, its wait woken") {
    // Every eventfd has the same device and inode, so fstat cannot tell the new one from the
    // closed one: unless the park re-arms, the new eventfd is not in the epoll set and the
    // wait sleeps until its timeout (then finds it ready, as a timed-out wait asks poll()).
    Scheduler s(1, false);
    bool first = false, second = false;
    std::chrono::steady_clock::duration second_took{};
    s.start();
    s.schedule([&] {
        const int a = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        REQUIRE(a >= 0);
        Scheduler::current()->schedule([a] { CHECK(eventfd_write(a, 1) == 0); });
        first = fsched::io::wait(a, Ready::Read, 5s);
        ::close(a);
        const int b = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        REQUIRE(b >= 0);
        if (b != a) {  // make it the same number
            REQUIRE(::dup2(b, a) == a);
            ::close(b);
        }
        Scheduler::current()->schedule([a] {
            fsched::this_fiber::sleep_for(20ms);
            CHECK(eventfd_write(a, 1) == 0);
        });
        const auto t0 = std::chrono::steady_clock::now();
        second = fsched::io::wait(a, Ready::Read, 8s);
        second_took = std::chrono::steady_clock::now() - t0;
        ::close(a);
    });
    s.stop();
    CHECK(first);
    CHECK(second);
    CHECK(second_took < 4s);
}

TEST_CASE("io reliability: a write on a known socket's number, taken over by a blocking pipe, is refused") {
    // The known socket's calls skip the non-blocking check; send() then says ENOTSOCK, and a
    // plain write() in its place would block the worker on the blocking pipe.
    Scheduler s(1, false);
    ssize_t got = 0, wrote = 0;
    int wrote_errno = 0;
    s.start();
    s.schedule([&] {
        int p[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p) == 0);
        char c = 0;
        got = read_after_park(p[0], &c, 5s, [&] { CHECK(::write(p[1], "1", 1) == 1); });  // now known
        Pipe blocking(false);
        REQUIRE(::dup2(blocking.write_end, p[0]) == p[0]);  // closes the socket behind io's back
        errno = 0;
        wrote = fsched::io::write(p[0], "y", 1);
        wrote_errno = fsched::io::last_error();
        ::close(p[0]);
        ::close(p[1]);
    });
    s.stop();
    CHECK(got == 1);
    CHECK(wrote == -1);
    CHECK(wrote_errno == EINVAL);
}

// Delayed validation: a known socket's waits trust its registration, and a sweep checks the
// ones that sleep long enough for the number to have been reused behind io's back.
namespace {

using test::known_peer;
using test::make_known;
using test::write_known_peer;

// A known non-blocking socket, closed with plain close(), its peer too; returns its number.
int known_socket_closed() {
    int p[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p) == 0);
    make_known(p[0], p[1]);
    ::close(p[0]);
    ::close(p[1]);
    return p[0];
}

// Moves `fd` to the number `number` (which must be free or fd's own); returns number.
int move_to(int fd, int number) {
    if (fd == number) return fd;
    REQUIRE(::dup2(fd, number) == number);
    ::close(fd);
    return number;
}

// Sets the sweep interval for the scope.
struct SweepInterval {
    explicit SweepInterval(std::chrono::milliseconds interval) { fsched::detail::set_io_sweep_interval(interval); }
    ~SweepInterval() { fsched::detail::set_io_sweep_interval(25ms); }
};

}  // namespace

TEST_CASE("io reliability: a known socket's number reused by a socket made outside io wakes its reader (sweep)") {
    // The new socket is not in the epoll set, and the read's park trusts the old socket's
    // registration: only the sweep's check of the parked reader registers the new socket.
    // Without it the read would sleep until its timeout (then find the byte: hence the clock).
    Scheduler s(1, false);
    ssize_t got = 0;
    char c = 0;
    bool same_number = false;
    long repairs = 0, stats = 0;
    std::chrono::steady_clock::duration took{};
    s.start();
    s.schedule([&] {
        const int number = known_socket_closed();
        int q[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q) == 0);
        same_number = q[0] == number;
        const long repairs0 = fsched::detail::io_sweep_repairs();
        const long stats0 = fsched::detail::io_fd_stats();
        const auto t0 = std::chrono::steady_clock::now();
        got = read_after_park(q[0], &c, 8s, [&] { CHECK(::write(q[1], "2", 1) == 1); });
        took = std::chrono::steady_clock::now() - t0;
        repairs = fsched::detail::io_sweep_repairs() - repairs0;
        stats = fsched::detail::io_fd_stats() - stats0;
        ::close(q[0]);
        ::close(q[1]);
    });
    s.stop();
    CHECK(same_number);
    CHECK(got == 1);
    CHECK(c == '2');
    CHECK(took < 4s);
    CHECK(repairs == 1);
    CHECK(stats == 0);  // the park trusted the registration
}

TEST_CASE("io reliability: a known socket's number reused by a pipe or an eventfd wakes its io::wait (sweep)") {
    // io::wait's poll() sees the new file not ready, and its park trusts the old socket's
    // registration; the sweep finds a file that is not a socket and registers it.
    enum Kind { pipe_kind, eventfd_kind };
    for (const Kind kind : {pipe_kind, eventfd_kind}) {
        CAPTURE(static_cast<int>(kind));
        Scheduler s(1, false);
        bool woke = false;
        long repairs = 0;
        std::chrono::steady_clock::duration took{};
        s.start();
        s.schedule([&] {
            const int number = known_socket_closed();
            int read_end = -1, write_end = -1;
            if (kind == pipe_kind) {
                int p[2];
                REQUIRE(pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
                write_end = p[1];
                read_end = move_to(p[0], number);
            } else {
                read_end = write_end = move_to(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), number);
            }
            const long repairs0 = fsched::detail::io_sweep_repairs();
            Scheduler::current()->schedule([&] {
                if (kind == pipe_kind) {
                    CHECK(::write(write_end, "p", 1) == 1);
                } else {
                    CHECK(eventfd_write(write_end, 1) == 0);
                }
            });
            const auto t0 = std::chrono::steady_clock::now();
            woke = fsched::io::wait(read_end, Ready::Read, 8s);
            took = std::chrono::steady_clock::now() - t0;
            repairs = fsched::detail::io_sweep_repairs() - repairs0;
            ::close(read_end);
            if (write_end != read_end) ::close(write_end);
        });
        s.stop();
        CHECK(woke);
        CHECK(took < 4s);
        CHECK(repairs == 1);
    }
}

TEST_CASE("io reliability: a reader trusting a stale registration on a number then closed gets EBADF, not a hang") {
    // The number is reused by a socket the reader parks on, then closed while it waits (a
    // user error): the sweep finds it closed. The interval is long enough that the close
    // comes before the check, however slow the machine.
    const SweepInterval interval(300ms);
    Scheduler s(1, false);
    ssize_t got = 0;
    int got_errno = 0;
    long repairs = 0;
    std::chrono::steady_clock::duration took{};
    s.start();
    s.schedule([&] {
        const int number = known_socket_closed();
        int q[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q) == 0);
        const int reused = move_to(q[0], number);
        const long repairs0 = fsched::detail::io_sweep_repairs();
        const auto t0 = std::chrono::steady_clock::now();
        char c = 0;
        got = read_after_park(reused, &c, 20s, [&] { ::close(reused); });
        got_errno = fsched::io::last_error();
        took = std::chrono::steady_clock::now() - t0;
        repairs = fsched::detail::io_sweep_repairs() - repairs0;
        ::close(q[1]);
    });
    s.stop();
    CHECK(got == -1);
    CHECK(got_errno == EBADF);
    CHECK(took < 10s);
    CHECK(repairs == 1);
}

TEST_CASE("io reliability: an accepted fd on a known socket's closed number is woken by its first data at once") {
    // accept() makes a new socket: its entry is renewed and registered there, so its first
    // read parks without an fstat and its data's edge wakes it, not a sweep. Trusting the
    // old entry, the read would be woken only by the sweep's repair.
    Scheduler s(1, false);
    ssize_t got = 0;
    char c = 0;
    bool same_number = false;
    long repairs = 0, stats = 0;
    s.start();
    s.schedule([&] {
        test::Listener tcp;
        const int listener = tcp.fd;
        sockaddr_in& addr = tcp.addr;
        const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // blocking: loopback connects at once
        REQUIRE(client >= 0);
        REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        const int number = known_socket_closed();
        const int server = fsched::io::accept(listener, nullptr, nullptr, 5s);
        REQUIRE(server >= 0);
        same_number = server == number;
        const long repairs0 = fsched::detail::io_sweep_repairs();
        const long stats0 = fsched::detail::io_fd_stats();
        got = read_after_park(server, &c, 8s, [&] { CHECK(::write(client, "a", 1) == 1); });
        repairs = fsched::detail::io_sweep_repairs() - repairs0;
        stats = fsched::detail::io_fd_stats() - stats0;
        ::close(server);
        ::close(client);
    });
    s.stop();
    CHECK(same_number);  // accept took the lowest free number
    CHECK(got == 1);
    CHECK(c == 'a');
    CHECK(repairs == 0);
    CHECK(stats == 0);
}

TEST_CASE("io reliability: an accept that cannot record its new fd still returns it, and the fd works") {
    Scheduler s(1, false);
    ssize_t got = 0;
    char c = 0;
    s.start();
    s.schedule([&] {
        test::Listener tcp;
        const int listener = tcp.fd;
        sockaddr_in& addr = tcp.addr;
        const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(client >= 0);
        REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        fsched::detail::inject_fault(fsched::detail::FaultSite::IoAlloc, 1);
        const int server = fsched::io::accept(listener, nullptr, nullptr, 5s);
        fsched::detail::inject_fault(fsched::detail::FaultSite::IoAlloc, 0);
        REQUIRE(server >= 0);
        const long stats0 = fsched::detail::io_fd_stats();
        got = read_after_park(server, &c, 8s, [&] { CHECK(::write(client, "f", 1) == 1); });
        CHECK(fsched::detail::io_fd_stats() - stats0 == 1);  // unrecorded: its park checks it
        ::close(server);
        ::close(client);
    });
    s.stop();
    CHECK(got == 1);
    CHECK(c == 'f');
}

TEST_CASE("io reliability: a connected fd on a known socket's closed number is registered by connect") {
    // socket() takes the closed number; connect's wait for the connection and the reads that
    // follow are woken by the new socket's edges, not by a sweep's repair.
    Scheduler s(1, false);
    ssize_t got = 0;
    int connected = -1;
    char c = 0;
    bool same_number = false;
    long repairs = 0;
    s.start();
    s.schedule([&] {
        test::Listener tcp;
        const int listener = tcp.fd;
        sockaddr_in& addr = tcp.addr;
        const int number = known_socket_closed();
        const int client = move_to(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), number);
        same_number = client == number;
        const long repairs0 = fsched::detail::io_sweep_repairs();
        connected = fsched::io::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr, 8s);
        const int server = fsched::io::accept(listener, nullptr, nullptr, 5s);
        REQUIRE(server >= 0);
        got = read_after_park(client, &c, 8s, [&] { CHECK(::write(server, "s", 1) == 1); });
        repairs = fsched::detail::io_sweep_repairs() - repairs0;
        ::close(server);
        ::close(client);
    });
    s.stop();
    CHECK(same_number);
    CHECK(connected == 0);
    CHECK(got == 1);
    CHECK(c == 's');
    CHECK(repairs == 0);
}

TEST_CASE("io reliability: sweeps stop once no waiter is unverified, and an idle scheduler makes none") {
    Scheduler s(2, false);
    s.start();
    // No waiter at all.
    long sweeps0 = fsched::detail::io_sweeps();
    std::this_thread::sleep_for(200ms);
    CHECK(fsched::detail::io_sweeps() - sweeps0 == 0);
    // A reader parked long on a known socket: checked by a sweep once, then left alone.
    Sockets pair;
    std::atomic<bool> known{false};
    std::atomic<ssize_t> got{0};
    const long checks0 = fsched::detail::io_sweep_checks();
    s.schedule([&] {
        make_known(pair.a, pair.b);
        known = true;
        char c = 0;
        got = fsched::io::read(pair.a, &c, 1, 20s);  // a trusted park: unverified
    });
    const auto until = std::chrono::steady_clock::now() + 10s;
    while ((!known || fsched::detail::io_sweep_checks() == checks0 || fsched::detail::io_sweeping(s)) &&
           std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
    }
    CHECK(fsched::detail::io_sweep_checks() - checks0 == 1);
    REQUIRE_FALSE(fsched::detail::io_sweeping(s));
    sweeps0 = fsched::detail::io_sweeps();
    std::this_thread::sleep_for(300ms);
    CHECK(fsched::detail::io_sweeps() - sweeps0 == 0);
    CHECK(got == 0);  // still parked
    REQUIRE(::write(pair.b, "2", 1) == 1);
    while (got == 0 && std::chrono::steady_clock::now() < until + 10s) std::this_thread::sleep_for(1ms);
    CHECK(got == 1);
    s.stop();
}

TEST_CASE("io reliability: a stale registration's reader on one worker is repaired while another sleeps polling") {
    // Worker `poller` sleeps in epoll_wait for a reader that never gets data, with no sweep
    // due (its wait was checked by fstat); the stale reader parks on the other worker, which
    // then sleeps too. The park must wake the poller to bound its sleep by the next sweep.
    Scheduler s(2, false);
    Sockets idle_pair;
    std::atomic<bool> idle_done{false};
    s.start();
    s.schedule([&] {
        char c = 0;
        fsched::io::read(idle_pair.a, &c, 1, 20s);
        idle_done = true;
    });
    auto until = std::chrono::steady_clock::now() + 10s;
    int poller = -1;
    while ((poller = fsched::detail::io_poller_worker(s)) < 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(poller >= 0);
    std::atomic<bool> done{false};
    std::atomic<int> peer{-1};
    ssize_t got = 0;
    char c = 0;
    std::chrono::steady_clock::duration took{};
    s.schedule([&] {
        const int number = known_socket_closed();
        int q[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q) == 0);
        const int reused = move_to(q[0], number);
        // Holds this worker so that the other one, woken by the wait above, is back asleep
        // in epoll_wait, with no sweep due, when the read below parks.
        std::this_thread::sleep_for(50ms);
        peer = q[1];
        const auto t0 = std::chrono::steady_clock::now();
        got = fsched::io::read(reused, &c, 1, 8s);
        took = std::chrono::steady_clock::now() - t0;
        ::close(reused);
        ::close(q[1]);
        done = true;
    }, 1 - poller);
    // Written from this thread once the reader has parked (its park turned the sweeps on):
    // no task of the scheduler's wakes the poller meanwhile.
    until = std::chrono::steady_clock::now() + 20s;
    while ((peer < 0 || !fsched::detail::io_sweeping(s)) && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(fsched::detail::io_sweeping(s));
    REQUIRE(::write(peer, "3", 1) == 1);
    while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    REQUIRE(done.load());
    CHECK(got == 1);
    CHECK(c == '3');
    CHECK(took < 4s);
    REQUIRE(::write(idle_pair.b, "x", 1) == 1);
    while (!idle_done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    s.stop();
}

TEST_CASE("io reliability: a fiber the use_caller thread parked on IO is resumed by another worker") {
    // run_pending() on the caller runs the reader, which parks in io::read, and returns; the
    // caller then leaves fsched alone. Worker 1 was asleep and not polling: the park must
    // make someone poll, or the reader waits until the caller next enters fsched.
    Sockets pair;
    Scheduler s(2, true);
    std::atomic<bool> done{false};
    std::atomic<int> ran_on{-2};
    s.start();
    std::this_thread::sleep_for(20ms);  // let worker 1 fall asleep
    s.schedule([&] {
        ran_on = Scheduler::worker_index();
        // Worker 1, woken by the push, finds nothing (the caller took the task) and falls
        // asleep again, not polling: no fiber waited for IO when it looked.
        std::this_thread::sleep_for(30ms);
        char c = 0;
        // No timeout: adding its timer would wake worker 1 (add_timer), which would then
        // take the poller role and hide the bug this checks.
        CHECK(fsched::io::read(pair.a, &c, 1) == 1);
        done = true;
    });
    const std::size_t ran = s.run_pending();
    CHECK(ran <= 1);
    REQUIRE(::write(pair.b, "x", 1) == 1);
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    INFO("the reader first ran on worker " << ran_on.load());
    CHECK(done.load());
    s.stop();
}

TEST_CASE("io reliability: when the poller gets a long task, an idle worker takes over the polling") {
    // The reader parks; once a worker sleeps in epoll_wait for it, that worker gets a task
    // that holds it (no yield) until the read is done, at most 10 s. The other worker is
    // idle and must take over the polling, or the read waits for the long task to end.
    Sockets pair;
    Scheduler s(2, false);
    std::atomic<bool> read_done{false}, read_during_busy{false}, busy_started{false}, busy_done{false};
    s.start();
    s.schedule([&] {
        char c = 0;
        CHECK(fsched::io::read(pair.a, &c, 1) == 1);
        read_done = true;
    });
    int poller = -1;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while ((poller = fsched::detail::io_poller_worker(s)) < 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(poller >= 0);
    s.schedule([&] {
        busy_started = true;
        const auto end = std::chrono::steady_clock::now() + 10s;
        while (!read_done && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
        read_during_busy = read_done.load();
        busy_done = true;
    }, poller);
    while (!busy_started) std::this_thread::sleep_for(1ms);
    REQUIRE(::write(pair.b, "x", 1) == 1);
    // Not stop() yet: it wakes every worker, and one would then poll.
    while (!busy_done) std::this_thread::sleep_for(1ms);
    s.stop();
    CHECK(read_during_busy.load());
}


// ---------------------------------------------------------------------------------------
// Reads that would fail: after a short read of a known stream socket, io::read parks without
// the read that would fail with EAGAIN.
// ---------------------------------------------------------------------------------------

TEST_CASE("io reliability: request/response on a TCP socket makes no read that fails with EAGAIN") {
    // A client writes a request, the server reads it (short: the buffer is larger) and
    // answers; the server's next read would fail with EAGAIN and is left out.
    constexpr int rounds = 500;
    Scheduler s(1, false);
    test::TcpPair pair;
    int served = 0, answered = 0;
    long skipped = 0, eagain = 0;
    s.start();
    s.schedule([&] {
        Scheduler::current()->schedule([&] {  // the client
            char reply[64];
            for (int i = 0; i < rounds; ++i) {
                if (fsched::io::write(pair.b, "GET", 3, 5s) != 3) break;
                if (fsched::io::read(pair.b, reply, sizeof reply, 5s) != 2) break;
                ++answered;
            }
            ::shutdown(pair.b, SHUT_WR);
        });
        const long skipped0 = fsched::detail::io_reads_skipped();
        const long eagain0 = fsched::detail::io_reads_eagain();
        char request[64];
        for (;;) {
            const ssize_t n = fsched::io::read(pair.a, request, sizeof request, 5s);
            if (n <= 0) break;  // the client's end: 0
            if (fsched::io::write(pair.a, "OK", 2, 5s) != 2) break;
            ++served;
        }
        skipped = fsched::detail::io_reads_skipped() - skipped0;
        eagain = fsched::detail::io_reads_eagain() - eagain0;
    });
    s.stop();
    CHECK(served == rounds);
    CHECK(answered == rounds);
    CAPTURE(skipped);
    CAPTURE(eagain);
    // Both sides' reads after their first: about 2 x 500 skipped, only the very first ones
    // (before any short read) fail with EAGAIN.
    CHECK(skipped >= rounds);
    CHECK(eagain <= 4);
}

TEST_CASE("io reliability: a short read then the peer's close: the next read returns 0, it does not wait for an edge that came already") {
    for (const bool close_first : {false, true}) {  // the edges taken before the short read, or after
        CAPTURE(close_first);
        Scheduler s(1, false);
        test::TcpPair pair;
        ssize_t first = -2, second = -2, third = -2;
        std::chrono::steady_clock::duration took{};
        s.start();
        s.schedule([&] {
            char buf[64];
            make_known(pair.a, pair.b);
            // Data and the end together, and their edges taken (`taken_first`) or not yet
            // before the short read: either way no edge is left to come after it.
            REQUIRE(::write(pair.b, "yz", 2) == 2);
            ::shutdown(pair.b, SHUT_WR);
            if (close_first) fsched::detail::io_poll_now();
            second = fsched::io::read(pair.a, buf, sizeof buf, 5s);  // short
            const auto t0 = std::chrono::steady_clock::now();
            third = fsched::io::read(pair.a, buf, sizeof buf, 20s);
            took = std::chrono::steady_clock::now() - t0;
            first = 1;
        });
        s.stop();
        CHECK(took < 10s);  // at once, not at the timeout
        CHECK(first == 1);
        CHECK(second == 2);
        CHECK(third == 0);
    }
}

// Takes the ready events out of epoll as a worker would, once the data written has arrived
// (on loopback TCP it may come a moment after the write); returns how many were for
// waited-for fds.
int take_edges() {
    const auto until = std::chrono::steady_clock::now() + 5s;
    int events = 0;
    while (events == 0 && std::chrono::steady_clock::now() < until) events = fsched::detail::io_poll_now();
    return events;
}

// The after-read hook of the test below: once, while the first read is under way, more data
// comes and its edge is taken (as another worker would take it), before the short read is
// recorded. It writes to edge_peer, as land_edge_before_park does.
int edge_hook_calls = 0;
void land_edge_during_read(int) {
    if (edge_hook_calls++ != 0) return;
    CHECK(::write(edge_peer, "cdefghij", 8) == 8);
    CHECK(take_edges() == 1);
}

// The short read of the tests below: "ab" is queued on `fd` by its peer `peer`, its edge
// taken, and io::read reads it with `hook` as the after-read hook (which writes to `peer`).
ssize_t short_read_with_hook(int fd, int peer, char* buf, std::size_t size, void (*hook)(int)) {
    REQUIRE(::write(peer, "ab", 2) == 2);
    CHECK(take_edges() == 1);  // its edge, before the read
    edge_peer = peer;
    edge_hook_calls = 0;
    fsched::detail::set_io_after_read_hook(hook);
    const ssize_t n = fsched::io::read(fd, buf, size, 5s);
    fsched::detail::set_io_after_read_hook(nullptr);
    return n;
}

// An io::read of `fd` with a 20 s timeout: what it returned, whether it left out its system
// call (and parked), and how long it took.
struct TimedRead {
    ssize_t n = -2;
    long skipped = -1;
    std::chrono::steady_clock::duration took{};
};
TimedRead timed_read(int fd, char* buf, std::size_t size) {
    TimedRead r;
    const long skipped_before = fsched::detail::io_reads_skipped();
    const auto t0 = std::chrono::steady_clock::now();
    r.n = fsched::io::read(fd, buf, size, 20s);
    r.took = std::chrono::steady_clock::now() - t0;
    r.skipped = fsched::detail::io_reads_skipped() - skipped_before;
    return r;
}

// Runs `body` in a task of a one-worker scheduler, with a loopback TCP pair whose end `a`
// io knows already (make_known: a registration and the edge of its "k"); returns once the
// scheduler has stopped, so tasks `body` queues may use the pair.
void with_known_tcp_pair(const std::function<void(test::TcpPair&, char (&buf)[64])>& body) {
    Scheduler s(1, false);
    test::TcpPair pair;
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(pair.a, pair.b);
        body(pair, buf);
    });
    s.stop();
}

TEST_CASE("io reliability: an edge taken while a short read is under way: the read after a full read is made, not skipped") {
    // The first read comes short ("ab"), but the edge for the 8 bytes written behind it is
    // taken before it records that: the queue is not empty. The second read takes 4 of them
    // (a full read, which empties nothing); the third must read the other 4 at once. No edge
    // is left to come for them: parking there waited for the timeout (a soak run saw a
    // reader and a writer of a socketpair wait for each other that way).
    ssize_t first = -2, second = -2;
    TimedRead third;
    with_known_tcp_pair([&](test::TcpPair& pair, char (&buf)[64]) {
        first = short_read_with_hook(pair.a, pair.b, buf, sizeof buf, &land_edge_during_read);
        second = fsched::io::read(pair.a, buf, 4, 5s);
        third = timed_read(pair.a, buf, sizeof buf);
        CHECK(std::string(buf, third.n > 0 ? static_cast<std::size_t>(third.n) : 0) == "ghij");
    });
    CHECK(edge_hook_calls >= 1);
    CHECK(first == 2);
    CHECK(second == 4);
    CHECK(third.n == 4);
    CHECK(third.skipped == 0);
    CHECK(third.took < 10s);  // at once, not at the timeout
}

TEST_CASE("io reliability: an edge taken while a short read is under way, then io::wait: the next read is made, not skipped") {
    // As above, but io::wait() takes the edge kept for the 8 bytes: the read after it must
    // still be made, since no edge is left to come for them.
    ssize_t first = -2;
    bool waited = false;
    TimedRead second;
    with_known_tcp_pair([&](test::TcpPair& pair, char (&buf)[64]) {
        first = short_read_with_hook(pair.a, pair.b, buf, sizeof buf, &land_edge_during_read);
        waited = fsched::io::wait(pair.a, fsched::io::Ready::Read, 5s);
        second = timed_read(pair.a, buf, sizeof buf);
    });
    CHECK(edge_hook_calls >= 1);
    CHECK(first == 2);
    CHECK(waited);
    CHECK(second.n == 8);
    CHECK(second.skipped == 0);
    CHECK(second.took < 10s);
}

TEST_CASE("io reliability: the read made after a skipped read's wait timed out says anew whether the next may be skipped") {
    // A short read, then a read that skips its system call and parks with a short timeout.
    // Data comes while the only worker is busy, so its edge stays in epoll: the timer ends
    // the wait, the fd is ready, and the read is made (a full one, leaving 4 bytes). The
    // read after that must be made too: the short read is no longer the latest.
    ssize_t first = -2, second = -2, third = -2;
    long skipped_second = -1, skipped_third = -1;
    with_known_tcp_pair([&](test::TcpPair& pair, char (&buf)[64]) {
        REQUIRE(::write(pair.b, "ab", 2) == 2);
        CHECK(take_edges() == 1);
        first = fsched::io::read(pair.a, buf, sizeof buf, 5s);  // short
        // Queued behind this fiber, it runs once the read below has parked, and outlasts
        // that read's timeout by far.
        Scheduler::current()->schedule([&pair] {
            CHECK(::write(pair.b, "cdefghij", 8) == 8);
            const auto until = std::chrono::steady_clock::now() + 300ms;
            while (std::chrono::steady_clock::now() < until) {
            }
        });
        long before = fsched::detail::io_reads_skipped();
        second = fsched::io::read(pair.a, buf, 4, 20ms);
        skipped_second = fsched::detail::io_reads_skipped() - before;
        before = fsched::detail::io_reads_skipped();
        third = fsched::io::read(pair.a, buf, sizeof buf, 20s);
        skipped_third = fsched::detail::io_reads_skipped() - before;
    });
    CHECK(first == 2);
    CHECK(second == 4);
    CHECK(skipped_second == 1);
    CHECK(third == 4);
    CHECK(skipped_third == 0);
}

TEST_CASE("io reliability: an edge another fiber's io::wait takes while a short read is under way: the next read is made, not skipped") {
    // W waits in io::wait for the fd R reads. R's read comes short ("ab"), and the edge for
    // the 8 bytes written behind it goes to W while the read is under way: nothing of it is
    // left in `ready`, yet the queue is not empty and no edge is left to come for it.
    ssize_t first = -2;
    bool waited = false;
    TimedRead second;
    with_known_tcp_pair([&](test::TcpPair& pair, char (&buf)[64]) {
        Scheduler::current()->schedule([&] { waited = fsched::io::wait(pair.a, fsched::io::Ready::Read, 20s); });
        fsched::this_fiber::yield();  // W parks in its wait
        REQUIRE(::write(pair.b, "ab", 2) == 2);
        pollfd arrived{pair.a, POLLIN, 0};
        const auto limit = std::chrono::steady_clock::now() + 10s;
        while (::poll(&arrived, 1, 0) != 1 && std::chrono::steady_clock::now() < limit) {
        }
        edge_peer = pair.b;
        edge_hook_calls = 0;
        fsched::detail::set_io_after_read_hook(&land_edge_during_read);  // its edge wakes W
        first = fsched::io::read(pair.a, buf, sizeof buf, 5s);
        fsched::detail::set_io_after_read_hook(nullptr);
        second = timed_read(pair.a, buf, sizeof buf);
        REQUIRE(::write(pair.b, "z", 1) == 1);  // W, woken for data R took, waits again: end it
    });
    CHECK(edge_hook_calls >= 1);
    CHECK(first == 2);
    CHECK(second.n == 8);
    CHECK(second.skipped == 0);
    CHECK(second.took < 10s);
    CHECK(waited);
}

// The after-read hook of the test below, once: io::cancel() forgets the fd's entry while
// the read is under way, and the edges of a new one are counted as the old one's were: a
// read that parks and registers the fd anew ("B" written just before it parks), then "C",
// whose edge an io::wait takes.
void forget_during_read(int fd) {
    if (edge_hook_calls++ != 0) return;
    fsched::io::cancel(fd);
    fsched::detail::set_io_before_park_hook(&write_known_peer);  // "k": the nested read's byte
    char c = 0;
    CHECK(fsched::io::read(fd, &c, 1, 5s) == 1);
    fsched::detail::set_io_before_park_hook(nullptr);
    CHECK(c == 'k');
    CHECK(::write(edge_peer, "C", 1) == 1);
    CHECK(take_edges() == 1);
    CHECK(fsched::io::wait(fd, fsched::io::Ready::Read, 5s));
}

TEST_CASE("io reliability: io::cancel() while a short read is under way: the next read is made, not skipped") {
    // The entry made after the cancel counts its read edges from nothing: the read's count
    // from before may come round again (here: a registration, the edge of "k", the edge of
    // "C"), with "C" queued and its edge gone to io::wait. Counts of two entries are never
    // equal: they come from one counter of the scheduler's.
    ssize_t first = -2;
    TimedRead second;
    with_known_tcp_pair([&](test::TcpPair& pair, char (&buf)[64]) {  // a registration, an edge
        known_peer = pair.b;
        // "ab" and a third edge, then the read, short.
        first = short_read_with_hook(pair.a, pair.b, buf, sizeof buf, &forget_during_read);
        second = timed_read(pair.a, buf, sizeof buf);  // "C"
    });
    CHECK(edge_hook_calls >= 1);
    CHECK(first == 2);
    CHECK(second.n == 1);
    CHECK(second.skipped == 0);
    CHECK(second.took < 10s);
}

TEST_CASE("io reliability: an AF_UNIX stream read stops after a message with file descriptors: the next read is made, not skipped") {
    // "AA" carries a file descriptor: the read takes it and stops there, short, with "BB"
    // queued behind it and its edge taken already. Only TCP reads are ever skipped.
    Scheduler s(1, false);
    Sockets pair;
    ssize_t first = -2;
    TimedRead second;
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(pair.a, pair.b);
        const int passed = ::dup(0);
        REQUIRE(passed >= 0);
        char data[2] = {'A', 'A'};
        iovec iov{data, sizeof data};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(cmsg), &passed, sizeof passed);
        REQUIRE(::sendmsg(pair.b, &msg, 0) == 2);
        ::close(passed);
        REQUIRE(::write(pair.b, "BB", 2) == 2);
        CHECK(take_edges() == 1);
        first = fsched::io::read(pair.a, buf, sizeof buf, 5s);  // "AA", and the fd is dropped
        second = timed_read(pair.a, buf, sizeof buf);
        CHECK(std::string(buf, second.n > 0 ? static_cast<std::size_t>(second.n) : 0) == "BB");
    });
    s.stop();
    CHECK(first == 2);
    CHECK(second.n == 2);
    CHECK(second.skipped == 0);
    CHECK(second.took < 10s);
}

TEST_CASE("io reliability: a datagram socket's second queued message is read at once after a short read of the first") {
    // One message per read: a short read does not mean the queue is empty, and no edge
    // comes for the second message, which was there before the first read.
    for (const int type : {SOCK_DGRAM, SOCK_SEQPACKET}) {
        CAPTURE(type);
        int fds[2];
        REQUIRE(socketpair(AF_UNIX, type | SOCK_NONBLOCK, 0, fds) == 0);
        Scheduler s(1, false);
        ssize_t got[3] = {-2, -2, -2};
        long skipped = -1;
        std::chrono::steady_clock::duration took{};
        s.start();
        s.schedule([&] {
            char buf[64];
            make_known(fds[0], fds[1]);
            REQUIRE(::write(fds[1], "a", 1) == 1);
            REQUIRE(::write(fds[1], "bb", 2) == 2);
            REQUIRE(::write(fds[1], "ccc", 3) == 3);
            fsched::detail::io_poll_now();  // the messages' edges are taken: none is left to come
            const long skipped0 = fsched::detail::io_reads_skipped();
            got[0] = fsched::io::read(fds[0], buf, sizeof buf, 5s);  // short
            const auto t0 = std::chrono::steady_clock::now();
            got[1] = fsched::io::read(fds[0], buf, sizeof buf, 20s);
            got[2] = fsched::io::read(fds[0], buf, sizeof buf, 20s);
            took = std::chrono::steady_clock::now() - t0;
            skipped = fsched::detail::io_reads_skipped() - skipped0;
        });
        s.stop();
        close(fds[0]);
        close(fds[1]);
        CHECK(got[0] == 1);
        CHECK(got[1] == 2);
        CHECK(got[2] == 3);
        CHECK(skipped == 0);
        CHECK(took < 10s);
    }
}

TEST_CASE("io reliability: after urgent data a short read stops at its mark, and the data behind it is read at once") {
    // TCP urgent data (MSG_OOB, not inline): a read stops at the mark, short, with data
    // still queued behind it and no edge left to come for that data.
    test::Listener tcp;
    const int client = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&tcp.addr), sizeof tcp.addr) == 0);
    const int server = ::accept4(tcp.fd, nullptr, nullptr, SOCK_NONBLOCK);  // connected at once on loopback
    REQUIRE(server >= 0);
    Scheduler s(1, false);
    ssize_t got[2] = {-2, -2};
    std::chrono::steady_clock::duration took{};
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(server, client);
        REQUIRE(::send(client, "ab", 2, 0) == 2);
        REQUIRE(::send(client, "!", 1, MSG_OOB) == 1);
        REQUIRE(::send(client, "cd", 2, 0) == 2);
        // Everything has arrived once the urgent byte can be read; then take the edges.
        const auto limit = std::chrono::steady_clock::now() + 10s;
        char urgent = 0;
        while (::recv(server, &urgent, 1, MSG_OOB | MSG_PEEK) != 1 && std::chrono::steady_clock::now() < limit) {
            fsched::this_fiber::sleep_for(1ms);
        }
        fsched::this_fiber::sleep_for(5ms);  // "cd" behind it
        fsched::detail::io_poll_now();
        got[0] = fsched::io::read(server, buf, sizeof buf, 5s);  // "ab": short, at the mark
        const auto t0 = std::chrono::steady_clock::now();
        got[1] = fsched::io::read(server, buf, sizeof buf, 20s);  // "cd"
        took = std::chrono::steady_clock::now() - t0;
    });
    s.stop();
    ::close(server);
    ::close(client);
    CHECK(got[0] == 2);
    CHECK(got[1] == 2);
    CHECK(took < 10s);
}

TEST_CASE("io reliability: a stray fd number far beyond the open ones fails with EBADF") {
    // Numbers no file can have (above any RLIMIT_NOFILE), from a fiber whose scheduler
    // already knows an fd: each call fails with EBADF, none waits out its timeout, and none
    // leaves an entry in the scheduler's fd table (kept for its life: a program passing
    // stray numbers would otherwise grow it by one each, up to INT_MAX of them).
    Scheduler s(1, false);
    int checked = 0;
    std::size_t known = 0, after = 0;
    std::chrono::steady_clock::duration took{};
    s.start();
    s.schedule([&] {
        Sockets pair;
        char c = 0;
        CHECK(fsched::io::write(pair.b, "x", 1) == 1);  // an fd the scheduler knows
        CHECK(fsched::io::read(pair.a, &c, 1, 1s) == 1);
        known = fsched::detail::io_fd_entries(s);
        const auto t0 = std::chrono::steady_clock::now();
        for (const int stray : {2000000000, 2147483647, (1 << 24) + 5}) {
            // Each call's result and error taken at once: a check's report may set errno.
            const ssize_t read = fsched::io::read(stray, &c, 1, 10s);
            const int read_error = fsched::io::last_error();
            const ssize_t wrote = fsched::io::write(stray, "x", 1, 10s);
            const int write_error = fsched::io::last_error();
            const bool readable = fsched::io::wait(stray, Ready::Read, 10s);
            const int wait_error = fsched::io::last_error();
            const bool writable = fsched::io::wait(stray, Ready::Write, 0ms);
            const int poll_error = fsched::io::last_error();
            CHECK(read == -1);
            CHECK(read_error == EBADF);
            CHECK(wrote == -1);
            CHECK(write_error == EBADF);
            CHECK_FALSE(readable);
            CHECK(wait_error == EBADF);
            CHECK_FALSE(writable);
            CHECK(poll_error == EBADF);
            fsched::io::cancel(stray);
            ++checked;
        }
        took = std::chrono::steady_clock::now() - t0;
        after = fsched::detail::io_fd_entries(s);
    });
    s.stop();
    CHECK(checked == 3);
    CHECK(took < 5s);  // no call waited for its timeout (10 s)
    CHECK(known >= 1);  // pair.a's at least: the count moves (next test too)
    CHECK(after == known);
}

TEST_CASE("io reliability: an open number gets an entry in the fd table, kept once it is closed") {
    Scheduler s(1, false);
    std::size_t before = 0, after_open = 0, after_closed = 0;
    int closed_errors = 0;
    s.start();
    s.schedule([&] {
        before = fsched::detail::io_fd_entries(s);
        char c = 0;
        int closed_number = -1;
        {
            Sockets pair;
            CHECK(fsched::io::write(pair.b, "x", 1) == 1);
            CHECK(fsched::io::read(pair.a, &c, 1, 1s) == 1);
            after_open = fsched::detail::io_fd_entries(s);
            closed_number = pair.a;
        }
        // Closed since: its entry stays (forgotten), and the calls fail at once with EBADF.
        if (!fsched::io::wait(closed_number, Ready::Read, 10s) && fsched::io::last_error() == EBADF) ++closed_errors;
        if (fsched::io::read(closed_number, &c, 1, 10s) == -1 && fsched::io::last_error() == EBADF) ++closed_errors;
        after_closed = fsched::detail::io_fd_entries(s);
    });
    s.stop();
    CHECK(after_open >= before + 1);  // pair.a's, and pair.b's unless the write went straight through
    CHECK(after_open <= before + 2);
    CHECK(closed_errors == 2);
    CHECK(after_closed == after_open);
}

TEST_CASE("io reliability: neighbouring fd numbers and the highest the limit allows keep their waits apart") {
    // Each number's read parks and is woken by its own write; a cancel of one number wakes
    // its reader, not its neighbour's; then all are closed and made again under the same
    // numbers, whose entries the io layer keeps (forgotten, not erased).
    rlimit limit{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
    const auto is_free = [](int n) { return ::fcntl(n, F_GETFD) == -1 && errno == EBADF; };
    int highest = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20)) - 1;
    while (highest > 512 && !is_free(highest)) --highest;
    REQUIRE(highest > 512);
    // Two neighbouring free numbers below it (dup2 would close a number in use).
    int low = 100;
    while (low + 2 < highest && !(is_free(low) && is_free(low + 1))) ++low;
    REQUIRE(low + 2 < highest);
    const std::vector<int> numbers{low, low + 1, highest};
    Scheduler s(2, false);
    std::atomic<int> rounds{0};
    s.start();
    s.schedule([&] {
        for (int round = 0; round < 2; ++round) {
            std::vector<int> readers, writers;
            for (const int number : numbers) {
                Sockets pair;
                readers.push_back(move_to(pair.a, number));
                writers.push_back(pair.b);
                pair.a = pair.b = -1;
            }
            // A read parked on every number at once; each woken by its own writer.
            fsched::WaitGroup wg;
            std::atomic<int> got{0};
            for (std::size_t i = 0; i < numbers.size(); ++i) {
                wg.add(1);
                Scheduler::current()->schedule([&, i] {
                    char c = 0;
                    if (fsched::io::read(readers[i], &c, 1, 10s) == 1 && c == static_cast<char>('a' + i)) ++got;
                    wg.done();
                });
            }
            fsched::this_fiber::sleep_for(20ms);  // let them park
            for (std::size_t i = 0; i < numbers.size(); ++i) {
                const char c = static_cast<char>('a' + i);
                CHECK(fsched::io::write(writers[i], &c, 1) == 1);
            }
            wg.wait();
            CHECK(got.load() == static_cast<int>(numbers.size()));
            // A cancel of one number wakes its reader alone.
            std::atomic<int> cancelled{0}, timed_out{0};
            for (std::size_t i = 0; i < 2; ++i) {
                wg.add(1);
                Scheduler::current()->schedule([&, i] {
                    char c = 0;
                    const ssize_t r = fsched::io::read(readers[i], &c, 1, i == 0 ? 10s : 300ms);
                    const int error = fsched::io::last_error();
                    if (r == -1 && error == ECANCELED) ++cancelled;
                    if (r == -1 && error == ETIMEDOUT) ++timed_out;
                    wg.done();
                });
            }
            // A cancel reaches the calls under way: repeated until reader 0's has begun.
            const auto until = std::chrono::steady_clock::now() + 10s;
            while (cancelled.load() == 0 && std::chrono::steady_clock::now() < until) {
                fsched::io::cancel(readers[0]);  // its neighbour waits on
                fsched::this_fiber::sleep_for(5ms);
            }
            wg.wait();
            CHECK(cancelled.load() == 1);
            CHECK(timed_out.load() == 1);
            for (std::size_t i = 0; i < numbers.size(); ++i) {
                ::close(readers[i]);
                ::close(writers[i]);
            }
            ++rounds;
        }
    });
    s.stop();
    CHECK(rounds.load() == 2);
}

#endif  // FIBER_SCHED_HAVE_EPOLL
