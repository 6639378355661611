// fsched::io at the edges of its contract: a socket's SO_RCVLOWAT (which the kernel's
// readiness honours and a non-blocking recv() does not), io::connect to an AF_UNIX
// listener whose backlog is full (no readiness event says when it has room), and
// io::cancel() reaching a call between its EAGAIN and its park, or between a wake-up and
// its next system call. Each test gives its calls timeouts far longer than the checks
// allow, so a call that is left asleep shows up as a failure, not as a slow pass.
#include "fiber_sched.hpp"
#include "listener.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#if defined(FIBER_SCHED_HAVE_EPOLL)

using fsched::Scheduler;
using fsched::io::Ready;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// A connected pair of non-blocking AF_UNIX stream sockets.
struct UnixPair {
    UnixPair(const UnixPair&) = delete;
    UnixPair& operator=(const UnixPair&) = delete;
    int a = -1, b = -1;
    UnixPair() {
        int fds[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
        a = fds[0];
        b = fds[1];
    }
    ~UnixPair() {
        close(a);
        close(b);
    }
};

// What one io call did: its result, its errno, how long it took.
struct Outcome {
    long rc = -2;
    int error = 0;
    Clock::duration took{};
};

template <class Call>
Outcome timed(Call call) {
    Outcome o;
    const auto t0 = Clock::now();
    o.rc = static_cast<long>(call());
    o.error = o.rc < 0 ? fsched::io::last_error() : 0;
    o.took = Clock::now() - t0;
    return o;
}

#if defined(FIBER_SCHED_FAULT_INJECTION)

int hook_cancel_fd = -1;  // cancel_in_hook cancels this fd
std::atomic<int> hook_calls{0};
using test::make_known;

// The before-park hook of the cancel tests: the call's system call has just failed with
// EAGAIN, and it has not parked (or polled) yet. Cancel hook_cancel_fd there, once.
void cancel_in_hook(int) {
    if (hook_calls++ != 0) return;
    fsched::io::cancel(hook_cancel_fd);
}

// Takes the ready events out of epoll as a worker would, once some have come (at most 5 s).
int take_edges() {
    const auto until = Clock::now() + 5s;
    int events = 0;
    while (events == 0 && Clock::now() < until) events = fsched::detail::io_poll_now();
    return events;
}

#endif  // FIBER_SCHED_FAULT_INJECTION

}  // namespace

// ---------------------------------------------------------------------------------------
// SO_RCVLOWAT: below the mark the kernel reports no readiness and sends no edge, yet a
// non-blocking recv() returns what is queued.
// ---------------------------------------------------------------------------------------

#if defined(FIBER_SCHED_FAULT_INJECTION)

namespace {

// The bytes queued for reading on `fd`, whatever its SO_RCVLOWAT (SIOCINQ).
int queued(int fd) {
    int n = -1;
    return ::ioctl(fd, SIOCINQ, &n) == 0 ? n : -1;
}

// Waits (at most 10 s) until at least `n` bytes are queued on `fd`: on loopback TCP data may
// land a moment after the write. (The helpers run in tasks, where a REQUIRE's exception
// would escape the task: they CHECK.)
void wait_queued(int fd, int n) {
    const auto until = Clock::now() + 10s;
    while (queued(fd) < n && Clock::now() < until) std::this_thread::sleep_for(1ms);
    CHECK(queued(fd) >= n);
}

void set_rcvlowat(int fd, int bytes) { CHECK(::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0); }

}  // namespace

TEST_CASE("io edges: a TCP read after a short one returns the bytes queued below an SO_RCVLOWAT set since") {
    // The case: an 8-byte short read (so io may leave the next read out and wait
    // for an edge instead), then SO_RCVLOWAT 16, then 4 bytes. recv() returns them; no edge
    // comes for them, and poll() does not report them either. Each read must return them,
    // not time out again and again. `lowat_first`: the mark is set before the short read.
    for (const bool lowat_first : {false, true}) {
        CAPTURE(lowat_first);
        Scheduler s(1, false);
        test::TcpPair pair;
        long first = -2;
        Outcome reads[3];
        s.start();
        s.schedule([&] {
            char buf[64];
            make_known(pair.a, pair.b);
            if (lowat_first) set_rcvlowat(pair.a, 16);
            CHECK(::write(pair.b, "12345678", 8) == 8);
            if (lowat_first) {
                wait_queued(pair.a, 8);  // below the mark: no edge to take
            } else {
                CHECK(take_edges() == 1);
            }
            first = fsched::io::read(pair.a, buf, sizeof buf, 5s);  // short: the queue is empty
            if (!lowat_first) set_rcvlowat(pair.a, 16);
            CHECK(::write(pair.b, "abcd", 4) == 4);
            wait_queued(pair.a, 4);
            for (Outcome& r : reads) r = timed([&] { return fsched::io::read(pair.a, buf, sizeof buf, 500ms); });
        });
        s.stop();
        CHECK(first == 8);
        CAPTURE(reads[0].error);
        CAPTURE(reads[1].rc);
        CAPTURE(reads[2].rc);
        CHECK(reads[0].rc == 4);  // what recv() returns, not -1 ETIMEDOUT
    }
}

