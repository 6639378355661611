// bench_io.cpp — an echo server on fsched::io beside its baselines, measured in one run.
//
// Echo round trips per second over loopback TCP: C connections (default 100) each send a
// small message (default 64 bytes), wait for the whole echo, and send again, for a fixed
// time. Servers, each on 2 threads where threads apply:
//   - fsched: Scheduler(2, false), one fiber accepting with io::accept and one fiber per
//     connection looping on io::read / io::write ("ours");
//   - thread per connection: blocking sockets, one std::thread per connection (C threads);
//   - epoll loop: the hand-written event loop a C programmer would write, 2 threads with
//     an epoll instance each, level-triggered, connections dealt out round-robin; the
//     floor for what a server on this kernel can cost;
//   - Go, when the build made the Go twins (bench/go/echo.go, FIBER_SCHED_BENCH_GO_TWINS):
//     a goroutine per connection on Go's netpoller, GOMAXPROCS=2, in a process of its own
//     that inherits the listening socket; its server CPU is that process's CPU clock.
// Every one of them is driven by the same client, in a forked child process so that its
// work is not counted as the server's: 2 threads, each with an epoll instance and C/2
// non-blocking connections. The parent (the server) and the child share the machine's
// cores, so the rate is the machine's; the CPU columns split it: server CPU is the parent
// process's CPU time during the measured window, client CPU the child's, each per round trip.
//
// One more row: client and server in one process, on one Scheduler(2, false): C client
// fibers (io::connect, io::write, io::read) and the server fibers above. Its client is not
// the epoll client, so its ratio compares whole systems; its CPU is the process's.
//
// Each repetition of a forked row: fork the client, start the server; the client opens
// every connection, warms up (a tenth of the window, at least 20 ms), counts round trips
// for the window (--rep-ms, default 600 ms; 150 ms with --quick) and closes its
// connections; the server ends when every connection has ended. Cases alternate within
// each repetition round so that drift on a shared machine hits every case alike.
//
// Usage: bench_io [--quick] [--reps N] [--rep-ms MS] [--filter TEXT] [--connections N] [--bytes N]
//   --reps N       repetitions per case (default 5; 1 with --quick)
//   --rep-ms MS    measured window of one repetition (default 600)
//   --filter TEXT  run only cases whose "echo/impl" name contains TEXT
//   --connections N, --bytes N: concurrent connections (100) and message size (64)
// Results and how to reproduce them: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_net.hpp"
#include "bench_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using fsched_bench::listen_loopback;
using fsched_bench::loopback;
using fsched_bench::raise_fd_limit;
using fsched_bench::set_nodelay;
using fsched_bench::write_all_fsched;
using fsched_bench::write_all_plain;

using Clock = std::chrono::steady_clock;

struct Config {
    int connections = 100;
    int bytes = 64;
    int reps = 5;
    double window_s = 0.6;
    double warmup_s = 0.1;
    bool quick = false;
    std::string filter;
};

// ---------------------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------------------

// Set in the forked client: it leaves with _exit(), never running the parent's atexit work.
bool in_client_process = false;

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "bench_io: %s: %s\n", what, std::strerror(errno));
    if (in_client_process) _exit(1);
    std::exit(1);
}

// Names the calling thread, so that `perf report --sort comm` tells the parts apart.
void name_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

void set_nonblocking(int fd) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) die("fcntl");
}

// Accepts one connection on a blocking listening socket, giving up after 10 s (a client
// that died must not hang the benchmark).
int accept_plain(int listen_fd) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return -1;
    return ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
}

// ---------------------------------------------------------------------------------------
// Servers. start() returns once the server runs on its own threads; finish() returns
// once every connection has ended (the client closed it) and the threads are gone.
// ---------------------------------------------------------------------------------------

