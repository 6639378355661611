// Test helpers: run a piece of code in a child process (forked on POSIX, the test program
// started again on Windows) and collect how it ended.
#pragma once

#include "fiber_sched.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <ostream>  // doctest prints std types through it
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#if defined(_WIN32)
#include <chrono>
#include <cstdlib>
#include <thread>
#if !defined(NOMINMAX)
#define NOMINMAX
#endif
#if !defined(WIN32_LEAN_AND_MEAN)
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#else
#if defined(__APPLE__)
#include <pthread.h>  // pthread_threadid_np: macOS has no gettid
#else
#include <sys/syscall.h>
#endif
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

// Wine builds each Win32 fiber's stack from a few Linux mappings (and at least 1 MiB), so
// under wine the winfiber backend is held to a few thousand fibers at once by Linux's
// vm.max_map_count (Windows itself has no such limit): the tests of very many live fibers
// use fewer there. (The macro names the wine-and-winfiber build; test_stack.cpp uses it
// for wine's handling of an OS fiber's overflow too.)
#if defined(_WIN32) && defined(FIBER_SCHED_USE_WINFIBER) && defined(FIBER_SCHED_TEST_EMULATED)
#define FSCHED_TEST_FEW_MAPPINGS 1
#endif

// An AddressSanitizer runtime that takes none of its own locks across fork(): g++'s libasan
// (libasan.so.8 of g++ 12 does not even import pthread_atfork) and compiler-rt before LLVM 18,
// whose asan got its pthread_atfork handler in llvm/llvm-project#75290 (none on Apple). A
// child of a threaded process may then inherit an allocator lock held for good.
#if defined(FIBER_SCHED_ASAN) && !(defined(__clang__) && __clang_major__ >= 18 && !defined(__APPLE__))
#define FSCHED_TEST_ASAN_UNSAFE_FORK 1
#endif

// In a forked child doctest's checks are lost: report a failure on stderr and exit 1.
#define FSCHED_CHILD_REQUIRE(cond)                                                            \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            std::fprintf(stderr, "line %d: failed: %s (errno %d)\n", __LINE__, #cond, errno); \
            _exit(1);                                                                         \
        }                                                                                     \
    } while (0)

namespace test {

// Whether `text` holds `part`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A file's bytes, all of them; empty when it cannot be opened.
inline std::string read_whole_file(const std::string& path) {
    std::string text;
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (!file) return text;
    char chunk[65536];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, file)) > 0;) text.append(chunk, n);
    std::fclose(file);
    return text;
}

// The line of a fiber_report() about fiber `id` ("" if it is not listed).
inline std::string report_line(const std::string& report, std::uint64_t id) {
    const std::string head = "fiber " + std::to_string(id);
    for (std::size_t at = 0; (at = report.find(head, at)) != std::string::npos; at += head.size()) {
        const bool line_start = at == 0 || report[at - 1] == '\n';
        const char after = at + head.size() < report.size() ? report[at + head.size()] : '\0';
        if (line_start && (after == ':' || after == ' ')) return report.substr(at, report.find('\n', at) - at);
    }
    return "";
}

#if defined(FSCHED_TEST_ASAN_UNSAFE_FORK)
[[maybe_unused]] constexpr bool asan_unsafe_fork = true;
#else
[[maybe_unused]] constexpr bool asan_unsafe_fork = false;
#endif

struct ChildResult {
    bool exited = false;
    int exit_code = -1;
    bool signaled = false;
    int signal = 0;
    std::string err;  // everything the child wrote to stderr
};

// The OS's id of the calling thread. Not std::this_thread::get_id(): pthread_self() is
// declared const, and the compiler may reuse its first answer after a fiber moved to another
// thread (the very bug fibers must avoid).
inline long os_thread_id() {
#if defined(_WIN32)
    return static_cast<long>(GetCurrentThreadId());
#elif defined(__APPLE__)
    std::uint64_t id = 0;  // the kernel's thread id (macOS has no gettid)
    pthread_threadid_np(nullptr, &id);
    return static_cast<long>(id);
#else
    return syscall(SYS_gettid);
#endif
}

// The size of a memory page.
inline std::size_t page_size() {
#if defined(_WIN32)
    SYSTEM_INFO info;
    GetSystemInfo(&info);
    return info.dwPageSize;
#else
    return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
#endif
}

#if !defined(_WIN32)

// Forks, runs `body` in the child with stderr captured, and reports how the child ended.
// A child still running after `seconds` is killed by SIGALRM.
template <class Body>
ChildResult run_in_child(Body&& body, unsigned seconds = 30) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return {};
    std::fflush(stdout);
    std::fflush(stderr);
    // No watch thread at the fork (qemu-user aborts a child forked beside one that waits).
    fsched::detail::quiesce_watch();
    pid_t pid = fork();
    if (pid == 0) {
        close(pipe_fds[0]);
        dup2(pipe_fds[1], STDERR_FILENO);
        // doctest's crash handlers are inherited; the child must die of its own signals.
        for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE}) std::signal(sig, SIG_DFL);
        alarm(seconds);
        body();
        _exit(0);
    }
    close(pipe_fds[1]);
    ChildResult result;
    char buffer[4096];
    ssize_t n;
    while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) result.err.append(buffer, static_cast<std::size_t>(n));
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    result.exited = WIFEXITED(status);
    result.exit_code = result.exited ? WEXITSTATUS(status) : -1;
    result.signaled = WIFSIGNALED(status);
    result.signal = result.signaled ? WTERMSIG(status) : 0;
    return result;
}

