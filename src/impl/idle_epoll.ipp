// ---------------------------------------------------------------------------
// Implementation: the idle wait on epoll (Linux), which also serves fsched::io.
//
// How a worker with nothing to do blocks until it is notified, its deadline passes or an fd
// a fiber waits for becomes ready. Both idle-wait files (this one and idle_condvar.ipp)
// provide the same interface:
//   SchedulerIdle      the scheduler's part:  open(), close(), poll_io(unless_polled),
//                      register_for_cancel()
//   WorkerIdle         each worker's part:    open(), close(), notify(shared),
//                      begin_sleep(shared), wait(shared, deadline), end_sleep(shared),
//                      poller_wanted(shared) (false where there is no fsched::io),
//                      poll_while_spinning(shared) (nothing where there is none)
// wait() returns at once for a notify() made since the last wait(): a wake-up that comes
// before the sleep is never lost.
//
// Each scheduler has one epoll instance for the fds its fibers wait for (io_epoll_fd), and
// each worker one of its own holding just an eventfd (wake_fd). A worker about to sleep
// takes the poller role if no one holds it and fibers wait for IO; the poller sleeps in
// epoll_wait on io_epoll_fd (which also holds poller_wake_fd, so new work still wakes it),
// the others on their own instance. So an idle scheduler blocks in the kernel, a ready fd
// wakes one worker, and timers bound every wait. Busy workers harvest ready fds without
// blocking every 32 tasks (poll_io) when no one is polling. While fibers wait on sockets
// whose registration no one has checked since they parked, the poller's sleep is bounded by
// the next sweep of those waiters, and busy workers make the sweep in poll_io; with none,
// nothing wakes up for it. What a ready fd does, and what a sweep checks, is fsched::io's
// business: the io_*.ipp parts.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"
#include "impl/common.ipp"

#include <sys/syscall.h>
#include <time.h>

