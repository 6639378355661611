// ---------------------------------------------------------------------------
// Implementation: the registry of live fibers, and how a report reads a fiber that other
// threads may wake, run or destroy meanwhile.
//
// The registry. Each thread that makes fibers owns a segment: chunks of slots, each holding
// a live Fiber*, null, or (low bit set) a link of the owner's free list. A new fiber takes
// the free list's first slot with plain stores (no lock, no atomic read-modify-write:
// creating and destroying a fiber costs a few plain loads and stores more); a fiber
// destroyed on the owner's thread puts its slot back on the list, one destroyed elsewhere
// nulls it. When the free list runs dry the owner sweeps its chunks and links the null
// slots, and adds a chunk as large as all the others when under a quarter were null, so a
// sweep's cost is spread over at least as many creations as it has slots, and a live fiber
// costs 8 to 16 bytes of slots. Segments and chunks are never freed;
// a segment whose thread exited goes to the next thread that asks.
//
// A destroyed fiber must not be freed while a report reads it. The destroyer nulls its
// slot, then reads its segment's `reporting` flag and waits while it is set; the report
// sets every segment's flag, then reads the slots. Between the two sides a barrier: the
// report's heavy one (inspect_os.ipp) where the system has it, so the destroyer's is a
// compiler barrier; else a seq_cst fence on each side. Either the report sees the slot
// null, or the destroyer sees the flag and waits until the report has let go.
//
// A parked fiber's stack and wait record. The report sets the fiber's hold (`inspected_`,
// seq_cst), then reads its state (seq_cst); the wake-up that claims a parked fiber does the
// opposite (claim_woken's seq_cst CAS, then the hold, in Worker::claim_task_fiber): either
// the report sees the fiber no longer parked and leaves it alone, or the wake-up sees the
// hold and waits until the report has read it. Only claim_woken takes a fiber out of
// Parked, so while held it stays parked, its stack and record still, and the primitive it
// waits on alive.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"
#include "impl/inspect_os.ipp"
#include "impl/registry_slots.ipp"

