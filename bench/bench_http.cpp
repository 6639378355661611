// bench_http.cpp — an HTTP/1.1 keep-alive server on fsched::io beside its baselines under
// wrk, measured in one run.
//
// wrk (one thread, C connections, default 100) sends GET requests over keep-alive
// connections for a fixed time; every server answers each with the same 13-byte response.
// The servers, each a process of its own pinned to one core, wrk pinned to another:
//   - fsched: Scheduler(1 worker), one fiber accepting with io::accept and one fiber per
//     connection looping on io::read / io::write ("ours");
//   - epoll loop: the hand-written single-threaded event loop a C programmer would write
//     (level-triggered, read once per event, write the responses straight back);
//   - Go, when the build made the Go twins (bench/go/http.go): a goroutine per connection,
//     bufio on net.Conn, GOMAXPROCS=1 (the fair twin), and the same on net/http (more work
//     per request: it parses every header and adds a Date).
// wrk reports requests/s; the server's CPU time over wrk's run (its process CPU clock, all
// threads) divided by the requests wrk counted is the server CPU per request. wrk on one
// core can saturate before the server does, so the rate may measure wrk; the CPU per
// request is the fair figure, and the less sensitive to a shared machine.
//
// Each repetition, for each server in turn (so that drift hits them alike): start it, run
// wrk for a warm-up (a fifth of the window, at least 0.3 s), then for the measured window,
// then kill it. Before that, a built-in client checks that every server answers pipelined
// and sequential requests correctly on a few connections; without wrk (not installed,
// --wrk '') only that check runs, and the benchmark says so.
//
// Usage: bench_http [--quick] [--reps N] [--seconds S] [--connections N] [--filter TEXT]
//                   [--wrk PATH]
//        bench_http --serve fsched|epoll [--port P]   (one server in the foreground, for
//                   strace -c / perf stat; Go's: go_twins http -procs 1 with fd 3 listening)
// Results and how to reproduce them: BENCHMARKS.md.

#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include "bench_net.hpp"
#include "bench_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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

// The one response, byte for byte the Go twin's (bench/go/http.go).
constexpr char response[] =
    "HTTP/1.1 200 OK\r\nServer: bench\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, world!";
constexpr std::size_t response_size = sizeof response - 1;

struct Config {
    int connections = 100;
    int reps = 3;
    double seconds = 5;
    bool quick = false;
    std::string filter;
    std::string wrk = "wrk";
    std::string serve;  // --serve: run this server in the foreground
    int port = 0;
};

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "bench_http: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

// The first two CPUs this process may run on: the servers get the first, wrk the second.
// -1 when there is only one (then nothing is pinned).
int allowed_cpu(int index) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    if (CPU_COUNT(&set) < 2) return -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set) && index-- == 0) return cpu;
    }
    return -1;
}

