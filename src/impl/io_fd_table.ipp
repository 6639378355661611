// ---------------------------------------------------------------------------
// fsched::io, the fd table: registering an fd with the scheduler's epoll instance (once,
// edge-triggered), forgetting a closed file, the unverified waiters a sweep checks, an
// edge taken by its waiter or kept for the next one (take_ready), and poll() of one fd.
// Relies on: io_registry.ipp (IoWait, the counted system calls), the idle wait's IoFd and
// io_lock (idle_epoll.ipp), Waiter (sync.hpp).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/io_registry.ipp"

#if defined(FIBER_SCHED_HAVE_EPOLL)

namespace fsched {
namespace detail {

namespace {

// Adds fd to the epoll instance, edge-triggered, under a new generation. Under io_lock.
// Returns 0 or the errno of epoll_ctl (EPERM: a regular file, which epoll refuses).
// `rearm`: the entry is registered, but for a file whose number may have been taken over
// unseen (not a socket: see the top of io_registry.ipp); MOD first, ADD if the set lost it.
int register_fd(SchedulerIdle& idle, int fd, IoFd& entry, bool rearm = false) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET;
    // Numbered per scheduler, not per entry: an entry erased by cancel() and made anew
    // must not repeat a number that an event still in flight carries.
    entry.generation = ++idle.io_registrations;
    ev.data.u64 = event_data(fd, entry.generation);
    entry.ready = 0;  // the kernel reports the present state at ADD and at MOD
    entry.drained = false;
    entry.read_mark = ++idle.io_read_marks;  // a read under way may be reading another file's queue
    if (rearm) {
        if (io_epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
        if (errno != ENOENT) return errno;
    }
    if (io_epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        // EEXIST: this file under this number is in the set already, without our knowing
        // (cancel()'s delete found the fd closed, and it was open again elsewhere): take it
        // over with this generation.
        if (errno != EEXIST || io_epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_MOD, fd, &ev) != 0) return errno;
    }
    entry.registered = true;
    return 0;
}

// Makes `entry` what a new one would be, but for its count of cancels, which the calls under
// way compare (see "Cancel" at the top of io_registry.ipp): entries are forgotten, never erased.
// A waiter still in a slot (its fd closed behind io's back) sleeps on until its timeout,
// found by no one: unlink_io_wait and the sweep look for it in the slot. Under io_lock.
void forget_file(SchedulerIdle& idle, IoFd& entry) noexcept {
    IoFd forgotten;
    forgotten.cancels = entry.cancels;
    // A read under way may have taken the old mark: its short read must not count.
    forgotten.read_mark = ++idle.io_read_marks;
    entry = forgotten;
}

// Forgets fd's file and registration; deletes the registration first if the fd may still be
// open (cancel() before a close: a dup of it elsewhere would otherwise keep reporting).
// Under io_lock.
void forget_fd(SchedulerIdle& idle, int fd, bool still_open) noexcept {
    auto it = idle.io_fds.find(fd);
    if (it == idle.io_fds.end()) return;
    if (still_open && it->second.registered) io_epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    forget_file(idle, it->second);
}

// Puts a waiter about to park on a registration it has not checked at the end of the list
// of unverified waiters, and has sweeps made while the list is not empty (the handshake with
// the poller is at SchedulerIdle::sweeping). Under io_lock.
void join_unverified(SchedulerIdle& idle, IoWait& wait, int fd) noexcept {
    wait.fd = fd;
    wait.park_epoch = idle.sweep_epoch;
    wait.unverified = true;
    wait.prev_unverified = idle.unverified_tail;
    wait.next_unverified = nullptr;
    (idle.unverified_tail ? idle.unverified_tail->next_unverified : idle.unverified_head) = &wait;
    idle.unverified_tail = &wait;
    if (!idle.sweeping.load(std::memory_order_relaxed)) {
        const auto first = std::chrono::steady_clock::now() + sweep_interval();
        idle.next_sweep.store(first.time_since_epoch().count(), std::memory_order_relaxed);
        idle.sweeping.store(true, std::memory_order_seq_cst);
        if (idle.poller_unbounded.load(std::memory_order_seq_cst)) signal_eventfd(idle.poller_wake_fd);
    }
}

// Takes a waiter out of the list of unverified waiters, if it is there. Under io_lock, by
// whoever takes it out of its fd's slot (or finds it timed out), so that every waiter in the
// list is still parked, its IoWait alive.
void leave_unverified(SchedulerIdle& idle, IoWait& wait) noexcept {
    if (!wait.unverified) return;
    wait.unverified = false;
    (wait.prev_unverified ? wait.prev_unverified->next_unverified : idle.unverified_head) = wait.next_unverified;
    (wait.next_unverified ? wait.next_unverified->prev_unverified : idle.unverified_tail) = wait.prev_unverified;
    wait.prev_unverified = wait.next_unverified = nullptr;
}

// Takes whichever of fd's waiters `revents` wakes, and keeps the edges no waiter took;
// under io_lock. An event of an earlier registration than the entry's is ignored.
void take_ready(SchedulerIdle& idle, int fd, std::uint32_t generation, std::uint32_t revents, IoWait* woken[2],
                int& count) noexcept {
    auto it = idle.io_fds.find(fd);
    if (it == idle.io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.generation != generation || !entry.registered) return;
    if (revents & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        entry.ready |= read_bit;
        entry.drained = false;
        entry.read_mark = ++idle.io_read_marks;
    }
    if (revents & (EPOLLRDHUP | EPOLLHUP | EPOLLERR | EPOLLPRI)) entry.final_events = true;
    if (revents & (EPOLLOUT | EPOLLHUP | EPOLLERR)) entry.ready |= write_bit;
    // A waiter that lost the race to its timer leaves the edge for the next one.
    if (entry.reader && (entry.ready & read_bit) && claim(entry.reader->waiter)) {
        leave_unverified(idle, *entry.reader);
        woken[count++] = entry.reader;
        entry.reader = nullptr;
        entry.ready &= ~read_bit;
    }
    if (entry.writer && (entry.ready & write_bit) && claim(entry.writer->waiter)) {
        leave_unverified(idle, *entry.writer);
        woken[count++] = entry.writer;
        entry.writer = nullptr;
        entry.ready &= ~write_bit;
    }
}

struct FiberIoWait {
    SchedulerIdle* idle;
    int fd;
};

// Takes a timed-out waiter out of its fd's entry (unless a waker already did); under io_lock.
void unlink_io_wait(void* context, Waiter& w) {
    auto* wait = reinterpret_cast<IoWait*>(&w);  // Waiter is IoWait's first member
    auto* where = static_cast<FiberIoWait*>(context);
    leave_unverified(*where->idle, *wait);
    auto it = where->idle->io_fds.find(where->fd);
    if (it == where->idle->io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.reader == wait) entry.reader = nullptr;
    if (entry.writer == wait) entry.writer = nullptr;
}

// The pollfd that asks whether fd is ready for `what`.
pollfd poll_entry(int fd, io::Ready what) noexcept {
    return pollfd{fd, static_cast<short>(what == io::Ready::Read ? POLLIN : POLLOUT), 0};
}

// poll() until `deadline` (null: none; already past: poll once without waiting), restarted
// when a signal interrupts it with the time then left, so that signals arriving faster than
// the timeout cannot keep the wait from ever ending.
int poll_until(pollfd* fds, nfds_t n, const TimePoint* deadline) noexcept {
    int rc;
    do {
        rc = ::poll(fds, n, timeout_ms(deadline));
    } while (rc < 0 && current_errno() == EINTR);
    return rc;
}

// What a poll() that returned `rc`, with `entry` the waited-for fd, says about the wait:
// true if the fd is ready; else false with errno poll()'s (`poll_errno`), EBADF (not open)
// or ETIMEDOUT (not ready).
bool poll_outcome(int rc, const pollfd& entry, int poll_errno) noexcept {
    if (rc < 0) {
        set_errno(poll_errno);
        return false;
    }
    if (entry.revents & POLLNVAL) {
        set_errno(EBADF);
        return false;
    }
    if (rc == 0) {
        set_errno(ETIMEDOUT);
        return false;
    }
    return true;
}

// poll(fd, 0): true if fd is ready for `what` now; else false, errno as poll_outcome().
bool ready_now(int fd, io::Ready what) noexcept {
    pollfd one = poll_entry(fd, what);
    const TimePoint past = TimePoint::min();
    const int rc = poll_until(&one, 1, &past);
    return poll_outcome(rc, one, current_errno());
}

}  // namespace

}  // namespace detail

}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