#else

// Windows has no fork(). run_in_child() starts this test program again (CreateProcess),
// filtered to the running test case (-tc=) and with FSCHED_TEST_CHILD=<n>:<test case> in
// its environment. The child runs the test case from its start; its calls of run_in_child()
// count as the parent's did (doctest runs subcases in the same order each time) and, at
// the nth, run `body` instead of starting a child, and exit. Earlier calls there return an
// empty result without running anything (what the child's checks say is not looked at).
// How a child ended reads as on POSIX: abort() (exit code 3) is SIGABRT, an access
// violation, guard-page fault or stack overflow is SIGSEGV.
namespace child {
// Set by the doctest listener in main.cpp at the start of each test case.
inline std::string test_case;
inline int calls = 0;  // run_in_child() calls so far in test_case
void run_body_here(int call, void (*run)(void*), void* body);  // main.cpp; does not return
ChildResult start(int call, unsigned seconds);                  // main.cpp
// True in a child for the call that is to run there.
bool is_target(int call);                                       // main.cpp
}  // namespace child

template <class Body>
ChildResult run_in_child(Body&& body, unsigned seconds = 30) {
    const int call = ++child::calls;
    if (child::is_target(call)) {
        child::run_body_here(call, [](void* b) { (*static_cast<std::remove_reference_t<Body>*>(b))(); },
                             static_cast<void*>(&body));
    }
    return child::start(call, seconds);
}

#endif

// True when the child aborted and its stderr names `rule`.
inline bool aborted_with(const ChildResult& r, const std::string& rule) {
    return r.signaled && r.signal == SIGABRT && r.err.find(rule) != std::string::npos;
}

// Fibers that suspended themselves with Fiber::yield() and wait for someone to put them back.
class Mailbox {
public:
    void post(fsched::Fiber::ptr fiber) {
        std::lock_guard<std::mutex> lock(mutex_);
        fibers_.push_back(std::move(fiber));
    }
    fsched::Fiber::ptr take() {
        std::lock_guard<std::mutex> lock(mutex_);
        if (fibers_.empty()) return nullptr;
        fsched::Fiber::ptr fiber = std::move(fibers_.back());
        fibers_.pop_back();
        return fiber;
    }

private:
    std::mutex mutex_;
    std::vector<fsched::Fiber::ptr> fibers_;
};

// A scheduler configuration the suites run under: 1, 2, 4 and 8 workers, with and without
// use_caller.
struct Config {
    std::size_t threads;
    bool use_caller;
};

inline std::vector<Config> all_configs() {
    std::vector<Config> configs;
    for (std::size_t threads : {1u, 2u, 4u, 8u}) {
        for (bool use_caller : {true, false}) configs.push_back({threads, use_caller});
    }
    return configs;
}

inline std::string config_name(const Config& c) {
    return std::to_string(c.threads) + (c.use_caller ? " workers, use_caller" : " workers");
}

// Counts what a scheduler's exception handler receives, by kind.
struct Failures {
    std::atomic<int> bad_alloc{0};
    std::atomic<int> other{0};
    std::function<void(std::exception_ptr)> handler() {
        return [this](std::exception_ptr e) {
            try {
                std::rethrow_exception(e);
            } catch (const std::bad_alloc&) {
                bad_alloc++;
            } catch (...) {
                other++;
            }
        };
    }
};

#if defined(FIBER_SCHED_FAULT_INJECTION)
// Arms `site` to fail from its nth next hit on, and disarms it when it goes out of scope.
struct Fault {
    fsched::detail::FaultSite site;
    Fault(fsched::detail::FaultSite s, long nth) : site(s) { fsched::detail::inject_fault(site, nth); }
    ~Fault() { fsched::detail::inject_fault(site, 0); }
    Fault(const Fault&) = delete;
    Fault& operator=(const Fault&) = delete;
};
#endif

}  // namespace test

// Runs `body(config)` once per configuration, each in its own doctest subcase.
#define FSCHED_FOR_EACH_CONFIG(...)                                               \
    do {                                                                          \
        for (const ::test::Config& config_ : ::test::all_configs()) {             \
            SUBCASE(::test::config_name(config_).c_str()) { (__VA_ARGS__)(config_); } \
        }                                                                         \
    } while (0)

#define FSCHED_CHECK_ABORTS_WITH(body, rule)                                        \
    do {                                                                            \
        ::test::ChildResult child_result_ = ::test::run_in_child(body);             \
        INFO("child stderr: " << child_result_.err);                                \
        CHECK(::test::aborted_with(child_result_, rule));                           \
    } while (0)