namespace fsched {
namespace detail {

// Every segment, newest first (a debugger starts here: tools/fiber_sched_gdb.py).
std::atomic<RegistrySegment*> registry_segments{nullptr};

namespace {

constexpr std::size_t registry_chunk_min = 256;

struct Registry {
    std::mutex mutex;  // claiming and adding segments
    std::mutex report_mutex;  // one report at a time
};

// Function-local and never destroyed: fibers outlive main(); built by build_process_state.
Registry& registry() {
    static Registry* r = new Registry;
    return *r;
}

RegistrySegment* claim_segment(ThreadState* ts) noexcept {
    const char* stack_lo = nullptr;
    const char* stack_hi = nullptr;
    if (!os::reusable_thread_stack(stack_lo, stack_hi)) stack_lo = stack_hi = nullptr;
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    RegistrySegment* seg = registry_segments.load(std::memory_order_relaxed);
    while (seg && seg->owned) seg = seg->next;
    if (!seg) {
        seg = new (std::nothrow) RegistrySegment;
        if (!seg) return nullptr;
        seg->next = registry_segments.load(std::memory_order_relaxed);
        registry_segments.store(seg, std::memory_order_release);
    }
    seg->owned = true;
    seg->stack_lo = stack_lo;
    seg->stack_hi = stack_hi;
    ts->registry = seg;
    return seg;
}

// The owner, with no free slot left: links the null slots, adds a chunk if few were null.
bool refill(RegistrySegment& seg) noexcept {
    std::size_t found = 0;
    for (RegistryChunk* c = seg.chunks.load(std::memory_order_relaxed); c; c = c->next) {
        for (std::size_t i = 0; i < c->size; ++i) {
            if (!c->slots[i].load(std::memory_order_relaxed)) {
                c->slots[i].store(free_link(seg.free_head), std::memory_order_relaxed);
                seg.free_head = &c->slots[i];
                ++found;
            }
        }
    }
    if (found * 4 <= seg.capacity || seg.capacity == 0) {
        const std::size_t n = std::max(registry_chunk_min, seg.capacity);
        auto* chunk = FIBER_SCHED_FAULT(RegistryAlloc) ? nullptr : new (std::nothrow) RegistryChunk(n);
        // (Out of memory: the fiber goes unlisted, unless the sweep found a slot.)
        if (chunk && chunk->slots) {
            for (std::size_t i = n; i-- > 0;) {
                chunk->slots[i].store(free_link(seg.free_head), std::memory_order_relaxed);
                seg.free_head = &chunk->slots[i];
            }
            chunk->next = seg.chunks.load(std::memory_order_relaxed);
            seg.chunks.store(chunk, std::memory_order_release);
            seg.capacity += n;
        } else {
            delete chunk;
        }
    }
    return seg.free_head != nullptr;
}

}  // namespace

// registry_add()'s way when the thread has no segment or no free slot (registry_slots.ipp).
void registry_add_slow(Fiber& f, ThreadState* ts) noexcept {
    if (ts->exited) return;  // a thread_local destructor's fiber
    RegistrySegment* seg = ts->registry;
    if (!seg && !(seg = claim_segment(ts))) return;
    if (!seg->free_head && !refill(*seg)) return;
    take_slot(f, *seg);
}

FIBER_SCHED_NOINLINE FIBER_SCHED_COLD void wait_for_report(RegistrySegment& seg) noexcept {
    while (seg.reporting.load(std::memory_order_acquire)) std::this_thread::yield();
}

// Unlists the fibers of `seg` whose objects lie in [lo, hi) (the report mutex held).
void forget_in_range(RegistrySegment& seg, const char* lo, const char* hi) noexcept {
    const auto first = reinterpret_cast<std::uintptr_t>(lo);
    const auto last = reinterpret_cast<std::uintptr_t>(hi);
    for (RegistryChunk* c = seg.chunks.load(std::memory_order_acquire); c; c = c->next) {
        for (std::size_t i = 0; i < c->size; ++i) {
            Fiber* f = c->slots[i].load(std::memory_order_relaxed);
            const auto at = reinterpret_cast<std::uintptr_t>(f);
            if (is_fiber(f) && at >= first && at < last) {
                c->slots[i].compare_exchange_strong(f, nullptr, std::memory_order_relaxed);
            }
        }
    }
}

// A Suspended fiber destroyed: its frames are never unwound, so a Fiber object that lives in
// one of them (a fiber made on another fiber's stack) is never destroyed either. Its slot
// would point into freed memory: unlist every fiber whose object lies in [lo, hi). No
// Fiber is read (only the slots' values compared), so no pinning; a slot that holds a
// fiber is written by no one else but its destroyer, and that one is never to come.
void registry_forget_range(const char* lo, const char* hi) noexcept {
    std::lock_guard<std::mutex> lock(registry().report_mutex);  // against a report reading them
    for (RegistrySegment* s = registry_segments.load(std::memory_order_acquire); s; s = s->next) {
        forget_in_range(*s, lo, hi);
    }
}

void release_registry_segment(ThreadState* ts) noexcept {
    if (!ts->registry) return;
    std::lock_guard<std::mutex> lock(registry().mutex);
    ts->registry->owned = false;
    ts->registry->stack_lo = ts->registry->stack_hi = nullptr;
    ts->registry = nullptr;
}

// Calls visit(fiber) for each listed fiber, with none of them destroyed until it returns.
// Reports run one at a time. visit must not destroy a fiber, nor wait for a thread that
// might (it would wait for this walk): it copies what it needs.
template <class Visit>
void for_each_live_fiber(Visit&& visit) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.report_mutex);
    RegistrySegment* const first = registry_segments.load(std::memory_order_acquire);
    for (RegistrySegment* s = first; s; s = s->next) s->reporting.store(true, registry_order);
    if (registry_fences.load(std::memory_order_relaxed) || !os::heavy_barrier()) {
        registry_fence();
        // A heavy barrier that failed (a forked child, a sandbox) cannot vouch for the
        // destroyers that skipped their fence; from now on they fence.
        registry_fences.store(true, std::memory_order_relaxed);
        registry_fence();
    }
    struct Release {
        RegistrySegment* first;
        ~Release() {
            for (RegistrySegment* s = first; s; s = s->next) s->reporting.store(false, std::memory_order_release);
        }
    } release{first};
    for (RegistrySegment* s = first; s; s = s->next) {
        for (RegistryChunk* c = s->chunks.load(std::memory_order_acquire); c; c = c->next) {
            for (std::size_t i = 0; i < c->size; ++i) {
                Fiber* f = c->slots[i].load(registry_load_order);
                if (is_fiber(f)) visit(*f);
            }
        }
    }
}

