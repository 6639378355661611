// ---------------------------------------------------------------------------
// Data parallelism: parallel_for and parallel_for_chunks over an index range.
//
// A call splits [first, last) into chunks of at least `grain` indexes (more when the range
// is long: about 8 chunks per worker, so that drawing a chunk stays cheap) and draws them
// from one atomic counter. It schedules up to one helper task per worker (fewer when there
// are fewer chunks), each drawing chunks until none is left; a caller that is a scheduler
// task draws chunks too, so the helpers are one fewer, and then parks until every helper
// has finished (WaitReason::ParallelFor); a plain thread blocks, and the use_caller thread
// outside its tasks runs the scheduler's tasks (the helpers among them) while it waits. The
// call's state lives on the caller's stack and each helper's closure is one pointer (kept
// inline in its task): no allocation per index or chunk, none per call beyond schedule()'s.
// Nested calls (from inside a chunk) work: every wait parks, so no worker is held.
// Exceptions: the first one thrown by fn (first to be caught, on whichever thread) is kept;
// from then on no new chunk starts (chunks already running finish), and it is rethrown by
// the call once every helper has finished.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
namespace detail {

// One parallel_for call, on its caller's stack (impl/parallel.ipp).
class ParallelRun {
public:
    using RunChunk = void (*)(void* fn, std::size_t begin, std::size_t end);

    ParallelRun(std::size_t first, std::size_t last, std::size_t grain, std::size_t workers, RunChunk run,
                void* fn) noexcept;
    ParallelRun(const ParallelRun&) = delete;
    ParallelRun& operator=(const ParallelRun&) = delete;

    // Runs every chunk on `scheduler`'s workers (and here, in a task), waits for all of
    // them, then rethrows the first exception fn threw.
    void run(Scheduler& scheduler);

private:
    // Draws and runs chunks until none is left or one has thrown.
    void work() noexcept;
    // A helper's end: the last one wakes the waiting caller. `this` may be gone after it.
    void helper_done() noexcept;
    // fiber_report()'s look at the call (WaitOps::describe).
    static void describe_wait(const void* run, char* out, std::size_t size) noexcept;

    const std::size_t first_;
    const std::size_t last_;
    const std::size_t chunk_;    // indexes per chunk (the last one may have fewer)
    const std::size_t chunks_;
    const RunChunk run_;
    void* const fn_;
    // The next chunk to draw; relaxed: each value is drawn once, and the chunk's range is
    // computed from it (fn's own data is ordered by the helper's end, under lock_).
    std::atomic<std::size_t> next_{0};
    std::atomic<bool> failed_{false};   // a chunk threw: draw no more (relaxed: a hint)
    SpinLock lock_;
    std::size_t helpers_left_ = 0;      // under lock_: helpers scheduled and not finished
    std::exception_ptr error_;          // under lock_: the first exception fn threw
    WaitList waiters_;                  // under lock_: the caller, once it waits
};

// parallel_for's and parallel_for_chunks' common entry: the range's checks, then the run.
template <class ChunkFn>
void parallel_chunks(Scheduler& scheduler, std::size_t first, std::size_t last, std::size_t grain,
                     ChunkFn& fn) {
    if (first == last) return;
    ParallelRun run(first, last, grain, scheduler.thread_count(),
                    [](void* f, std::size_t begin, std::size_t end) { (*static_cast<ChunkFn*>(f))(begin, end); },
                    static_cast<void*>(&fn));
    run.run(scheduler);
}

}  // namespace detail

// Calls fn(i) for every i in [first, last), in chunks of at least `grain` indexes (0 counts
// as 1) spread over `scheduler`'s workers, and returns when all have run. fn is shared by
// the threads that run chunks: it is called concurrently, by reference. From a task the
// calling fiber runs chunks too and then parks; from the use_caller thread it runs the
// scheduler's tasks while it waits; from a plain thread it blocks (until the scheduler,
// started, has run them). The first exception fn throws is rethrown here after every chunk
// has finished; no chunk starts after it was thrown, so some indexes may not be visited.
// Precondition (FIBER_SCHED_ASSERT): first <= last. An empty range returns at once.
template <class F>
void parallel_for(Scheduler& scheduler, std::size_t first, std::size_t last, std::size_t grain, F&& fn) {
    FIBER_SCHED_ASSERT(first <= last && "parallel_for(): first must not be greater than last");
    auto chunk = [&fn](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i != end; ++i) fn(i);
    };
    detail::parallel_chunks(scheduler, first, last, grain, chunk);
}

// The same with fn(begin, end) called once per chunk [begin, end).
template <class F>
void parallel_for_chunks(Scheduler& scheduler, std::size_t first, std::size_t last, std::size_t grain, F&& fn) {
    FIBER_SCHED_ASSERT(first <= last && "parallel_for_chunks(): first must not be greater than last");
    auto chunk = [&fn](std::size_t begin, std::size_t end) { fn(begin, end); };
    detail::parallel_chunks(scheduler, first, last, grain, chunk);
}

}  // namespace fsched
