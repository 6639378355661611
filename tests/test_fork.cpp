// fork(): what a child may do whatever the moment it was forked at (issue 20, item 3).
// The child of a process that had just started its first Scheduler makes fibers and
// schedulers (the library's process-wide state and its fork handlers existed before any of
// its threads). Each case fails without its fix.
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#if !defined(_WIN32)  // no fork() on Windows

using fsched::Fiber;
using fsched::Scheduler;
using namespace std::chrono_literals;

// Some of these are unused where the tests that need them are left out (not Linux, no epoll).
namespace {

#if defined(FIBER_SCHED_TSAN)
// ThreadSanitizer's runtime does not support starting threads in the child of a
// multi-threaded process (its own state is copied mid-flight): children there start none.
[[maybe_unused]] constexpr bool tsan = true;
#else
[[maybe_unused]] constexpr bool tsan = false;
#endif
#if defined(FIBER_SCHED_TSAN) || defined(FIBER_SCHED_ASAN)
[[maybe_unused]] constexpr bool sanitized = true;
#else
[[maybe_unused]] constexpr bool sanitized = false;
#endif
#if defined(FIBER_SCHED_TEST_EMULATED)
[[maybe_unused]] constexpr bool emulated = true;  // under qemu-user (tests/cross), which aborts such children
#else
[[maybe_unused]] constexpr bool emulated = false;
#endif
// An AddressSanitizer runtime that takes none of its own locks across fork() (as in
// test_reliability.cpp): g++'s libasan, and compiler-rt's before LLVM 18.
#if defined(FIBER_SCHED_ASAN) && !(defined(__clang__) && __clang_major__ >= 18 && !defined(__APPLE__))
[[maybe_unused]] constexpr bool asan_unsafe_fork = true;
#else
[[maybe_unused]] constexpr bool asan_unsafe_fork = false;
#endif

// Waits for `pid`; how it ended, in words, and whether it exited with 0.
[[maybe_unused]] bool child_succeeded(pid_t pid, std::string& how) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            how = "waitpid failed";
            return false;
        }
    }
    if (WIFEXITED(status)) {
        how = "exit code " + std::to_string(WEXITSTATUS(status));
        return WEXITSTATUS(status) == 0;
    }
    how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : "stopped";
    return false;
}

// A child forked by a test: the crash handlers doctest installed are inherited, and the
// child must die of its own signals; one that hangs is ended by SIGALRM.
[[maybe_unused]] void become_child(unsigned seconds) {
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE}) std::signal(sig, SIG_DFL);
    alarm(seconds);
}

[[maybe_unused]] std::chrono::steady_clock::duration since(std::chrono::steady_clock::time_point start) {
    return std::chrono::steady_clock::now() - start;
}

}  // namespace

// --- item 3: the child of a process whose first Scheduler had just started -----------------

#if defined(__linux__)  // the test program starts itself again through /proc/self/exe

