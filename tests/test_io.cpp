// fsched::io over real sockets on loopback: echo, timeouts, wake-ups across threads,
// half-close and EOF, cancel, bad fds; at 1, 2 and 4 workers.
#include "fiber_sched.hpp"
#include "helpers.hpp"
#include "listener.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(FIBER_SCHED_HAVE_EPOLL)

using fsched::Scheduler;
using fsched::io::Ready;
using test::Listener;
using namespace std::chrono_literals;

namespace {

#if defined(FIBER_SCHED_TSAN)
constexpr int echo_clients = 60;
#else
constexpr int echo_clients = 300;
#endif

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A non-blocking connected pair of stream sockets.
struct SocketPair {
    int a = -1, b = -1;
    SocketPair() {
        int fds[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
        a = fds[0];
        b = fds[1];
        set_nonblocking(a);
        set_nonblocking(b);
    }
    ~SocketPair() {
        if (a >= 0) close(a);
        if (b >= 0) close(b);
    }
};

// Writes all of `n` bytes, or fails.
bool write_all(int fd, const char* data, std::size_t n) {
    while (n > 0) {
        const ssize_t w = fsched::io::write(fd, data, n, 5s);
        if (w <= 0) return false;
        data += w;
        n -= static_cast<std::size_t>(w);
    }
    return true;
}

bool read_exactly(int fd, char* data, std::size_t n) {
    while (n > 0) {
        const ssize_t r = fsched::io::read(fd, data, n, 5s);
        if (r <= 0) return false;
        data += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

}  // namespace

TEST_CASE("io: an echo server serves hundreds of concurrent client fibers, every byte checked") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        CAPTURE(threads);
        Scheduler s(threads, false, "echo");
        Listener listener;
        std::atomic<int> good_clients{0};
        std::atomic<int> served{0};
        s.start();
        s.schedule([&] {  // the acceptor
            for (int i = 0; i < echo_clients; ++i) {
                const int conn = fsched::io::accept(listener.fd, nullptr, nullptr, 10s);
                if (conn < 0) break;
                Scheduler::current()->schedule([&, conn] {  // one fiber per connection
                    char buf[4096];
                    for (;;) {
                        const ssize_t r = fsched::io::read(conn, buf, sizeof buf, 10s);
                        if (r <= 0) break;  // EOF: the client is done
                        if (!write_all(conn, buf, static_cast<std::size_t>(r))) break;
                    }
                    close(conn);
                    served++;
                });
            }
        });
        for (int c = 0; c < echo_clients; ++c) {
            s.schedule([&, c] {
                const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
                if (fsched::io::connect(fd, reinterpret_cast<const sockaddr*>(&listener.addr),
                                        sizeof listener.addr, 10s) != 0) {
                    close(fd);
                    return;
                }
                std::string message;
                for (int k = 0; k < 200 + c * 37 % 3000; ++k) message.push_back(static_cast<char>('a' + (k * 7 + c) % 26));
                bool ok = true;
                for (int round = 0; round < 3 && ok; ++round) {
                    std::string echoed(message.size(), '\0');
                    ok = write_all(fd, message.data(), message.size()) &&
                         read_exactly(fd, &echoed[0], echoed.size()) && echoed == message;
                }
                close(fd);
                good_clients += ok;
            });
        }
        s.stop();
        CHECK(good_clients == echo_clients);
        CHECK(served == echo_clients);
    }
}

TEST_CASE("io: timeouts that fire and ones that do not") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        Scheduler s(threads, false);
        SocketPair pair;
        bool timed_out = false;
        int timeout_errno = 0;
        std::chrono::steady_clock::duration waited{};
        ssize_t read_result = 0;
        int read_errno = 0;
        bool ready_in_time = false;
        fsched::WaitGroup timed_out_both(1);  // the writer writes only after both timeouts
        s.start();
        s.schedule([&] {
            const auto start = std::chrono::steady_clock::now();
            timed_out = !fsched::io::wait(pair.a, Ready::Read, 20ms);
            timeout_errno = fsched::io::last_error();
            waited = std::chrono::steady_clock::now() - start;
            char c;
            read_result = fsched::io::read(pair.a, &c, 1, 5ms);
            read_errno = fsched::io::last_error();
            timed_out_both.done();
            // Now one that does not time out: data arrives after 10 ms, well within 5 s.
            ready_in_time = fsched::io::wait(pair.a, Ready::Read, 5s);
        });
        s.schedule([&] {
            timed_out_both.wait();
            fsched::this_fiber::sleep_for(10ms);
            char c = 'x';
            CHECK(::write(pair.b, &c, 1) == 1);
        });
        s.stop();
        CHECK(timed_out);
        CHECK(timeout_errno == ETIMEDOUT);
        CHECK(waited >= 20ms);
        CHECK(read_result == -1);
        CHECK(read_errno == ETIMEDOUT);
        CHECK(ready_in_time);
    }
}

