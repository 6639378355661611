// bench_util.hpp — timing helpers shared by the fiber_sched benchmarks.
//
// Not part of the library. Each benchmark is one .cpp that defines
// FIBER_SCHED_IMPLEMENTATION itself and includes this file for:
//   - Options: the command line every benchmark understands (--quick, --reps, --iters, --filter);
//   - measure(): warm up, calibrate an iteration count, time several repetitions, and
//     return the best (min) and median nanoseconds per operation;
//   - median(): the median of a benchmark's samples;
//   - ThreadPool: the std::thread pool the baselines use (bench_scheduler, bench_latency);
//   - Timing and timed(): measure() that one slow call cannot spoil (bench_sync, bench_toolbox);
//   - join_boost_work_stealing(): a process's two threads on Boost.Fiber's work_stealing;
//   - TextTable: the aligned table every benchmark prints its results in, format() for its
//     cells, and Table, one on it that prints each ns/op result beside its baselines with
//     the ratio ours / baseline;
//   - build_line() and boost_note(): the first line of every benchmark's output;
//   - the Boost macros, FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT and _FIBER, defined 0 or 1;
//   - ChildProcess, write_all() and read_exact(): a forked child with a pipe back to the
//     benchmark, for the baselines and the client that must not run in its process, and
//     run_cases_in_child(): a benchmark's rows run in one such child (bench_sync, bench_toolbox);
//   - GoTwin, run_go_twin(), have_go(), go_version() and go_note(): the Go twins of
//     bench/go/, run as a child process when the build made them (FIBER_SCHED_BENCH_GO_TWINS).
// The benchmarks need a POSIX system (bench/CMakeLists.txt skips them elsewhere).
#ifndef FIBER_SCHED_BENCH_UTIL_HPP
#define FIBER_SCHED_BENCH_UTIL_HPP

#include "fiber_sched.hpp"

#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// The Boost baselines. The build defines FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT=1 when it found
// Boost.Context (bench_fiber's baseline) and FIBER_SCHED_BENCH_HAVE_BOOST_FIBER=1 when it found
// Boost.Fiber (bench_scheduler's and bench_sync's). Left undefined they are 0 here, so that a
// benchmark can test its library's macro in #if and in C++ alike; each includes the Boost
// headers it uses itself.
#ifndef FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT
#define FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT 0
#endif
#ifndef FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#define FIBER_SCHED_BENCH_HAVE_BOOST_FIBER 0
#endif
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT || FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/version.hpp>
#endif
#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
#include <boost/fiber/algo/work_stealing.hpp>
#include <boost/fiber/condition_variable.hpp>
#include <boost/fiber/mutex.hpp>
#include <boost/fiber/operations.hpp>
#endif

namespace fsched_bench {

// Written after every timed loop so the compiler must keep the work that produced it.
inline volatile std::uint64_t sink = 0;

// The command line shared by every benchmark.
struct Options {
    bool quick = false;         // tiny fixed counts: CTest checks that the benchmark runs
    int reps = 15;              // timed repetitions per case
    std::uint64_t iters = 0;    // fixed iterations per repetition; 0: calibrate
    double rep_ms = 40.0;       // calibration target: milliseconds per repetition
    std::string filter;         // run only cases whose "group/impl" name contains this

    // Returns false (after printing usage) on a bad or --help argument.
    bool parse(int argc, char** argv) {
        for (int i = 1; i < argc; ++i) {
            const char* a = argv[i];
            const bool has_value = i + 1 < argc;
            if (std::strcmp(a, "--quick") == 0) {
                quick = true;
            } else if (std::strcmp(a, "--reps") == 0 && has_value) {
                reps = std::atoi(argv[++i]);
            } else if (std::strcmp(a, "--iters") == 0 && has_value) {
                iters = std::strtoull(argv[++i], nullptr, 10);
            } else if (std::strcmp(a, "--rep-ms") == 0 && has_value) {
                rep_ms = std::atof(argv[++i]);
            } else if (std::strcmp(a, "--filter") == 0 && has_value) {
                filter = argv[++i];
            } else {
                usage(argv[0]);
                return false;
            }
        }
        if (quick) {
            reps = std::min(reps, 3);
            if (iters == 0) iters = 1000;
        }
        if (reps < 1) reps = 1;
        return true;
    }

