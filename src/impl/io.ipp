// ---------------------------------------------------------------------------
// Implementation: fsched::io (Linux). The epoll instance it registers fds with, and the
// worker that sleeps on it (the poller), belong to the idle wait: idle_epoll.ipp.
//
// Registration is persistent and edge-triggered, as Go's netpoller's: the first wait on an
// fd adds it once, for EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, and it stays while the
// number names the same file, so a wait makes no epoll_ctl call. Each readiness change is
// one event; dispatch_io_events() hands it to the fd's waiter or, when there is none, keeps
// it in IoFd::ready.
//
// The lost edge. An edge comes once: one that lands between a read's EAGAIN and the
// reader's park would, if dropped, leave the reader asleep for good. So (a) a call clears
// its direction's bit under io_lock *before* its read or write system call (prepare_call()),
// (b) dispatch sets the bit or claims the waiter under io_lock, and (c) the waiter, after
// EAGAIN, checks the bit under io_lock and parks only if it is clear, publishing itself in
// the same critical section (block() releases io_lock only once the fiber is parked). An
// edge after (a) is therefore either in the bit when (c) looks, or finds the waiter in its
// slot. An edge before (a) means the data was there before the system call, which then does
// not fail with EAGAIN. The kernel keeps an edge queued from the moment it happens until
// some worker takes it out of epoll_wait; it also queues one at EPOLL_CTL_ADD if the fd is
// ready then, so readiness from before the registration is not lost either. A bit left set
// by data that a later call read without waiting makes one spurious wake-up: the retry
// loop's next call fails with EAGAIN and waits again. io::wait() itself promises "ready",
// so it clears the bit, asks poll(fd, 0), and only then looks at the bit and parks.
// An fd with no waiter costs at most one poller wake-up per edge (none per level, as
// a level-triggered registration would): the edge is kept in IoFd::ready and nothing else.
//
// Closed fds and reused numbers. Nothing sees a ::close() behind our back, so the number is
// checked against its file: fstat()'s device and inode, recorded in IoFd. EBADF forgets the
// entry's file (forget_file); another file under the same number drops the registration (a
// new one gets a new generation, so events of the old file, if it is still open elsewhere,
// are stale) and its calls check the new file's flags again. io::read / io::write on a
// known non-blocking socket skip the per-call fcntl (the socket's reads and writes use
// MSG_DONTWAIT, so a number reused by a blocking socket cannot block the worker before a
// check finds it out; a write that finds ENOTSOCK there goes back to the check). A socket's
// inode number is unique among live files, so for sockets the check is enough; a number
// reused by a socket with the same device and inode as a closed one would need 2^32 sockets
// opened in between. Other files can share an inode with a closed one (every eventfd,
// timerfd and epoll fd shares one; each open of a FIFO, a tty or /dev/ptmx has the node's),
// so a non-socket is checked and re-arms its registration at each park (EPOLL_CTL_MOD, ADD
// if the set lost it): one epoll_ctl per park, as before the persistent registration, and a
// new generation, so the closed file's events are stale. A socket not yet known as a
// non-blocking one is checked at each park too.
//
// Delayed validation. A known non-blocking socket (IoFd::fast_socket, registered) parks
// without the fstat: the wait trusts the registration, which a keep-alive connection's
// every request would otherwise pay a system call for. A registration can only be wrong if
// the fd was closed behind our back and its number reused, and then its only harm is that
// the waiter is never woken (the new file is not in the epoll set; the old one, if open
// elsewhere, wakes it at worst spuriously, and the retry loop's call, on the new file, then
// fails with EAGAIN or ENOTSOCK). So such a waiter joins SchedulerIdle's list of unverified
// waiters, in park order, with the sweep epoch (no clock read per park), and a sweep, due
// every sweep_interval() while the list is not empty, fstat()s the fd of each waiter that
// parked before the previous sweep (so 1 to 2 intervals after its park; most waits end
// sooner and cost nothing more). Same file: verified for the rest of this park. Another
// file: registered anew under a new generation; EPOLL_CTL_ADD reports its present
// readiness, so a file that is ready now wakes its waiter as an edge does, and its calls
// check it again (fast_socket false). Not open: the waiters are woken with EBADF rather than
// left asleep. Sweeps come from the poller, whose epoll_wait is bounded by the next sweep
// while sweeps are on (SchedulerIdle::sweeping, with the handshake that wakes a poller that
// fell asleep unbounded), and from busy workers in poll_io(); a sweep that leaves the list
// empty turns them off, so with no unverified waiter nothing wakes up. Races, all settled
// by io_lock, under which the list, each waiter's slot and each sweep's check are changed:
// a waiter leaves the list when it leaves its slot (take_ready, cancel(), a sweep's wake)
// or, timed out, in unlink_io_wait; so every waiter in the list is parked and its IoWait
// alive. The sweep checks a waiter still in its slot; one that timed out meanwhile (its
// claim by the timer is not under io_lock) may have its fd registered anew, which is
// harmless, and is not woken again (claim fails). A wake or cancel before the check takes
// the waiter out of the list first; after it, the waiter is not in the list any more. The
// lost-edge argument is untouched: a sweep only adds a registration (whose ADD reports the
// present state) and a wake.
//
// Fds born through io. accept4() returns a new socket, so whatever an entry under its number
// said is a closed file's: io::accept records the new file (one fstat per connection),
// registers it and marks it a known non-blocking socket, so its first park needs neither a
// check nor a sweep. io::connect's fd is typically fresh from socket(): connect records and
// registers it the same way, trusting nothing.
//
// Reads that would fail. A known TCP socket's io::read that returned less than it asked for
// emptied the kernel's receive queue (a TCP read with MSG_DONTWAIT copies everything queued
// up to its length), so its next read, with no edge since, would fail with EAGAIN: io::read
// then parks straight away (IoFd::drained), saving the system call a request/response
// connection makes at every request; nginx does the same. `drained` speaks of the latest
// read only: every read that is made clears it before its system call (prepare_call), and
// takes the fd's mark of its latest read edge (IoFd::read_mark, new from one counter of the
// scheduler's at each edge take_ready takes, whoever gets it: a parked reader, an io::wait,
// or `ready`; and at each registration); a short read sets it only if the mark is the same
// (read_came_short): the same file, no edge since (an entry that io::cancel forgot takes a
// new mark). The next read edge clears it. So a skipped read is always one whose previous
// read came short with no read edge since that read began: a full read leaves data queued,
// and an edge while the short read was under way may be for more, and neither is followed
// by a skip. That park is the one after an EAGAIN, and the lost-edge argument above holds
// as it is: the data that came after the short read is either kept in `ready` (checked
// before the park, and before the skip) or finds the waiter. What a short read does not
// prove is left alone: any socket but TCP (SO_PROTOCOL, asked once: a datagram or seqpacket
// socket reads one message per read, and an AF_UNIX stream read stops at a message that
// carried file descriptors, or between senders when SO_PASSCRED is on) and a socket after
// an event with hang-up, error or urgent data (IoFd::final_events: the peer's FIN is a
// queued end, not data, and urgent data stops a read at its mark), whose reads are all
// made. A number reused unseen leaves the flag of the old file behind; its wait is then an
// unverified one, as any, and the sweep finds it.
//
// The low-water mark. Below a socket's SO_RCVLOWAT the kernel sends no edge, and poll()
// reports nothing, for data that a non-blocking recv() returns (checked on Linux 6.18; a
// short read still empties the queue). So a TCP socket whose mark is above 1 when its first
// short read asks (with SO_PROTOCOL: IoFd::short_reads) never skips a read. The mark can be
// raised at any time behind io's back, and raising it sends no edge: so the wait of a
// skipped read always joins the unverified waiters (WaitKind::SkippedRead), and the sweep
// that checks it, 1 to 2 intervals after its park, also asks FIONREAD (which, unlike
// poll(), ignores the mark): data queued wakes it to read, and its socket's reads are all
// made from then on. A queue the sweep finds empty means the read left out would have
// failed with EAGAIN then, so from then on the wait is the one a made read would have begun
// (and waits as a made read does: see "Timeouts"). So the skip never leaves data behind for
// longer than that. Nothing else was found to change the rule: lowering the mark sends an
// edge if enough is queued; a user's recv(MSG_PEEK) sends none and takes nothing; a dup()ed
// fd read by another thread only takes data, which sends no edge and leaves no more than
// there was; Nagle's algorithm on the peer (no TCP_NODELAY) changes only how many segments
// come, and each arrival is an edge.
//
// Timeouts. A read, write or accept whose wait times out makes its system call once more,
// and returns what that returns: -1 ETIMEDOUT only if it fails with EAGAIN again (a zero
// timeout: the one call). An edge, and poll(), follow the kernel's readiness, which a
// socket's low-water marks hold back while the call itself would return data: SO_RCVLOWAT
// for recv() (above), TCP_NOTSENT_LOWAT for send() (poll() says "not writable" while a
// one-byte send() succeeds; checked on Linux 6.18). So io::read waits as a blocking recv()
// with SO_RCVTIMEO does: for the mark, an end or an error, or its timeout, and then returns
// what is there. io::wait() promises readiness as poll() reports it, and still asks poll().
//
// Cancel. io::cancel(fd) must reach every call on fd that has started and not returned, not
// only the waiters in fd's slots: a call between its EAGAIN and its park, or one woken (its
// slot emptied by an edge, a timer or a sweep) and not yet back at its system call, is in
// no slot, and parked on, or made its call on, an fd that may be closed by then (and its
// number reused). So each IoFd counts the cancels of its number (IoFd::cancels), and a call
// of a scheduler's fiber, or of its use_caller thread (IoCall), takes that count at its
// first step under io_lock (prepare_call, io::wait's first look, connect's first try) and
// compares it at every later one, also under io_lock: before each system call of its retry
// loop and before each park (call_step). cancel() adds one under io_lock, then wakes the
// parked waiters; a call that finds the count changed returns ECANCELED at once and does
// nothing more with fd. An entry is made by its number's first call and never erased, only
// forgotten (forget_file keeps the count), so the count outlives cancel()'s forgetting the
// registration; a call that could not make its entry (no memory) fails with ENOMEM if it
// has to wait, since cancel() could not reach it. A call that starts after cancel()
// returned takes the new count and is not affected; nor are calls on other fds. A plain
// thread's call is in io_registry().thread_waits from its start to its return: cancel()
// sets its flag, then writes its eventfd, which its poll() watches; the call reads the flag
// before each system call and each poll(). What is left is the instant between a call's
// last check and its system call, with no park or lock in between: a cancel(), close() and
// reuse of the number all landing there meet that one system call on the new file, as they
// would meet a call that had just begun.
//
// Connect on a full backlog. connect() on an AF_UNIX stream socket fails with EAGAIN while
// the listener's backlog is full, and leaves the socket unconnected, ready for another
// connect() (checked on Linux 6.18); no readiness event says when the backlog has room (a
// blocking connect sleeps on the listener's queue, which no poll of this socket reports). So
// io::connect tries again after a pause, 1 ms doubling to 50 ms, until it connects, fails
// otherwise, or its timeout passes (ETIMEDOUT). A fiber pauses in fd's writer slot, with the
// pause's end as its deadline (cancel() finds it there; an edge of the unconnected socket
// ends a pause early, which only brings the next try forward), a plain thread in a poll()
// of its eventfd alone. A TCP connect to a full backlog goes EINPROGRESS (the kernel retries
// the SYN): its path, a wait for Write, is unchanged.
// ---------------------------------------------------------------------------