double process_cpu_seconds(int who) {
    rusage ru{};
    getrusage(who, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

class Server {
public:
    virtual ~Server() = default;
    virtual bool nonblocking_listener() const = 0;
    virtual void start(int listen_fd, int connections) = 0;
    virtual void finish() = 0;
    // CPU seconds the server has used so far: this process's, unless it runs elsewhere.
    virtual double cpu_seconds() const { return process_cpu_seconds(RUSAGE_SELF); }
};

// fsched: one fiber per connection on a 2-worker scheduler.
void echo_fsched(int fd) {
    char buf[4096];
    for (;;) {
        const ssize_t n = fsched::io::read(fd, buf, sizeof buf);
        if (n <= 0 || !write_all_fsched(fd, buf, static_cast<std::size_t>(n))) break;
    }
    ::close(fd);
}

// Accepts `connections` connections, a fiber for each on the current scheduler; runs in a fiber.
void accept_fsched(int listen_fd, int connections) {
    for (int i = 0; i < connections; ++i) {
        const int fd = fsched::io::accept(listen_fd, nullptr, nullptr, std::chrono::seconds(10));
        if (fd < 0) {
            std::fprintf(stderr, "bench_io: fsched accept: %s\n", std::strerror(fsched::io::last_error()));
            return;
        }
        set_nodelay(fd);
        fsched::Scheduler::current()->schedule([fd] { echo_fsched(fd); });
    }
}

class FschedServer : public Server {
public:
    bool nonblocking_listener() const override { return true; }
    void start(int listen_fd, int connections) override {
        scheduler_ = std::make_unique<fsched::Scheduler>(2, false, "echo");
        scheduler_->start();
        scheduler_->schedule([listen_fd, connections] { accept_fsched(listen_fd, connections); });
    }
    void finish() override {
        scheduler_->stop();
        scheduler_.reset();
    }

private:
    std::unique_ptr<fsched::Scheduler> scheduler_;
};

// Thread per connection, blocking sockets.
class ThreadServer : public Server {
public:
    bool nonblocking_listener() const override { return false; }
    void start(int listen_fd, int connections) override {
        acceptor_ = std::thread([listen_fd, connections] {
            name_thread("conn-acceptor");
            std::vector<std::thread> threads;
            threads.reserve(static_cast<std::size_t>(connections));
            for (int i = 0; i < connections; ++i) {
                const int fd = accept_plain(listen_fd);
                if (fd < 0) {
                    std::fprintf(stderr, "bench_io: thread server accept failed\n");
                    break;
                }
                set_nodelay(fd);
                threads.emplace_back([fd] {
                    name_thread("conn-thread");
                    char buf[4096];
                    for (;;) {
                        const ssize_t n = ::read(fd, buf, sizeof buf);
                        if (n <= 0) break;
                        std::size_t done = 0;
                        while (done < static_cast<std::size_t>(n)) {
                            const ssize_t w = ::write(fd, buf + done, static_cast<std::size_t>(n) - done);
                            if (w <= 0) break;
                            done += static_cast<std::size_t>(w);
                        }
                        if (done < static_cast<std::size_t>(n)) break;
                    }
                    ::close(fd);
                });
            }
            for (auto& t : threads) t.join();
        });
    }
    void finish() override { acceptor_.join(); }

private:
    std::thread acceptor_;
};

// The hand-written event loop: 2 threads, an epoll instance each, level-triggered.
class EpollServer : public Server {
public:
    bool nonblocking_listener() const override { return false; }
    void start(int listen_fd, int connections) override {
        for (int t = 0; t < 2; ++t) {
            loops_[t].epoll_fd = epoll_create1(EPOLL_CLOEXEC);
            if (loops_[t].epoll_fd < 0) die("epoll_create1");
            const int share = connections / 2 + (t < connections % 2 ? 1 : 0);
            loops_[t].thread = std::thread([this, t, share] {
                name_thread(t == 0 ? "epoll-loop-0" : "epoll-loop-1");
                run_loop(loops_[t].epoll_fd, share);
            });
        }
        acceptor_ = std::thread([this, listen_fd, connections] {
            name_thread("epoll-acceptor");
            for (int i = 0; i < connections; ++i) {
                const int fd = accept_plain(listen_fd);
                if (fd < 0) {
                    std::fprintf(stderr, "bench_io: epoll server accept failed\n");
                    std::exit(1);  // the loops wait for connections that will never come
                }
                set_nodelay(fd);
                set_nonblocking(fd);
                epoll_event ev{};
                ev.events = EPOLLIN;
                ev.data.fd = fd;
                if (epoll_ctl(loops_[i % 2].epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
            }
        });
    }
    void finish() override {
        acceptor_.join();
        for (auto& loop : loops_) {
            loop.thread.join();
            ::close(loop.epoll_fd);
        }
    }

private:
    // Serves until `share` connections have come and gone.
    static void run_loop(int epoll_fd, int share) {
        char buf[4096];
        epoll_event events[64];
        int closed = 0;
        while (closed < share) {
            const int n = epoll_wait(epoll_fd, events, 64, -1);
            for (int i = 0; i < n; ++i) {
                const int fd = events[i].data.fd;
                const ssize_t r = ::read(fd, buf, sizeof buf);
                if (r > 0 && write_all_plain(fd, buf, static_cast<std::size_t>(r))) continue;
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
                ::close(fd);
                ++closed;
            }
        }
    }

    struct Loop {
        int epoll_fd = -1;
        std::thread thread;
    };
    Loop loops_[2];
    std::thread acceptor_;
};

// Go: the twins' echo server (bench/go/echo.go), a goroutine per connection, GOMAXPROCS=2,
// in a child process that gets the listening socket as fd 3 and ends once every connection
// has. Its CPU is read from the child's process CPU clock, which counts all its threads.
class GoServer : public Server {
public:
    bool nonblocking_listener() const override { return false; }
    void start(int listen_fd, int connections) override {
        // Built before the fork: the child only dup2()s and execs.
        twin_ = std::make_unique<fsched_bench::GoTwin>(
            std::vector<std::string>{"echo", "-procs", "2", "-connections", std::to_string(connections)});
        const fsched_bench::GoTwin& twin = *twin_;
        child_ = std::make_unique<fsched_bench::ChildProcess>([&twin, listen_fd](int fd) {
            // dup2() onto fd 3 clears close-on-exec; a socket that is fd 3 already keeps it, so clear it.
            if (listen_fd == 3 ? ::fcntl(3, F_SETFD, 0) != 0 : ::dup2(listen_fd, 3) != 3) return 126;
            ::dup2(fd, STDOUT_FILENO);
            twin.exec();
            return 127;
        });
        // Like the other servers, return once it serves: the twins say "ready" when they do.
        char ready[6] = {};
        if (!child_->started() || !child_->read(ready, sizeof ready) || std::memcmp(ready, "ready\n", 6) != 0 ||
            clock_getcpuclockid(child_->pid(), &cpu_clock_) != 0) {
            die("start the Go echo server");
        }
    }
    void finish() override {
        if (!child_->wait()) std::fprintf(stderr, "bench_io: the Go echo server failed\n");
        child_.reset();
        twin_.reset();
    }
    double cpu_seconds() const override {
        timespec ts{};
        clock_gettime(cpu_clock_, &ts);
        return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
    }

private:
    std::unique_ptr<fsched_bench::GoTwin> twin_;
    std::unique_ptr<fsched_bench::ChildProcess> child_;
    clockid_t cpu_clock_{};
};

// ---------------------------------------------------------------------------------------
// The client: a forked child, 2 threads with an epoll instance each
// ---------------------------------------------------------------------------------------

// What the client sends to the parent at the end of its window.
struct ClientReport {
    std::uint64_t round_trips = 0;  // completed in the window
    double seconds = 0;             // the window's measured length
    double cpu_seconds = 0;         // the client process's CPU time in the window
    std::uint64_t errors = 0;       // wrong echoes or broken connections (any: the case failed)
};

struct alignas(64) ClientCounter {
    std::atomic<std::uint64_t> round_trips{0};
    std::atomic<std::uint64_t> errors{0};
};

void client_loop(const std::vector<int>& fds, const std::string& message, ClientCounter& counter,
                 const std::atomic<bool>& stop) {
    const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0) die("epoll_create1");
    const std::size_t size = message.size();
    std::vector<std::size_t> got(fds.size(), 0);
    std::string echo(size * fds.size(), '\0');
    std::uint64_t round_trips = 0, errors = 0;
    for (std::size_t i = 0; i < fds.size(); ++i) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = i;
        if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fds[i], &ev) != 0) die("epoll_ctl");
        if (!write_all_plain(fds[i], message.data(), size)) ++errors;
    }
    epoll_event events[64];
    while (!stop.load(std::memory_order_relaxed) && errors == 0) {
        const int n = epoll_wait(epoll_fd, events, 64, 50);
        for (int k = 0; k < n; ++k) {
            const std::size_t i = events[k].data.u64;
            char* into = &echo[i * size];
            const ssize_t r = ::read(fds[i], into + got[i], size - got[i]);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                ++errors;
                continue;
            }
            got[i] += static_cast<std::size_t>(r);
            if (got[i] < size) continue;
            got[i] = 0;
            if (std::memcmp(into, message.data(), size) != 0) ++errors;
            ++round_trips;
            if (!write_all_plain(fds[i], message.data(), size)) ++errors;
        }
        counter.round_trips.store(round_trips, std::memory_order_relaxed);
        counter.errors.store(errors, std::memory_order_relaxed);
    }
    counter.errors.store(errors, std::memory_order_relaxed);
    ::close(epoll_fd);
}