    bool selected(const std::string& name) const {
        return filter.empty() || name.find(filter) != std::string::npos;
    }

    static void usage(const char* prog) {
        std::fprintf(stderr,
                     "usage: %s [--quick] [--reps N] [--iters N] [--rep-ms MS] [--filter TEXT]\n"
                     "  --quick       tiny fixed iteration counts (a smoke test, numbers are noise)\n"
                     "  --reps N      timed repetitions per case (default 15; the best and median are shown)\n"
                     "  --iters N     fixed operations per repetition, no warm-up or calibration\n"
                     "                (for instruction counting under callgrind)\n"
                     "  --rep-ms MS   calibration target per repetition (default 40)\n"
                     "  --filter TEXT run only cases whose \"group/impl\" name contains TEXT\n",
                     prog);
    }
};

struct Result {
    double min_ns = 0;     // best repetition, ns per operation
    double median_ns = 0;  // median repetition, ns per operation
    std::uint64_t iters = 0;
};

using Clock = std::chrono::steady_clock;

// The plain thread pool the baselines use: `threads` std::threads on one std::mutex,
// std::condition_variable and std::deque of std::function; FIFO; the destructor runs what is
// queued, then joins.
class ThreadPool {
public:
    explicit ThreadPool(int threads) {
        for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
    }
    ~ThreadPool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
        for (std::thread& t : threads_) t.join();
    }

    void submit(std::function<void()> task) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            queue_.push_back(std::move(task));
        }
        cv_.notify_one();
    }

    template <class It>
    void submit(It first, It last) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (; first != last; ++first) queue_.push_back(std::move(*first));
        }
        cv_.notify_all();
    }

private:
    void loop() {
        for (;;) {
            std::function<void()> task;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
                if (queue_.empty()) return;
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            task();
        }
    }

    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

// The median of `samples` (the mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> samples) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    const std::size_t mid = samples.size() / 2;
    return samples.size() % 2 ? samples[mid] : (samples[mid - 1] + samples[mid]) / 2;
}

// ns for one call of body(n).
template <class Body>
double time_body_ns(Body& body, std::uint64_t n) {
    const auto t0 = Clock::now();
    body(n);
    const auto t1 = Clock::now();
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

// The n for which body(n) takes about rep_ms (--iters when given): warms up by doubling n
// until one call takes about a tenth of rep_ms, then scales it, then one more warm-up call.
template <class Body>
std::uint64_t calibrate(const Options& opt, Body& body) {
    std::uint64_t n = opt.iters;
    if (n != 0) return n;
    const double target_ns = opt.rep_ms * 1e6;
    n = 1;
    double t = time_body_ns(body, n);
    while (t < target_ns / 10 && n < (std::uint64_t(1) << 40)) {
        n *= 2;
        t = time_body_ns(body, n);
    }
    const double per_op = t / static_cast<double>(n);
    n = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(target_ns / std::max(per_op, 0.01)));
    time_body_ns(body, n);  // one more warm-up at the final size
    return n;
}

inline Result summarise(std::vector<double> per_op, std::uint64_t n) {
    std::sort(per_op.begin(), per_op.end());
    Result res;
    res.iters = n;
    res.min_ns = per_op.empty() ? 0 : per_op.front();
    res.median_ns = median(std::move(per_op));
    return res;
}

// Times body(n), which must perform n operations, and returns ns per operation, over
// --reps repetitions of about rep_ms each (calibrate()).
template <class Body>
Result measure(const Options& opt, Body&& body) {
    const std::uint64_t n = calibrate(opt, body);
    std::vector<double> per_op;
    per_op.reserve(static_cast<std::size_t>(opt.reps));
    for (int r = 0; r < opt.reps; ++r) per_op.push_back(time_body_ns(body, n) / static_cast<double>(n));
    return summarise(std::move(per_op), n);
}