// Registers the registry's fork handlers and asks for the heavy barrier; once, from
// build_process_state, before any thread of the library exists.
void build_registry() {
    (void)registry();
    if (os::enable_heavy_barrier()) registry_fences.store(false, std::memory_order_relaxed);
    os::at_fork(
        [] {
            registry().mutex.lock();
            registry().report_mutex.lock();
        },
        [] {
            registry().report_mutex.unlock();
            registry().mutex.unlock();
        },
        [] {
            // Only this thread goes on: no report runs; the others' segments stay theirs.
            // Their fibers stay listed where their memory stays (the heap, fiber stacks),
            // but not those on the other threads' own stacks: the thread library hands
            // those stacks to the child's new threads, which write over the fibers.
            registry_fences.store(true, std::memory_order_relaxed);
            const RegistrySegment* mine = thread_state()->registry;
            for (RegistrySegment* s = registry_segments.load(std::memory_order_relaxed); s; s = s->next) {
                s->reporting.store(false, std::memory_order_relaxed);
                if (s != mine && s->owned && s->stack_lo) {
                    forget_in_range(*s, s->stack_lo, s->stack_hi);
                    s->stack_lo = s->stack_hi = nullptr;
                }
            }
            registry().report_mutex.unlock();
            registry().mutex.unlock();
            if (os::enable_heavy_barrier()) registry_fences.store(false, std::memory_order_relaxed);
        });
}

// --- wait records ----------------------------------------------------------------------

// A worker's index (sched_submit.ipp; -1 for null).
int worker_number(const Worker* worker) noexcept;

std::atomic<long> mutex_waiters{0};

const char* wait_reason_word(WaitReason kind) noexcept {
    switch (kind) {
    case WaitReason::None: return "";
    case WaitReason::Mutex: return "Mutex";
    case WaitReason::ConditionVariable: return "ConditionVariable";
    case WaitReason::WaitGroup: return "WaitGroup";
    case WaitReason::ChannelSend: return "Channel send";
    case WaitReason::ChannelReceive: return "Channel receive";
    case WaitReason::Sleep: return "sleep";
    case WaitReason::Io: return "io";
    case WaitReason::Yield: return "yield";
    case WaitReason::Semaphore: return "Semaphore";
    case WaitReason::Latch: return "Latch";
    case WaitReason::Barrier: return "Barrier";
    case WaitReason::SharedMutex: return "SharedMutex";
    case WaitReason::SharedMutexShared: return "SharedMutex shared";
    case WaitReason::Event: return "Event";
    case WaitReason::ConditionVariableAny: return "ConditionVariableAny";
    case WaitReason::Select: return "select";
    case WaitReason::Future: return "Future";
    case WaitReason::ParallelFor: return "parallel_for";
    case WaitReason::Other: return "";
    }
    return "";
}

void note_wait(WaitReason kind, const void* object, const WaitOps* ops,
               const std::chrono::steady_clock::time_point* deadline, std::uint64_t a, std::uint64_t b) noexcept {
    ThreadState* ts = thread_state();
    Fiber* f = ts->current;
    if (!f) return;
    WaitRecord& w = FiberAccess::wait(*f);
    w.word = nullptr;
    w.object = object;
    w.ops = ops;
    w.scheduler = ts->scheduler;
    w.worker = ts->worker;
    w.since_ns = os::coarse_now_ns();
    w.deadline_ns = deadline ? static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                              deadline->time_since_epoch())
                                                              .count())
                             : -1;
    w.a = a;
    w.b = b;
    FiberAccess::woken(*f).store(false, std::memory_order_relaxed);
    w.kind.store(kind, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace fsched