// The child process: connects, drives the echo, reports over `report_fd`: one byte when
// the window opens, a ClientReport when it closes. Then closes every connection and returns
// the process's exit status.
int run_client_process(int port, const Config& cfg, int report_fd) {
    std::vector<int> fds;
    const sockaddr_in addr = loopback(port);
    for (int c = 0; c < cfg.connections; ++c) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) die("client connect");
        set_nodelay(fd);
        set_nonblocking(fd);
        fds.push_back(fd);
    }
    std::string message(static_cast<std::size_t>(cfg.bytes), 'x');
    for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>('a' + i % 26);

    ClientCounter counters[2];
    std::atomic<bool> stop{false};
    std::vector<int> halves[2];
    for (std::size_t i = 0; i < fds.size(); ++i) halves[i % 2].push_back(fds[i]);
    std::thread threads[2];
    for (int t = 0; t < 2; ++t) {
        threads[t] = std::thread([&, t] {
            name_thread("client");
            client_loop(halves[t], message, counters[t], stop);
        });
    }
    auto total = [&] { return counters[0].round_trips.load() + counters[1].round_trips.load(); };

    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.warmup_s));
    const std::uint64_t n0 = total();
    const double cpu0 = process_cpu_seconds(RUSAGE_SELF);
    const auto t0 = Clock::now();
    const char start_byte = 'S';
    if (!fsched_bench::write_all(report_fd, &start_byte, 1)) die("client report");

    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.window_s));
    ClientReport report;
    report.round_trips = total() - n0;
    report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    report.cpu_seconds = process_cpu_seconds(RUSAGE_SELF) - cpu0;
    if (!fsched_bench::write_all(report_fd, &report, sizeof report)) die("client report");

    stop.store(true);
    for (auto& t : threads) t.join();
    report.errors = counters[0].errors.load() + counters[1].errors.load();
    if (!fsched_bench::write_all(report_fd, &report.errors, sizeof report.errors)) die("client report");
    for (int fd : fds) ::close(fd);
    return 0;
}