namespace fsched {
namespace detail {

struct IoWait;
struct SchedulerIdle;

// One fd as fsched::io knows it: the fibers waiting for it (at most one per direction), its
// edge-triggered registration in the scheduler's epoll instance, the readiness edges that no
// waiter has taken yet, which file the number named when it was last checked, and how many
// times io::cancel() reached the number. The registration outlives each wait: see io_registry.ipp
// for why that is safe. An entry is made by the first io call on its number (open: a number no
// file has gets none) and never erased while the scheduler lives, only forgotten
// (io_fd_table.ipp, forget_file), so that `cancels` outlives it. Under SchedulerIdle::io_lock.
struct IoFd {
    IoWait* reader = nullptr;
    IoWait* writer = nullptr;
    bool registered = false;  // in io_epoll_fd, for EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET
    // Carried in the registration's events and new with each registration: an event of an
    // earlier one (the fd was closed and its number reused, its file still open elsewhere;
    // or a worker took the event out of epoll_wait before cancel() removed the entry) is stale.
    std::uint32_t generation = 0;
    // Edges that arrived with no waiter to take them, io::Ready bits: a waiter checks these
    // under io_lock before it parks, so an edge between its EAGAIN and its park is not lost.
    unsigned ready = 0;
    // The file the number named when it was last checked (fstat), and whether that file is
    // a non-blocking socket, whose reads and writes then skip the per-call fcntl() check
    // (io_calls.ipp, usable_fd) and use MSG_DONTWAIT. `checked` false: none of this is known.
    bool checked = false;
    bool fast_socket = false;
    dev_t device = 0;
    ino_t inode = 0;
    // io::read on a known TCP socket (io_registry.ipp, "Reads that would fail"): `drained` is set
    // when a read returned less than it asked for with no read edge since it began (the
    // mark `read_mark` unchanged), and cleared by the next read edge and the next read;
    // while it is set, io::read parks without making the read that would fail with EAGAIN.
    // `short_reads`: what a short read says of the socket, asked once (SO_PROTOCOL and
    // SO_RCVLOWAT): 0 not yet asked; 1 its receive queue was empty (TCP, low-water mark 1);
    // 2 nothing (any other socket, a low-water mark above 1, or a skipped read that a sweep
    // found wrong). `final_events`: an event said hang-up, error or urgent data, after which
    // a short read no longer means the queue was empty: no read is skipped any more.
    bool drained = false;
    std::uint8_t short_reads = 0;
    bool final_events = false;
    // The latest read event taken (take_ready) or registration made, numbered by
    // SchedulerIdle::io_read_marks: unique across entries, so never repeated by a new one.
    std::uint64_t read_mark = 0;
    // io::cancel() calls that reached this number, kept when the entry is forgotten: an io
    // call under way compares it at each step with the count it started with (io_wait.ipp,
    // "Cancel").
    std::uint64_t cancels = 0;
};

// Wakes the fibers waiting for the fds in `events` (io_sweep.ipp); true if any was woken.
bool dispatch_io_events(SchedulerIdle& idle, const epoll_event* events, int n, bool from_poller) noexcept;
// Checks the fds of the waiters that parked trusting their registration unverified (io_sweep.ipp,
// "Delayed validation"), if a sweep is due; true if it woke any fiber.
bool sweep_unverified(SchedulerIdle& idle) noexcept;
// Builds the io registry (io_registry.ipp) and its fork handlers unless built (build_process_state).
void build_io_registry();
// Makes `idle` visible to io::cancel() (io_registry.ipp); throws std::bad_alloc.
void add_to_io_registry(SchedulerIdle* idle);
void remove_from_io_registry(SchedulerIdle* idle) noexcept;

// An epoll event's data: the fd and the generation of the arming that asked for it (see
// IoFd::generation; the idle wait's own eventfds use generation 0).
inline std::uint64_t event_data(int fd, std::uint32_t generation) noexcept {
    return static_cast<std::uint64_t>(generation) << 32 | static_cast<std::uint32_t>(fd);
}
inline int event_fd(const epoll_event& ev) noexcept { return static_cast<int>(static_cast<std::uint32_t>(ev.data.u64)); }
inline std::uint32_t event_generation(const epoll_event& ev) noexcept {
    return static_cast<std::uint32_t>(ev.data.u64 >> 32);
}

// Adds `fd` to `epoll_fd` for reading; false with errno set if epoll_ctl fails.
inline bool watch(int epoll_fd, int fd) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = event_data(fd, 0);
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

inline void drain(int event_fd) noexcept {
    std::uint64_t count;
    while (::read(event_fd, &count, sizeof count) > 0) {
    }
}

inline void signal_eventfd(int fd) noexcept {
    const std::uint64_t one = 1;
    ssize_t written = ::write(fd, &one, sizeof one);
    (void)written;  // an eventfd only fails to count past 2^64 - 2
}

inline void close_fd(int& fd) noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

// Milliseconds until `deadline` for epoll_wait/poll: -1 for none, rounded up (waking a
// little late is fine, waking early means another wait).
inline int timeout_ms(const TimePoint* deadline) noexcept {
    if (!deadline) return -1;
    const TimePoint now = std::chrono::steady_clock::now();
    if (*deadline <= now) return 0;  // before subtracting: a deadline near min() would overflow
    const auto left = *deadline - now;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms);
}

// Turned on by the first refusal of epoll_pwait2: the idle waits' timeouts are milliseconds.
inline std::atomic<bool> no_pwait2{false};

// The kernel's timespec (__kernel_timespec): 64-bit fields on every ABI, also where the C
// library's timespec has a 32-bit time_t (i386, armhf), which the raw system call would
// misread.
struct KernelTimespec {
    std::int64_t tv_sec;
    std::int64_t tv_nsec;
};

// epoll_wait until `deadline` (nullptr: none). Where the kernel has epoll_pwait2 (Linux
// 5.11) the timeout is a timespec, so a sleep of 100 us wakes after about 100 us plus the
// timer slack (50 us by default), not after a whole millisecond. Any failure of it but
// EINTR (ENOSYS on an older kernel or some qemu-user builds, EPERM or another errno from a
// seccomp filter) turns it off for the process, and epoll_wait's milliseconds, rounded up,
// are used from then on: a wait that fails at once would make every idle worker spin. -1
// with errno on failure (EINTR), as epoll_wait.
inline int epoll_wait_until(int epfd, epoll_event* events, int max_events, const TimePoint* deadline) noexcept {
#if defined(SYS_epoll_pwait2)
    if (deadline && !no_pwait2.load(std::memory_order_relaxed)) {
        KernelTimespec timeout{0, 0};
        const TimePoint now = std::chrono::steady_clock::now();
        if (*deadline > now) {  // compared first: a deadline near min() would overflow the subtraction
            const std::int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - now).count();
            constexpr std::int64_t longest_s = std::int64_t{1} << 31;  // 68 years: past any deadline we make
            timeout.tv_sec = std::min<std::int64_t>(left / 1000000000, longest_s);
            timeout.tv_nsec = timeout.tv_sec == longest_s ? 0 : left % 1000000000;
        }
        long rc;
        if (FIBER_SCHED_FAULT(TimeoutSyscall)) {
            rc = -1;
            errno = EINVAL;
        } else {
            rc = ::syscall(SYS_epoll_pwait2, epfd, events, max_events, &timeout, nullptr, 0);
        }
        if (rc >= 0 || errno == EINTR) return static_cast<int>(rc);
        no_pwait2.store(true, std::memory_order_relaxed);
    }
#endif
    return epoll_wait(epfd, events, max_events, timeout_ms(deadline));
}

