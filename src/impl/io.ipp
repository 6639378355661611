// ---------------------------------------------------------------------------
// Implementation: fsched::io (Linux). The epoll instance it registers fds with, and the
// worker that sleeps on it (the poller), belong to the idle wait: idle_epoll.ipp.
//
// Registration is level-triggered and one-shot (EPOLLONESHOT), re-armed by each wait:
// one-shot, because an fd's readiness must wake its waiter once and then stay quiet until
// someone waits again (a level-triggered fd with no waiter would wake the poller in a loop);
// not edge-triggered, because a waiter that arrives after the edge would sleep forever
// unless every caller drained the fd first. Each fd has one interest entry, for the union
// of its reader's and writer's directions, and the fd itself as the key (io_fds).
// ---------------------------------------------------------------------------

#if defined(FIBER_SCHED_HAVE_EPOLL)

namespace fsched {
namespace detail {

// errno is thread-local and glibc declares its address function const, so the optimiser may
// keep the address from before a fiber switch and use the first thread's errno after the
// fiber moved. Every errno access that may follow a park goes through these.
__attribute__((noinline)) int current_errno() noexcept {
    const int error = errno;
    __asm__ volatile("" : : : "memory");
    return error;
}

__attribute__((noinline)) void set_errno(int error) noexcept {
    errno = error;
    __asm__ volatile("" : : : "memory");
}

struct IoWait {
    Waiter waiter;           // notified (ready or cancelled) races timed_out
    bool cancelled = false;  // written by cancel() before it wakes the waiter
};

namespace {

// A plain thread blocked in poll() for one fd, on that thread's stack.
struct ThreadIoWait {
    int cancel_fd;           // the thread's eventfd, which interrupts its poll()
    bool cancelled = false;  // cancel() wrote to cancel_fd; under IoRegistry::mutex
};

// What io::cancel() must find: the live schedulers and the plain threads blocked in poll().
struct IoRegistry {
    std::mutex mutex;
    std::vector<SchedulerIdle*> schedulers;                    // under mutex
    std::unordered_multimap<int, ThreadIoWait*> thread_waits;  // fd -> its waiting threads; under mutex
};

// Built on first use and never destroyed: a Scheduler may be constructed by another
// translation unit's static initialiser before this one's would run (it would then be
// wiped from a namespace-scope registry), or destroyed after this one's statics are gone.
IoRegistry& io_registry() {
    static IoRegistry* const registry = [] {
        auto* r = new IoRegistry;
        // fork(): hold the registry's lock across it, so the child never inherits it held;
        // the child forgets the parent's schedulers and waiting threads, none of which it
        // has (io::cancel() in the child would otherwise take their locks).
        os::at_fork([] { io_registry().mutex.lock(); }, [] { io_registry().mutex.unlock(); },
                    [] {
                        IoRegistry& child = io_registry();
                        child.schedulers.clear();
                        child.thread_waits.clear();
                        child.mutex.unlock();
                    });
        return r;
    }();
    return *registry;
}

// What to do with an fd's epoll entry once no fiber waits for it.
enum class WhenIdle {
    keep,    // it just fired, so one-shot already disarmed it: no system call
    disarm,  // a waiter gave up (timeout): stop its interest, keep the entry for the next wait
    remove,  // cancel(): the fd is about to be closed, forget it
};

// Sets fd's epoll interest to what its waiters want. Under io_lock. Returns 0 or the errno
// of epoll_ctl. Entries stay registered between waits, so the next wait costs one MOD, not
// an ADD and a DEL; io_fds is keyed by fd number, so it grows no larger than the highest fd.
// An entry left by a closed fd is found stale when its number is reused: MOD then fails
// with ENOENT (closing removed it from epoll) and becomes an ADD.
int rearm(SchedulerIdle& idle, int fd, IoFd& entry, WhenIdle when_idle) noexcept {
    const std::uint32_t events = (entry.reader ? EPOLLIN | EPOLLRDHUP : 0u) | (entry.writer ? EPOLLOUT : 0u);
    epoll_event ev{};
    // Events of earlier armings are stale from now on. Numbered per scheduler, not per
    // entry: an entry erased by cancel() and made anew must not repeat a number.
    if (events != 0) entry.generation = ++idle.io_armings;
    ev.data.u64 = event_data(fd, entry.generation);
    if (events == 0) {
        if (when_idle == WhenIdle::remove) {
            // The fd may be closed by now; a failed delete changes nothing.
            if (entry.registered) epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
            idle.io_fds.erase(fd);
        } else if (when_idle == WhenIdle::disarm && entry.registered) {
            ev.events = EPOLLONESHOT;  // no events: disarmed until the next MOD
            if (epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_MOD, fd, &ev) != 0) entry.registered = false;
        }
        return 0;
    }
    ev.events = events | EPOLLONESHOT;
    if (entry.registered && epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_MOD, fd, &ev) == 0) return 0;
    if (epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        // EEXIST: registered although we lost track (an ADD that raced a close/reuse).
        if (errno != EEXIST || epoll_ctl(idle.io_epoll_fd, EPOLL_CTL_MOD, fd, &ev) != 0) {
            entry.registered = false;
            return errno;
        }
    }
    entry.registered = true;
    return 0;
}

// Takes whichever of fd's waiters `revents` wakes; under io_lock. An event of an earlier
// arming than the entry's current one is ignored: the current arming reports for itself.
void take_ready(SchedulerIdle& idle, int fd, std::uint32_t generation, std::uint32_t revents, IoWait* woken[2],
                int& count) noexcept {
    auto it = idle.io_fds.find(fd);
    if (it == idle.io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.generation != generation) return;
    if (entry.reader && (revents & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        if (claim(entry.reader->waiter)) woken[count++] = entry.reader;
        entry.reader = nullptr;
    }
    if (entry.writer && (revents & (EPOLLOUT | EPOLLHUP | EPOLLERR))) {
        if (claim(entry.writer->waiter)) woken[count++] = entry.writer;
        entry.writer = nullptr;
    }
    rearm(idle, fd, entry, WhenIdle::keep);  // one-shot: the rest of the interest needs arming again
}

struct FiberIoWait {
    SchedulerIdle* idle;
    int fd;
};

// Takes a timed-out waiter out of its fd's entry (unless a waker already did); under io_lock.
void unlink_io_wait(void* context, Waiter& w) {
    auto* wait = reinterpret_cast<IoWait*>(&w);  // Waiter is IoWait's first member
    auto* where = static_cast<FiberIoWait*>(context);
    auto it = where->idle->io_fds.find(where->fd);
    if (it == where->idle->io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.reader == wait) entry.reader = nullptr;
    if (entry.writer == wait) entry.writer = nullptr;
    rearm(*where->idle, where->fd, entry, WhenIdle::disarm);
}

// The pollfd that asks whether fd is ready for `what`.
pollfd poll_entry(int fd, io::Ready what) noexcept {
    return pollfd{fd, static_cast<short>(what == io::Ready::Read ? POLLIN : POLLOUT), 0};
}

// poll(), restarted when a signal interrupts it.
int poll_restarting(pollfd* fds, nfds_t n, int timeout) noexcept {
    int rc;
    do {
        rc = ::poll(fds, n, timeout);
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
    const int rc = poll_restarting(&one, 1, 0);
    return poll_outcome(rc, one, current_errno());
}

bool fiber_wait(SchedulerIdle& idle, int fd, io::Ready what, const TimePoint* deadline) {
    IoWait wait;
    try {
        if (deadline) prepare_timed_wait(wait.waiter);  // before the lock: it may throw
    } catch (const std::bad_alloc&) {
        set_errno(ENOMEM);
        return false;
    }
    idle.io_lock.lock();
    IoFd* found;
    try {
        if (FIBER_SCHED_FAULT(io_alloc)) throw std::bad_alloc();
        found = &idle.io_fds[fd];
    } catch (const std::bad_alloc&) {
        idle.io_lock.unlock();
        set_errno(ENOMEM);
        return false;
    }
    IoFd& entry = *found;
    IoWait*& slot = what == io::Ready::Read ? entry.reader : entry.writer;
    if (slot) {
        idle.io_lock.unlock();
        set_errno(EBUSY);
        return false;
    }
    slot = &wait;
    if (const int error = rearm(idle, fd, entry, WhenIdle::keep)) {
        slot = nullptr;
        if (!entry.reader && !entry.writer) idle.io_fds.erase(fd);
        idle.io_lock.unlock();
        if (error == EPERM) return true;  // a regular file: always ready
        set_errno(error);
        return false;
    }
    idle.io_waiters.fetch_add(1, std::memory_order_relaxed);
    FiberIoWait where{&idle, fd};
    const bool woken = block(idle.io_lock, wait.waiter, deadline, &unlink_io_wait, &where);
    idle.io_waiters.fetch_sub(1, std::memory_order_relaxed);
    if (!woken) {
        // The timer may fire before any worker has asked epoll about the fd (all were busy):
        // a wait that ends with the fd ready reports it ready, as poll() would.
        if (ready_now(fd, what)) return true;
        set_errno(ETIMEDOUT);
        return false;
    }
    if (wait.cancelled) {
        set_errno(ECANCELED);
        return false;
    }
    return true;
}

int thread_cancel_fd() {
    static thread_local struct CancelFd {
        int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        ~CancelFd() {
            if (fd >= 0) close(fd);
        }
    } cancel_fd;
    return cancel_fd.fd;
}

bool thread_wait(int fd, io::Ready what, const TimePoint* deadline) {
    const int cancel_fd = thread_cancel_fd();
    if (cancel_fd < 0) return false;  // errno from eventfd()
    IoRegistry& registry = io_registry();
    ThreadIoWait wait{cancel_fd};
    std::unordered_multimap<int, ThreadIoWait*>::iterator registration;
    {
        std::lock_guard<std::mutex> lock(registry.mutex);
        registration = registry.thread_waits.emplace(fd, &wait);
    }
    pollfd fds[2] = {poll_entry(fd, what), {cancel_fd, POLLIN, 0}};
    const int rc = poll_restarting(fds, 2, timeout_ms(deadline));
    const int poll_errno = current_errno();
    bool cancelled;
    {
        std::lock_guard<std::mutex> lock(registry.mutex);
        registry.thread_waits.erase(registration);
        cancelled = wait.cancelled;
    }
    // Unregistered, so no cancel() writes to cancel_fd any more: empty it now. A cancel that
    // came after poll() returned would otherwise fail this thread's next wait, on any fd.
    if (cancelled) drain(cancel_fd);
    if (rc > 0 && fds[1].revents) {
        set_errno(ECANCELED);
        return false;
    }
    return poll_outcome(rc, fds[0], poll_errno);
}

bool wait_until(int fd, io::Ready what, const TimePoint* deadline) {
    FIBER_SCHED_ASSERT((what == io::Ready::Read || what == io::Ready::Write) &&
                       "io::wait(): wait for Read or for Write, one at a time");
    if (fd < 0) {
        set_errno(EBADF);
        return false;
    }
    // A zero timeout (or one a retry has used up) asks, like poll(fd, 0), without parking:
    // a parked fiber's timer could fire before anyone asked epoll whether the fd is ready.
    if (deadline && *deadline <= std::chrono::steady_clock::now()) return ready_now(fd, what);
    if (in_scheduler_task()) {
        return fiber_wait(SchedulerCore::of(*thread_state()->scheduler).idle, fd, what, deadline);
    }
    // The use_caller thread waits through its scheduler's epoll like a fiber, and runs the
    // scheduler's tasks meanwhile (block() helps, see help_until).
    if (SchedulerCore* core = caller_may_help()) return fiber_wait(core->idle, fd, what, deadline);
    return thread_wait(fd, what, deadline);
}

// io::read & co. take non-blocking fds only, sockets or not: on a blocking one the call
// would block the worker thread (or, for a plain thread, forever), so refuse it up front.
// One fcntl() per call: cheaper than finding out what kind of fd it is.
bool usable_fd(int fd) {
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

// Calls `call` until it succeeds or fails with something other than EAGAIN, waiting for
// `what` in between; a blocking fd is refused first (see usable_fd).
template <class Call>
auto retry(int fd, io::Ready what, std::chrono::milliseconds timeout, Call call) -> decltype(call()) {
    if (!usable_fd(fd)) return -1;
    const Deadline deadline(timeout);
    for (;;) {
        const auto rc = call();
        if (rc >= 0) return rc;
        const int error = current_errno();  // not `errno`: its address may be from before a move
        if (error == EINTR) continue;
        if (error != EAGAIN && error != EWOULDBLOCK) return rc;
        if (!wait_until(fd, what, deadline.get())) return -1;
    }
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

void add_to_io_registry(SchedulerIdle* idle) {
    IoRegistry& registry = io_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.schedulers.push_back(idle);
}

void remove_from_io_registry(SchedulerIdle* idle) noexcept {
    IoRegistry& registry = io_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.schedulers.erase(std::remove(registry.schedulers.begin(), registry.schedulers.end(), idle),
                              registry.schedulers.end());
}

}  // namespace detail

namespace io {

int last_error() noexcept { return detail::current_errno(); }

bool wait(int fd, Ready what, std::chrono::milliseconds timeout) {
    const detail::Deadline deadline(timeout);
    return detail::wait_until(fd, what, deadline.get());
}

ssize_t read(int fd, void* buf, std::size_t n, std::chrono::milliseconds timeout) {
    return detail::retry(fd, Ready::Read, timeout, [&] { return ::read(fd, buf, n); });
}

ssize_t write(int fd, const void* buf, std::size_t n, std::chrono::milliseconds timeout) {
    // A socket takes MSG_NOSIGNAL (a peer that has gone is EPIPE, not SIGPIPE); send() says
    // ENOTSOCK once for anything else, which then goes through write_without_sigpipe.
    bool is_socket = true;
    return detail::retry(fd, Ready::Write, timeout, [&]() -> ssize_t {
        if (is_socket) {
            const ssize_t rc = ::send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (rc >= 0 || detail::current_errno() != ENOTSOCK) return rc;
            is_socket = false;
        }
        return detail::write_without_sigpipe(fd, buf, n);
    });
}

int accept(int fd, sockaddr* addr, socklen_t* len, std::chrono::milliseconds timeout) {
    return detail::retry(fd, Ready::Read, timeout, [&] { return ::accept4(fd, addr, len, SOCK_NONBLOCK | SOCK_CLOEXEC); });
}

int connect(int fd, const sockaddr* addr, socklen_t len, std::chrono::milliseconds timeout) {
    if (!detail::usable_fd(fd)) return -1;
    if (::connect(fd, addr, len) == 0) return 0;
    if (detail::current_errno() != EINPROGRESS && detail::current_errno() != EINTR) return -1;
    if (!wait(fd, Ready::Write, timeout)) return -1;
    int error = 0;
    socklen_t error_len = sizeof error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_len) != 0) return -1;
    if (error != 0) {
        detail::set_errno(error);
        return -1;
    }
    return 0;
}

void cancel(int fd) {
    detail::IoRegistry& registry = detail::io_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto threads = registry.thread_waits.equal_range(fd);
    for (auto it = threads.first; it != threads.second; ++it) {
        detail::ThreadIoWait& wait = *it->second;
        if (wait.cancelled) continue;  // its eventfd is already signalled
        wait.cancelled = true;
        detail::signal_eventfd(wait.cancel_fd);
    }
    for (detail::SchedulerIdle* idle : registry.schedulers) {
        detail::IoWait* woken[2];
        int count = 0;
        idle->io_lock.lock();
        auto it = idle->io_fds.find(fd);
        if (it != idle->io_fds.end()) {
            detail::IoFd& entry = it->second;
            for (detail::IoWait** slot : {&entry.reader, &entry.writer}) {
                if (*slot && detail::claim((*slot)->waiter)) {
                    (*slot)->cancelled = true;
                    woken[count++] = *slot;
                }
                *slot = nullptr;
            }
            detail::rearm(*idle, fd, entry, detail::WhenIdle::remove);
        }
        idle->io_lock.unlock();
        for (int k = 0; k < count; ++k) detail::wake_waiter(woken[k]->waiter);
    }
}

}  // namespace io
}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