void pin_to(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

// Requests in `buf` up to the end of the last complete one: each ends with an empty line
// (wrk and the check send GETs without bodies). Returns how many, and their bytes in `used`.
int complete_requests(const char* buf, std::size_t n, std::size_t* used) {
    int count = 0;
    std::size_t start = 0;
    for (std::size_t i = 3; i < n; ++i) {
        if (buf[i] == '\n' && buf[i - 1] == '\r' && buf[i - 2] == '\n' && buf[i - 3] == '\r') {
            ++count;
            start = i + 1;
        }
    }
    *used = start;
    return count;
}

// Up to this many pipelined requests are answered with one write.
constexpr int max_batch = 16;

// Fills `out` with `count` responses (count <= max_batch); returns its length.
std::size_t responses(char* out, int count) {
    for (int i = 0; i < count; ++i) std::memcpy(out + static_cast<std::size_t>(i) * response_size, response, response_size);
    return static_cast<std::size_t>(count) * response_size;
}

// ---------------------------------------------------------------------------------------
// The servers. Each serves the listening socket until it is killed.
// ---------------------------------------------------------------------------------------

void serve_connection_fsched(int fd) {
    char in[4096];
    char out[max_batch * response_size];
    std::size_t have = 0;
    for (;;) {
        const ssize_t r = fsched::io::read(fd, in + have, sizeof in - have);
        if (r <= 0) break;
        have += static_cast<std::size_t>(r);
        std::size_t used = 0;
        int count = complete_requests(in, have, &used);
        if (count == 0 && have == sizeof in) break;  // a request head larger than the buffer
        bool ok = true;
        while (count > 0 && ok) {
            const int batch = std::min(count, max_batch);
            ok = write_all_fsched(fd, out, responses(out, batch));
            count -= batch;
        }
        if (!ok) break;
        std::memmove(in, in + used, have - used);
        have -= used;
    }
    ::close(fd);
}

[[noreturn]] void serve_fsched(int listen_fd) {
    fsched::Scheduler scheduler(1, false, "http");
    scheduler.start();
    scheduler.schedule([listen_fd] {
        for (;;) {
            const int fd = fsched::io::accept(listen_fd, nullptr, nullptr);
            if (fd < 0) {
                if (fsched::io::last_error() == EMFILE || fsched::io::last_error() == ENFILE) {
                    fsched::this_fiber::sleep_for(std::chrono::milliseconds(10));
                }
                continue;
            }
            set_nodelay(fd);
            fsched::Scheduler::current()->schedule([fd] { serve_connection_fsched(fd); });
        }
    });
    for (;;) pause();
}

// The hand-written loop: one thread, one epoll instance, level-triggered; a connection's
// unanswered bytes live in its slot of `conns` (indexed by fd).
[[noreturn]] void serve_epoll(int listen_fd) {
    struct Connection {
        char in[4096];
        std::size_t have = 0;
    };
    std::vector<std::unique_ptr<Connection>> conns;
    const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0) die("epoll_create1");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev) != 0) die("epoll_ctl");
    char out[max_batch * response_size];
    epoll_event events[128];
    for (;;) {
        const int n = epoll_wait(epoll_fd, events, 128, -1);
        for (int i = 0; i < n; ++i) {
            const int fd = events[i].data.fd;
            if (fd == listen_fd) {
                for (;;) {
                    const int c = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK);
                    if (c < 0) break;
                    set_nodelay(c);
                    if (static_cast<std::size_t>(c) >= conns.size()) conns.resize(static_cast<std::size_t>(c) + 1);
                    conns[static_cast<std::size_t>(c)] = std::make_unique<Connection>();
                    epoll_event add{};
                    add.events = EPOLLIN;
                    add.data.fd = c;
                    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c, &add) != 0) die("epoll_ctl");
                }
                continue;
            }
            Connection& conn = *conns[static_cast<std::size_t>(fd)];
            const ssize_t r = ::read(fd, conn.in + conn.have, sizeof conn.in - conn.have);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            bool ok = r > 0;
            if (ok) {
                conn.have += static_cast<std::size_t>(r);
                std::size_t used = 0;
                int count = complete_requests(conn.in, conn.have, &used);
                ok = count > 0 || conn.have < sizeof conn.in;
                while (count > 0 && ok) {
                    const int batch = std::min(count, max_batch);
                    ok = write_all_plain(fd, out, responses(out, batch));
                    count -= batch;
                }
                std::memmove(conn.in, conn.in + used, conn.have - used);
                conn.have -= used;
            }
            if (!ok) {
                epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
                ::close(fd);
                conns[static_cast<std::size_t>(fd)].reset();
            }
        }
    }
}

// One server as a child process pinned to the servers' core.
class Server {
public:
    virtual ~Server() = default;
    // Starts it on `listen_fd`; returns once it accepts connections.
    virtual void start(int listen_fd, int cpu) = 0;
    // The server process's CPU seconds so far (all its threads).
    double cpu_seconds() const {
        timespec ts{};
        clock_gettime(cpu_clock_, &ts);
        return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
    }
    void stop() {
        if (child_ && child_->pid() > 0) ::kill(child_->pid(), SIGKILL);
        child_.reset();  // waits for it
    }

protected:
    // Forks `body` (which must not return) after pinning, waits for its "ready".
    template <class Body>
    void fork_server(int cpu, Body body) {
        child_ = std::make_unique<fsched_bench::ChildProcess>([cpu, body](int fd) {
            pin_to(cpu);
            return body(fd);
        });
        char ready[6] = {};
        if (!child_->started() || !child_->read(ready, sizeof ready) || std::memcmp(ready, "ready\n", 6) != 0 ||
            clock_getcpuclockid(child_->pid(), &cpu_clock_) != 0) {
            die("start a server");
        }
    }

private:
    std::unique_ptr<fsched_bench::ChildProcess> child_;
    clockid_t cpu_clock_{};
};

