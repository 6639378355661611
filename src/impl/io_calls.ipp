// ---------------------------------------------------------------------------
// fsched::io, the calls: the fast way a known socket's call takes (prepare_call), a plain
// thread's wait (poll() of the fd and its cancel eventfd), the retry loop every call runs
// (try the system call, wait on EAGAIN, once more after a timeout), connect, a write that
// raises no SIGPIPE, and the public io::wait/read/write/accept/connect/cancel.
// Relies on: io_wait.ipp, io_sweep.ipp.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/io_sweep.ipp"

#if defined(FIBER_SCHED_HAVE_EPOLL)

#if !defined(FIBER_SCHED_ASAN) && !defined(FIBER_SCHED_TSAN)
#include <sys/syscall.h>
#endif

namespace fsched {
namespace detail {

namespace {

// recv() and send() on a known non-blocking socket. glibc's are cancellation points: each
// call switches the thread's asynchronous cancellation on and off around the system call
// (2 % of a keep-alive HTTP server's CPU), for a pthread_cancel() that no worker thread may
// take anyway. So these make the system call themselves; under ASan and TSan, which
// intercept the library's calls (the bytes a read writes, an fd's hand-over between
// threads), they stay the library's.
ssize_t socket_recv(int fd, void* buf, std::size_t n, int flags) noexcept {
#if !defined(FIBER_SCHED_ASAN) && !defined(FIBER_SCHED_TSAN)
    return ::syscall(SYS_recvfrom, fd, buf, n, flags, nullptr, nullptr);
#else
    return ::recv(fd, buf, n, flags);
#endif
}
ssize_t socket_send(int fd, const void* buf, std::size_t n, int flags) noexcept {
#if !defined(FIBER_SCHED_ASAN) && !defined(FIBER_SCHED_TSAN)
    return ::syscall(SYS_sendto, fd, buf, n, flags, nullptr, 0);
#else
    return ::send(fd, buf, n, flags);
#endif
}

// Before a read or write system call of `call` in a scheduler: clears the call's readiness
// bit (step (a) at the top of io_registry.ipp), and says whether fd is a known non-blocking socket
// in a scheduler task, whose call may skip usable_fd(); in `cancelled`, whether cancel() has
// reached the call since it began (then nothing else is done: it must not touch fd again).
// Takes io_lock.
// `skip_read` (io::read only): set instead, with nothing cleared, when the read would fail
// with EAGAIN and may be left out ("Reads that would fail" at the top of io_registry.ipp).
// `read_mark` (io::read only): the fd's mark of its latest read edge as the read begins,
// for read_came_short.
bool prepare_call(IoCall& call, io::Ready what, bool& cancelled, bool* skip_read = nullptr,
                  std::uint64_t* read_mark = nullptr) noexcept {
    SchedulerIdle& idle = *call.idle;
    idle.io_lock.lock();
    bool fast = false;
    IoFd* entry = call_step(call, cancelled);
    if (entry && !cancelled) {
        fast = call.in_task && entry->checked && entry->fast_socket;
        if (skip_read && fast && entry->drained && !entry->final_events && !(entry->ready & read_bit)) {
            *skip_read = true;
        } else {
            entry->ready &= ~static_cast<unsigned>(what);
            if (what == io::Ready::Read) entry->drained = false;  // this read says anew
        }
        if (read_mark) *read_mark = entry->read_mark;
    }
    idle.io_lock.unlock();
    return fast;
}

// A plain thread's wait: poll() of fd and of the thread's eventfd, which cancel() writes
// (see "Cancel" at the top of io_registry.ipp). A pause polls the eventfd alone.
bool thread_wait(IoCall& call, io::Ready what, const TimePoint* deadline, WaitKind kind) {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    auto hook = io_before_park.load(std::memory_order_relaxed);
    if (hook && kind == WaitKind::AfterEagain) hook(call.fd);
#endif
    if (!call.thread_registered) {
        set_errno(call.thread_error);
        return false;
    }
    pollfd fds[2] = {kind == WaitKind::Pause ? pollfd{-1, 0, 0} : poll_entry(call.fd, what),
                     {call.thread.cancel_fd, POLLIN, 0}};
    // cancel() sets the flag, then writes the eventfd: a cancel before this load is seen
    // here, one after it ends the poll().
    if (call.thread.cancelled.load(std::memory_order_acquire)) {
        set_errno(ECANCELED);
        return false;
    }
    const int rc = poll_until(fds, 2, deadline);
    if (rc > 0 && fds[1].revents) {
        set_errno(ECANCELED);
        return false;
    }
    return poll_outcome(rc, fds[0], current_errno());
}

// The wait of `call` for `what` (see WaitKind): through its scheduler's epoll, or, for a
// plain thread, poll().
bool wait_until(IoCall& call, io::Ready what, const TimePoint* deadline, WaitKind kind, bool nonblocking_known,
                bool trusted = false) {
    FIBER_SCHED_ASSERT((what == io::Ready::Read || what == io::Ready::Write) &&
                       "io::wait(): wait for Read or for Write, one at a time");
    if (call.fd < 0) {
        set_errno(EBADF);
        return false;
    }
    if (deadline && *deadline <= clock_now()) {
        // A zero timeout (or one a retry has used up): io::wait() asks, like poll(fd, 0),
        // without parking (a parked fiber's timer could fire before anyone asked epoll
        // whether the fd is ready); the other callers make their call once more.
        if (kind == WaitKind::ReadyOnly) return ready_now(call.fd, what);
        set_errno(ETIMEDOUT);
        return false;
    }
    if (!call.idle) return thread_wait(call, what, deadline, kind);
    for (;;) {
        if (!fiber_wait(call, what, deadline, kind, nonblocking_known, trusted)) return false;
        if (kind != WaitKind::ReadyOnly) return true;
        // io::wait() promises "ready", and the edge that woke it may be from data another
        // thread took between epoll_wait's return and the dispatch (the kernel drops edges
        // that are no longer ready only when it hands them out): ask again, and wait again
        // if it is gone. No test makes that window happen on purpose. (Not after a cancel():
        // fd may be closed by now.)
        if (cancelled_now(call)) {
            set_errno(ECANCELED);
            return false;
        }
        if (ready_now(call.fd, what)) return true;
        if (current_errno() != ETIMEDOUT) return false;  // EBADF: closed meanwhile
        if (deadline && *deadline <= clock_now()) {
            set_errno(ETIMEDOUT);
            return false;
        }
    }
}

// io::read & co. take non-blocking fds only, sockets or not: on a blocking one the call
// would block the worker thread (or, for a plain thread, forever), so refuse it up front.
// One fcntl() per call: cheaper than finding out what kind of fd it is.
bool usable_fd(int fd) {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_fd_check_count.fetch_add(1, std::memory_order_relaxed);
#endif
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return false;  // errno EBADF
    if (!(flags & O_NONBLOCK)) {
        set_errno(EINVAL);
        return false;
    }
    return true;
}

// An io call's timeout as a deadline; a negative timeout is none.
struct Deadline {
    explicit Deadline(std::chrono::milliseconds timeout)
        : has(timeout.count() >= 0), at(has ? deadline_after(timeout) : TimePoint{}) {}
    const TimePoint* get() const noexcept { return has ? &at : nullptr; }
    bool has;
    TimePoint at;
};

// Calls `call(fast)` until it succeeds or fails with something other than EAGAIN, waiting
// for `what` in between. A blocking fd is refused first (usable_fd), except that in a fiber
// a known non-blocking socket skips that check when `may_skip_check` (its call is then made
// with fast = true and must use MSG_DONTWAIT, so it cannot block whatever the number names
// now; see the top of io_registry.ipp). Once the timeout has passed, `call` is made once more
// ("Timeouts" at the top of io_registry.ipp); after cancel() reached the call, never again.
template <class Call>
auto retry(int fd, io::Ready what, std::chrono::milliseconds timeout, bool may_skip_check, Call call,
           bool may_skip_read = false) -> decltype(call(false, nullptr, std::uint64_t{0})) {
    IoCall io(fd);
    bool checked = false;  // usable_fd() passed in this call
    const Deadline deadline(timeout);
    // The call to make whatever comes: a zero timeout's only one, or the one after the
    // timeout passed. Never left out.
    bool last_try = deadline.has && timeout.count() == 0;
    if (last_try) may_skip_read = false;
    for (;;) {
        bool skip_read = false, cancelled = false;
        std::uint64_t read_mark = 0;
        bool fast = false;
        if (io.idle) {
            fast = prepare_call(io, what, cancelled, may_skip_read ? &skip_read : nullptr, &read_mark);
            fast = fast && may_skip_check;
        } else {
            cancelled = io.thread.cancelled.load(std::memory_order_acquire);
        }
        if (cancelled) {
            set_errno(ECANCELED);
            return -1;
        }
        if (fast && skip_read) {
            // The read would fail with EAGAIN: wait for the edge first, as after one. Once:
            // whatever ended the wait (an edge, a sweep that found data queued, or the
            // timeout), the read is made next, so a queue that was not empty after all is
            // read, not waited on again.
#if defined(FIBER_SCHED_FAULT_INJECTION)
            io_read_skip_count.fetch_add(1, std::memory_order_relaxed);
#endif
            may_skip_read = false;
            if (!wait_until(io, what, deadline.get(), WaitKind::SkippedRead, checked, fast)) {
                if (current_errno() != ETIMEDOUT) return -1;
                last_try = true;
            }
            continue;
        }
        if (!fast && !checked) {
            if (!usable_fd(fd)) return -1;
            checked = true;
        }
        const auto rc = call(fast, io.idle, read_mark);
        if (rc >= 0) return rc;
        const int error = current_errno();  // not `errno`: its address may be from before a move
        if (error == EINTR) continue;
        if (fast && error == ENOTSOCK) {
            not_a_socket(*io.idle, fd);
            continue;
        }
        if (error != EAGAIN && error != EWOULDBLOCK) return rc;
        if (last_try) {
            set_errno(ETIMEDOUT);
            return -1;
        }
        if (!wait_until(io, what, deadline.get(), WaitKind::AfterEagain, checked, fast)) {
            if (current_errno() != ETIMEDOUT) return -1;
            last_try = true;
        }
    }
}

// io::connect after usable_fd: the system call, its retries after EAGAIN, and the wait for
// the connection, as one call (see "Connect on a full backlog" at the top of io_registry.ipp).
int connect_call(int fd, const sockaddr* addr, socklen_t len, std::chrono::milliseconds timeout) {
    IoCall call(fd);
    const Deadline deadline(timeout);
    constexpr std::chrono::milliseconds longest_pause(50);
    std::chrono::milliseconds pause(1);
    for (;;) {
        if (cancelled_now(call)) {
            set_errno(ECANCELED);
            return -1;
        }
        if (::connect(fd, addr, len) == 0) return 0;
        const int error = current_errno();
        if (error == EINPROGRESS || error == EINTR) break;
        if (error != EAGAIN) return -1;
        // AF_UNIX: the listener's backlog is full, and no readiness event says when it has
        // room. Try again after a pause, or once the timeout has passed, fail.
        const TimePoint now = clock_now();
        if (deadline.has && deadline.at <= now) {
            set_errno(ETIMEDOUT);
            return -1;
        }
        const TimePoint until = deadline.has && deadline.at < now + pause ? deadline.at : now + pause;
        if (!wait_until(call, io::Ready::Write, &until, WaitKind::Pause, true) && current_errno() != ETIMEDOUT) {
            return -1;  // ECANCELED, or the pause could not be made
        }
        pause = std::min(pause * 2, longest_pause);
    }
    if (!wait_until(call, io::Ready::Write, deadline.get(), WaitKind::ReadyOnly, false)) return -1;
    int error = 0;
    socklen_t error_len = sizeof error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_len) != 0) return -1;
    if (error != 0) {
        set_errno(error);
        return -1;
    }
    return 0;
}

// write() that fails with EPIPE instead of raising SIGPIPE, for fds send() cannot take
// (pipes): SIGPIPE is blocked in this thread around the call, and the one the call raised,
// if any, is taken before the mask is restored. One that was pending before is left alone.
// The fiber cannot move between the two pthread_sigmask calls: nothing here parks.
ssize_t write_without_sigpipe(int fd, const void* buf, std::size_t n) noexcept {
    sigset_t sigpipe, old_mask, pending;
    sigemptyset(&sigpipe);
    sigaddset(&sigpipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe, &old_mask);
    const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    const ssize_t rc = ::write(fd, buf, n);
    const int error = errno;
    if (rc < 0 && error == EPIPE && !was_pending) {
        const timespec no_wait{0, 0};
        while (sigtimedwait(&sigpipe, nullptr, &no_wait) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    set_errno(error);
    return rc;
}

}  // namespace

}  // namespace detail

namespace io {

int last_error() noexcept { return detail::current_errno(); }

bool wait(int fd, Ready what, std::chrono::milliseconds timeout) {
    const detail::Deadline deadline(timeout);
    detail::IoCall call(fd);
    return detail::wait_until(call, what, deadline.get(), detail::WaitKind::ReadyOnly, false);
}

ssize_t read(int fd, void* buf, std::size_t n, std::chrono::milliseconds timeout) {
    return detail::retry(fd, Ready::Read, timeout, true,
                         [&](bool fast, detail::SchedulerIdle* idle, std::uint64_t read_mark) -> ssize_t {
        if (!fast) return ::read(fd, buf, n);
        const ssize_t rc = detail::socket_recv(fd, buf, n, MSG_DONTWAIT);
#if defined(FIBER_SCHED_FAULT_INJECTION)
        if (auto hook = detail::io_after_read.load(std::memory_order_relaxed); hook && rc > 0) hook(fd);
        if (rc < 0 && detail::current_errno() == EAGAIN) detail::io_read_eagain_count.fetch_add(1, std::memory_order_relaxed);
#endif
        if (rc > 0 && static_cast<std::size_t>(rc) < n) detail::read_came_short(*idle, fd, read_mark);
        return rc;
    }, true);
}

ssize_t write(int fd, const void* buf, std::size_t n, std::chrono::milliseconds timeout) {
    // A socket takes MSG_NOSIGNAL (a peer that has gone is EPIPE, not SIGPIPE); send() says
    // ENOTSOCK once for anything else, which then goes through write_without_sigpipe.
    // With the check skipped (`fast`: a known non-blocking socket) ENOTSOCK goes back to
    // retry(), which checks the file the number names now: a plain write() here could block
    // the worker on a blocking file that took the number over.
    bool is_socket = true;
    return detail::retry(fd, Ready::Write, timeout, true, [&](bool fast, detail::SchedulerIdle*, std::uint64_t) -> ssize_t {
        if (is_socket) {
            const ssize_t rc = detail::socket_send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (rc >= 0 || detail::current_errno() != ENOTSOCK || fast) return rc;
            is_socket = false;
        }
        return detail::write_without_sigpipe(fd, buf, n);
    });
}

int accept(int fd, sockaddr* addr, socklen_t* len, std::chrono::milliseconds timeout) {
    // Never with the check skipped: accept4() has no MSG_DONTWAIT.
    const int accepted = detail::retry(fd, Ready::Read, timeout, false,
                                       [&](bool, detail::SchedulerIdle*, std::uint64_t) { return ::accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC); });
    // A new non-blocking socket: whatever io knew under its number was a closed file's.
    if (accepted >= 0 && detail::in_scheduler_task()) {
        const int error = detail::current_errno();
        detail::refresh_fd(detail::SchedulerCore::of(*detail::thread_state()->scheduler).idle, accepted, true);
        detail::set_errno(error);
    }
    return accepted;
}

int connect(int fd, const sockaddr* addr, socklen_t len, std::chrono::milliseconds timeout) {
    if (!detail::usable_fd(fd)) return -1;
    // Typically fresh from socket(), on a number io may know as a closed file's: once per
    // connection, look at the file now rather than trust that.
    if (detail::in_scheduler_task()) {
        detail::refresh_fd(detail::SchedulerCore::of(*detail::thread_state()->scheduler).idle, fd, false);
    }
    return detail::connect_call(fd, addr, len, timeout);
}

void cancel(int fd) {
    detail::IoRegistry& registry = detail::io_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto threads = registry.thread_waits.equal_range(fd);
    for (auto it = threads.first; it != threads.second; ++it) {
        detail::ThreadIoWait& call = *it->second;
        if (call.cancelled.load(std::memory_order_relaxed)) continue;  // its eventfd is already signalled
        call.cancelled.store(true, std::memory_order_release);
        detail::signal_eventfd(call.cancel_fd);
    }
    for (detail::SchedulerIdle* idle : registry.schedulers) {
        detail::IoWait* woken[2];
        int count = 0;
        idle->io_lock.lock();
        auto it = idle->io_fds.find(fd);
        // No entry: no call of this scheduler is under way on fd (each makes one first),
        // or none that waits (a call on a number no file had makes none and never waits).
        if (it != idle->io_fds.end()) {
            detail::IoFd& entry = it->second;
            // The calls under way that are not parked find this at their next step ("Cancel"
            // at the top of io_registry.ipp); the parked ones are woken here.
            ++entry.cancels;
            for (detail::IoWait** slot : {&entry.reader, &entry.writer}) {
                if (*slot && detail::claim((*slot)->waiter)) {
                    (*slot)->cancelled = true;
                    detail::leave_unverified(*idle, **slot);
                    woken[count++] = *slot;
                }
                *slot = nullptr;
            }
            // The fd is about to be closed, or used afresh: its next wait registers it again.
            detail::forget_fd(*idle, fd, true);
        }
        idle->io_lock.unlock();
        for (int k = 0; k < count; ++k) detail::wake_waiter(woken[k]->waiter);
    }
}

}  // namespace io

}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