TEST_CASE("io edges: a TCP read left out after a short read, with a long timeout, returns the bytes queued below SO_RCVLOWAT well before it") {
    // As above, with a 15 s timeout: the read that io left out must find the 4 bytes long
    // before its timeout (a sweep checks a skipped read's queue 25 to 50 ms after it parked).
    Scheduler s(1, false);
    test::TcpPair pair;
    long first = -2;
    Outcome read;
    Outcome after;
    long skipped_after = -1;
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(pair.a, pair.b);
        CHECK(::write(pair.b, "12345678", 8) == 8);
        CHECK(take_edges() == 1);
        first = fsched::io::read(pair.a, buf, sizeof buf, 5s);
        set_rcvlowat(pair.a, 16);
        CHECK(::write(pair.b, "abcd", 4) == 4);
        wait_queued(pair.a, 4);
        read = timed([&] { return fsched::io::read(pair.a, buf, sizeof buf, 15s); });
        // Once found wrong, reads of this socket are made, never left out: the next short
        // read's successor reads the 2 bytes at once.
        CHECK(::write(pair.b, "ef", 2) == 2);
        wait_queued(pair.a, 2);
        const long skipped0 = fsched::detail::io_reads_skipped();
        after = timed([&] { return fsched::io::read(pair.a, buf, sizeof buf, 15s); });
        skipped_after = fsched::detail::io_reads_skipped() - skipped0;
    });
    s.stop();
    CHECK(first == 8);
    CAPTURE(read.error);
    CAPTURE(std::chrono::duration_cast<std::chrono::milliseconds>(read.took).count());
    CHECK(read.rc == 4);
    CHECK(read.took < 8s);  // found by the sweep, not at the timeout
    CHECK(after.rc == 2);
    CHECK(skipped_after == 0);
    CHECK(after.took < 8s);
}

TEST_CASE("io edges: a read left out on a number io knew as another TCP socket returns the bytes queued below SO_RCVLOWAT") {
    // The soak's case: a known TCP socket's number, closed behind io's back, is taken over
    // by a new TCP socket made outside io. io trusts the old file's entry: a short read of
    // the new socket leaves the next read out; then SO_RCVLOWAT 16 and 4 bytes. The sweep
    // finds another file under the number and registers it anew, whose readiness the mark
    // holds back: the read left out must still be made (it slept to its timeout).
    Scheduler s(1, false);
    test::TcpPair old_pair, pair;
    long first = -2;
    Outcome read;
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(old_pair.a, old_pair.b);
        CHECK(::dup3(pair.a, old_pair.a, O_CLOEXEC) == old_pair.a);  // the old file closed, its number reused
        const int fd = old_pair.a;
        CHECK(::write(pair.b, "12345678", 8) == 8);
        wait_queued(fd, 8);
        first = fsched::io::read(fd, buf, sizeof buf, 5s);  // short, on the old file's word
        set_rcvlowat(fd, 16);
        CHECK(::write(pair.b, "abcd", 4) == 4);
        wait_queued(fd, 4);
        read = timed([&] { return fsched::io::read(fd, buf, sizeof buf, 15s); });
    });
    s.stop();
    CHECK(first == 8);
    CAPTURE(read.error);
    CAPTURE(std::chrono::duration_cast<std::chrono::milliseconds>(read.took).count());
    CHECK(read.rc == 4);
    CHECK(read.took < 8s);  // found by the sweep, not at the timeout
}

