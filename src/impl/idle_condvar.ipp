// ---------------------------------------------------------------------------
// Implementation: the idle wait on a condition variable, for systems without epoll (and
// FIBER_SCHED_NO_EPOLL). The same interface as idle_epoll.ipp, which describes it; there is
// no fd to wait for, so there is no fsched::io and no poller role.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"
#include "impl/common.ipp"

namespace fsched {
namespace detail {

// wait_until() takes the deadline as it is (what the OS's timer makes of it is its own:
// Windows' ends on its tick, 15.6 ms by default, unless a program asks for finer).
std::chrono::nanoseconds idle_wait_resolution() noexcept { return std::chrono::nanoseconds(1); }

struct SchedulerIdle {
    const char* open() noexcept { return nullptr; }
    void register_for_cancel() noexcept {}
    void close() noexcept {}
    bool poll_io(bool) noexcept { return false; }
};

struct WorkerIdle {
    std::mutex mutex;
    std::condition_variable cv;
    bool notified = false;  // under mutex

    const char* open() noexcept { return nullptr; }
    void close() noexcept {}
    void begin_sleep(SchedulerIdle&) noexcept {}
    bool poller_wanted(const SchedulerIdle&) const noexcept { return false; }  // no fsched::io here
    void wait(SchedulerIdle&, const TimePoint* deadline) {
        std::unique_lock<std::mutex> lock(mutex);
        if (deadline) {
            cv.wait_until(lock, *deadline, [this] { return notified; });
        } else {
            cv.wait(lock, [this] { return notified; });
        }
        notified = false;
    }
    void end_sleep(SchedulerIdle&) noexcept {}
    void poll_while_spinning(SchedulerIdle&) noexcept {}
    void notify(SchedulerIdle&) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            notified = true;
        }
        cv.notify_one();
    }
};

}  // namespace detail
}  // namespace fsched
