// ---------------------------------------------------------------------------
// What a parked fiber waits for (WaitRecord), as fiber_report() shows it: each primitive
// calls note_wait() just before it parks; the fiber's resumer publishes the record with the
// park itself (finish_parked's release), and the report reads it only while the fiber is
// parked and held (impl/registry.ipp), so the record needs no lock and no atomic of its
// own but `kind`, which the report also reads of fibers that run.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {

class Scheduler;
class Fiber;

namespace detail {

struct Worker;

// The wait a parked fiber is in; its word in the report (wait_reason_word) is the primitive's
// class name or the call's ("sleep", "io", "yield").
// tools/fiber_sched_gdb.py's _WAITS mirrors these numbers: renumber both together.
enum class WaitReason : std::uint8_t {
    None,               // not waiting, or parked by a primitive that says nothing
    Mutex,
    ConditionVariable,
    WaitGroup,
    ChannelSend,        // "Channel send"
    ChannelReceive,     // "Channel receive"
    Sleep,
    Io,
    Yield,              // queued again by this_fiber::yield(): runnable, not parked
    Semaphore,
    Latch,
    Barrier,
    SharedMutex,        // "SharedMutex" (exclusive lock)
    SharedMutexShared,  // "SharedMutex shared"
    Event,
    ConditionVariableAny,
    Select,             // "select" over channel cases
    Future,             // Future<T>::get()/wait()
    ParallelFor,        // "parallel_for": the caller waits for its chunks
    Other               // a primitive that names itself (WaitRecord::word)
};
const char* wait_reason_word(WaitReason kind) noexcept;

// What the report may ask a waited-for object, while the waiting fiber is held (so the
// object is alive). Neither may block (use try_lock and say "busy").
struct WaitOps {
    // Writes what `object` holds now (a channel's length, a group's count) into `out`
    // (NUL-terminated, at most `size` bytes); may be null.
    void (*describe)(const void* object, char* out, std::size_t size) noexcept = nullptr;
    // Who holds it now (a fiber id or a thread's token, caller_identity()), 0: no one; may
    // be null. The deadlock watch follows these.
    std::uint64_t (*holder)(const void* object) noexcept = nullptr;
};

// Only `kind` is initialised: note_wait() writes every other field before it sets a kind
// other than None, and the report reads them only then (a Fiber's constructor is spared
// nine stores). Whether the wait is over is Fiber::woken_, beside the fiber's state.
struct WaitRecord {
    std::atomic<WaitReason> kind{WaitReason::None};  // relaxed: the report reads it of running fibers
    const char* word;                            // WaitReason::Other's word (a string literal)
    const void* object;                          // the primitive waited on, or nullptr
    const WaitOps* ops;                          // what the report may ask it, or nullptr
    Scheduler* scheduler;                        // where it parked, and on which worker
    const Worker* worker;                        // (the index is looked up by the report)
    std::int64_t since_ns;                       // coarse_now_ns() at the park
    std::int64_t deadline_ns;                    // steady_clock ns of a timed wait's end; -1: none
    std::uint64_t a;                             // io: the fd
    std::uint64_t b;                             // io: the events waited for
};

// Records the running fiber's coming wait (a no-op outside fibers). `deadline`: the
// steady_clock time a timed wait ends, or nullptr.
void note_wait(WaitReason kind, const void* object, const WaitOps* ops = nullptr,
               const std::chrono::steady_clock::time_point* deadline = nullptr, std::uint64_t a = 0,
               std::uint64_t b = 0) noexcept;

// The word of what `f` waits for now (as fiber_report() shows it), or nullptr when it is not
// waiting or its primitive names no wait. A racy look, for tracers: no hold is taken.
const char* wait_reason(const Fiber& f) noexcept;

// Fibers parked in Mutex::lock() now (the deadlock watch runs only while there are some).
extern std::atomic<long> mutex_waiters;
// Starts the watch thread (deadlocks, hang reports) if it is not running; it wakes once a
// second while it has something to watch and ends when it has nothing. Never throws:
// without a thread there is no watch.
void ensure_watchdog() noexcept;

}  // namespace detail
}  // namespace fsched