TEST_CASE("io edges: a TCP read that waits with SO_RCVLOWAT set returns the bytes queued below the mark when its timeout passes") {
    // The read fails with EAGAIN and waits; 4 bytes come (the hook writes them just before
    // the park), below the mark of 16: no edge, and poll() says "not ready". Like a blocking
    // recv() with SO_RCVTIMEO, the read waits for the mark and, when its timeout passes,
    // returns what is there rather than -1 ETIMEDOUT.
    Scheduler s(1, false);
    test::TcpPair pair;
    Outcome read;
    s.start();
    s.schedule([&] {
        char buf[64];
        make_known(pair.a, pair.b);
        set_rcvlowat(pair.a, 16);
        test::known_peer = pair.b;
        fsched::detail::set_io_before_park_hook([](int) {
            fsched::detail::set_io_before_park_hook(nullptr);
            CHECK(::write(test::known_peer, "abcd", 4) == 4);
        });
        read = timed([&] { return fsched::io::read(pair.a, buf, sizeof buf, 300ms); });
        fsched::detail::set_io_before_park_hook(nullptr);
    });
    s.stop();
    CAPTURE(read.error);
    CHECK(read.rc == 4);
    CHECK(read.took >= 250ms);  // it waited for the mark, as a blocking read does
}

#endif  // FIBER_SCHED_FAULT_INJECTION

// ---------------------------------------------------------------------------------------
// io::connect to an AF_UNIX listener whose backlog is full: connect() fails with EAGAIN,
// and no readiness event says when the backlog has room.
// ---------------------------------------------------------------------------------------

namespace {

// An AF_UNIX stream listener in the abstract namespace (nothing to clean up on disk) whose
// backlog is full: listen(fd, 0) takes one connection, which `queued_client` made.
struct FullUnixListener {
    FullUnixListener(const FullUnixListener&) = delete;
    FullUnixListener& operator=(const FullUnixListener&) = delete;
    int fd = -1;
    int queued_client = -1;
    sockaddr_un addr{};
    socklen_t addr_len = 0;
    FullUnixListener() {
        static std::atomic<int> serial{0};
        addr.sun_family = AF_UNIX;
        const int n = std::snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "fsched-io-edges-%d-%d",
                                    static_cast<int>(::getpid()), serial++);
        addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
        fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len) == 0);
        REQUIRE(::listen(fd, 0) == 0);
        queued_client = new_client();
        REQUIRE(::connect(queued_client, reinterpret_cast<const sockaddr*>(&addr), addr_len) == 0);
        const int refused = new_client();
        CHECK(::connect(refused, reinterpret_cast<const sockaddr*>(&addr), addr_len) == -1);
        CHECK(errno == EAGAIN);  // full
        ::close(refused);
    }
    ~FullUnixListener() {
        ::close(queued_client);
        ::close(fd);
    }
    static int new_client() {
        const int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        REQUIRE(c >= 0);
        return c;
    }
    int connect(int client, std::chrono::milliseconds timeout) const {
        return fsched::io::connect(client, reinterpret_cast<const sockaddr*>(&addr), addr_len, timeout);
    }
    // Makes room: accepts (and closes) the queued connection.
    void accept_one() const {
        const int accepted = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        CHECK(accepted >= 0);
        if (accepted >= 0) ::close(accepted);
    }
};

}  // namespace

TEST_CASE("io edges: io::connect to an AF_UNIX listener whose backlog is full waits until an accept makes room") {
    SUBCASE("in a fiber") {
        FullUnixListener listener;
        const int client = FullUnixListener::new_client();
        Outcome connected;
        char c = 0;
        long got = -2;
        Scheduler s(1, false);
        s.start();
        s.schedule([&] {
            Scheduler::current()->schedule([&] {  // runs while the connect waits
                fsched::this_fiber::sleep_for(200ms);
                listener.accept_one();
            });
            connected = timed([&] { return listener.connect(client, 20s); });
            // Connected for real: the listener's next accept gets it, and data flows.
            const int server = fsched::io::accept(listener.fd, nullptr, nullptr, 5s);
            CHECK(server >= 0);
            if (server >= 0) {
                CHECK(fsched::io::write(client, "u", 1, 5s) == 1);
                got = fsched::io::read(server, &c, 1, 5s);
                ::close(server);
            }
        });
        s.stop();
        ::close(client);
        CAPTURE(connected.error);
        CHECK(connected.rc == 0);
        CHECK(connected.took >= 150ms);  // it waited for the room
        CHECK(connected.took < 10s);
        CHECK(got == 1);
        CHECK(c == 'u');
    }
    SUBCASE("in a plain thread") {
        FullUnixListener listener;
        const int client = FullUnixListener::new_client();
        std::thread acceptor([&] {
            std::this_thread::sleep_for(200ms);
            listener.accept_one();
        });
        const Outcome connected = timed([&] { return listener.connect(client, 20s); });
        acceptor.join();
        ::close(client);
        CAPTURE(connected.error);
        CHECK(connected.rc == 0);
        CHECK(connected.took >= 150ms);
        CHECK(connected.took < 10s);
    }
}

