// ---------------------------------------------------------------------------
// Implementation: fsched::io (Linux), overall; its parts are io_registry.ipp (this one: the
// process-wide registry of schedulers, a wait's record IoWait, the counted system calls),
// io_fd_table.ipp, io_wait.ipp, io_sweep.ipp and io_calls.ipp. The epoll instance it
// registers fds with, and the worker that sleeps on it (the poller), belong to the idle
// wait: idle_epoll.ipp.
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
// nothing more with fd. An entry is made by its number's first call (while a file has the
// number: a stray one gets none, and its call fails with EBADF) and never erased, only
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

#pragma once

#include "io.hpp"
#include "sync.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"
#include "impl/idle.ipp"

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

}  // namespace

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

}  // namespace detail

}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