// One repetition's figures.
struct Sample {
    double rate = 0;        // round trips per second
    double server_us = -1;  // server CPU µs per round trip (-1: not measured separately)
    double client_us = -1;  // client CPU µs per round trip
    double total_us = 0;    // both, µs per round trip
    bool failed = false;
};

Sample run_forked(Server& server, const Config& cfg) {
    Sample s;
    int port = 0;
    const int listen_fd = listen_loopback(server.nonblocking_listener(), &port);
    if (listen_fd < 0) die("listen");
    // Fork before the server starts any thread: the child is a copy of a single-threaded
    // process.
    fsched_bench::ChildProcess client([&](int report_fd) {
        in_client_process = true;
        ::close(listen_fd);
        return run_client_process(port, cfg, report_fd);
    });
    if (!client.started()) die("fork the client");
    server.start(listen_fd, cfg.connections);

    char start_byte = 0;
    ClientReport report;
    std::uint64_t errors = 0;
    bool ok = client.read(&start_byte, 1);
    const double cpu0 = server.cpu_seconds();
    ok = ok && client.read(&report, sizeof report);
    const double cpu1 = server.cpu_seconds();
    ok = ok && client.read(&errors, sizeof errors);
    server.finish();
    ::close(listen_fd);
    const bool exited_ok = client.wait();
    ok = ok && exited_ok && errors == 0 && report.round_trips > 0;
    if (!ok) {
        std::fprintf(stderr, "bench_io: a client failed (%llu errors)\n", static_cast<unsigned long long>(errors));
        s.failed = true;
        return s;
    }
    const double n = static_cast<double>(report.round_trips);
    s.rate = n / report.seconds;
    s.server_us = (cpu1 - cpu0) / n * 1e6;
    s.client_us = report.cpu_seconds / n * 1e6;
    s.total_us = s.server_us + s.client_us;
    return s;
}

