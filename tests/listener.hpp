// Test helpers (POSIX): a listening TCP socket on the loopback address, a connected pair
// of loopback TCP sockets, and (with the fault-injection hooks) making a socket known to io,
// for the io tests.
#pragma once

#include "fiber_sched.hpp"

#include <doctest/doctest.h>

#include <chrono>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace test {

// A non-blocking listening TCP socket on 127.0.0.1 and an ephemeral port.
struct Listener {
    Listener(const Listener&) = delete;
    Listener& operator=(const Listener&) = delete;
    int fd = -1;
    sockaddr_in addr{};
    Listener() {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = 0;
        REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        socklen_t len = sizeof addr;
        REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        REQUIRE(listen(fd, 1024) == 0);
    }
    ~Listener() { close(fd); }
};

// A connected pair of loopback TCP sockets, both non-blocking, TCP_NODELAY (a request/reply
// exchange is not held back by Nagle's algorithm). `a` is the accepted end.
struct TcpPair {
    TcpPair(const TcpPair&) = delete;
    TcpPair& operator=(const TcpPair&) = delete;
    int a = -1, b = -1;
    TcpPair() {
        Listener listener;
        b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(b >= 0);
        REQUIRE(connect(b, reinterpret_cast<sockaddr*>(&listener.addr), sizeof listener.addr) == 0);
        a = accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);  // queued on loopback
        REQUIRE(a >= 0);
        REQUIRE(fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK) == 0);
        const int one = 1;
        for (const int fd : {a, b}) REQUIRE(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0);
    }
    ~TcpPair() {
        close(a);
        close(b);
    }
};

#if defined(FIBER_SCHED_HAVE_EPOLL) && defined(FIBER_SCHED_FAULT_INJECTION)
inline int known_peer = -1;  // write_known_peer writes here

// A before-park hook that writes "k" to known_peer, once.
inline void write_known_peer(int) {
    fsched::detail::set_io_before_park_hook(nullptr);  // once
    CHECK(::write(known_peer, "k", 1) == 1);
}

// Makes the non-blocking socket `fd` known to io (checked by a wait of io::read, in a fiber)
// whatever the number of workers: its read fails with EAGAIN, and the byte comes from the
// hook, just before the wait's park. The read asks for one byte and gets it: a full read, so
// no read is skipped after it.
inline void make_known(int fd, int peer) {
    known_peer = peer;
    fsched::detail::set_io_before_park_hook(&write_known_peer);
    char c = 0;
    CHECK(fsched::io::read(fd, &c, 1, std::chrono::seconds(5)) == 1);
    fsched::detail::set_io_before_park_hook(nullptr);
    CHECK(c == 'k');
}
#endif

}  // namespace test
