// ---------------------------------------------------------------------------
// The scheduler's task queues: what a queue holds (QueuedTask, and how its fiber is taken:
// TaskKind) and the queue itself (TaskQueue, a deque whose blocks come from slabs the queue
// maps itself: TaskBlockSlabs). Owns no lock: a worker's ready.lock guards its queues
// (sched_worker.ipp).
// Relies on: Fiber (fiber.hpp), TaskFunction, NewTask and Priority (scheduler.hpp), the OS
// layer's page mapping (os.ipp).
// ---------------------------------------------------------------------------

#pragma once

#include "scheduler.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"

namespace fsched {
namespace detail {

// How a queued fiber is to be taken when its task runs.
enum class TaskKind : std::uint8_t {
    Fresh,    // schedule(): claim it, or defer when it is still running or parked
    Woken,    // coming back from a park: Parked, and this task is its wake-up
    Claimed,  // a deferred schedule() taking effect: already Running (claimed) for us
};

// What the queues hold: a scheduled task (from a ScheduleTask, the API's record, once
// checked) or a fiber coming back, and how to take its fiber. `sequence` orders a worker's
// two queues against each other (see Worker::pop).
struct QueuedTask {
    QueuedTask() = default;
    explicit QueuedTask(NewTask&& task) noexcept
        : fiber(std::move(task.fiber)), cb(std::move(task.cb)), worker(task.thread), priority(task.priority) {}

    Fiber::ptr fiber;
    TaskFunction cb;
    int worker = -1;  // the worker it is pinned to; -1: any
    Priority priority = Priority::Normal;  // which level of the queues it waits in
    TaskKind kind = TaskKind::Fresh;
    std::uint64_t sequence = 0;
};

// Where a TaskQueue's deque gets its blocks of tasks: slabs of slab_bytes that the queue maps
// itself, each block carrying its slab's address in the 16 bytes before it. Two things
// came from malloc before. std::deque allocates a block for every few tasks and frees it
// once they are taken; with thieves taking from the back, workers freed each other's
// blocks, some 230,000 of them per skynet run of a million leaves (docs/performance-notes.md,
// "Stacks and skynet" and "Task queues' blocks"). And a burst of tasks queued at once
// (100,000 from outside, say) left its blocks in malloc's heap once drained, pinned there by
// whatever was allocated after them: 9 MB, 92 bytes per task, still resident while the
// burst's fibers were parked (docs/performance-notes.md,
// "Memory per parked fiber"). Here a drained slab
// is kept for the queue's next blocks while the worker is busy, so a queue that fills and
// drains maps nothing, and a burst's slabs go back to the OS, all but one, once the worker
// has slept for queue_trim_delay (Worker::sleep_until_work). Blocks of another size (none
// with libstdc++ or libc++) go to operator new. Under the owning worker's ready.lock, as
// the deque is.
class TaskBlockSlabs {
public:
    TaskBlockSlabs() = default;
    TaskBlockSlabs(const TaskBlockSlabs&) = delete;
    TaskBlockSlabs& operator=(const TaskBlockSlabs&) = delete;
    ~TaskBlockSlabs() {
        // The deque is gone (declared after this), so every block is back and every slab
        // is empty. (A full slab would be in no list; none is.)
        while (partial_) {
            Slab* slab = partial_;
            unlink(slab);
            unmap(slab);
        }
        release_empty(0);
    }

    void* allocate(std::size_t bytes) {
        if (block_bytes_ == 0 && stride_for(bytes) <= slab_bytes - slab_header) block_bytes_ = bytes;
        if (bytes != block_bytes_) return ::operator new(bytes);
        Slab* slab = partial_;
        if (!slab) {
            if (empty_) {
                slab = empty_;
                empty_ = slab->next;
                --empty_count_;
            } else {
                slab = map_slab();
            }
            link(slab);
        }
        char* block;
        if (slab->free) {
            block = slab->free;
            std::memcpy(&slab->free, block, sizeof(char*));
        } else {
            block = reinterpret_cast<char*>(slab) + slab_header + slab->carved * stride_ + 16;
            std::memcpy(block - 16, &slab, sizeof slab);
            ++slab->carved;
        }
        if (++slab->used == capacity_) unlink(slab);  // full: no longer a place to allocate
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(block, bytes);
#endif
        return block;
    }

