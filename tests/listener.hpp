// Test helper (POSIX): a listening TCP socket on the loopback address, for the io tests.
#pragma once

#include <doctest/doctest.h>

#include <netinet/in.h>
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

}  // namespace test