// ---------------------------------------------------------------------------------------
// Client and server in one process, on one 2-worker scheduler
// ---------------------------------------------------------------------------------------

struct alignas(64) ConnectionCounter {
    std::atomic<std::uint64_t> round_trips{0};
};

Sample run_shared(const Config& cfg) {
    Sample s;
    int port = 0;
    const int listen_fd = listen_loopback(true, &port);
    if (listen_fd < 0) die("listen");
    const sockaddr_in addr = loopback(port);
    std::vector<ConnectionCounter> counters(static_cast<std::size_t>(cfg.connections));
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::string message(static_cast<std::size_t>(cfg.bytes), 'x');
    for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>('a' + i % 26);

    fsched::Scheduler scheduler(2, false, "echo+client");
    scheduler.start();
    scheduler.schedule([listen_fd, &cfg] { accept_fsched(listen_fd, cfg.connections); });
    for (int c = 0; c < cfg.connections; ++c) {
        scheduler.schedule([&, c] {
            const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0 ||
                fsched::io::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr, std::chrono::seconds(10)) != 0) {
                ++errors;
                if (fd >= 0) ::close(fd);
                return;
            }
            set_nodelay(fd);
            std::string echo(message.size(), '\0');
            std::uint64_t round_trips = 0;
            while (!stop.load(std::memory_order_relaxed)) {
                if (!write_all_fsched(fd, message.data(), message.size())) {
                    ++errors;
                    break;
                }
                std::size_t got = 0;
                while (got < echo.size()) {
                    const ssize_t r = fsched::io::read(fd, &echo[got], echo.size() - got);
                    if (r <= 0) break;
                    got += static_cast<std::size_t>(r);
                }
                if (got < echo.size() || echo != message) {
                    ++errors;
                    break;
                }
                counters[static_cast<std::size_t>(c)].round_trips.store(++round_trips, std::memory_order_relaxed);
            }
            ::close(fd);
        });
    }
    auto total = [&] {
        std::uint64_t sum = 0;
        for (auto& counter : counters) sum += counter.round_trips.load(std::memory_order_relaxed);
        return sum;
    };
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.warmup_s));
    const std::uint64_t n0 = total();
    const double cpu0 = process_cpu_seconds(RUSAGE_SELF);
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.window_s));
    const double n = static_cast<double>(total() - n0);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_seconds(RUSAGE_SELF) - cpu0;
    stop.store(true);
    scheduler.stop();
    ::close(listen_fd);
    if (errors.load() != 0 || n == 0) {
        std::fprintf(stderr, "bench_io: shared scheduler case failed (%d errors)\n", errors.load());
        s.failed = true;
        return s;
    }
    s.rate = n / seconds;
    s.total_us = cpu / n * 1e6;
    return s;
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