#if defined(FIBER_SCHED_HAVE_EPOLL)

namespace fsched {
namespace detail {

// errno is thread-local and glibc declares its address function const, so the optimiser may
// keep the address from before a fiber switch and use the first thread's errno after the
// fiber moved. Every errno access that may follow a park goes through these.
FIBER_SCHED_NOINLINE int current_errno() noexcept {
    const int error = errno;
    __asm__ volatile("" : : : "memory");
    return error;
}

FIBER_SCHED_NOINLINE void set_errno(int error) noexcept {
    errno = error;
    __asm__ volatile("" : : : "memory");
}

struct IoWait {
    Waiter waiter;           // notified (ready or cancelled) races timed_out; the first member
    bool cancelled = false;  // written by cancel() before it wakes the waiter
    int error = 0;           // a sweep's verdict, written before it wakes the waiter: the
                             // wait fails with this errno (EBADF: closed); 0: ready
    int fd = -1;             // the fd waited for, for a sweep
    bool skipped_read = false;  // io::read left its read out (a sweep checks the queue)
    // In SchedulerIdle's list of unverified waiters (see "Delayed validation" above); all
    // under io_lock.
    bool unverified = false;
    IoWait* prev_unverified = nullptr;
    IoWait* next_unverified = nullptr;
    std::uint64_t park_epoch = 0;  // SchedulerIdle::sweep_epoch when it parked
};

namespace {

// A plain thread's io call on one fd, from its start to its return (see "Cancel" at the top
// of this file), on that thread's stack.
struct ThreadIoWait {
    int cancel_fd = -1;  // the thread's eventfd, which interrupts its poll()
    // Set by cancel(), under IoRegistry::mutex, before it writes to cancel_fd (once); read
    // by the call before each system call (acquire: cancel()'s release).
    std::atomic<bool> cancelled{false};
};

// What io::cancel() must find: the live schedulers and the plain threads' io calls.
struct IoRegistry {
    std::mutex mutex;
    std::vector<SchedulerIdle*> schedulers;                    // under mutex
    std::unordered_multimap<int, ThreadIoWait*> thread_waits;  // fd -> its threads' calls; under mutex
};

// This thread's eventfd, which interrupts its poll() when io::cancel() writes to it; made
// by its first wait (thread_cancel_fd), -1 before. A plain int, constant-initialised, so
// that the fork handler below can look at it without making anything.
thread_local int thread_cancel_fd_value = -1;

// Closes this thread's eventfd when the thread exits.
struct CancelFdCloser {
    ~CancelFdCloser() {
        if (thread_cancel_fd_value >= 0) close(thread_cancel_fd_value);
        thread_cancel_fd_value = -1;
    }
};

// Built on first use and never destroyed: a Scheduler may be constructed by another
// translation unit's static initialiser before this one's would run (it would then be
// wiped from a namespace-scope registry), or destroyed after this one's statics are gone.
// build_process_state() builds it before any thread of the library exists.
IoRegistry& io_registry() {
    static IoRegistry* const registry = [] {
        auto* r = new IoRegistry;
        // fork(): hold the registry's lock across it, so the child never inherits it held;
        // the child forgets the parent's schedulers and waiting threads, none of which it
        // has (io::cancel() in the child would otherwise take their locks). And the forking
        // thread's eventfd: the child's copy is the same file as the parent's, so a cancel
        // of the parent's waits would fail the child's (on any fd) with ECANCELED, and the
        // reverse. The child closes its copy; its first wait makes its own.
        os::at_fork([] { io_registry().mutex.lock(); }, [] { io_registry().mutex.unlock(); },
                    [] {
                        IoRegistry& child = io_registry();
                        child.schedulers.clear();
                        child.thread_waits.clear();
                        child.mutex.unlock();
                        if (thread_cancel_fd_value >= 0) close(thread_cancel_fd_value);
                        thread_cancel_fd_value = -1;
                    });
        return r;
    }();
    return *registry;
}

#if defined(FIBER_SCHED_FAULT_INJECTION)
std::atomic<long> io_epoll_ctl_count{0};
std::atomic<long> io_fd_check_count{0};
std::atomic<long> io_fd_stat_count{0};
std::atomic<long> io_read_skip_count{0};
std::atomic<long> io_read_eagain_count{0};
std::atomic<long> io_sweep_count{0};
std::atomic<long> io_sweep_check_count{0};
std::atomic<long> io_sweep_repair_count{0};
std::atomic<int> io_sweep_interval_ms{25};
std::atomic<void (*)(int)> io_before_park{nullptr};
std::atomic<void (*)(int)> io_after_read{nullptr};
#endif

// How often unverified waiters are swept: a stale registration wakes its waiter one to two
// of these after it parked.
std::chrono::steady_clock::duration sweep_interval() noexcept {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    return std::chrono::milliseconds(io_sweep_interval_ms.load(std::memory_order_relaxed));
#else
    return std::chrono::milliseconds(25);
#endif
}

// fstat() of fd by a wait, an accept or a connect (not by a sweep); counted for the tests.
int io_fstat(int fd, struct stat& st) noexcept {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_fd_stat_count.fetch_add(1, std::memory_order_relaxed);
#endif
    return ::fstat(fd, &st);
}

// epoll_ctl on a waited-for fd; counted for the tests.
int io_epoll_ctl(int epoll_fd, int op, int fd, epoll_event* ev) noexcept {
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_epoll_ctl_count.fetch_add(1, std::memory_order_relaxed);
#endif
    return epoll_ctl(epoll_fd, op, fd, ev);
}

constexpr unsigned read_bit = static_cast<unsigned>(io::Ready::Read);
constexpr unsigned write_bit = static_cast<unsigned>(io::Ready::Write);

// Adds fd to the epoll instance, edge-triggered, under a new generation. Under io_lock.
// Returns 0 or the errno of epoll_ctl (EPERM: a regular file, which epoll refuses).
// `rearm`: the entry is registered, but for a file whose number may have been taken over
// unseen (not a socket: see the top of this file); MOD first, ADD if the set lost it.
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
// way compare (see "Cancel" at the top of this file): entries are forgotten, never erased.
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

// How a wait was reached: after its read or write failed with EAGAIN (an edge left in
// IoFd::ready by data read since may wake it spuriously: its caller tries again); instead of
// a read that would fail (a skipped read: see "Reads that would fail" at the top of this
// file); from io::wait(), which reports the fd ready only when it is; or as io::connect's
// pause before it tries again (a wait that only cancel() or its deadline ends; an edge that
// ends it early only brings the next try forward). Each but ReadyOnly ends with ETIMEDOUT
// when its deadline passes, without asking poll(): its caller makes its call once more.
enum class WaitKind { AfterEagain, SkippedRead, ReadyOnly, Pause };

// The calling thread's eventfd, which cancel() writes to end a plain thread's poll(); -1 with
// errno set when none can be made (the next call tries again). A child of fork() makes its
// own: the io registry's child handler closes the inherited one, which is the parent's.
int thread_cancel_fd() {
    if (thread_cancel_fd_value < 0) {
        thread_cancel_fd_value = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (thread_cancel_fd_value < 0) return -1;
        static thread_local CancelFdCloser closer;
        (void)&closer;
    }
    return thread_cancel_fd_value;
}

// One io call (wait, read, write, accept, connect) from its start to its return, as
// io::cancel() must reach it (see "Cancel" at the top of this file). On the caller's stack.
struct IoCall {
    explicit IoCall(int fd) noexcept;
    IoCall(const IoCall&) = delete;
    IoCall& operator=(const IoCall&) = delete;
    ~IoCall();

