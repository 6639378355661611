// A Scheduler that is a global object of a translation unit linked before the one holding
// the implementation (tests/impl.cpp): it is constructed before the implementation's own
// namespace-scope objects would be, so everything it registers must live in constant-
// initialised or function-local state (the reliability issue, failure 12).
#include "fiber_sched.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace {
fsched::Scheduler global_scheduler(2, false, "global");
}  // namespace

#if defined(FIBER_SCHED_HAVE_EPOLL)
TEST_CASE("a global Scheduler in another translation unit is seen by io::cancel") {
    using namespace std::chrono_literals;
    int fds[2];
    REQUIRE(pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    std::atomic<bool> done{false};
    bool woke = true;
    int error = 0;
    global_scheduler.start();
    global_scheduler.schedule([&] {
        woke = fsched::io::wait(fds[0], fsched::io::Ready::Read, 60s);
        error = fsched::io::last_error();
        done = true;
    });
    // Cancel until the wait has ended: a cancel that comes before the wait starts does nothing.
    const auto start = std::chrono::steady_clock::now();
    while (!done && std::chrono::steady_clock::now() - start < 30s) {
        fsched::io::cancel(fds[0]);
        std::this_thread::sleep_for(1ms);
    }
    global_scheduler.stop();
    close(fds[0]);
    close(fds[1]);
    CHECK(done);
    CHECK_FALSE(woke);
    CHECK(error == ECANCELED);
    CHECK(std::chrono::steady_clock::now() - start < 30s);  // not the wait's own timeout
}
#endif