struct Row {
    std::string name;
    bool ours = false;
    std::function<Sample()> run;
    std::vector<Sample> samples;
    bool failed = false;
};

// Median over the repetitions of one CPU figure; negative: not measured for this row.
double cpu_median(const Row& row, double Sample::*field) {
    std::vector<double> v;
    for (const Sample& s : row.samples) {
        if (s.*field >= 0) v.push_back(s.*field);
    }
    return v.empty() ? -1 : fsched_bench::median(v);
}

std::string cell(double value, const char* format) {
    return value < 0 ? "-" : fsched_bench::format(format, value);
}

void print_table(const std::vector<Row>& rows, const Config& cfg) {
    fsched_bench::TextTable table;
    table.begin_group(fsched_bench::format("echo: %d connections, %d-byte messages, loopback TCP; round trips/s (higher "
                                           "is better) and CPU\nmicroseconds per round trip (lower is better)",
                                           cfg.connections, cfg.bytes),
                      {{"best rt/s", 11}, {"median rt/s", 11}, {"ours/x best", 11}, {"ours/x med", 11},
                       {"server us", 10}, {"ours/x srv", 11}, {"client us", 10}, {"total us", 10}});
    const Row* ours = nullptr;
    for (const Row& r : rows) {
        if (r.ours && !r.failed) ours = &r;
    }
    auto rates = [](const Row& r) {
        std::vector<double> v;
        for (const Sample& s : r.samples) v.push_back(s.rate);
        return v;
    };
    for (const Row& r : rows) {
        if (r.failed) {
            table.row(r.name, {"failed"});
            continue;
        }
        const std::vector<double> v = rates(r);
        const double best = *std::max_element(v.begin(), v.end());
        const double med = fsched_bench::median(v);
        const double server_us = cpu_median(r, &Sample::server_us);
        double ratio_best = -1, ratio_med = -1, ratio_server = -1;
        if (ours) {
            // Ratios of times per round trip, as in every other table: x's rate / ours.
            const std::vector<double> o = rates(*ours);
            ratio_best = best / *std::max_element(o.begin(), o.end());
            ratio_med = med / fsched_bench::median(o);
            const double ours_server_us = cpu_median(*ours, &Sample::server_us);
            if (server_us > 0 && ours_server_us > 0) ratio_server = ours_server_us / server_us;
        }
        table.row(r.name, {cell(best, "%.0f"), cell(med, "%.0f"), cell(ratio_best, "%.2f"), cell(ratio_med, "%.2f"),
                           cell(server_us, "%.2f"), cell(ratio_server, "%.2f"),
                           cell(cpu_median(r, &Sample::client_us), "%.2f"), cell(cpu_median(r, &Sample::total_us), "%.2f")});
    }
    table.print();
    std::printf("\n  server / client / total us: CPU microseconds per round trip, median over the repetitions:\n"
                "  the server process, the forked epoll client, and both (for the one-scheduler row, its one\n"
                "  process). 2 cores in all: total us x rate <= 2,000,000. On a shared machine the rate also\n"
                "  measures how much CPU each design wins from the neighbours (100 runnable threads win more\n"
                "  than 2); the CPU per round trip does not, so \"ours/x srv\" is the steadier comparison.\n");
    std::printf("\nours/x is a ratio of times per round trip (x's rate / ours, or ours' server CPU / x's):\n"
                "< 1: fiber_sched is faster than x; > 1: slower.\n");
}