TEST_CASE("io: a reader fiber is woken by a writer on another thread") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        Scheduler s(threads, false);
        SocketPair pair;
        std::string got;
        s.start();
        s.schedule([&] {
            char buf[64];
            const ssize_t r = fsched::io::read(pair.a, buf, sizeof buf);
            if (r > 0) got.assign(buf, static_cast<std::size_t>(r));
        });
        std::thread writer([&] {
            std::this_thread::sleep_for(20ms);  // the reader parks first
            CHECK(::write(pair.b, "hello", 5) == 5);
        });
        writer.join();
        s.stop();
        CHECK(got == "hello");
    }
}

TEST_CASE("io: a reader and a writer fiber wait on the same fd") {
    Scheduler s(2, false);
    SocketPair pair;
    // Fill a's send buffer so a writer on `a` must wait, while a reader on `a` waits too.
    std::vector<char> junk(1 << 16, 'j');
    while (::write(pair.a, junk.data(), junk.size()) > 0) {
    }
    std::atomic<bool> read_done{false};
    std::atomic<bool> write_done{false};
    s.start();
    s.schedule([&] {
        char c;
        read_done = fsched::io::read(pair.a, &c, 1, 5s) == 1 && c == 'r';
    });
    s.schedule([&] {
        write_done = fsched::io::write(pair.a, "w", 1, 5s) == 1;
    });
    s.schedule([&] {
        fsched::this_fiber::sleep_for(20ms);
        CHECK(::write(pair.b, "r", 1) == 1);  // wakes the reader
        std::vector<char> sink(1 << 16);
        for (int i = 0; i < 64 && !write_done; ++i) {  // drain: wakes the writer
            ssize_t r = ::read(pair.b, sink.data(), sink.size());
            (void)r;
            fsched::this_fiber::sleep_for(1ms);
        }
    });
    s.stop();
    CHECK(read_done);
    CHECK(write_done);
}

TEST_CASE("io: half-close and EOF") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        Scheduler s(threads, false);
        Listener listener;
        std::string received;
        ssize_t eof = -2;
        bool reply_ok = false;
        s.start();
        s.schedule([&] {
            const int conn = fsched::io::accept(listener.fd, nullptr, nullptr, 5s);
            REQUIRE(conn >= 0);
            char buf[16];
            ssize_t r;
            while ((r = fsched::io::read(conn, buf, sizeof buf, 5s)) > 0) received.append(buf, static_cast<std::size_t>(r));
            eof = r;  // 0 once the client shut down its side
            reply_ok = fsched::io::write(conn, "bye", 3, 5s) == 3;  // our side is still open
            close(conn);
        });
        std::string reply;
        s.schedule([&] {
            const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            REQUIRE(fsched::io::connect(fd, reinterpret_cast<const sockaddr*>(&listener.addr), sizeof listener.addr, 5s) == 0);
            CHECK(fsched::io::write(fd, "half", 4, 5s) == 4);
            shutdown(fd, SHUT_WR);
            char buf[16];
            ssize_t r;
            while ((r = fsched::io::read(fd, buf, sizeof buf, 5s)) > 0) reply.append(buf, static_cast<std::size_t>(r));
            CHECK(r == 0);
            close(fd);
        });
        s.stop();
        CHECK(received == "half");
        CHECK(eof == 0);
        CHECK(reply_ok);
        CHECK(reply == "bye");
    }
}