    void deallocate(void* p, std::size_t bytes) noexcept {
        if (bytes != block_bytes_) return ::operator delete(p);
        char* const block = static_cast<char*>(p);
        Slab* slab;
        std::memcpy(&slab, block - 16, sizeof slab);
        if (slab->used-- == capacity_) link(slab);  // was full: room again
        std::memcpy(block, &slab->free, sizeof(char*));
        slab->free = block;
#if defined(FIBER_SCHED_ASAN)
        __asan_poison_memory_region(block + sizeof(char*), bytes - sizeof(char*));  // a stale task read is caught
#endif
        if (slab->used == 0) {  // kept for the next blocks, until release_empty()
            unlink(slab);
            slab->next = empty_;
            empty_ = slab;
            ++empty_count_;
        }
    }

    // Slabs with no block handed out, kept for the next ones.
    std::size_t empty_slabs() const noexcept { return empty_count_; }
    // Gives all but `keep` of them back to the OS.
    void release_empty(std::size_t keep) noexcept { unmap_detached(detach_empty(keep)); }
    // Takes all but `keep` of them out, still linked through `next`, for unmap_detached(),
    // which needs no lock.
    void* detach_empty(std::size_t keep) noexcept {
        Slab* detached = nullptr;
        Slab** tail = &detached;
        while (empty_count_ > keep) {
            Slab* slab = empty_;
            empty_ = slab->next;
            --empty_count_;
            --mapped_;
            *tail = slab;
            tail = &slab->next;
        }
        *tail = nullptr;
        return detached;
    }
    static void unmap_detached(void* detached) noexcept {
        for (Slab* slab = static_cast<Slab*>(detached); slab;) {
            Slab* const next = slab->next;
            unmap_memory(slab);
            slab = next;
        }
    }
    // Slabs mapped now (tests).
    std::size_t slabs() const noexcept { return mapped_; }

    static constexpr std::size_t slab_bytes = 64 * 1024;

private:
    struct Slab {
        Slab* prev;
        Slab* next;
        char* free;        // freed blocks, each linking the next in its first word
        std::size_t used;  // blocks handed out
        std::size_t carved;  // blocks handed out at least once (the rest never touched)
    };
    static constexpr std::size_t slab_header = (sizeof(Slab) + 15) / 16 * 16;

    static std::size_t stride_for(std::size_t bytes) noexcept { return 16 + (bytes + 15) / 16 * 16; }

    Slab* map_slab() {
        void* memory = os::map_stack_memory(slab_bytes);
        if (!memory) throw std::bad_alloc();
        if (capacity_ == 0) {
            stride_ = stride_for(block_bytes_);
            capacity_ = (slab_bytes - slab_header) / stride_;
        }
        ++mapped_;
        return new (memory) Slab{nullptr, nullptr, nullptr, 0, 0};
    }
    void unmap(Slab* slab) noexcept {
        unmap_memory(slab);
        --mapped_;
    }
    static void unmap_memory(Slab* slab) noexcept {
#if defined(FIBER_SCHED_ASAN)
        __asan_unpoison_memory_region(slab, slab_bytes);
#endif
        os::unmap_memory(slab, slab_bytes);
    }
    // The slabs with room (partial_ first) are a doubly linked list.
    void link(Slab* slab) noexcept {
        slab->prev = nullptr;
        slab->next = partial_;
        if (partial_) partial_->prev = slab;
        partial_ = slab;
    }
    void unlink(Slab* slab) noexcept {
        if (slab->prev) {
            slab->prev->next = slab->next;
        } else {
            partial_ = slab->next;
        }
        if (slab->next) slab->next->prev = slab->prev;
        slab->prev = slab->next = nullptr;
    }