// 1 ns with epoll_pwait2 (until it is refused), 1 ms without it (the timer spin's margin;
// a test knob with FIBER_SCHED_FAULT_INJECTION).
std::chrono::nanoseconds idle_wait_resolution() noexcept {
#if defined(SYS_epoll_pwait2)
    if (!no_pwait2.load(std::memory_order_relaxed)) return std::chrono::nanoseconds(1);
#endif
    return std::chrono::milliseconds(1);
}

struct WorkerIdle;
struct SchedulerCore;
struct SchedulerIdle;
// Wakes one sleeping worker of idle's scheduler, if any, so that it sleeps again as the
// poller (sched_park.ipp): a fiber parks for IO while no worker polls.
void wake_for_io(SchedulerIdle& idle) noexcept;

struct SchedulerIdle {
    SchedulerCore* core = nullptr;  // the scheduler this belongs to (for wake_for_io)
    int io_epoll_fd = -1;     // every fd a fiber of this scheduler waits for, plus poller_wake_fd
    int poller_wake_fd = -1;  // wakes whichever worker holds the poller role
    // The worker that sleeps in epoll_wait on io_epoll_fd, if any: taken with a CAS by a
    // worker about to sleep (begin_sleep), given up when it wakes (end_sleep).
    //
    // No fiber waits for IO unseen: while fibers wait (io_waiters > 0), either a worker
    // holds the role, or every worker is awake (and one takes it when it sleeps), or a
    // sleeping worker is being woken to take it. Three sides, all seq_cst on `poller`,
    // `io_waiters` and each Worker's `sleeping`: (a) a fiber about to park for IO increments
    // io_waiters, then looks at `poller`, and if it is vacant wakes a sleeper (fiber_wait);
    // (b) a worker going to sleep sets `sleeping`, then, unless it took the role, looks at
    // both, and if fibers wait with the role vacant it does not sleep but goes round its
    // loop again, to take the role (Worker::sleep_until_work); (c) the poller, waking up,
    // clears `poller`, then looks at io_waiters, and if fibers wait wakes a sleeper.
    // Between (a) or (c) and (b) one of the two sees the other's write.
    std::atomic<WorkerIdle*> poller{nullptr};
    // Fibers parked in io::wait().
    std::atomic<int> io_waiters{0};
    SpinLock io_lock;         // guards io_fds and each fd's registration in io_epoll_fd
    std::unordered_map<int, IoFd> io_fds;
    std::uint32_t io_registrations = 0;  // under io_lock: the source of IoFd::generation
    std::uint64_t io_read_marks = 0;     // under io_lock: the source of IoFd::read_mark
    // Delayed validation (io_registry.ipp): the waiters that parked on a known socket without an
    // fstat, oldest first, and the sweeps that check them. Lists and epoch under io_lock.
    IoWait* unverified_head = nullptr;
    IoWait* unverified_tail = nullptr;
    std::uint64_t sweep_epoch = 0;  // sweeps made so far; a waiter records it when it parks
    // Sweeps are made while this is set: set under io_lock by a park that joins the list,
    // cleared under io_lock by a sweep that leaves it empty; read without the lock by the
    // poller and busy workers. seq_cst with poller_unbounded: the poller stores that, then
    // loads this before it sleeps; the park that sets this then loads poller_unbounded and,
    // if it is set, wakes the poller, which then bounds its sleep by the next sweep.
    std::atomic<bool> sweeping{false};
    std::atomic<bool> poller_unbounded{false};  // the poller may sleep past the next sweep
    // steady_clock ticks of the next sweep; written under io_lock, read as a hint without it.
    std::atomic<std::int64_t> next_sweep{0};
    bool registered = false;  // in the io registry (register_for_cancel)