// fsched or the epoll loop, forked from this (single-threaded) process.
class ForkedServer : public Server {
public:
    explicit ForkedServer(void (*serve)(int)) : serve_(serve) {}
    void start(int listen_fd, int cpu) override {
        void (*serve)(int) = serve_;
        fork_server(cpu, [serve, listen_fd](int fd) {
            if (!fsched_bench::write_all(fd, "ready\n", 6)) return 1;
            serve(listen_fd);
            return 1;
        });
    }

private:
    void (*serve_)(int);
};

// A Go twin (`go_twins http|nethttp -procs 1`) with the listening socket as fd 3.
class GoServer : public Server {
public:
    explicit GoServer(const char* which) : twin_({which, "-procs", "1"}) {}
    void start(int listen_fd, int cpu) override {
        const fsched_bench::GoTwin& twin = twin_;
        fork_server(cpu, [&twin, listen_fd](int fd) {
            if (::dup2(listen_fd, 3) != 3) return 126;
            // dup2 onto itself (the listener is fd 3 already) keeps FD_CLOEXEC: clear it.
            ::fcntl(3, F_SETFD, 0);
            ::fcntl(3, F_SETFL, ::fcntl(3, F_GETFL) & ~O_NONBLOCK);
            ::dup2(fd, STDOUT_FILENO);
            twin.exec();
            return 127;
        });
    }

private:
    fsched_bench::GoTwin twin_;
};

// ---------------------------------------------------------------------------------------
// The built-in check: correct answers to sequential and pipelined requests
// ---------------------------------------------------------------------------------------

// Reads `count` responses: exactly `response` each, or (`exact` false: net/http adds a Date
// header) each a 200 with its 13-byte body.
bool read_responses(int fd, int count, bool exact) {
    std::string want;
    for (int i = 0; i < count; ++i) want.append(response, response_size);
    const std::string body = "\r\n\r\nHello, world!";
    std::string got;
    char buf[4096];
    auto complete = [&] {
        if (exact) return got.size() >= want.size();
        int bodies = 0;
        for (std::size_t at = got.find(body); at != std::string::npos; at = got.find(body, at + 1)) ++bodies;
        return bodies >= count;
    };
    while (!complete()) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 5000) != 1) return false;
        const ssize_t r = ::read(fd, buf, sizeof buf);
        if (r <= 0) return false;
        got.append(buf, static_cast<std::size_t>(r));
    }
    if (exact) return got == want;
    int heads = 0;
    for (std::size_t at = got.find("HTTP/1.1 200 OK\r\n"); at != std::string::npos; at = got.find("HTTP/1.1 200 OK\r\n", at + 1)) ++heads;
    return heads == count && got.size() >= body.size() && got.compare(got.size() - body.size(), body.size(), body) == 0;
}

// 4 connections, 50 rounds each of one request, then of 3 pipelined (one split across
// two writes); false with a message if any answer is wrong.
bool check_server(int port, const char* name, bool exact) {
    const char* request = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: check\r\n\r\n";
    const std::string one = request;
    const std::string three = one + one + one;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    std::vector<int> fds;
    bool ok = true;
    for (int c = 0; c < 4 && ok; ++c) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        if (fd >= 0) fds.push_back(fd);
        if (ok) set_nodelay(fd);
    }
    for (int round = 0; round < 50 && ok; ++round) {
        for (int fd : fds) {
            ok = ok && write_all_plain(fd, one.data(), one.size()) && read_responses(fd, 1, exact);
            const std::size_t split = three.size() / 2 + 7;
            ok = ok && write_all_plain(fd, three.data(), split);
            ok = ok && write_all_plain(fd, three.data() + split, three.size() - split) && read_responses(fd, 3, exact);
        }
    }
    for (int fd : fds) ::close(fd);
    if (!ok) std::fprintf(stderr, "bench_http: %s answered the check wrongly or not at all\n", name);
    return ok;
}