// measure() for several bodies at once, repetition by repetition (the first repetition of
// each, then the second of each...), so that a slow spell of the machine, which can last
// seconds on these VMs, slows them alike; each calibrated on its own first.
inline std::vector<Result> measure_interleaved(const Options& opt,
                                               std::vector<std::function<void(std::uint64_t)>>& bodies) {
    std::vector<std::uint64_t> n;
    for (auto& body : bodies) n.push_back(calibrate(opt, body));
    std::vector<std::vector<double>> per_op(bodies.size());
    for (int r = 0; r < opt.reps; ++r) {
        for (std::size_t k = 0; k < bodies.size(); ++k) {
            per_op[k].push_back(time_body_ns(bodies[k], n[k]) / static_cast<double>(n[k]));
        }
    }
    std::vector<Result> results;
    for (std::size_t k = 0; k < bodies.size(); ++k) results.push_back(summarise(std::move(per_op[k]), n[k]));
    return results;
}

// A measure() result plus the slowest timed repetition: contended cases can be bimodal
// (see BENCHMARKS.md), which the best and the median alone would hide.
struct Timing {
    Result r;
    double max_ns = 0;    // slowest timed repetition, ns per operation
    bool failed = false;  // the case could not be measured (a Go twin or a child that failed)
};

// Like measure(), with a calibration that one slow call cannot spoil and repetitions that
// cannot run away (bench_sync, bench_toolbox). measure()'s calibration stops doubling at the
// first call that takes a tenth of --rep-ms, so one scheduling hiccup of a few ms at a tiny
// count leaves a handful of operations per repetition; and contended cases switch between
// regimes 100 times apart, so a count calibrated in the fast one can make a repetition last
// seconds. So: the count doubles from `start` (256) until a call takes a quarter of
// --rep-ms; the per-operation time is the slowest of three calls at that count; and a
// repetition that takes over 4 x --rep-ms halves the count of the ones after it. Each
// repetition is reported per operation, so repetitions of different counts compare. With
// --iters the count is fixed, as callgrind_per_op.sh needs.
template <class Body>
Timing timed(const Options& opt, Body&& body, std::uint64_t start = 256) {
    auto run_ns = [&](std::uint64_t n) {
        const auto t0 = Clock::now();
        body(n);
        return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    };
    const double target_ns = opt.rep_ms * 1e6;
    std::uint64_t n = opt.iters;
    if (n == 0) {
        n = start;
        run_ns(n);  // warm-up: worker threads started, stacks and queues allocated
        while (run_ns(n) < target_ns / 4 && n < (std::uint64_t(1) << 36)) n *= 2;
        const double worst = std::max({run_ns(n), run_ns(n), run_ns(n)}) / static_cast<double>(n);
        n = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(target_ns / std::max(worst, 0.01)));
    } else {
        run_ns(std::min<std::uint64_t>(n, start));
    }
    Timing t;
    t.r.iters = n;
    std::vector<double> per_op;
    for (int r = 0; r < opt.reps; ++r) {
        const double ns = run_ns(n);
        per_op.push_back(ns / static_cast<double>(n));
        if (opt.iters == 0 && ns > 4 * target_ns && n > 1) n /= 2;
    }
    std::sort(per_op.begin(), per_op.end());
    t.r.min_ns = per_op.front();
    t.r.median_ns = median(per_op);
    t.max_ns = per_op.back();
    return t;
}

#if FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
// The calling thread and one helper, both on Boost.Fiber's work_stealing(2), its default
// (spinning when idle). Once per process, in a child: the helper runs until it _exit()s.
inline void join_boost_work_stealing() {
    namespace bf = boost::fibers;
    struct Quit {
        bf::mutex mutex;
        bf::condition_variable cv;
        bool quit = false;
    };
    auto* q = new Quit;  // leaked with the helper on purpose
    std::thread([q] {
        bf::use_scheduling_algorithm<bf::algo::work_stealing>(2);
        std::unique_lock<bf::mutex> lock(q->mutex);
        q->cv.wait(lock, [q] { return q->quit; });
    }).detach();
    // Returns once both threads have registered (the constructor waits at a barrier).
    bf::use_scheduling_algorithm<bf::algo::work_stealing>(2);
}
#endif