namespace {

constexpr const char* trial_variable = "FSCHED_FORK_TRIAL";

// What the grandchild does: a Fiber, and (where the sanitizer allows threads) a Scheduler.
[[noreturn]] void make_fiber_and_scheduler() {
    int value = 0;
    Fiber f([&value] { value = 1; });
    f.resume();
    if (value != 1) _exit(3);
    if (!tsan) {
        Scheduler s(1, false, "grandchild");
        std::atomic<int> ran{0};
        s.start();
        s.schedule([&ran] { ran++; });
        s.stop();
        if (ran != 1) _exit(4);
    }
    _exit(0);
}

// Starts this test program again with `trial_variable` set to `delay_us`, running only the
// trial below; true if it exited with 0. `how` says how it ended, `err` what it wrote.
bool run_fresh_trial(long delay_us, std::string& how, std::string& err) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
        how = "pipe2 failed";
        return false;
    }
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
        if (std::strncmp(*e, trial_variable, std::strlen(trial_variable)) != 0) env_strings.emplace_back(*e);
    }
    env_strings.push_back(std::string(trial_variable) + "=" + std::to_string(delay_us));
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", no_skip = "--no-skip=true", filter = "--test-case=fork trial: *",
                quiet = "--no-version=true";
    char* argv[] = {&exe[0], &no_skip[0], &filter[0], &quiet[0], nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (rc != 0) {
        close(out[0]);
        how = "posix_spawn failed: " + std::to_string(rc);
        return false;
    }
    char buffer[4096];
    ssize_t n;
    while ((n = read(out[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
        if (n > 0) err.append(buffer, static_cast<std::size_t>(n));
    }
    close(out[0]);
    return child_succeeded(pid, how);
}

}  // namespace

// Run only by the test below, in a process of its own (doctest skips it otherwise): the
// process starts its first Scheduler, as a pre-fork server does, and forks at once.
TEST_CASE("fork trial: a fresh process starts its first Scheduler and forks at once" * doctest::skip()) {
    const char* delay_text = std::getenv(trial_variable);
    if (!delay_text) return;
    alarm(120);  // the parent's guard, should this process hang itself
    const long delay_us = std::atol(delay_text);
    Scheduler s(2, false, "prefork");
    s.start();
    // A worker may be making the library's first stack just now, or about to.
    s.schedule([] {});
    const auto start = std::chrono::steady_clock::now();
    while (since(start) < std::chrono::microseconds(delay_us)) {
    }
    std::fflush(nullptr);  // nothing buffered is written twice
    const pid_t pid = fork();
    if (pid == 0) {
        become_child(sanitized ? 20 : 10);  // a hang in the child ends with SIGALRM
        make_fiber_and_scheduler();
    }
    std::string how;
    const bool ok = pid > 0 && child_succeeded(pid, how);
    if (!ok) std::fprintf(stderr, "the grandchild (forked after %ld us) ended with %s\n", delay_us, how.c_str());
    s.stop();
    std::fflush(stderr);
    _exit(ok ? 0 : 1);  // no doctest summary: the parent reads the exit code
}

TEST_CASE("fork: a child forked right after the first Scheduler of a process starts can make a Fiber and a Scheduler") {
    if (emulated) return;
    // Nor under an AddressSanitizer that does not lock its allocator across fork(): the
    // workers' own start inside that runtime (AsanThread::Init -> pthread_getattr_np -> free
    // -> a quarantine batch from SizeClassAllocator64::GetFromAllocator) takes a lock of its
    // allocator just when this test forks, and the grandchild's first thread waited on it
    // for good (one trial in about 20 here, g++ 12; gdb showed no lock of ours held). The
    // other tests of this file fork while the workers sleep, and run there.
    if (asan_unsafe_fork) return;
    // Before the fix a worker built the stack pool (a function-local static) on its first
    // look at it, and a child forked meanwhile hung in __cxa_guard_acquire making its first
    // fiber: about one child in 1 to 60. Each trial is a fresh process (its first Scheduler
    // is its first use of the library), whose fork comes 0 to 150 us after start().
    // Under ThreadSanitizer a trial takes about a second (its threads' start and exit).
    const int trials = tsan ? 12 : sanitized ? 100 : 250;
    const int enough = tsan ? 6 : 20;
    const auto budget = sanitized ? 60s : 40s;
    const auto start = std::chrono::steady_clock::now();
    int ran = 0, bad = 0;
    std::string first_failure;
    for (int i = 0; i < trials && since(start) < budget; ++i) {
        std::string how, err;
        ++ran;
        if (!run_fresh_trial((i % 16) * 10, how, err)) {
            if (bad++ == 0) first_failure = "trial " + std::to_string(i) + ": " + how + "; " + err;
            break;  // one hang is proof enough, and each costs the child's alarm
        }
    }
    INFO(first_failure);
    CAPTURE(ran);
    CHECK(bad == 0);
    if (bad == 0) CHECK(ran >= enough);  // the budget let enough trials run to mean something
}

#endif  // __linux__

#endif  // !_WIN32
