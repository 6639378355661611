// ---------------------------------------------------------------------------
// Implementation: parallel_for's run (ParallelRun): the chunks, the helpers, the wait.
// ---------------------------------------------------------------------------

#pragma once

#include "parallel.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
namespace detail {

inline std::size_t parallel_chunk_size(std::size_t n, std::size_t grain, std::size_t workers) noexcept {
    // About 8 chunks per worker: enough to even out uneven chunks, few enough that the
    // counter is not fought over; never below the grain asked for.
    const std::size_t spread = n / (8 * (workers == 0 ? 1 : workers));
    const std::size_t at_least = grain == 0 ? 1 : grain;
    return spread > at_least ? spread : at_least;
}

ParallelRun::ParallelRun(std::size_t first, std::size_t last, std::size_t grain, std::size_t workers,
                         RunChunk run, void* fn) noexcept
    : first_(first),
      last_(last),
      chunk_(parallel_chunk_size(last - first, grain, workers)),
      chunks_((last - first) / chunk_ + ((last - first) % chunk_ != 0)),
      run_(run),
      fn_(fn) {}

void ParallelRun::run(Scheduler& scheduler) {
    const bool in_task = in_scheduler_task();
    const std::size_t workers = scheduler.thread_count();
    const std::size_t takers = chunks_ < workers ? chunks_ : workers;
    const std::size_t helpers = in_task ? takers - 1 : takers;
    std::exception_ptr schedule_error;
    for (std::size_t h = 0; h < helpers; ++h) {
        {
            std::lock_guard<SpinLock> guard(lock_);
            ++helpers_left_;
        }
        try {
            scheduler.schedule([this] {
                work();
                helper_done();
            });
        } catch (...) {  // no helper was queued: take its place here
            std::lock_guard<SpinLock> guard(lock_);
            --helpers_left_;
            schedule_error = std::current_exception();
            break;
        }
    }
    if (in_task || schedule_error) work();
    lock_.lock();
    if (helpers_left_ != 0) {
        Waiter self;
        waiters_.push_back(&self);
        static constexpr WaitOps ops{&ParallelRun::describe_wait, nullptr};
        note_wait(WaitReason::ParallelFor, this, &ops);
        block(lock_, waiters_, self, nullptr);
        lock_.lock();  // orders the helpers' writes (error_ and fn's) before ours
    }
    std::exception_ptr error = std::move(error_);
    lock_.unlock();
    if (error) std::rethrow_exception(error);
    if (schedule_error) std::rethrow_exception(schedule_error);
}

void ParallelRun::work() noexcept {
    while (!failed_.load(std::memory_order_relaxed)) {
        const std::size_t k = next_.fetch_add(1, std::memory_order_relaxed);
        if (k >= chunks_) return;
        const std::size_t begin = first_ + k * chunk_;
        const std::size_t end = begin + (last_ - begin < chunk_ ? last_ - begin : chunk_);
        std::exception_ptr error;
        try {
            run_(fn_, begin, end);
            continue;
        } catch (...) {
            error = std::current_exception();
        }
        // Kept after the catch block has ended (libstdc++'s count on the exception, invisible
        // to TSan, then drops on this thread before the caller can take it).
        failed_.store(true, std::memory_order_relaxed);
        std::lock_guard<SpinLock> guard(lock_);
        if (!error_) error_ = std::move(error);
    }
}

void ParallelRun::helper_done() noexcept {
    Waiter* caller = nullptr;
    lock_.lock();
    if (--helpers_left_ == 0) caller = pop_claimed(waiters_);
    lock_.unlock();  // the caller may return and free *this from here on
    if (caller) wake_waiter(*caller);
}

void ParallelRun::describe_wait(const void* run, char* out, std::size_t size) noexcept {
    auto* self = const_cast<ParallelRun*>(static_cast<const ParallelRun*>(run));
    std::size_t drawn = self->next_.load(std::memory_order_relaxed);
    if (drawn > self->chunks_) drawn = self->chunks_;
    if (!self->lock_.try_lock()) {
        std::snprintf(out, size, "busy");
        return;
    }
    const std::size_t helpers = self->helpers_left_;
    self->lock_.unlock();
    std::snprintf(out, size, "%llu of %llu chunks started, helpers running: %llu",
                  static_cast<unsigned long long>(drawn), static_cast<unsigned long long>(self->chunks_),
                  static_cast<unsigned long long>(helpers));
}

}  // namespace detail
}  // namespace fsched