// The text table every benchmark prints: groups of rows, each group under a blank line, its
// title, a header and a rule. The first column holds the implementation, left-aligned and as
// wide as the longest name in the whole table, so that the groups line up; the other columns
// are the group's own, each right-aligned at its width. A cell wider than its column pushes
// the rest of its row right instead of being cut, and a row may stop short of the last
// column, as a "failed" row does.
class TextTable {
public:
    struct Column {
        std::string header;
        int width;
    };

    void begin_group(std::string title, std::vector<Column> columns) {
        groups_.push_back(Group{std::move(title), std::move(columns), {}});
    }

    void row(std::string impl, std::vector<std::string> cells) {
        groups_.back().lines.push_back(Line{std::move(impl), std::move(cells), false});
    }

    // A line of text under the group's rows so far, indented like them.
    void note(std::string text) { groups_.back().lines.push_back(Line{std::move(text), {}, true}); }

    void print(std::FILE* out = stdout) const {
        std::size_t w = std::strlen("implementation");
        for (const Group& g : groups_)
            for (const Line& line : g.lines)
                if (!line.is_note) w = std::max(w, line.text.size());
        const int iw = static_cast<int>(w);
        for (const Group& g : groups_) {
            std::fprintf(out, "\n%s\n", g.title.c_str());
            std::vector<std::string> headers;
            std::size_t rule = w;
            for (const Column& c : g.columns) {
                headers.push_back(c.header);
                rule += 2 + static_cast<std::size_t>(c.width);
            }
            print_row(out, iw, "implementation", headers, g.columns);
            std::fprintf(out, "  %s\n", std::string(rule, '-').c_str());
            for (const Line& line : g.lines) {
                if (line.is_note) {
                    std::fprintf(out, "  %s\n", line.text.c_str());
                } else {
                    print_row(out, iw, line.text, line.cells, g.columns);
                }
            }
        }
    }

private:
    struct Line {
        std::string text;  // a row's implementation, or a note
        std::vector<std::string> cells;
        bool is_note;
    };
    struct Group {
        std::string title;
        std::vector<Column> columns;
        std::vector<Line> lines;
    };

    static void print_row(std::FILE* out, int iw, const std::string& impl, const std::vector<std::string>& cells,
                          const std::vector<Column>& columns) {
        std::fprintf(out, "  %-*s", iw, impl.c_str());
        for (std::size_t i = 0; i < cells.size() && i < columns.size(); ++i)
            std::fprintf(out, "  %*s", columns[i].width, cells[i].c_str());
        std::fprintf(out, "\n");
    }

    std::vector<Group> groups_;
};

// printf() into a std::string, for a TextTable cell or note.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string format(const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    return buf;
}

// ns/op results grouped by benchmark. One row per group is marked as fiber_sched's
// ("ours"); every row then shows ours / this row, for the best and for the median ("-"
// when --filter left ours out).
class Table {
public:
    void begin_group(std::string title) { groups_.push_back(Group{std::move(title), {}, -1}); }

    void add(std::string impl, const Result& r, bool ours = false) {
        if (groups_.empty()) begin_group("");
        Group& g = groups_.back();
        if (ours) g.ours = static_cast<int>(g.rows.size());
        g.rows.push_back(Row{std::move(impl), r});
    }

    void print(std::FILE* out = stdout) const {
        TextTable table;
        for (const Group& g : groups_) {
            if (g.rows.empty()) continue;  // every row filtered out
            table.begin_group(g.title, {{"min ns/op", 10}, {"median ns", 10}, {"ours/x min", 11},
                                        {"ours/x med", 11}, {"iters/rep", 12}});
            for (const Row& row : g.rows) {
                std::string ratio_min = "-", ratio_med = "-";
                if (g.ours >= 0) {
                    const Result& ours = g.rows[static_cast<std::size_t>(g.ours)].r;
                    ratio_min = format("%.2f", ours.min_ns / row.r.min_ns);
                    ratio_med = format("%.2f", ours.median_ns / row.r.median_ns);
                }
                table.row(row.impl, {format("%.1f", row.r.min_ns), format("%.1f", row.r.median_ns), ratio_min,
                                     ratio_med, std::to_string(row.r.iters)});
            }
        }
        table.print(out);
        std::fprintf(out, "\nours/x < 1: fiber_sched is faster than x; > 1: slower.\n");
    }

private:
    struct Row {
        std::string impl;
        Result r;
    };
    struct Group {
        std::string title;
        std::vector<Row> rows;
        int ours;  // index of fiber_sched's row, -1 when filtered out
    };
    std::vector<Group> groups_;
};

