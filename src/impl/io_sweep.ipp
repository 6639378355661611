// ---------------------------------------------------------------------------
// fsched::io, delayed validation: what a sweep checks of the waiters parked without an
// fstat (refresh_fd, verify_waiter, a read that came short, an fd that is no socket),
// dispatching epoll's events to waiters, and the sweep itself; the counters the tests read.
// Relies on: io_wait.ipp, io_fd_table.ipp, SchedulerCore (sched_core.ipp) for the tests' hooks.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/io_wait.ipp"

#if defined(FIBER_SCHED_HAVE_EPOLL)

namespace fsched {
namespace detail {

namespace {

// A new fd, or one about to be connected, in a fiber of `idle`'s scheduler: records its file
// and, for a socket, registers it and marks it a known non-blocking socket (the callers know
// it is non-blocking), so that its waits need no fstat. `born`: accept() made it, so an entry
// under its number is a closed file's, whatever its device and inode say. Takes io_lock.
void refresh_fd(SchedulerIdle& idle, int fd, bool born) noexcept {
    struct stat st;
    if (io_fstat(fd, st) != 0 || !S_ISSOCK(st.st_mode)) return;
    idle.io_lock.lock();
    IoFd* entry = nullptr;
    auto it = idle.io_fds.find(fd);
    try {
        if (it != idle.io_fds.end()) {
            entry = &it->second;
        } else {
            if (FIBER_SCHED_FAULT(IoAlloc)) throw std::bad_alloc();
            entry = &idle.io_fds[fd];
        }
    } catch (const std::bad_alloc&) {
        idle.io_lock.unlock();
        return;  // no entry: its first wait checks the file and tries again
    }
    if (born) entry->checked = false;
    record_file(*entry, st);
    entry->fast_socket = true;
    // A failure leaves it unregistered: its first wait registers it, or reports the error.
    if (!entry->registered) register_fd(idle, fd, *entry);
    idle.io_lock.unlock();
}

// A skipped read's wait, found by the sweep to have data after all: woken to make the read
// it left out (into `woken`, under io_lock).
void wake_skipped_read(IoFd& entry, IoWait& wait, IoWait* woken[2], int& count) noexcept {
    if (claim(wait.waiter)) {
        woken[count++] = &wait;
        entry.reader = nullptr;
    }
}

// The sweep found `entry`'s fd closed (`error` EBADF), or a file epoll cannot wait for (0:
// always ready): its waiters, which would otherwise sleep for good (until their timeout),
// wake with `error` (into `woken`, under io_lock), and the entry goes once it has none.
void fail_waiters(SchedulerIdle& idle, IoFd& entry, int error, IoWait* woken[2], int& count) noexcept {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_repair_count.fetch_add(1, std::memory_order_relaxed);
#endif
    for (IoWait** slot : {&entry.reader, &entry.writer}) {
        if (*slot && claim((*slot)->waiter)) {
            (*slot)->error = error;
            leave_unverified(idle, **slot);
            woken[count++] = *slot;
            *slot = nullptr;
        }
    }
    if (!entry.reader && !entry.writer) forget_file(idle, entry);
}

// The sweep's check of one unverified waiter's fd (see "Delayed validation" at the top of
// io_registry.ipp), under io_lock: a closed fd fails its waiters with EBADF; another file
// under the number is registered anew (its waiters then wake on its present readiness). The
// waiters it wakes go to `woken` (room for two), to be woken once io_lock is released.
void verify_waiter(SchedulerIdle& idle, IoWait& wait, IoWait* woken[2], int& count) noexcept {
    auto it = idle.io_fds.find(wait.fd);
    if (it == idle.io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.reader != &wait && entry.writer != &wait) return;  // timed out or cancelled; it is leaving
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_check_count.fetch_add(1, std::memory_order_relaxed);
#endif
    const bool skipped_read = wait.skipped_read && entry.reader == &wait;
    struct stat st;
    if (::fstat(wait.fd, &st) != 0) {
        fail_waiters(idle, entry, current_errno(), woken, count);
        return;
    }
    if (entry.checked && entry.device == st.st_dev && entry.inode == st.st_ino && S_ISSOCK(st.st_mode)) {
        // The file it registered. A skipped read's wait is also checked for the read it left
        // out: if data is queued after all (below an SO_RCVLOWAT set since the short read, or
        // anything else that sends no edge), wake it to read, and make every later read of
        // this socket ("Reads that would fail" at the top of io_registry.ipp).
        int queued = 0;
        if (!skipped_read) return;
        if (::ioctl(wait.fd, FIONREAD, &queued) != 0 || queued <= 0) return;
        entry.short_reads = 2;
        entry.drained = false;
        wake_skipped_read(entry, wait, woken, count);
        return;
    }
    record_file(entry, st);  // another file: fast_socket false, its calls check it again
    const int error = register_fd(idle, wait.fd, entry);
    if (error != 0) {
        fail_waiters(idle, entry, error == EPERM ? 0 : error, woken, count);  // EPERM: a regular file
        return;
    }
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_repair_count.fetch_add(1, std::memory_order_relaxed);
#endif
    // A skipped read left out on the word of the old file's queue: the new file's present
    // readiness (ADD reports it) may be held back by its SO_RCVLOWAT while recv() would
    // return data, so wake it to make its read (which checks the file).
    if (skipped_read) wake_skipped_read(entry, wait, woken, count);
}

// io::read of a known socket returned less than it asked for: if it is a TCP socket with a
// low-water mark of 1 and no read edge has come since the read began (`read_mark`, from
// prepare_call), its receive queue was empty then (see the top of io_registry.ipp). Takes io_lock.
void read_came_short(SchedulerIdle& idle, int fd, std::uint64_t read_mark) noexcept {
    idle.io_lock.lock();
    auto it = idle.io_fds.find(fd);
    if (it != idle.io_fds.end() && it->second.fast_socket && !it->second.final_events) {
        IoFd& entry = it->second;
        if (entry.short_reads == 0) {
            int protocol = 0, lowat = 0;
            socklen_t protocol_size = sizeof protocol, lowat_size = sizeof lowat;
            const bool tcp = getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &protocol_size) == 0 &&
                             protocol == IPPROTO_TCP;
            // Below SO_RCVLOWAT data sends no edge: with a mark, no read of it is skipped.
            const bool no_mark = getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, &lowat_size) == 0 && lowat <= 1;
            entry.short_reads = tcp && no_mark ? 1 : 2;
        }
        entry.drained = entry.short_reads == 1 && entry.read_mark == read_mark;
    }
    idle.io_lock.unlock();
}

// A known socket's call failed with ENOTSOCK: the number names another file now. Its next
// wait records that file; until then its calls take the checked path.
void not_a_socket(SchedulerIdle& idle, int fd) noexcept {
    idle.io_lock.lock();
    auto it = idle.io_fds.find(fd);
    if (it != idle.io_fds.end()) it->second.fast_socket = false;
    idle.io_lock.unlock();
}

}  // namespace