// ---------------------------------------------------------------------------------------
// wrk
// ---------------------------------------------------------------------------------------

struct WrkResult {
    bool ok = false;
    double requests = 0;  // completed in its run
    double rate = 0;      // its "Requests/sec"
};

// Runs wrk pinned to `cpu` against the port for `seconds`; parses its summary.
WrkResult run_wrk(const Config& cfg, int port, double seconds, int cpu) {
    WrkResult res;
    // wrk takes whole seconds.
    const std::string duration = std::to_string(std::max(1, static_cast<int>(seconds + 0.5))) + "s";
    const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
    std::vector<std::string> args{cfg.wrk, "-t1", "-c" + std::to_string(cfg.connections), "-d" + duration, url};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    fsched_bench::ChildProcess child([&](int fd) {
        pin_to(cpu);
        ::dup2(fd, STDOUT_FILENO);
        ::execvp(argv[0], argv.data());
        return 127;
    });
    const std::string out = child.read_to_end();
    const bool exited_ok = child.wait();
    const std::size_t in = out.find(" requests in ");
    const std::size_t per_s = out.find("Requests/sec:");
    if (!exited_ok || in == std::string::npos || per_s == std::string::npos) {
        std::fprintf(stderr, "bench_http: wrk failed:\n%s\n", out.c_str());
        return res;
    }
    std::size_t start = out.rfind('\n', in);
    start = start == std::string::npos ? 0 : start + 1;
    res.requests = std::atof(out.c_str() + start);
    res.rate = std::atof(out.c_str() + per_s + std::strlen("Requests/sec:"));
    // A server that answered wrongly or dropped connections fails the case.
    if (out.find("Non-2xx") != std::string::npos || out.find("Socket errors") != std::string::npos) {
        std::fprintf(stderr, "bench_http: wrk saw errors:\n%s\n", out.c_str());
        return res;
    }
    res.ok = res.requests > 0;
    return res;
}

bool wrk_runs(const Config& cfg) {
    if (cfg.wrk.empty()) return false;
    fsched_bench::ChildProcess child([&](int fd) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        execlp(cfg.wrk.c_str(), cfg.wrk.c_str(), "--version", static_cast<char*>(nullptr));
        return 127;
    });
    const std::string out = child.read_to_end();
    child.wait();  // wrk --version exits 1
    return out.find("wrk") != std::string::npos;
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

struct Sample {
    double rate = 0;    // requests/s, wrk's
    double cpu_us = 0;  // server CPU µs per request
};

struct Row {
    std::string name;
    bool ours;
    bool exact;  // sends `response` byte for byte (all but net/http)
    std::unique_ptr<Server> server;
    std::vector<Sample> samples;
    bool failed = false;
};

std::vector<double> column(const Row& r, double Sample::*field) {
    std::vector<double> v;
    for (const Sample& s : r.samples) v.push_back(s.*field);
    return v;
}

