// echo_server.cpp: a TCP echo server on a handful of worker threads, one fiber per
// connection, with a load-generating client mode.
//
//   echo_server                      demo: serve, and from a forked client process open
//                                    10,000 connections at once and check every echo
//   echo_server --serve [--port P]   serve until killed
//   echo_server --client PORT        only the client
//   options: --connections N (10000), --workers N (4), --rounds N (3)
//
// Each connection is a fiber that reads and writes with fsched::io, which parks it while
// the socket is not ready; idle workers sleep in epoll_wait. No callbacks, no state
// machines: the per-connection code reads like blocking code.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct Options {
    int connections = 10000;
    int workers = 4;
    int rounds = 3;
    int port = 0;
    enum { demo, serve, client } mode = demo;
};

// Each process holds one fd per connection: lift the soft limit to the hard one.
void raise_fd_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
    }
}

int listen_on(int port, int* bound_port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof addr;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 4096) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        std::perror("echo_server: listen");
        std::exit(1);
    }
    *bound_port = ntohs(addr.sin_port);
    return fd;
}

bool write_all(int fd, const char* data, size_t n) {
    while (n > 0) {
        ssize_t w = fsched::io::write(fd, data, n);
        if (w <= 0) return false;
        data += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

// Serves until `stop_after` connections have come and gone (0: forever).
void run_server(int listen_fd, const Options& options, int stop_after) {
    fsched::Scheduler scheduler(static_cast<size_t>(options.workers), false, "echo");
    std::atomic<int> open{0}, peak{0}, closed{0};
    scheduler.start();
    scheduler.schedule([&] {
        for (int accepted = 0; stop_after == 0 || accepted < stop_after; ++accepted) {
            int conn = fsched::io::accept(listen_fd, nullptr, nullptr);
            if (conn < 0) {
                std::perror("echo_server: accept");
                break;
            }
            int now = ++open;
            for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
            }
            fsched::Scheduler::current()->schedule([&, conn] {  // one fiber per connection
                char buf[4096];
                ssize_t n;
                while ((n = fsched::io::read(conn, buf, sizeof buf)) > 0) {
                    if (!write_all(conn, buf, static_cast<size_t>(n))) break;
                }
                close(conn);  // EOF, or the client went away
                --open;
                ++closed;
            });
        }
    });
    scheduler.stop();  // returns once every connection fiber has finished
    std::printf("server: %d connections served, %d open at once at the peak, on %d workers\n", closed.load(),
                peak.load(), options.workers);
}

// Opens all connections, waits until every one is open, then echoes `rounds` messages on
// each and checks them. Returns the number of connections whose every echo matched.
int run_client(int port, const Options& options) {
    fsched::Scheduler scheduler(static_cast<size_t>(options.workers), false, "client");
    fsched::WaitGroup all_open;
    all_open.add(options.connections);
    fsched::Channel<int> connect_slots(256);  // at most 256 handshakes in flight
    for (int i = 0; i < 256; ++i) connect_slots.send(i);
    std::atomic<int> good{0};
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const auto start = std::chrono::steady_clock::now();
    scheduler.start();
    for (int c = 0; c < options.connections; ++c) {
        scheduler.schedule([&, c] {
            int slot = *connect_slots.receive();
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            bool ok = fd >= 0 && fsched::io::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr,
                                                     std::chrono::seconds(30)) == 0;
            connect_slots.send(slot);
            all_open.done();
            all_open.wait();  // every connection is open now, at the same time
            std::string message = "hello from connection " + std::to_string(c);
            for (int r = 0; ok && r < options.rounds; ++r) {
                std::string echo(message.size(), '\0');
                ok = write_all(fd, message.data(), message.size());
                for (size_t got = 0; ok && got < echo.size();) {
                    ssize_t n = fsched::io::read(fd, &echo[got], echo.size() - got, std::chrono::seconds(30));
                    ok = n > 0;
                    if (ok) got += static_cast<size_t>(n);
                }
                ok = ok && echo == message;
            }
            if (fd >= 0) close(fd);
            good += ok;
        });
    }
    scheduler.stop();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("client: %d of %d connections open at once, %d echoes checked, in %.0f ms\n", good.load(),
                options.connections, good.load() * options.rounds, ms);
    return good.load();
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
        if (arg == "--serve") options.mode = Options::serve;
        else if (arg == "--client") options.mode = Options::client, options.port = next();
        else if (arg == "--port") options.port = next();
        else if (arg == "--connections") options.connections = next();
        else if (arg == "--workers") options.workers = next();
        else if (arg == "--rounds") options.rounds = next();
        else {
            std::fprintf(stderr, "usage: %s [--serve | --client PORT] [--port P] [--connections N] [--workers N] [--rounds N]\n", argv[0]);
            return 2;
        }
    }
    raise_fd_limit();
    if (options.mode == Options::client) return run_client(options.port, options) == options.connections ? 0 : 1;
    int port = 0;
    int listen_fd = listen_on(options.port, &port);
    if (options.mode == Options::serve) {
        std::printf("echo server on 127.0.0.1:%d, %d workers\n", port, options.workers);
        std::fflush(stdout);
        run_server(listen_fd, options, 0);
        return 0;
    }
    // Demo: the client runs in a child process, so each process needs one fd per connection.
    std::fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(listen_fd);
        const bool all_good = run_client(port, options) == options.connections;
        std::fflush(stdout);
        _exit(all_good ? 0 : 1);
    }
    run_server(listen_fd, options, options.connections);
    close(listen_fd);
    int status = 0;
    waitpid(child, &status, 0);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::printf("%s\n", ok ? "every echo matched" : "some echoes failed");
    return ok ? 0 : 1;
}
