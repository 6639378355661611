// bench_net.hpp — loopback TCP helpers shared by bench_io and bench_http.
#pragma once

#include "fiber_sched.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace fsched_bench {

inline sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    return addr;
}

// A listening socket on 127.0.0.1:*port (any free port when *port is 0, which is then
// written back); -1 with errno set when a call fails.
inline int listen_loopback(bool nonblocking, int* port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr = loopback(*port);
    socklen_t len = sizeof addr;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        const int error = errno;
        ::close(fd);
        errno = error;
        return -1;
    }
    *port = ntohs(addr.sin_port);
    return fd;
}

inline void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Writes all of buf with plain system calls, waiting in poll() while the socket is full.
inline bool write_all_plain(int fd, const char* buf, std::size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, buf, n);
        if (w > 0) {
            buf += w;
            n -= static_cast<std::size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            pollfd p{fd, POLLOUT, 0};
            ::poll(&p, 1, 1000);
        } else {
            return false;
        }
    }
    return true;
}

// Writes all of buf from a fiber, parking while the socket is full.
inline bool write_all_fsched(int fd, const char* buf, std::size_t n) {
    while (n > 0) {
        const ssize_t w = fsched::io::write(fd, buf, n);
        if (w <= 0) return false;
        buf += w;
        n -= static_cast<std::size_t>(w);
    }
    return true;
}

// Many connections at once: raise the soft limit on open files to the hard one.
inline void raise_fd_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
    }
}

}  // namespace fsched_bench