TEST_CASE("io: cancel wakes every waiter with ECANCELED, and the fd can then be closed") {
    for (std::size_t threads : {1u, 2u, 4u}) {
        Scheduler s(threads, false);
        SocketPair pair;
        std::vector<char> junk(1 << 16, 'j');
        while (::write(pair.a, junk.data(), junk.size()) > 0) {
        }
        std::atomic<int> cancelled{0};
        s.start();
        s.schedule([&] {
            if (!fsched::io::wait(pair.a, Ready::Read) && fsched::io::last_error() == ECANCELED) cancelled++;
        });
        s.schedule([&] {
            if (!fsched::io::wait(pair.a, Ready::Write) && fsched::io::last_error() == ECANCELED) cancelled++;
        });
        std::thread plain([&] {  // a plain thread waiting on the same fd, in poll()
            if (!fsched::io::wait(pair.a, Ready::Read) && fsched::io::last_error() == ECANCELED) cancelled++;
        });
        std::this_thread::sleep_for(30ms);
        fsched::io::cancel(pair.a);
        plain.join();
        s.stop();  // both fibers were woken, or this would never return
        CHECK(cancelled == 3);
        close(pair.a);
        pair.a = -1;
    }
}

TEST_CASE("io: bad input gives the system call's error, never a crash or a hang") {
    Scheduler s(2, false);
    int bad_wait = 0, bad_read = 0, blocking_read = 0, bad_accept = 0, refused = 0, busy = 0;
    SocketPair pair;
    s.start();
    s.schedule([&] {
        CHECK_FALSE(fsched::io::wait(-1, Ready::Read, 10ms));
        bad_wait = fsched::io::last_error();
        char c;
        CHECK(fsched::io::read(12345, &c, 1) == -1);  // not an open fd
        bad_read = fsched::io::last_error();
        int blocking[2];
        REQUIRE(pipe(blocking) == 0);
        CHECK(fsched::io::read(blocking[0], &c, 1) == -1);  // blocking: refused, not a hang
        blocking_read = fsched::io::last_error();
        close(blocking[0]);
        close(blocking[1]);
        CHECK(fsched::io::accept(pair.a, nullptr, nullptr, 10ms) == -1);  // not listening
        bad_accept = fsched::io::last_error();
        // Nothing listens on this port: the connection is refused.
        Listener closed_listener;
        sockaddr_in addr = closed_listener.addr;
        close(closed_listener.fd);
        closed_listener.fd = socket(AF_INET, SOCK_STREAM, 0);
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        CHECK(fsched::io::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr, 5s) == -1);
        refused = fsched::io::last_error();
        close(fd);
    });
    std::atomic<int> woken{0};
    s.schedule([&] {  // two fibers waiting for the same fd and direction
        // Whichever comes second, the other is parked (nothing ends its wait but the byte
        // the refused one writes): it is refused with EBUSY, whatever order a loaded
        // machine runs them in.
        fsched::WaitGroup both;
        both.add(2);
        const auto waiter = [&] {
            const bool ready = fsched::io::wait(pair.b, Ready::Read, 30s);
            const int error = fsched::io::last_error();
            if (ready) {
                ++woken;
            } else {
                busy = error;
                CHECK(::write(pair.a, "x", 1) == 1);  // ends the other's wait
            }
            both.done();
        };
        Scheduler::current()->schedule(waiter);
        Scheduler::current()->schedule(waiter);
        both.wait();
        char c;
        CHECK(::read(pair.b, &c, 1) == 1);
    });
    s.stop();
    CHECK(bad_wait == EBADF);
    CHECK(bad_read == EBADF);
    CHECK(blocking_read == EINVAL);
    CHECK(bad_accept == EINVAL);
    CHECK(refused == ECONNREFUSED);
    CHECK(busy == EBUSY);
    CHECK(woken.load() == 1);
    // And from a plain thread:
    CHECK_FALSE(fsched::io::wait(-1, Ready::Write, 10ms));
    CHECK(fsched::io::last_error() == EBADF);
    CHECK_FALSE(fsched::io::wait(pair.a, Ready::Read, 10ms));
    CHECK(fsched::io::last_error() == ETIMEDOUT);
}

TEST_CASE("io: an idle scheduler with fibers waiting for IO blocks in the kernel") {
    Scheduler s(2, false);
    SocketPair pair;
    s.start();
    std::atomic<bool> got{false};
    s.schedule([&] {
        char c;
        got = fsched::io::read(pair.a, &c, 1) == 1;
    });
    std::this_thread::sleep_for(20ms);
    timespec before{}, after{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
    std::this_thread::sleep_for(200ms);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
    const double used = static_cast<double>(after.tv_sec - before.tv_sec) +
                        static_cast<double>(after.tv_nsec - before.tv_nsec) / 1e9;
    CHECK(used < 0.02);
    CHECK(::write(pair.b, "!", 1) == 1);
    s.stop();
    CHECK(got);
}

#endif  // FIBER_SCHED_HAVE_EPOLL
