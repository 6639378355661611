// ---------------------------------------------------------------------------
// fsched::io: fibers waiting for file descriptors, Linux.
//
// Nothing in libc is hooked: a fiber waits explicitly, with io::wait() or the read /
// write / accept / connect wrappers, which retry on EAGAIN by waiting. A waiting fiber
// parks and frees its worker; a plain thread blocks in poll().
// ---------------------------------------------------------------------------

#pragma once

#include "scheduler.hpp"

#if defined(FIBER_SCHED_HAVE_EPOLL)
#include <sys/socket.h>
#include <sys/types.h>
#endif

namespace fsched {
namespace io {

enum class Ready : unsigned { Read = 1, Write = 2 };

#if defined(FIBER_SCHED_HAVE_EPOLL)

// Parks until `fd` is ready for `what` (Read: data, EOF or an error; Write: room or an
// error), or `timeout` passes (negative: no limit; one too large for the clock, such as
// milliseconds::max(), waits as if it had none). Returns true when ready (a wait whose
// timeout is zero or has just passed asks as poll(fd, 0) would); false with errno ETIMEDOUT
// on timeout, ECANCELED after cancel(fd), EBADF for a bad fd, EBUSY when another fiber of
// the same scheduler already waits for the same fd and direction, ENOMEM when no memory
// could be had to record the wait. A plain thread blocks in poll(); a use_caller thread
// outside its scheduler's tasks waits through that scheduler, running its tasks meanwhile.
bool wait(int fd, Ready what, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

// read, write, accept and connect take non-blocking fds only, sockets or not: a blocking fd
// is refused with -1, errno EINVAL, before anything is done with it. (In a fiber, a socket
// that was non-blocking when a wait first saw it is not checked again: its reads and writes
// use MSG_DONTWAIT, which cannot block whatever its flags have become.) Each retries on EAGAIN
// by waiting, returns what the system call returns with errno set, and -1 with errno
// ETIMEDOUT once `timeout` (over all retries) has passed and a last try of the call still
// fails with EAGAIN (a zero timeout: one try), or EBUSY when another fiber of the same
// scheduler already waits for the same fd and direction (one reader and one writer per fd).
// A wait ends on the kernel's readiness, as poll() reports it: a socket's SO_RCVLOWAT holds a
// waiting read back until that many bytes are queued (or the end, or an error), as it holds
// a blocking recv(), and the try at the timeout returns what is queued below the mark. Data
// queued when a read begins is returned at once, or, when the read comes after a short one
// (which io takes to mean the queue is empty: see io_calls.ipp) and a mark raised since hid the
// data, 25 to 50 ms later.
// write() never raises SIGPIPE: a peer that has gone (socket or pipe) is -1, errno EPIPE.
ssize_t read(int fd, void* buf, std::size_t n, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
ssize_t write(int fd, const void* buf, std::size_t n,
              std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
// accept4() with SOCK_NONBLOCK | SOCK_CLOEXEC: the new connection is ready for io::read.
int accept(int fd, sockaddr* addr, socklen_t* len, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
// Connects a non-blocking socket: 0 once connected, -1 with the connection's error. When
// the system call fails with EAGAIN (an AF_UNIX listener whose backlog is full: no readiness
// event says when it has room), tries again after pauses of 1 ms doubling to 50 ms, until
// it connects or `timeout` passes (ETIMEDOUT); a fiber's pause parks it, a thread's sleeps.
int connect(int fd, const sockaddr* addr, socklen_t len,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

// errno of the calling thread. Read errno through this in a fiber: the compiler may keep
// errno's (thread-local) address from before a call that moved the fiber to another thread.
int last_error() noexcept;

// Ends every io call on `fd` (wait, read, write, accept, connect, in any fiber or thread) that
// has started and not returned: it returns false or -1, errno ECANCELED, and does nothing
// more with `fd`. A parked or polling call is woken now; one between its system call and its
// wait does not wait; one woken and not yet back at its system call does not make it. Calls
// that start after cancel() returns, and calls on other fds, are not affected. Then the fd
// can be closed safely (closing one that is waited for is a user error). An fd that is not
// waited for may be closed with plain close() at any time: fsched::io keeps each fd in its
// scheduler's epoll instance between waits, and finds out that the number was closed or
// names another file — before the next wait, or, for a socket it knows (whose waits park
// trusting the registration), 25 to 50 ms after that wait parked, which then wakes on the
// new file's readiness (or fails with EBADF if the number names no file by then).
// io::accept's and io::connect's fds are checked when they are made. cancel() also forgets
// that registration.
void cancel(int fd);

}  // namespace io

#if defined(FIBER_SCHED_FAULT_INJECTION)
namespace detail {
// Test hooks: epoll_ctl calls fsched::io has made on waited-for fds, and the per-call fcntl
// checks of read / write / accept / connect (usable_fd), since the process started.
long io_epoll_ctl_calls() noexcept;
long io_fd_checks() noexcept;
// fstat calls by waits, accept and connect; fstat calls by the sweeps of unverified waiters,
// the sweeps made, and the waiters whose fd a sweep found closed or naming another file.
long io_fd_stats() noexcept;
// io::read calls that parked without their read (the queue was empty after a short read),
// and io::read system calls that failed with EAGAIN.
long io_reads_skipped() noexcept;
long io_reads_eagain() noexcept;
long io_sweep_checks() noexcept;
long io_sweeps() noexcept;
long io_sweep_repairs() noexcept;
// The interval between sweeps (default 25 ms), for every scheduler.
void set_io_sweep_interval(std::chrono::milliseconds interval) noexcept;
// Whether `s` makes sweeps now (an unverified waiter parked since its last empty sweep).
bool io_sweeping(Scheduler& s) noexcept;
// The fd numbers `s` keeps an entry for (each kept for the scheduler's life).
std::size_t io_fd_entries(Scheduler& s) noexcept;
// When set, called by a wait after its read or write failed with EAGAIN, just before it
// looks at the fd's readiness and parks (a fiber) or polls (a plain thread): a test lands
// an edge, or a cancel(), there.
void set_io_before_park_hook(void (*hook)(int fd)) noexcept;
// When set, called by io::read of a known socket just after its system call returned data,
// before a short read is recorded: a test lands an edge while the read is under way.
void set_io_after_read_hook(void (*hook)(int fd)) noexcept;
// In a scheduler task: takes the ready events out of its scheduler's epoll instance now and
// hands them out as the workers would; returns how many were for waited-for fds.
int io_poll_now() noexcept;
// The index of the worker of `s` that sleeps in epoll_wait for the fds (the poller), or -1.
int io_poller_worker(Scheduler& s) noexcept;
}  // namespace detail
#endif

namespace io {

#else

namespace detail {
template <class... T>
constexpr bool linux_only = sizeof...(T) > 1000000;
}
// Without epoll these exist only to say so when used: each is a template whose
// static_assert fires only when a call instantiates it (an #error would refuse the whole
// header, which every program includes).
#if defined(_WIN32)
#define FIBER_SCHED_IO_REFUSAL \
    "fsched::io is Linux-only: it needs epoll; Windows has no fsched::io yet (IOCP is a later step)"
#elif defined(__APPLE__)
#define FIBER_SCHED_IO_REFUSAL \
    "fsched::io is Linux-only: it needs epoll; macOS has no fsched::io yet (kqueue is a later step)"
#else
#define FIBER_SCHED_IO_REFUSAL "fsched::io is Linux-only: it needs epoll"
#endif
#define FIBER_SCHED_IO_LINUX_ONLY(result, name, value)                                \
    template <class... Args>                                                           \
    result name(Args&&...) {                                                           \
        static_assert(detail::linux_only<Args...>, FIBER_SCHED_IO_REFUSAL);           \
        return value;                                                                  \
    }
FIBER_SCHED_IO_LINUX_ONLY(bool, wait, false)
FIBER_SCHED_IO_LINUX_ONLY(long, read, -1)
FIBER_SCHED_IO_LINUX_ONLY(long, write, -1)
FIBER_SCHED_IO_LINUX_ONLY(int, accept, -1)
FIBER_SCHED_IO_LINUX_ONLY(int, connect, -1)
FIBER_SCHED_IO_LINUX_ONLY(int, last_error, 0)
FIBER_SCHED_IO_LINUX_ONLY(void, cancel, static_cast<void>(0))
#undef FIBER_SCHED_IO_LINUX_ONLY
#undef FIBER_SCHED_IO_REFUSAL

#endif

}  // namespace io
}  // namespace fsched
