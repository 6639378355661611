// ---------------------------------------------------------------------------
// fsched::io, one wait: a call's record (IoCall, which cancel() reaches), and a fiber's
// wait for an fd (fiber_wait, in named steps: the ready-only look, the entry under io_lock,
// arming it, parking, the result).
// Relies on: io_fd_table.ipp, block() and prepare_timed_wait() (sync.hpp), wake_for_io
// (sched_park.ipp).
// ---------------------------------------------------------------------------

#pragma once

#include "impl/io_fd_table.ipp"
#include "impl/sched_core.ipp"

#if defined(FIBER_SCHED_HAVE_EPOLL)

namespace fsched {
namespace detail {

namespace {

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
// io::cancel() must reach it (see "Cancel" at the top of io_registry.ipp). On the caller's stack.
struct IoCall {
    explicit IoCall(int fd) noexcept;
    IoCall(const IoCall&) = delete;
    IoCall& operator=(const IoCall&) = delete;
    ~IoCall();

    enum class Start : unsigned char {
        NotYet,      // no step under io_lock yet
        Recorded,    // `cancels` is the entry's count at the first step
        Unrecorded,  // no entry was made at the first step (no memory, fd not open): it never waits
    };
    const int fd;
    // The scheduler whose epoll instance the call's waits use: a scheduler task's, or the
    // use_caller thread's outside its tasks; nullptr for a plain thread, which polls.
    SchedulerIdle* idle = nullptr;
    bool in_task = false;  // a scheduler task's: its reads and writes may go the fast way
    Start start = Start::NotYet;
    bool not_open = false;      // Unrecorded because fd was not open at the first step (EBADF)
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
// and records its count of cancels (see "Cancel" at the top of io_registry.ipp). nullptr: no entry
// was made at the first step (no memory, or fd is not open: `not_open`); the call must then
// not wait. A number no file has gets no entry: entries are kept for the scheduler's life,
// and a program passing stray numbers (up to INT_MAX) would otherwise grow the table by one
// each. The check, one fcntl(), is made once per number that gets an entry.
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
        if (call.fd < 0 || (::fcntl(call.fd, F_GETFD) == -1 && current_errno() == EBADF)) {
            call.not_open = true;  // its call fails with EBADF (or, opened since, as if it came before)
            return nullptr;
        }
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
// this poll comes as a new edge (see the top of io_registry.ipp). Empty: go on and park.
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
            set_errno(call.not_open ? EBADF : ENOMEM);
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
        // An edge that came while no one waited (see the top of io_registry.ipp): not parking is
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
    // failed ("Reads that would fail" at the top of io_registry.ipp).
    wait.skipped_read = kind == WaitKind::SkippedRead;
    if (!stated || wait.skipped_read) join_unverified(idle, wait, fd);
    // Side (a) of the argument at SchedulerIdle::poller: the fiber parks below, and someone
    // must be polling for it (the caller thread that runs it may not sleep again for long).
    idle.io_waiters.fetch_add(1, std::memory_order_seq_cst);
    if (idle.poller.load(std::memory_order_seq_cst) == nullptr) wake_for_io(idle);
    FiberIoWait where{&idle, fd};
    note_wait(WaitReason::Io, nullptr, nullptr, deadline, static_cast<std::uint64_t>(fd), static_cast<unsigned>(what));
    const bool woken = block(idle.io_lock, wait.waiter, deadline, &unlink_io_wait, &where);
    idle.io_waiters.fetch_sub(1, std::memory_order_seq_cst);
    return fiber_wait_result(call, wait, what, kind, woken);
}

}  // namespace

}  // namespace detail

}  // namespace fsched

#endif  // FIBER_SCHED_HAVE_EPOLL
