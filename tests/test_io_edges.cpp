// fsched::io at the edges of its contract: io::cancel() reaching a call between its EAGAIN
// and its park, or between a wake-up and its next system call. Each test gives its calls timeouts far longer than the checks
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

int hook_peer = -1;  // make_known's hook writes here
int hook_cancel_fd = -1;  // cancel_in_hook cancels this fd
std::atomic<int> hook_calls{0};

void write_hook_peer(int) {
    fsched::detail::set_io_before_park_hook(nullptr);  // once
    CHECK(::write(hook_peer, "k", 1) == 1);
}

// Makes the non-blocking socket `fd` known to io (a wait of io::read has checked it, in a
// fiber): its read fails with EAGAIN and the byte comes from the hook, just before the
// park. The read asks for one byte and gets it: a full read, so no read is skipped after it.
void make_known(int fd, int peer) {
    hook_peer = peer;
    fsched::detail::set_io_before_park_hook(&write_hook_peer);
    char c = 0;
    CHECK(fsched::io::read(fd, &c, 1, 5s) == 1);
    fsched::detail::set_io_before_park_hook(nullptr);
    CHECK(c == 'k');
}

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