    Slab* partial_ = nullptr;  // slabs with blocks handed out and room for more
    Slab* empty_ = nullptr;    // slabs with none, linked through `next`
    std::size_t empty_count_ = 0;
    std::size_t block_bytes_ = 0;  // the deque's block size, set by its first block
    std::size_t stride_ = 0;
    std::size_t capacity_ = 0;  // blocks per slab
    std::size_t mapped_ = 0;
};

// std::deque's allocator for a TaskQueue: its blocks of tasks come from the queue's
// TaskBlockSlabs; anything else (the deque's map of blocks) straight from operator new.
template <class T>
struct TaskBlockAllocator {
    using value_type = T;
    TaskBlockSlabs* cache;
    explicit TaskBlockAllocator(TaskBlockSlabs* c) noexcept : cache(c) {}
    template <class U>
    TaskBlockAllocator(const TaskBlockAllocator<U>& other) noexcept : cache(other.cache) {}
    T* allocate(std::size_t n) {
        if constexpr (std::is_same<T, QueuedTask>::value) return static_cast<T*>(cache->allocate(n * sizeof(T)));
        return static_cast<T*>(::operator new(n * sizeof(T)));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if constexpr (std::is_same<T, QueuedTask>::value) return cache->deallocate(p, n * sizeof(T));
        ::operator delete(p);
    }
    template <class U>
    bool operator==(const TaskBlockAllocator<U>& other) const noexcept { return cache == other.cache; }
    template <class U>
    bool operator!=(const TaskBlockAllocator<U>& other) const noexcept { return cache != other.cache; }
};

// A worker's queue of one kind (stealable or pinned) at one level: a deque whose freed
// blocks come from slabs of its own (TaskBlockSlabs). Under the owning worker's ready.lock.
class TaskQueue {
public:
    TaskQueue() : tasks_(TaskBlockAllocator<QueuedTask>(&cache_)) {}
    TaskQueue(const TaskQueue&) = delete;
    TaskQueue& operator=(const TaskQueue&) = delete;

    bool empty() const noexcept { return tasks_.empty(); }
    std::size_t size() const noexcept { return tasks_.size(); }
    QueuedTask& front() noexcept { return tasks_.front(); }
    QueuedTask& back() noexcept { return tasks_.back(); }
    // Strong guarantee: on std::bad_alloc nothing changed.
    void push_back(QueuedTask&& task) {
        tasks_.push_back(std::move(task));
        grown();
    }
    void push_front(QueuedTask&& task) {
        tasks_.push_front(std::move(task));
        grown();
    }
    void pop_front() noexcept {
        tasks_.pop_front();
        if (tasks_.empty()) drained();
    }
    void pop_back() noexcept {
        tasks_.pop_back();
        if (tasks_.empty()) drained();
    }
    // Drops the tasks after the first `n` (undoing push_back calls).
    void truncate(std::size_t n) noexcept { tasks_.erase(tasks_.begin() + static_cast<std::ptrdiff_t>(n), tasks_.end()); }

    // Slabs of blocks mapped now (tests), and how many of them hold no task.
    std::size_t slabs() const noexcept { return cache_.slabs(); }
    std::size_t empty_slabs() const noexcept { return cache_.empty_slabs(); }
    // Takes out all but one of the empty slabs, for TaskBlockSlabs::unmap_detached() (an
    // idle worker's trim, which unmaps them without holding the queue lock).
    void* detach_empty_slabs() noexcept { return cache_.detach_empty(1); }

    // A deque's map of blocks never shrinks by itself: after a burst of 100,000 tasks it
    // kept 256 KiB. Once a queue that held this many drains, it starts again small.
    static constexpr std::size_t shrink_after = 8192;

private:
    void grown() noexcept {
        if (tasks_.size() > high_water_) high_water_ = tasks_.size();
    }
    void drained() noexcept {
        if (high_water_ < shrink_after) return;
        high_water_ = 0;
        try {
            tasks_.shrink_to_fit();
        } catch (...) {  // no memory for the small one: keep the large one
        }
    }

    TaskBlockSlabs cache_;  // before tasks_: built first, destroyed last
    std::deque<QueuedTask, TaskBlockAllocator<QueuedTask>> tasks_;
    std::size_t high_water_ = 0;  // the most tasks held since it last started small
};

}  // namespace detail
}  // namespace fsched