TEST_CASE("io edges: io::connect to an AF_UNIX listener whose backlog stays full times out, and io::cancel ends it") {
    SUBCASE("timeout, in a fiber and in a plain thread") {
        FullUnixListener listener;
        const int fiber_client = FullUnixListener::new_client();
        const int thread_client = FullUnixListener::new_client();
        Outcome in_fiber, in_thread;
        Scheduler s(1, false);
        s.start();
        s.schedule([&] { in_fiber = timed([&] { return listener.connect(fiber_client, 300ms); }); });
        s.stop();
        in_thread = timed([&] { return listener.connect(thread_client, 300ms); });
        ::close(fiber_client);
        ::close(thread_client);
        for (const Outcome* o : {&in_fiber, &in_thread}) {
            CHECK(o->rc == -1);
            CHECK(o->error == ETIMEDOUT);
            CHECK(o->took >= 250ms);
        }
    }
    SUBCASE("cancel, in a fiber and in a plain thread") {
        FullUnixListener listener;
        const int fiber_client = FullUnixListener::new_client();
        const int thread_client = FullUnixListener::new_client();
        Outcome in_fiber, in_thread;
        Scheduler s(1, false);
        s.start();
        s.schedule([&] {
            Scheduler::current()->schedule([&] {
                fsched::this_fiber::sleep_for(200ms);
                fsched::io::cancel(fiber_client);
            });
            in_fiber = timed([&] { return listener.connect(fiber_client, 20s); });
        });
        s.stop();
        std::thread canceller([&] {
            std::this_thread::sleep_for(200ms);
            fsched::io::cancel(thread_client);
        });
        in_thread = timed([&] { return listener.connect(thread_client, 20s); });
        canceller.join();
        ::close(fiber_client);
        ::close(thread_client);
        for (const Outcome* o : {&in_fiber, &in_thread}) {
            CHECK(o->rc == -1);
            CHECK(o->error == ECANCELED);
            CHECK(o->took < 10s);  // not at its timeout of 20 s
        }
    }
}

// ---------------------------------------------------------------------------------------
// io::cancel(fd) reaches every io call on fd that has started and not returned.
// ---------------------------------------------------------------------------------------

#if defined(FIBER_SCHED_FAULT_INJECTION)

TEST_CASE("io edges: io::cancel between a fiber's EAGAIN and its park wakes the call with ECANCELED") {
    // The hook runs just after the read (or write) failed with EAGAIN, before the park: a
    // cancel there used to find no waiter, and the call then slept until its timeout.
    // Afterwards a call that starts after the cancel is not affected, nor is one on another
    // fd whose window a cancel of this fd lands in.
    struct Case {
        bool tcp;  // a known TCP socket (its waits trust the registration), or a socketpair
        Ready what;
    };
    // A write only on the socketpair: once its send buffer is full, it stays full while the
    // peer reads nothing (a TCP socket's may drain a little as ACKs come).
    for (const Case c : {Case{false, Ready::Read}, Case{false, Ready::Write}, Case{true, Ready::Read}}) {
        const bool tcp = c.tcp;
        const Ready what = c.what;
        CAPTURE(tcp);
        CAPTURE(static_cast<int>(what));
        Scheduler s(1, false);
        test::TcpPair tcp_pair;
        UnixPair unix_pair;
        const int fd = tcp ? tcp_pair.a : unix_pair.a;
        const int peer = tcp ? tcp_pair.b : unix_pair.b;
        UnixPair other;
        Outcome cancelled, later, unaffected;
        char got = 0;
        s.start();
        s.schedule([&] {
            make_known(fd, peer);
            static char fill[1 << 16];
            if (what == Ready::Write) {  // fill the send buffer, so the write fails with EAGAIN
                while (::send(fd, fill, sizeof fill, MSG_DONTWAIT) > 0) {
                }
                CHECK(errno == EAGAIN);
            }
            hook_cancel_fd = fd;
            hook_calls = 0;
            fsched::detail::set_io_before_park_hook(&cancel_in_hook);
            cancelled = timed([&] {
                return what == Ready::Read ? fsched::io::read(fd, &got, 1, 20s) : fsched::io::write(fd, "w", 1, 20s);
            });
            fsched::detail::set_io_before_park_hook(nullptr);
            CHECK(hook_calls.load() == 1);
            // After the cancel: a new call on fd works as ever (data written once it parked).
            if (what == Ready::Read) {
                Scheduler::current()->schedule([&] { CHECK(::write(peer, "n", 1) == 1); });
                later = timed([&] { return fsched::io::read(fd, &got, 1, 10s); });
            } else {
                later.rc = 1;
            }
            // A cancel of `fd` in the window of a read of another fd leaves that read alone.
            hook_cancel_fd = fd;
            hook_calls = 0;
            fsched::detail::set_io_before_park_hook(&cancel_in_hook);
            Scheduler::current()->schedule([&] { CHECK(::write(other.b, "o", 1) == 1); });
            char o = 0;
            unaffected = timed([&] { return fsched::io::read(other.a, &o, 1, 10s); });
            fsched::detail::set_io_before_park_hook(nullptr);
            CHECK(o == 'o');
        });
        s.stop();
        CAPTURE(cancelled.rc);
        CHECK(cancelled.error == ECANCELED);
        CHECK(cancelled.took < 10s);  // not at its timeout of 20 s
        CHECK(later.rc == 1);
        CHECK(unaffected.rc == 1);
    }
}