    enum class Start : unsigned char {
        NotYet,      // no step under io_lock yet
        Recorded,    // `cancels` is the entry's count at the first step
        Unrecorded,  // no entry could be made at the first step (no memory): it never waits
    };
    const int fd;
    // The scheduler whose epoll instance the call's waits use: a scheduler task's, or the
    // use_caller thread's outside its tasks; nullptr for a plain thread, which polls.
    SchedulerIdle* idle = nullptr;
    bool in_task = false;  // a scheduler task's: its reads and writes may go the fast way
    Start start = Start::NotYet;
    std::uint64_t cancels = 0;  // IoFd::cancels at the call's first step
    // A plain thread's call, in io_registry().thread_waits for the whole call, unless
    // `thread_error` says why it could not be (eventfd()'s errno, or ENOMEM): its waits then
    // fail with that errno.
    ThreadIoWait thread;
    bool thread_registered = false;
    int thread_error = 0;
    std::unordered_multimap<int, ThreadIoWait*>::iterator registration;
};

IoCall::IoCall(int fd_) noexcept : fd(fd_) {
    if (in_scheduler_task()) {
        idle = &SchedulerCore::of(*thread_state()->scheduler).idle;
        in_task = true;
        return;
    }
    if (SchedulerCore* core = caller_may_help()) {
        idle = &core->idle;
        return;
    }
    const int error = current_errno();
    thread.cancel_fd = thread_cancel_fd();
    if (thread.cancel_fd < 0) {
        thread_error = current_errno();
    } else {
        IoRegistry& registry = io_registry();
        try {
            std::lock_guard<std::mutex> lock(registry.mutex);
            registration = registry.thread_waits.emplace(fd, &thread);
            thread_registered = true;
        } catch (const std::bad_alloc&) {
            thread_error = ENOMEM;
        }
    }
    set_errno(error);
}

IoCall::~IoCall() {
    if (!thread_registered) return;
    const int error = current_errno();  // the call's result
    IoRegistry& registry = io_registry();
    {
        std::lock_guard<std::mutex> lock(registry.mutex);
        registry.thread_waits.erase(registration);
    }
    // Unregistered, so no cancel() writes to cancel_fd any more: empty it now. A cancel that
    // came after the call's last poll() would otherwise fail this thread's next wait, on any fd.
    if (thread.cancelled.load(std::memory_order_acquire)) drain(thread.cancel_fd);
    set_errno(error);
}

// A step of `call` in a scheduler, under its io_lock: fd's entry, and in `cancelled` whether
// cancel() has reached the call since its first step, which makes the entry if it is missing
// and records its count of cancels (see "Cancel" at the top of this file). nullptr: no entry
// was made at the first step (no memory, or a negative fd); the call must then not wait.
IoFd* call_step(IoCall& call, bool& cancelled) noexcept {
    cancelled = false;
    SchedulerIdle& idle = *call.idle;
    if (call.start == IoCall::Start::Unrecorded) return nullptr;
    auto it = idle.io_fds.find(call.fd);
    if (call.start == IoCall::Start::Recorded) {
        // Entries are never erased while their scheduler lives (forget_file).
        cancelled = it == idle.io_fds.end() || it->second.cancels != call.cancels;
        return it == idle.io_fds.end() ? nullptr : &it->second;
    }
    if (it == idle.io_fds.end()) {
        call.start = IoCall::Start::Unrecorded;  // unless the entry is made now
        if (call.fd < 0) return nullptr;         // its call fails with EBADF
        try {
            if (FIBER_SCHED_FAULT(IoAlloc)) throw std::bad_alloc();
            it = idle.io_fds.try_emplace(call.fd).first;
        } catch (const std::bad_alloc&) {
            return nullptr;
        }
    }
    call.start = IoCall::Start::Recorded;
    call.cancels = it->second.cancels;
    return &it->second;
}

// Whether cancel() has reached `call` since it started; a call's first step (in a scheduler)
// records where it starts from. Takes io_lock (a plain thread's: none).
bool cancelled_now(IoCall& call) noexcept {
    if (!call.idle) return call.thread.cancelled.load(std::memory_order_acquire);
    bool cancelled;
    call.idle->io_lock.lock();
    call_step(call, cancelled);
    call.idle->io_lock.unlock();
    return cancelled;
}

// fstat() of fd for fiber_wait; false with errno EBADF (or fstat's) if fd is not open, whose
// entry is then forgotten: it was closed behind our back, and the kernel dropped its
// registration with the file (or will with the last dup of it).
bool stat_fd(SchedulerIdle& idle, int fd, struct stat& st) noexcept {
    if (io_fstat(fd, st) == 0) return true;
    const int error = current_errno();
    idle.io_lock.lock();
    forget_fd(idle, fd, false);
    idle.io_lock.unlock();
    set_errno(error);
    return false;
}

// A known non-blocking socket, registered: a wait on it may park without an fstat.
bool trusted_entry(const IoFd& entry) noexcept { return entry.checked && entry.fast_socket && entry.registered; }

// Records in `entry` the file that fstat found under its number; a file it has not seen
// drops the registration, which, if any, was the old file's. Under io_lock.
void record_file(IoFd& entry, const struct stat& st) noexcept {
    if (entry.checked && entry.device == st.st_dev && entry.inode == st.st_ino) return;
    entry.registered = false;
    entry.ready = 0;
    entry.checked = true;
    entry.device = st.st_dev;
    entry.inode = st.st_ino;
    entry.fast_socket = false;
    entry.drained = false;
    entry.short_reads = 0;
    entry.final_events = false;
}

// fiber_wait()'s first step for io::wait() (WaitKind::ReadyOnly): an edge already in
// `ready` may be from data that is gone, so drop it and ask the fd. Readiness from after
// this poll comes as a new edge (see the top of this file). Empty: go on and park.
std::optional<bool> ready_only_look(IoCall& call, io::Ready what, bool& trusted) {
    SchedulerIdle& idle = *call.idle;
    bool cancelled;
    idle.io_lock.lock();
    if (IoFd* entry = call_step(call, cancelled); entry && !cancelled) {
        entry->ready &= ~static_cast<unsigned>(what);
        trusted = trusted_entry(*entry);
    }
    idle.io_lock.unlock();
    if (cancelled) {
        set_errno(ECANCELED);
        return false;
    }
    if (ready_now(call.fd, what)) return true;
    if (current_errno() == EBADF) return false;
    return std::nullopt;
}

// fiber_wait()'s entry for the call, io_lock taken (held on return). `stated`: fd was
// fstat'ed into `st` in this wait (done here when the entry is no longer a trusted socket's).
// Null with errno set and the lock released: cancelled, no memory, or a closed fd.
IoFd* lock_wait_entry(IoCall& call, bool& stated, struct stat& st) {
    SchedulerIdle& idle = *call.idle;
    for (;;) {
        bool cancelled;
        idle.io_lock.lock();
        IoFd* found = call_step(call, cancelled);
        // cancel() came after the call began and before it parks (between its EAGAIN and
        // here, or between a wake-up and its next system call): it must not park.
        if (cancelled) {
            idle.io_lock.unlock();
            set_errno(ECANCELED);
            return nullptr;
        }
        if (!found) {  // no record of the call, which cancel() could not then reach
            idle.io_lock.unlock();
            set_errno(ENOMEM);
            return nullptr;
        }
        if (stated || trusted_entry(*found)) return found;
        // No longer a known socket (cancel() forgot it, or a call found ENOTSOCK): check
        // the file, as any other wait does.
        idle.io_lock.unlock();
        if (!stat_fd(idle, call.fd, st)) return nullptr;
        stated = true;
    }
}

// Under io_lock (held): records what fstat said, registers the fd where it must be, and
// takes an edge that came while no one waited. Empty: park, with the lock still held; else
// the lock is released and the wait's result given (false with errno set).
std::optional<bool> arm_wait_locked(IoCall& call, IoFd& entry, io::Ready what, bool stated, const struct stat& st,
                                    bool nonblocking_known) {
    SchedulerIdle& idle = *call.idle;
    const bool socket = !stated || S_ISSOCK(st.st_mode);
    if (stated) {
        record_file(entry, st);
        if (socket && nonblocking_known) entry.fast_socket = true;
    }
    if (what == io::Ready::Read ? entry.reader : entry.writer) {
        idle.io_lock.unlock();
        set_errno(EBUSY);
        return false;
    }
    // A socket's device and inode name it for as long as it is open; every eventfd, timerfd
    // or epoll fd shares one inode, and every open of a FIFO, a tty or /dev/ptmx has the
    // node's: for those the check above cannot see a reused number, so each park re-arms.
    if (!entry.registered || !socket) {
        if (const int error = register_fd(idle, call.fd, entry, entry.registered)) {
            idle.io_lock.unlock();
            if (error == EPERM) return true;  // a regular file: always ready
            set_errno(error);
            return false;
        }
    }
    const unsigned bit = static_cast<unsigned>(what);
    if (entry.ready & bit) {
        // An edge that came while no one waited (see the top of this file): not parking is
        // what keeps it from being lost.
        entry.ready &= ~bit;
        idle.io_lock.unlock();
        return true;
    }
    return std::nullopt;
}

// What a parked fiber_wait() reports once it is back: woken (ready, cancelled, an error the
// sweep found) or timed out.
bool fiber_wait_result(IoCall& call, const IoWait& wait, io::Ready what, WaitKind kind, bool woken) {
    if (!woken) {
        // io::wait(): the timer may fire before any worker has asked epoll about the fd (all
        // were busy): a wait that ends with the fd ready reports it ready, as poll() would.
        // The others' callers make their call once more instead (see "Timeouts").
        if (kind == WaitKind::ReadyOnly) {
            if (cancelled_now(call)) {
                set_errno(ECANCELED);
                return false;
            }
            if (ready_now(call.fd, what)) return true;
        }
        set_errno(ETIMEDOUT);
        return false;
    }
    if (wait.cancelled) {
        set_errno(ECANCELED);
        return false;
    }
    if (wait.error != 0) {
        set_errno(wait.error);
        return false;
    }
    return true;
}

// `nonblocking_known`: the calling io function checked with fcntl, in this call, that fd
// is non-blocking (usable_fd); the entry may then mark a socket as fast_socket.
// `trusted`: the caller's call went the fast way (prepare_call), so the entry was a known
// socket's a moment ago; fiber_wait checks that again under io_lock.
bool fiber_wait(IoCall& call, io::Ready what, const TimePoint* deadline, WaitKind kind, bool nonblocking_known,
                bool trusted) {
    SchedulerIdle& idle = *call.idle;
    const int fd = call.fd;
    IoWait wait;
    try {
        if (deadline) prepare_timed_wait(wait.waiter);  // before the lock: it may throw
    } catch (const std::bad_alloc&) {
        set_errno(ENOMEM);
        return false;
    }
    if (kind == WaitKind::ReadyOnly) {
        if (const std::optional<bool> done = ready_only_look(call, what, trusted)) return *done;
    }
    struct stat st;
    bool stated = !trusted;
    if (stated && !stat_fd(idle, fd, st)) return false;
#if defined(FIBER_SCHED_FAULT_INJECTION)
    if (auto hook = io_before_park.load(std::memory_order_relaxed);
        hook && (kind == WaitKind::AfterEagain || kind == WaitKind::SkippedRead)) {
        hook(fd);
    }
#endif
    IoFd* entry = lock_wait_entry(call, stated, st);
    if (!entry) return false;
    if (const std::optional<bool> done = arm_wait_locked(call, *entry, what, stated, st, nonblocking_known)) return *done;
    (what == io::Ready::Read ? entry->reader : entry->writer) = &wait;
    // Parking on a registration no fstat has checked in this wait: a sweep checks it later.
    // A skipped read's wait always joins: the sweep also checks that its read would have
    // failed ("Reads that would fail" at the top of this file).
    wait.skipped_read = kind == WaitKind::SkippedRead;
    if (!stated || wait.skipped_read) join_unverified(idle, wait, fd);
    // Side (a) of the argument at SchedulerIdle::poller: the fiber parks below, and someone
    // must be polling for it (the caller thread that runs it may not sleep again for long).
    idle.io_waiters.fetch_add(1, std::memory_order_seq_cst);
    if (idle.poller.load(std::memory_order_seq_cst) == nullptr) wake_for_io(idle);
    FiberIoWait where{&idle, fd};
    const bool woken = block(idle.io_lock, wait.waiter, deadline, &unlink_io_wait, &where);
    idle.io_waiters.fetch_sub(1, std::memory_order_seq_cst);
    return fiber_wait_result(call, wait, what, kind, woken);
}


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

// The sweep's check of one unverified waiter's fd (see "Delayed validation" at the top of
// this file), under io_lock: a closed fd fails its waiters with EBADF; another file under the
// number is registered anew (its waiters then wake on its present readiness). The waiters it
// wakes go to `woken` (room for two), to be woken once io_lock is released.
void verify_waiter(SchedulerIdle& idle, IoWait& wait, IoWait* woken[2], int& count) noexcept {
    auto it = idle.io_fds.find(wait.fd);
    if (it == idle.io_fds.end()) return;
    IoFd& entry = it->second;
    if (entry.reader != &wait && entry.writer != &wait) return;  // timed out or cancelled; it is leaving
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_check_count.fetch_add(1, std::memory_order_relaxed);
#endif
    // Wakes a skipped read's wait to make the read it left out.
    auto make_skipped_read = [&] {
        if (claim(wait.waiter)) {
            woken[count++] = &wait;
            entry.reader = nullptr;
        }
    };
    const bool skipped_read = wait.skipped_read && entry.reader == &wait;
    struct stat st;
    int error = 0;
    if (::fstat(wait.fd, &st) != 0) {
        error = current_errno();
    } else if (entry.checked && entry.device == st.st_dev && entry.inode == st.st_ino && S_ISSOCK(st.st_mode)) {
        // The file it registered. A skipped read's wait is also checked for the read it left
        // out: if data is queued after all (below an SO_RCVLOWAT set since the short read, or
        // anything else that sends no edge), wake it to read, and make every later read of
        // this socket ("Reads that would fail" at the top of this file).
        int queued = 0;
        if (!skipped_read) return;
        if (::ioctl(wait.fd, FIONREAD, &queued) != 0 || queued <= 0) return;
        entry.short_reads = 2;
        entry.drained = false;
        make_skipped_read();
        return;
    } else {
        record_file(entry, st);  // another file: fast_socket false, its calls check it again
        error = register_fd(idle, wait.fd, entry);
        if (error == 0) {
#if defined(FIBER_SCHED_FAULT_INJECTION)
            io_sweep_repair_count.fetch_add(1, std::memory_order_relaxed);
#endif
            // A skipped read left out on the word of the old file's queue: the new file's
            // present readiness (ADD reports it) may be held back by its SO_RCVLOWAT while
            // recv() would return data, so wake it to make its read (which checks the file).
            if (skipped_read) make_skipped_read();
            return;
        }
        if (error == EPERM) error = 0;  // a regular file: always ready
    }
#if defined(FIBER_SCHED_FAULT_INJECTION)
    io_sweep_repair_count.fetch_add(1, std::memory_order_relaxed);
#endif
    // Not open, or not to be waited for through epoll: wake its waiters, which would
    // otherwise sleep for good (until their timeout).
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

// Before a read or write system call of `call` in a scheduler: clears the call's readiness
// bit (step (a) at the top of this file), and says whether fd is a known non-blocking socket
// in a scheduler task, whose call may skip usable_fd(); in `cancelled`, whether cancel() has
// reached the call since it began (then nothing else is done: it must not touch fd again).
// Takes io_lock.
// `skip_read` (io::read only): set instead, with nothing cleared, when the read would fail
// with EAGAIN and may be left out ("Reads that would fail" at the top of this file).
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

// io::read of a known socket returned less than it asked for: if it is a TCP socket with a
// low-water mark of 1 and no read edge has come since the read began (`read_mark`, from
// prepare_call), its receive queue was empty then (see the top of this file). Takes io_lock.
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

// A plain thread's wait: poll() of fd and of the thread's eventfd, which cancel() writes
// (see "Cancel" at the top of this file). A pause polls the eventfd alone.
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
    const int rc = poll_restarting(fds, 2, timeout_ms(deadline));
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
    if (deadline && *deadline <= std::chrono::steady_clock::now()) {
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
        if (deadline && *deadline <= std::chrono::steady_clock::now()) {
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
// now; see the top of this file). Once the timeout has passed, `call` is made once more
// ("Timeouts" at the top of this file); after cancel() reached the call, never again.
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
// the connection, as one call (see "Connect on a full backlog" at the top of this file).
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
        const TimePoint now = std::chrono::steady_clock::now();
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

void build_io_registry() { (void)io_registry(); }

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
        const ssize_t rc = ::recv(fd, buf, n, MSG_DONTWAIT);
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
            const ssize_t rc = ::send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
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
        // No entry: no call of this scheduler is under way on fd (each makes one first).
        if (it != idle->io_fds.end()) {
            detail::IoFd& entry = it->second;
            // The calls under way that are not parked find this at their next step ("Cancel"
            // at the top of this file); the parked ones are woken here.
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