    // Opens the epoll instance and its eventfd. nullptr, or the name of the call that
    // failed with errno set; close() then releases what was opened.
    const char* open() noexcept {
        if ((io_epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0) return "fiber_sched: epoll_create1";
        if ((poller_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) return "fiber_sched: eventfd";
        if (!watch(io_epoll_fd, poller_wake_fd)) return "fiber_sched: epoll_ctl";
        return nullptr;
    }
    // Once everything is open: io::cancel() may look at this scheduler from now on.
    void register_for_cancel() {
        add_to_io_registry(this);
        registered = true;
    }
    void close() noexcept {
        if (registered) remove_from_io_registry(this);
        registered = false;
        close_fd(io_epoll_fd);
        close_fd(poller_wake_fd);
    }
    // Harvests ready fds without blocking; true if any fiber was woken. `unless_polled`:
    // not while a sleeping worker waits for them anyway.
    bool poll_io(bool unless_polled) noexcept {
        if (io_waiters.load(std::memory_order_relaxed) == 0) return false;
        const bool swept = sweeping.load(std::memory_order_relaxed) && sweep_unverified(*this);
        if (unless_polled && poller.load(std::memory_order_relaxed) != nullptr) return swept;
        epoll_event events[64];
        const int n = epoll_wait(io_epoll_fd, events, 64, 0);
        return (n > 0 && dispatch_io_events(*this, events, n, false)) || swept;
    }
};

struct WorkerIdle {
    // This worker's epoll instance, which holds only wake_fd.
    int epoll_fd = -1;
    int wake_fd = -1;
    // Written by this worker before it sets its `sleeping` flag; read by whoever claims the
    // wake-up after its CAS on that flag, which orders the two.
    std::atomic<bool> is_poller{false};

    const char* open() noexcept {
        if (FIBER_SCHED_FAULT(FdOpen)) {
            errno = EMFILE;
            return "fiber_sched: epoll_create1";
        }
        if ((epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0) return "fiber_sched: epoll_create1";
        if ((wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) return "fiber_sched: eventfd";
        if (!watch(epoll_fd, wake_fd)) return "fiber_sched: epoll_ctl";
        return nullptr;
    }
    void close() noexcept {
        close_fd(epoll_fd);
        close_fd(wake_fd);
    }

    // Before the worker announces its sleep: one sleeping worker waits for the fds too (the
    // poller), so a ready fd wakes one worker.
    void begin_sleep(SchedulerIdle& shared) noexcept {
        WorkerIdle* no_poller = nullptr;
        if (shared.io_waiters.load(std::memory_order_seq_cst) > 0 &&
            shared.poller.compare_exchange_strong(no_poller, this, std::memory_order_seq_cst)) {
            is_poller.store(true, std::memory_order_relaxed);
        }
    }
    // After `sleeping` is set: true if this worker must not sleep as it is, because fibers
    // wait for IO and no one polls (side (b) of the argument at SchedulerIdle::poller).
    bool poller_wanted(const SchedulerIdle& shared) const noexcept {
        return !is_poller.load(std::memory_order_relaxed) && shared.io_waiters.load(std::memory_order_seq_cst) > 0 &&
               shared.poller.load(std::memory_order_seq_cst) == nullptr;
    }
    // Blocks until notify(), `deadline`, or (for the poller) an fd becoming ready.
    void wait(SchedulerIdle& shared, const TimePoint* deadline) noexcept {
        epoll_event events[64];
        if (is_poller.load(std::memory_order_relaxed)) {
            poller_wait(shared, deadline, events);
            return;
        }
        if (epoll_wait_until(epoll_fd, events, 1, deadline) > 0) drain(wake_fd);
    }
    // The poller's sleep: until an fd is ready, notify() or `deadline`, waking meanwhile for
    // each due sweep of unverified waiters (and sleeping on if the sweep woke no one).
    static void poller_wait(SchedulerIdle& shared, const TimePoint* deadline, epoll_event* events) noexcept {
        for (;;) {
            shared.poller_unbounded.store(true, std::memory_order_seq_cst);
            const TimePoint* bound = deadline;
            TimePoint sweep_at;
            if (shared.sweeping.load(std::memory_order_seq_cst)) {
                sweep_at = TimePoint{std::chrono::steady_clock::duration(shared.next_sweep.load(std::memory_order_relaxed))};
                if (!deadline || sweep_at < *deadline) bound = &sweep_at;
            }
            const int n = epoll_wait_until(shared.io_epoll_fd, events, 64, bound);
            shared.poller_unbounded.store(false, std::memory_order_relaxed);
            if (n > 0) dispatch_io_events(shared, events, n, true);
            if (n != 0 || bound == deadline) return;
            if (sweep_unverified(shared)) return;
        }
    }
    // Gives up the poller role; then, if fibers wait for IO, wakes a sleeper to take it
    // (side (c)): this worker is about to run tasks, which may take long.
    void end_sleep(SchedulerIdle& shared) noexcept {
        if (is_poller.load(std::memory_order_relaxed)) {
            is_poller.store(false, std::memory_order_relaxed);
            shared.poller.store(nullptr, std::memory_order_seq_cst);
            if (shared.io_waiters.load(std::memory_order_seq_cst) > 0) wake_for_io(shared);
        }
    }
    // While the worker spins to a timer instead of waiting (Worker::spin_to_timer): the
    // poller harvests ready fds without blocking, as its wait would have.
    void poll_while_spinning(SchedulerIdle& shared) noexcept {
        if (is_poller.load(std::memory_order_relaxed)) shared.poll_io(false);
    }
    // Ends this worker's wait, or makes its next one return at once. Whoever claimed the
    // wake-up read is_poller after its CAS on `sleeping`, and this worker set it before
    // setting `sleeping`: the write goes where it sleeps.
    void notify(SchedulerIdle& shared) noexcept {
        signal_eventfd(is_poller.load(std::memory_order_relaxed) ? shared.poller_wake_fd : wake_fd);
    }
};

}  // namespace detail
}  // namespace fsched