TEST_CASE("io edges: io::cancel between a plain thread's EAGAIN and its poll wakes the call with ECANCELED") {
    UnixPair pair;
    hook_cancel_fd = pair.a;
    hook_calls = 0;
    fsched::detail::set_io_before_park_hook(&cancel_in_hook);
    char c = 0;
    const Outcome cancelled = timed([&] { return fsched::io::read(pair.a, &c, 1, 20s); });
    fsched::detail::set_io_before_park_hook(nullptr);
    CHECK(hook_calls.load() == 1);
    CAPTURE(cancelled.rc);
    CHECK(cancelled.error == ECANCELED);
    CHECK(cancelled.took < 10s);
    // A call that starts after the cancel is not affected.
    CHECK(::write(pair.b, "x", 1) == 1);
    CHECK(fsched::io::read(pair.a, &c, 1, 10s) == 1);
}

TEST_CASE("io edges: io::cancel between the use_caller thread's EAGAIN and its park wakes the call with ECANCELED") {
    Scheduler s(2, true);
    s.start();
    UnixPair pair;
    hook_cancel_fd = pair.a;
    hook_calls = 0;
    fsched::detail::set_io_before_park_hook(&cancel_in_hook);
    char c = 0;
    const Outcome cancelled = timed([&] { return fsched::io::read(pair.a, &c, 1, 20s); });
    fsched::detail::set_io_before_park_hook(nullptr);
    s.stop();
    CHECK(hook_calls.load() == 1);
    CAPTURE(cancelled.rc);
    CHECK(cancelled.error == ECANCELED);
    CHECK(cancelled.took < 10s);
}

TEST_CASE("io edges: io::cancel of a read woken for data that is gone before it reads again: ECANCELED, no park") {
    // The reader parks; an edge wakes it (it leaves its slot and is queued), and before it
    // runs, the byte is read behind io's back and the fd cancelled. The read has started and
    // not returned: it must not read again and park on an fd that may be closed by now.
    Scheduler s(1, false);
    UnixPair pair;
    Outcome read;
    bool cancel_ran = false;
    s.start();
    s.schedule([&] {
        Scheduler::current()->schedule([&] {  // runs once the reader has parked
            CHECK(::write(pair.b, "g", 1) == 1);
            CHECK(take_edges() == 1);  // wakes the reader: queued behind this task
            char gone = 0;
            CHECK(::read(pair.a, &gone, 1) == 1);
            fsched::io::cancel(pair.a);
            cancel_ran = true;
        });
        char c = 0;
        read = timed([&] { return fsched::io::read(pair.a, &c, 1, 20s); });
    });
    s.stop();
    CHECK(cancel_ran);
    CAPTURE(read.rc);
    CHECK(read.error == ECANCELED);
    CHECK(read.took < 10s);
}

#endif  // FIBER_SCHED_FAULT_INJECTION

#endif  // FIBER_SCHED_HAVE_EPOLL