// Wakes the waiters of each ready fd in `events`; true if any was woken. Only the poller
// drains poller_wake_fd: a busy worker polling the same instance would otherwise swallow
// the wake-up meant for the sleeping poller (the fd is level-triggered, so it stays ready).
bool dispatch_io_events(SchedulerIdle& idle, const epoll_event* events, int n, bool from_poller) noexcept {
    bool any = false;
    for (int i = 0; i < n; ++i) {
        const int fd = event_fd(events[i]);
        if (fd == idle.poller_wake_fd) {
            if (from_poller) drain(fd);
            continue;
        }
        IoWait* woken[2];
        int count = 0;
        idle.io_lock.lock();
        take_ready(idle, fd, event_generation(events[i]), events[i].events, woken, count);
        idle.io_lock.unlock();
        for (int k = 0; k < count; ++k) wake_waiter(woken[k]->waiter);
        any = any || count > 0;
    }
    return any;
}

bool sweep_unverified(SchedulerIdle& idle) noexcept {
    const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    if (now < idle.next_sweep.load(std::memory_order_relaxed)) return false;
    idle.io_lock.lock();
    if (!idle.sweeping.load(std::memory_order_relaxed) || now < idle.next_sweep.load(std::memory_order_relaxed)) {
        idle.io_lock.unlock();  // another worker made this one
        return false;
    }
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_count.fetch_add(1, std::memory_order_relaxed);
#endif
    idle.next_sweep.store(now + sweep_interval().count(), std::memory_order_relaxed);
    // Due: the waiters that parked before the previous sweep (at least one interval ago).
    const std::uint64_t due_before = idle.sweep_epoch++;
    bool any = false;
    for (;;) {
        // In batches, so that io_lock is not held across many fstat calls at once.
        IoWait* woken[2 * 16];
        int count = 0;
        for (int checked = 0; checked < 16; ++checked) {
            IoWait* wait = idle.unverified_head;
            if (!wait || wait->park_epoch >= due_before) break;
            leave_unverified(idle, *wait);  // verified for the rest of this park, whatever follows
            verify_waiter(idle, *wait, woken, count);
        }
        const IoWait* next = idle.unverified_head;
        const bool done = !next || next->park_epoch >= due_before;
        // No waiter left to check: no more sweeps until one parks unverified.
        if (!next) idle.sweeping.store(false, std::memory_order_relaxed);
        idle.io_lock.unlock();
        for (int k = 0; k < count; ++k) wake_waiter(woken[k]->waiter);
        any = any || count > 0;
        if (done) return any;
        idle.io_lock.lock();
    }
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
long io_epoll_ctl_calls() noexcept { return io_epoll_ctl_count.load(std::memory_order_relaxed); }
long io_fd_checks() noexcept { return io_fd_check_count.load(std::memory_order_relaxed); }
long io_fd_stats() noexcept { return io_fd_stat_count.load(std::memory_order_relaxed); }
long io_reads_skipped() noexcept { return io_read_skip_count.load(std::memory_order_relaxed); }
long io_reads_eagain() noexcept { return io_read_eagain_count.load(std::memory_order_relaxed); }
long io_sweeps() noexcept { return io_sweep_count.load(std::memory_order_relaxed); }
long io_sweep_checks() noexcept { return io_sweep_check_count.load(std::memory_order_relaxed); }
long io_sweep_repairs() noexcept { return io_sweep_repair_count.load(std::memory_order_relaxed); }
void set_io_sweep_interval(std::chrono::milliseconds interval) noexcept {
    io_sweep_interval_ms.store(static_cast<int>(interval.count()), std::memory_order_relaxed);
}
bool io_sweeping(Scheduler& s) noexcept { return SchedulerCore::of(s).idle.sweeping.load(std::memory_order_relaxed); }
std::size_t io_fd_entries(Scheduler& s) noexcept {
    SchedulerIdle& idle = SchedulerCore::of(s).idle;
    idle.io_lock.lock();
    const std::size_t n = idle.io_fds.size();
    idle.io_lock.unlock();
    return n;
}
void set_io_before_park_hook(void (*hook)(int fd)) noexcept { io_before_park.store(hook, std::memory_order_relaxed); }
void set_io_after_read_hook(void (*hook)(int fd)) noexcept { io_after_read.store(hook, std::memory_order_relaxed); }
int io_poller_worker(Scheduler& s) noexcept {
    SchedulerCore& core = SchedulerCore::of(s);
    const WorkerIdle* poller = core.idle.poller.load(std::memory_order_acquire);
    for (const auto& w : core.workers) {
        if (&w->idle == poller) return w->index;
    }
    return -1;
}

int io_poll_now() noexcept {
    if (!in_scheduler_task()) return 0;
    SchedulerIdle& idle = SchedulerCore::of(*thread_state()->scheduler).idle;
    epoll_event events[64];
    const int n = epoll_wait(idle.io_epoll_fd, events, 64, 0);
    if (n <= 0) return 0;
    dispatch_io_events(idle, events, n, false);
    int fds = 0;
    for (int i = 0; i < n; ++i) fds += event_fd(events[i]) != idle.poller_wake_fd;
    return fds;
}
#endif

}  // namespace detail

}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