void print_table(const std::vector<Row>& rows, const Config& cfg, int server_cpu, int wrk_cpu) {
    fsched_bench::TextTable table;
    table.begin_group(fsched_bench::format("HTTP/1.1 keep-alive, wrk -t1 -c%d, %.1f s windows; server on CPU %d, wrk on CPU %d;\n"
                                           "requests/s (higher is better) and server CPU us per request (lower is better)",
                                           cfg.connections, cfg.seconds, server_cpu, wrk_cpu),
                      {{"best req/s", 11}, {"median req/s", 12}, {"ours/x med", 11}, {"min cpu us", 10},
                       {"median cpu", 10}, {"max cpu", 8}, {"ours/x cpu", 11}});
    const Row* ours = nullptr;
    for (const Row& r : rows) {
        if (r.ours && !r.failed && !r.samples.empty()) ours = &r;
    }
    for (const Row& r : rows) {
        if (r.failed || r.samples.empty()) {
            table.row(r.name, {"failed"});
            continue;
        }
        const std::vector<double> rates = column(r, &Sample::rate);
        const std::vector<double> cpu = column(r, &Sample::cpu_us);
        std::string ratio_rate = "-", ratio_cpu = "-";
        if (ours) {
            // As every other table: a ratio of times per request, < 1 when we are faster.
            ratio_rate = fsched_bench::format("%.2f", fsched_bench::median(rates) / fsched_bench::median(column(*ours, &Sample::rate)));
            ratio_cpu = fsched_bench::format("%.2f", fsched_bench::median(column(*ours, &Sample::cpu_us)) / fsched_bench::median(cpu));
        }
        table.row(r.name, {fsched_bench::format("%.0f", *std::max_element(rates.begin(), rates.end())),
                           fsched_bench::format("%.0f", fsched_bench::median(rates)), ratio_rate,
                           fsched_bench::format("%.2f", *std::min_element(cpu.begin(), cpu.end())),
                           fsched_bench::format("%.2f", fsched_bench::median(cpu)),
                           fsched_bench::format("%.2f", *std::max_element(cpu.begin(), cpu.end())), ratio_cpu});
    }
    table.print();
    std::printf("\n  cpu us: the server process's CPU time (user + system, all threads) during wrk's run, over the\n"
                "  requests wrk completed. ours/x: x's median rate / ours, and our median CPU / x's: < 1 means\n"
                "  fiber_sched is faster than x; > 1: slower. wrk on one core may saturate before the server, so\n"
                "  the rate can be wrk's; the CPU per request is the fair comparison.\n");
}