bool parse(int argc, char** argv, Config& cfg) {
    bool reps_given = false, window_given = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--quick") {
            cfg.quick = true;
        } else if (a == "--reps" && has_value) {
            cfg.reps = std::atoi(argv[++i]);
            reps_given = true;
        } else if (a == "--rep-ms" && has_value) {
            cfg.window_s = std::atof(argv[++i]) / 1e3;
            window_given = true;
        } else if (a == "--filter" && has_value) {
            cfg.filter = argv[++i];
        } else if (a == "--connections" && has_value) {
            cfg.connections = std::atoi(argv[++i]);
        } else if (a == "--bytes" && has_value) {
            cfg.bytes = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr,
                         "usage: %s [--quick] [--reps N] [--rep-ms MS] [--filter TEXT] [--connections N] [--bytes N]\n"
                         "  --quick          one short repetition per case (a smoke test, the numbers are noise)\n"
                         "  --reps N         repetitions per case (default 5)\n"
                         "  --rep-ms MS      measured window of one repetition (default 600; 150 with --quick)\n"
                         "  --filter TEXT    run only cases whose \"echo/implementation\" name contains TEXT\n"
                         "  --connections N  concurrent connections (default 100)\n"
                         "  --bytes N        message size (default 64)\n",
                         argv[0]);
            return false;
        }
    }
    if (cfg.quick) {
        if (!reps_given) cfg.reps = 1;
        if (!window_given) cfg.window_s = 0.15;
    }
    cfg.reps = std::max(cfg.reps, 1);
    cfg.connections = std::max(cfg.connections, 2);
    cfg.bytes = std::max(cfg.bytes, 1);
    cfg.window_s = std::max(cfg.window_s, 0.01);
    cfg.warmup_s = std::max(cfg.window_s / 10, 0.02);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Config cfg;
    if (!parse(argc, argv, cfg)) return 2;
    raise_fd_limit();

    std::printf("%s%s; %u hardware threads\n", fsched_bench::build_line("bench_io").c_str(),
                fsched_bench::go_note().c_str(), std::thread::hardware_concurrency());
    std::printf("%s; %d repetition%s per case of a %.0f ms window after a %.0f ms warm-up; best and median shown\n",
                cfg.quick ? "--quick: one short window, the numbers are noise" : "full run", cfg.reps,
                cfg.reps == 1 ? "" : "s", cfg.window_s * 1e3, cfg.warmup_s * 1e3);
    std::fflush(stdout);

    FschedServer fsched_server;
    ThreadServer thread_server;
    EpollServer epoll_server;
    GoServer go_server;
    std::vector<Row> rows;
    rows.push_back(Row{"fsched, fiber per connection", true, [&] { return run_forked(fsched_server, cfg); }, {}, false});
    rows.push_back(Row{"thread per connection, blocking", false, [&] { return run_forked(thread_server, cfg); }, {}, false});
    rows.push_back(Row{"epoll loop, 2 threads", false, [&] { return run_forked(epoll_server, cfg); }, {}, false});
    if (fsched_bench::have_go()) {
        rows.push_back(Row{"Go, goroutine per connection, GOMAXPROCS=2", false, [&] { return run_forked(go_server, cfg); },
                           {}, false});
    }
    rows.push_back(Row{"fsched, client + server on one scheduler", false, [&] { return run_shared(cfg); }, {}, false});
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const Row& r) {
                                  return !cfg.filter.empty() && ("echo/" + r.name).find(cfg.filter) == std::string::npos;
                              }),
               rows.end());

    for (int rep = 0; rep < cfg.reps; ++rep) {
        for (Row& row : rows) {
            if (row.failed) continue;
            const Sample s = row.run();
            if (s.failed) {
                row.failed = true;
            } else {
                row.samples.push_back(s);
            }
        }
    }
    print_table(rows, cfg);
    const bool any_failed = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.failed; });
    return any_failed ? 1 : 0;
}