// "g++ 12.2.0", "clang 14.0.6": the compiler, for build_line().
inline std::string compiler_string() {
#if defined(__clang__)
    std::string s = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    std::string s = std::string("g++ ") + __VERSION__;
#else
    std::string s = "unknown compiler";
#endif
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

// What every benchmark's first line starts with: "<benchmark>: fiber_sched backend
// <backend>; <compiler>".
inline std::string build_line(const char* benchmark) {
    return std::string(benchmark) + ": fiber_sched backend " + fsched::backend() + "; " + compiler_string();
}

// The first line's Boost part: "; Boost 1.74.0" and `suffix` when the benchmark's Boost rows
// are compiled in (`compiled_in`: the FIBER_SCHED_BENCH_HAVE_BOOST_* macro of its library),
// else "; " and `missing`, which says what is left out.
inline std::string boost_note([[maybe_unused]] bool compiled_in, [[maybe_unused]] const char* suffix,
                              const char* missing) {
#if FIBER_SCHED_BENCH_HAVE_BOOST_CONTEXT || FIBER_SCHED_BENCH_HAVE_BOOST_FIBER
    if (compiled_in) {
        return "; Boost " + std::to_string(BOOST_VERSION / 100000) + "." + std::to_string(BOOST_VERSION / 100 % 1000) +
               "." + std::to_string(BOOST_VERSION % 100) + suffix;
    }
#endif
    return std::string("; ") + missing;
}

// ---------------------------------------------------------------------------------------
// Child processes (POSIX only: on Windows only bench_fiber is built, without them)
// ---------------------------------------------------------------------------------------
#if !defined(_WIN32)

// Calls transfer(fd, p, left) (a read() or a write()) until all `n` bytes from `p` on have
// moved; false on an error or on 0 bytes moved (end of file) first. Restarts after a signal.
template <class Byte, class Transfer>
bool transfer_all(int fd, Byte* p, std::size_t n, Transfer transfer) {
    while (n > 0) {
        const ssize_t moved = transfer(fd, p, n);
        if (moved < 0 && errno == EINTR) continue;
        if (moved <= 0) return false;
        p += moved;
        n -= static_cast<std::size_t>(moved);
    }
    return true;
}

// Writes all `n` bytes of `buf` to `fd`; false on an error.
inline bool write_all(int fd, const void* buf, std::size_t n) {
    return transfer_all(fd, static_cast<const char*>(buf), n,
                        [](int f, const char* p, std::size_t left) { return ::write(f, p, left); });
}

// Reads exactly `n` bytes from `fd` into `buf`; false on an error or at end of file first.
inline bool read_exact(int fd, void* buf, std::size_t n) {
    return transfer_all(fd, static_cast<char*>(buf), n,
                        [](int f, char* p, std::size_t left) { return ::read(f, p, left); });
}

// A forked child process with a pipe from it to the parent. The baselines that need a
// process of their own run in one (Boost's work_stealing sets up per-process state that
// cannot be torn down safely), and so does bench_io's client (its CPU must not be counted
// as the server's). Fork only while the parent has no other threads: the child has a copy of
// the forking thread alone, and a lock another thread held stays locked in it forever.
class ChildProcess {
public:
    // Forks; the child runs body(fd), fd being the pipe's write end, and leaves with
    // _exit(body's return value). _exit() runs no destructors and no atexit handlers: what the
    // child inherited (the parent's schedulers, stdio buffers, Boost's statics) is the
    // parent's to tear down, not the child's. stdout and stderr are flushed first, or the
    // child would print the parent's buffered output a second time. Both pipe ends are
    // close-on-exec, so a child that execs keeps only what it dup2()s. started() is false if
    // the pipe or the fork failed, with errno saying why.
    template <class Body>
    explicit ChildProcess(Body&& body) {
        std::fflush(stdout);
        std::fflush(stderr);
        int fds[2];
        if (::pipe(fds) != 0) return;
        ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
        ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
        pid_ = ::fork();
        if (pid_ < 0) {
            const int fork_errno = errno;
            ::close(fds[0]);
            ::close(fds[1]);
            errno = fork_errno;
            return;
        }
        if (pid_ == 0) {
            ::close(fds[0]);
            const int status = body(fds[1]);
            std::fflush(stdout);
            std::fflush(stderr);
            ::_exit(status);
        }
        ::close(fds[1]);
        fd_ = fds[0];
    }
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    ~ChildProcess() { wait(); }

    bool started() const { return pid_ > 0; }

    // The child's process id (<= 0 if it did not start or was waited for).
    pid_t pid() const { return pid_; }

    // Reads exactly `n` bytes that the child wrote; false if it could not (the child ended,
    // crashed or never started).
    bool read(void* buf, std::size_t n) { return fd_ >= 0 && read_exact(fd_, buf, n); }

    // Everything the child writes until it closes the pipe (by ending).
    std::string read_to_end() {
        std::string text;
        char buf[4096];
        for (ssize_t got; fd_ >= 0 && (got = ::read(fd_, buf, sizeof buf)) != 0;) {
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) break;
            text.append(buf, static_cast<std::size_t>(got));
        }
        return text;
    }

    // Waits for the child; true if it exited with status 0. The pipe is closed first, so
    // that a child blocked writing to it fails (SIGPIPE) instead of hanging the wait. Once:
    // later calls return false.
    bool wait() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        if (pid_ <= 0) return false;
        int status = 0;
        pid_t got;
        while ((got = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        return got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }

private:
    pid_t pid_ = -1;
    int fd_ = -1;  // the pipe's read end
};

// Runs cases[i].run(opt) for each i in `which` in one forked child (after `setup`, if set)
// and copies each Timing back into cases[i].result, setting cases[i].done; false if the
// child failed before it reported them all. A hung baseline ends the child after 300 s.
// Fork only while this process has no other threads (ChildProcess). `Case`: a benchmark's
// row, with run, result and done.
template <class Case>
bool run_cases_in_child(std::vector<Case>& cases, const std::vector<std::size_t>& which, const Options& opt,
                        const std::function<void()>& setup) {
    ChildProcess child([&](int fd) {
        alarm(300);
        if (setup) setup();
        for (std::size_t i : which) {
            const Timing r = cases[i].run(opt);
            if (!write_all(fd, &r, sizeof r)) return 1;
        }
        return 0;
    });
    bool ok = true;
    for (std::size_t i : which) {
        Timing r;
        if (!child.read(&r, sizeof r)) {
            ok = false;
            break;
        }
        cases[i].result = r;
        cases[i].done = true;
    }
    return child.wait() && ok;
}

// ---------------------------------------------------------------------------------------
// The Go twins
// ---------------------------------------------------------------------------------------
//
// bench/go/ is one Go program with a case for each of our cases that Go has a peer for
// (goroutines, Gosched, channels, an echo server). When CMake finds `go` it builds it into
// the build tree and passes its path as FIBER_SCHED_BENCH_GO_TWINS (a string literal), so a
// run never compiles anything; without it the Go rows are left out and the reference
// figures stay. Go's runtime measures its own case and prints one line,
//   result <case> unit <unit> work <per repetition> best <b> median <m> samples <s1,s2,...>
// which run_go_twin() parses: the program's start-up is not in the figures.

// The twins' executable; nullptr when this benchmark was built without them.
inline const char* go_twins_path() {
#ifdef FIBER_SCHED_BENCH_GO_TWINS
    return FIBER_SCHED_BENCH_GO_TWINS;
#else
    return nullptr;
#endif
}

// One command line of the twins. The argv array is built here, in the parent: exec() runs
// in a forked child, where a multi-threaded parent's child must not allocate.
class GoTwin {
public:
    explicit GoTwin(std::vector<std::string> args) : args_(std::move(args)) {
        args_.insert(args_.begin(), go_twins_path() ? go_twins_path() : "");
        for (std::string& a : args_) argv_.push_back(&a[0]);
        argv_.push_back(nullptr);
    }
    GoTwin(const GoTwin&) = delete;
    GoTwin& operator=(const GoTwin&) = delete;

    // In a forked child: replaces it with the twins; returns only if that failed.
    void exec() const { ::execv(argv_[0], argv_.data()); }

    // "go_twins spawn -n 1000", for messages.
    std::string text() const {
        std::string t = "go_twins";
        for (std::size_t i = 1; i < args_.size(); ++i) t += " " + args_[i];
        return t;
    }

private:
    std::vector<std::string> args_;
    std::vector<char*> argv_;
};

// What a measuring case of the twins printed.
struct GoResult {
    bool ok = false;  // false: the twins could not run, failed, or printed no result
    std::string unit;
    std::uint64_t work = 0;  // operations per repetition
    double best = 0;         // the best repetition (for a rate the highest), in `unit`
    double median = 0;
    std::vector<double> samples;  // every timed repetition, in `unit`
};

// Runs `twin` to its end with its stdout read back through a pipe (its stderr is ours);
// `exited_ok`: whether it exited with status 0. Fork only while this process has no other
// threads (see ChildProcess).
inline std::string go_twin_output(const GoTwin& twin, bool& exited_ok) {
    ChildProcess child([&twin](int fd) {
        ::dup2(fd, STDOUT_FILENO);
        twin.exec();
        return 127;
    });
    std::string out = child.read_to_end();
    exited_ok = child.wait();
    return out;
}

// Runs the twins with `args` (the case first, then its flags) and parses their "result" line.
inline GoResult run_go_twin(std::vector<std::string> args) {
    GoResult res;
    if (!go_twins_path()) return res;
    const GoTwin twin(std::move(args));
    bool exited_ok = false;
    std::istringstream lines(go_twin_output(twin, exited_ok));
    for (std::string line; std::getline(lines, line);) {
        std::istringstream words(line);
        std::string word, name;
        if (!(words >> word) || word != "result" || !(words >> name)) continue;
        GoResult r;
        for (std::string key, value; words >> key >> value;) {
            if (key == "unit") {
                r.unit = value;
            } else if (key == "work") {
                r.work = std::strtoull(value.c_str(), nullptr, 10);
            } else if (key == "best") {
                r.best = std::atof(value.c_str());
            } else if (key == "median") {
                r.median = std::atof(value.c_str());
            } else if (key == "samples") {
                std::istringstream list(value);
                for (std::string s; std::getline(list, s, ',');) r.samples.push_back(std::atof(s.c_str()));
            }
        }
        r.ok = exited_ok && !r.samples.empty();
        res = std::move(r);
    }
    if (!res.ok) std::fprintf(stderr, "Go twin failed: %s\n", twin.text().c_str());
    return res;
}

// The Go version the twins were built with ("go1.19.8"); "" when they are absent or do not
// run. Asked once per process.
inline const std::string& go_version() {
    static const std::string version = [] {
        std::string v;
        if (!go_twins_path() || ::access(go_twins_path(), X_OK) != 0) return v;
        bool exited_ok = false;
        std::istringstream words(go_twin_output(GoTwin({"version"}), exited_ok));
        std::string word;
        if (exited_ok && words >> word && word == "version") words >> v;
        return v;
    }();
    return version;
}

// Whether the Go rows run: the twins were built and answer.
inline bool have_go() { return !go_version().empty(); }

// The first line's Go part: "; Go twins: go1.19.8", or why there are no Go rows.
inline std::string go_note() {
    if (have_go()) return "; Go twins: " + go_version();
    if (!go_twins_path()) return "; no Go rows (no Go twins in this build: CMake found no `go`, or FIBER_SCHED_BENCH_GO=OFF)";
    return std::string("; no Go rows (the Go twins at ") + go_twins_path() + " do not run)";
}
#endif  // !_WIN32

}  // namespace fsched_bench

#endif  // FIBER_SCHED_BENCH_UTIL_HPP