bool parse(int argc, char** argv, Config& cfg) {
    bool reps_given = false, seconds_given = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--quick") {
            cfg.quick = true;
        } else if (a == "--reps" && has_value) {
            cfg.reps = std::atoi(argv[++i]);
            reps_given = true;
        } else if (a == "--seconds" && has_value) {
            cfg.seconds = std::atof(argv[++i]);
            seconds_given = true;
        } else if (a == "--connections" && has_value) {
            cfg.connections = std::atoi(argv[++i]);
        } else if (a == "--filter" && has_value) {
            cfg.filter = argv[++i];
        } else if (a == "--wrk" && has_value) {
            cfg.wrk = argv[++i];
        } else if (a == "--serve" && has_value) {
            cfg.serve = argv[++i];
        } else if (a == "--port" && has_value) {
            cfg.port = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr,
                         "usage: %s [--quick] [--reps N] [--seconds S] [--connections N] [--filter TEXT] [--wrk PATH]\n"
                         "       %s --serve fsched|epoll [--port P]\n"
                         "  --quick          one short window per server (a smoke test, the numbers are noise)\n"
                         "  --reps N         repetitions per server (default 3; 1 with --quick)\n"
                         "  --seconds S      wrk's measured window (default 5; 1 with --quick)\n"
                         "  --connections N  wrk's connections (default 100)\n"
                         "  --filter TEXT    run only servers whose \"http/name\" contains TEXT\n"
                         "  --wrk PATH       the wrk to run (default: wrk on PATH; '' for the check only)\n"
                         "  --serve NAME     serve in the foreground on --port (default: any; printed)\n",
                         argv[0], argv[0]);
            return false;
        }
    }
    if (cfg.quick) {
        if (!reps_given) cfg.reps = 1;
        if (!seconds_given) cfg.seconds = 1;
    }
    cfg.reps = std::max(cfg.reps, 1);
    cfg.connections = std::max(cfg.connections, 1);
    cfg.seconds = std::max(cfg.seconds, 1.0);  // wrk takes whole seconds
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Config cfg;
    if (!parse(argc, argv, cfg)) return 2;
    raise_fd_limit();
    ::signal(SIGPIPE, SIG_IGN);

    if (!cfg.serve.empty()) {
        int port = cfg.port;
        const int listen_fd = listen_loopback(true, &port);
        if (listen_fd < 0) die("listen");
        std::printf("bench_http: serving %s on 127.0.0.1:%d\n", cfg.serve.c_str(), port);
        std::fflush(stdout);
        if (cfg.serve == "fsched") serve_fsched(listen_fd);
        if (cfg.serve == "epoll") serve_epoll(listen_fd);
        std::fprintf(stderr, "bench_http: --serve fsched or epoll\n");
        return 2;
    }

    const int server_cpu = allowed_cpu(0), wrk_cpu = allowed_cpu(1);
    const bool have_wrk = wrk_runs(cfg);
    std::printf("%s%s; %u hardware threads\n", fsched_bench::build_line("bench_http").c_str(),
                fsched_bench::go_note().c_str(), std::thread::hardware_concurrency());
    if (have_wrk) {
        std::printf("%s; %d repetition%s per server of a %.1f s wrk window after a warm-up\n",
                    cfg.quick ? "--quick: one short window, the numbers are noise" : "full run", cfg.reps,
                    cfg.reps == 1 ? "" : "s", cfg.seconds);
    } else {
        std::printf("wrk not found (%s): only the built-in check of each server runs, no figures "
                    "(Debian: apt-get install wrk)\n",
                    cfg.wrk.empty() ? "--wrk ''" : cfg.wrk.c_str());
    }
    if (server_cpu < 0) std::printf("fewer than 2 CPUs allowed: nothing is pinned\n");
    std::fflush(stdout);

    std::vector<Row> rows;
    rows.push_back(Row{"fsched, fiber per connection, 1 worker", true, true, std::make_unique<ForkedServer>(&serve_fsched), {}, false});
    rows.push_back(Row{"epoll loop, 1 thread", false, true, std::make_unique<ForkedServer>(&serve_epoll), {}, false});
    if (fsched_bench::have_go()) {
        rows.push_back(Row{"Go, goroutine per connection, bufio, GOMAXPROCS=1", false, true, std::make_unique<GoServer>("http"), {}, false});
        rows.push_back(Row{"Go, net/http, GOMAXPROCS=1", false, false, std::make_unique<GoServer>("nethttp"), {}, false});
    }
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const Row& r) {
                                  return !cfg.filter.empty() && ("http/" + r.name).find(cfg.filter) == std::string::npos;
                              }),
               rows.end());

    bool all_ok = true;
    for (Row& row : rows) {
        int port = 0;
        const int listen_fd = listen_loopback(true, &port);
        if (listen_fd < 0) die("listen");
        row.server->start(listen_fd, server_cpu);
        ::close(listen_fd);
        if (!check_server(port, row.name.c_str(), row.exact)) row.failed = true;
        row.server->stop();
        all_ok = all_ok && !row.failed;
    }
    if (!have_wrk) {
        std::printf("\nevery server answered the check %s\n", all_ok ? "correctly" : "WRONGLY (see above)");
        return all_ok ? 0 : 1;
    }

    const double warmup = std::max(1.0, cfg.seconds / 5);
    for (int rep = 0; rep < cfg.reps; ++rep) {
        for (Row& row : rows) {
            if (row.failed) continue;
            int port = 0;
            const int listen_fd = listen_loopback(true, &port);
        if (listen_fd < 0) die("listen");
            row.server->start(listen_fd, server_cpu);
            ::close(listen_fd);
            const WrkResult warm = run_wrk(cfg, port, warmup, wrk_cpu);
            const double cpu0 = row.server->cpu_seconds();
            const WrkResult run = warm.ok ? run_wrk(cfg, port, cfg.seconds, wrk_cpu) : WrkResult{};
            const double cpu1 = row.server->cpu_seconds();
            row.server->stop();
            if (!run.ok) {
                row.failed = true;
                continue;
            }
            row.samples.push_back(Sample{run.rate, (cpu1 - cpu0) / run.requests * 1e6});
        }
    }
    print_table(rows, cfg, server_cpu, wrk_cpu);
    for (const Row& r : rows) all_ok = all_ok && !r.failed;
    return all_ok ? 0 : 1;
}
