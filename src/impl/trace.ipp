// ---------------------------------------------------------------------------
// Implementation: the trace recorder and the flight recorder (trace.hpp).
//
// No global lock per event. A thread's first event of a session registers a TraceBuffer in
// the Tracer's list (under its mutex, once per thread) and keeps a pointer to it in the
// thread's ThreadState, read in a function the compiler does not inline into a switch path
// (fibers move between threads). The owning thread takes the buffer's spin lock for each
// event; stop() and dump() take it only to drain, so the lock is uncontended, and stop()
// while fibers switch neither races nor frees what a recorder holds: the list owns every
// buffer, and frees one only after its thread has exited (TraceThreadExit marks it) and a
// stop() has collected it (or a new session starts). A ring keeps the buffers of its newest 64 exited
// threads for dump(), which copies and never takes; older ones go when a thread registers
// or a dump runs. A slice's fiber is never read through the buffer (only its id and the
// name it had as the slice opened): once stop() has cleared the trace bit, a fiber that
// switches out takes no lock here and may be freed while its slice still shows open.
//
// A slice is opened at switch-in and closed at switch-out, both on the resumer's thread
// (run_claimed), and the hooks' calls switch a resumer out around the fiber it resumes, so
// a thread has at most one slice open: the buffer keeps it (open_*) and writes the slice's
// event when it closes, once its name (a task's is set when it starts) and why it ended are
// known. A wake is an event on the waker's thread, taken before the woken fiber is queued
// (wake_fiber), so on the one steady clock the woken fiber's next slice begins after it.
// The writer pairs each wake with the first slice of that fiber beginning at or after it
// (the latest wake before a slice when there are several: the others' slices were dropped)
// and turns the pairs into flow arrows; the recorder keeps nothing per fiber. A flow starts
// inside the waker's slice: the first slice a thread closes after the wake, if it had
// begun by then; a wake with none (a plain thread, a timer, an IO event) gets a slice of
// no duration named "wake" for its arrow to start from.
// ---------------------------------------------------------------------------

#pragma once

#include "trace.hpp"
#include "observe.hpp"
#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "sync.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"

namespace fsched {
namespace detail {

constexpr std::size_t default_trace_max_events = 1000000;

enum class TraceEventKind : std::uint8_t { Slice, Wake };

struct TraceEvent {
    std::int64_t begin = 0;       // ns since the session's origin
    std::int64_t end = 0;         // a slice's end; a wake's is its begin
    std::uint64_t fiber = 0;      // the slice's fiber; a wake's woken fiber
    std::uint64_t waker = 0;      // a wake's waking fiber; 0: a plain thread, a timer, IO
    const char* name = nullptr;   // the slice's fiber's name (interned, never freed) or nullptr
    const char* ended = nullptr;  // a slice: why it ended (a string literal)
    const char* parked = nullptr; // a slice that parked: what it waits for, when known
    TraceEventKind kind = TraceEventKind::Slice;
};

// One thread's events. Guarded by lock, but tid (set before the buffer is shared).
struct TraceBuffer {
    SpinLock lock;                        // the owning thread, each event; stop(), dump()
    int tid = 0;
    std::vector<TraceEvent> events;       // in order; a full ring: oldest at ring_next
    std::size_t ring_next = 0;
    std::size_t capacity = 0;             // 0: not recording
    bool ring = false;
    std::uint64_t dropped = 0;            // a recording: events not kept; a ring: overwritten
    std::chrono::steady_clock::time_point origin;
    const Fiber* open_fiber = nullptr;    // the slice running now, nullptr: none (compared, never read)
    std::uint64_t open_id = 0;
    const char* open_name = nullptr;      // its name when the slice opened (interned)
    std::int64_t open_begin = 0;
    std::string thread_name;
    const Scheduler* named_for = nullptr; // the scheduler thread_name names; nullptr: none
    bool thread_exited = false;

    std::int64_t now() const noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin).count();
    }

    void append(const TraceEvent& event) noexcept {
        if (ring) {
            if (events.size() == capacity) {
                events[ring_next] = event;  // the ring's storage is reserved at start
                ring_next = (ring_next + 1) % capacity;
                ++dropped;
                return;
            }
            events.push_back(event);
            return;
        }
        if (events.size() == capacity) {
            ++dropped;
            return;
        }
        try {
            if (events.size() == events.capacity()) events.reserve(std::min(capacity, std::max<std::size_t>(256, 2 * events.size())));
            events.push_back(event);
        } catch (...) {  // out of memory: counted as dropped, never thrown into the switch
            ++dropped;
        }
    }

    void open_slice(const Fiber& fiber, std::int64_t at) noexcept {
        open_fiber = &fiber;
        open_id = fiber.id();
        open_name = fiber.name_c_str();
        open_begin = at;
    }

    // Closes the slice of `fiber` opened on this thread; nothing when none is (the trace
    // began while it ran).
    void close_slice(const Fiber& fiber, std::int64_t at, const char* ended, const char* parked) noexcept {
        if (open_fiber != &fiber || open_id != fiber.id()) return;
        open_fiber = nullptr;
        TraceEvent event;
        event.begin = open_begin;
        event.end = at;
        event.fiber = fiber.id();
        event.name = fiber.name_c_str();
        event.ended = ended;
        event.parked = parked;
        append(event);
    }

    void begin_session(std::vector<TraceEvent>& storage, std::size_t cap, bool is_ring,
                       std::chrono::steady_clock::time_point at) noexcept {
        events.swap(storage);  // the old events go with `storage`, freed outside the lock
        ring_next = 0;
        capacity = cap;
        ring = is_ring;
        dropped = 0;
        origin = at;
        open_fiber = nullptr;
    }
};

// What stop() or dump() took from one buffer, in order, with the slice running then.
struct ThreadTrace {
    int tid = 0;
    std::string name;
    std::uint64_t dropped = 0;
    std::vector<TraceEvent> events;
};

struct Tracer {
    std::mutex mutex;  // guards all below; taken once per thread per session, and by the API
    std::vector<std::unique_ptr<TraceBuffer>> buffers;
    bool on = false;   // a recording or a ring
    bool ring = false;
    std::size_t capacity = 0;
    std::chrono::steady_clock::time_point origin;
    std::FILE* file = nullptr;  // start() to stop()
    int next_tid = 1;
    int next_plain_thread = 1;
    std::size_t max_events_override = 0;
    // In a fork()ed child, the parent's buffers: never read, never freed (see
    // build_trace_fork_handlers). Grows by one parent's list at each fork.
    std::vector<std::unique_ptr<TraceBuffer>> left_by_fork;
};

namespace {

// Function-local and never destroyed: threads may record while the process exits.
Tracer& tracer() {
    static Tracer* instance = new Tracer;
    return *instance;
}

// Its destructor, at thread exit, leaves the buffer to the next stop() or dump(). The
// buffer is found through ThreadState (trace_buffer), which outlives every thread_local.
struct TraceThreadExit {
    TraceThreadExit() = default;
    TraceThreadExit(const TraceThreadExit&) = delete;
    TraceThreadExit& operator=(const TraceThreadExit&) = delete;
    ~TraceThreadExit() {
        ThreadState* ts = thread_state();
        TraceBuffer* buffer = ts->trace_buffer;
        ts->trace_buffer = nullptr;
        ts->trace_gone = true;
        if (!buffer) return;
        buffer->lock.lock();
        buffer->thread_exited = true;  // the buffer may be freed once the lock is released
        buffer->lock.unlock();
    }
};

// How many exited threads' rings a flight recorder keeps for dump() (the newest exits).
constexpr std::size_t trace_kept_exited_rings = 64;

// Frees the buffers of exited threads but the `keep` that registered last. REQUIRES(t.mutex);
// each buffer's lock is taken.
void forget_exited_threads(Tracer& t, std::size_t keep) {
    std::vector<bool> gone(t.buffers.size());
    std::size_t exited = 0;
    for (std::size_t i = 0; i < t.buffers.size(); ++i) {
        TraceBuffer& buffer = *t.buffers[i];
        buffer.lock.lock();
        gone[i] = buffer.thread_exited;
        buffer.lock.unlock();
        exited += gone[i] ? 1 : 0;
    }
    if (exited <= keep) return;
    std::size_t to_free = exited - keep, kept = 0;
    for (std::size_t i = 0; i < t.buffers.size(); ++i) {
        if (gone[i] && to_free > 0) {
            --to_free;
            t.buffers[i].reset();
        } else {
            t.buffers[kept++] = std::move(t.buffers[i]);
        }
    }
    t.buffers.resize(kept);
}

// A worker's name ("<scheduler> worker <i>") when this thread is one now. REQUIRES(buffer.lock)
// or a buffer not yet shared.
void name_worker_thread(TraceBuffer& buffer) {
    const Scheduler* scheduler = Scheduler::current();
    if (!scheduler || scheduler == buffer.named_for) return;
    buffer.thread_name = scheduler->name() + " worker " + std::to_string(Scheduler::worker_index());
    buffer.named_for = scheduler;
}

FIBER_SCHED_NOINLINE TraceBuffer* register_trace_buffer() noexcept {
    Tracer& t = tracer();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (!t.on) return nullptr;
    try {
        // A ring keeps exited threads' buffers for dump(), a bounded number of them.
        if (t.ring) forget_exited_threads(t, trace_kept_exited_rings);
        static thread_local TraceThreadExit exit_guard;  // constructed here: runs at thread exit
        (void)exit_guard;
        auto buffer = std::make_unique<TraceBuffer>();
        buffer->tid = t.next_tid++;
        std::vector<TraceEvent> storage;
        if (t.ring) storage.reserve(t.capacity);
        buffer->begin_session(storage, t.capacity, t.ring, t.origin);
        name_worker_thread(*buffer);
        if (!buffer->named_for) buffer->thread_name = "thread " + std::to_string(t.next_plain_thread++);
        t.buffers.push_back(std::move(buffer));
    } catch (...) {
        return nullptr;  // out of memory: this thread records nothing
    }
    TraceBuffer* buffer = t.buffers.back().get();
    thread_state()->trace_buffer = buffer;
    return buffer;
}

// This thread's buffer (registered on its first event); nullptr when it records nothing.
FIBER_SCHED_NOINLINE TraceBuffer* this_thread_trace_buffer() noexcept {
    const ThreadState* ts = thread_state();
    if (ts->trace_gone) return nullptr;
    if (TraceBuffer* buffer = ts->trace_buffer) return buffer;
    return register_trace_buffer();
}

// Why `fiber` has just switched out, as the trace shows it.
const char* switch_out_reason(const Fiber& fiber) noexcept { return FiberAccess::switch_out_kind(fiber); }

std::size_t trace_max_events(const Tracer& t) {
    if (t.max_events_override) return t.max_events_override;
    if (const char* text = std::getenv("FIBER_SCHED_TRACE_MAX_EVENTS")) {
        if (const std::size_t value = parse_event_count(text)) return value;
    }
    return default_trace_max_events;
}

// REQUIRES(t.mutex), !t.on. False when a ring's memory cannot be had.
bool begin_trace_session(Tracer& t, std::size_t capacity, bool ring) {
    forget_exited_threads(t, 0);
    // A ring's memory is reserved for each thread as it first records: refuse a size that
    // cannot be had even once, rather than start a ring that records nothing.
    if (ring) {
        try {
            std::vector<TraceEvent> probe;
            probe.reserve(capacity);
        } catch (...) {
            return false;
        }
    }
    const auto origin = std::chrono::steady_clock::now();
    for (auto& buffer : t.buffers) {
        std::vector<TraceEvent> storage;
        try {
            if (ring) storage.reserve(capacity);
        } catch (...) {
            return false;
        }
        buffer->lock.lock();
        buffer->begin_session(storage, capacity, ring, origin);
        buffer->lock.unlock();
    }
    t.on = true;
    t.ring = ring;
    t.capacity = capacity;
    t.origin = origin;
    // Relaxed: the flag only sends the switch paths here; each buffer's lock orders its data.
    observe_flags.fetch_or(observe_trace, std::memory_order_relaxed);
    return true;
}

// Copies (a ring's dump) or takes (stop()) every buffer's events, in order, with the slice
// each thread runs now. stop() then forgets exited threads; a dump keeps the rings of the
// newest trace_kept_exited_rings of them, so that a later dump shows them too. REQUIRES(t.mutex).
std::vector<ThreadTrace> collect_trace(Tracer& t, bool take) {
    std::vector<ThreadTrace> threads;
    for (auto& buffer : t.buffers) {
        ThreadTrace thread;
        std::vector<TraceEvent> taken;
        if (!take) thread.events.reserve(t.capacity + 1);  // no allocation under the spin lock
        buffer->lock.lock();
        const bool has_open = buffer->open_fiber != nullptr;
        TraceEvent running;
        if (has_open) {
            // Its name as the slice opened: the fiber itself may be gone by now. stop() has
            // cleared the trace bit, and a fiber switching out after that takes no lock here
            // and may end and be freed while its slice is still open in this buffer.
            running.begin = buffer->open_begin;
            running.end = buffer->now();
            running.fiber = buffer->open_id;
            running.name = buffer->open_name;
            running.ended = "running";
        }
        const std::size_t split = buffer->ring_next;
        if (take) {
            taken.swap(buffer->events);
            buffer->capacity = 0;
            buffer->open_fiber = nullptr;
        } else {
            thread.events.insert(thread.events.end(), buffer->events.begin() + static_cast<std::ptrdiff_t>(split),
                                 buffer->events.end());
            thread.events.insert(thread.events.end(), buffer->events.begin(),
                                 buffer->events.begin() + static_cast<std::ptrdiff_t>(split));
        }
        thread.tid = buffer->tid;
        thread.dropped = buffer->dropped;
        thread.name = buffer->thread_name;
        buffer->lock.unlock();
        if (take) {
            std::rotate(taken.begin(), taken.begin() + static_cast<std::ptrdiff_t>(split), taken.end());
            thread.events = std::move(taken);
        }
        if (has_open) thread.events.push_back(running);
        if (!thread.events.empty() || thread.dropped) threads.push_back(std::move(thread));
    }
    forget_exited_threads(t, take ? 0 : trace_kept_exited_rings);
    return threads;
}

// --- the JSON writer ------------------------------------------------------------------

// The length of the well-formed UTF-8 sequence at `c` (1 to 4), or 0 when it is not one
// (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
std::size_t utf8_sequence_length(const unsigned char* c) noexcept {
    if (c[0] < 0x80) return 1;
    std::size_t n;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c[0] >= 0xC2 && c[0] <= 0xDF) {
        n = 2;
    } else if (c[0] >= 0xE0 && c[0] <= 0xEF) {
        n = 3;
        if (c[0] == 0xE0) lo = 0xA0;  // no overlong forms
        if (c[0] == 0xED) hi = 0x9F;  // no surrogates
    } else if (c[0] >= 0xF0 && c[0] <= 0xF4) {
        n = 4;
        if (c[0] == 0xF0) lo = 0x90;
        if (c[0] == 0xF4) hi = 0x8F;  // up to U+10FFFF
    } else {
        return 0;
    }
    if (c[1] < lo || c[1] > hi) return 0;
    for (std::size_t i = 2; i < n; ++i) {
        if (c[i] < 0x80 || c[i] > 0xBF) return 0;  // a NUL ends the walk here too
    }
    return n;
}

// A JSON string: JSON text is UTF-8, so a byte that is not part of a well-formed sequence
// (a name is any bytes the user gave) is written as U+FFFD, the replacement character.
void append_json_string(std::string& out, const char* text) {
    out += '"';
    const auto* c = reinterpret_cast<const unsigned char*>(text);
    while (*c) {
        const unsigned char ch = *c;
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += static_cast<char>(ch);
            ++c;
        } else if (ch < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(ch));
            out += escaped;
            ++c;
        } else if (const std::size_t n = utf8_sequence_length(c)) {
            out.append(reinterpret_cast<const char*>(c), n);
            c += n;
        } else {
            out += "\\ufffd";
            ++c;
        }
    }
    out += '"';
}

// Nanoseconds as the format's microseconds, with three decimals.
void append_microseconds(std::string& out, std::int64_t ns) {
    if (ns < 0) {
        out += '-';
        ns = -ns;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%lld.%03d", static_cast<long long>(ns / 1000), static_cast<int>(ns % 1000));
    out += text;
}

struct TraceEventRef {
    std::int64_t at;
    std::size_t thread;
    std::size_t index;
};

// Flow ids: flow_from[t][i] for wake i of thread t, flow_to[t][i] for the slice it led to.
struct TraceFlows {
    std::vector<std::vector<std::uint64_t>> from, to;
};

TraceFlows pair_wakes_with_slices(const std::vector<ThreadTrace>& threads) {
    std::unordered_map<std::uint64_t, std::vector<TraceEventRef>> slices, wakes;
    TraceFlows flows;
    for (std::size_t t = 0; t < threads.size(); ++t) {
        const auto& events = threads[t].events;
        flows.from.emplace_back(events.size(), 0);
        flows.to.emplace_back(events.size(), 0);
        for (std::size_t i = 0; i < events.size(); ++i) {
            auto& into = events[i].kind == TraceEventKind::Slice ? slices : wakes;
            into[events[i].fiber].push_back(TraceEventRef{events[i].begin, t, i});
        }
    }
    auto by_time = [](const TraceEventRef& a, const TraceEventRef& b) { return a.at < b.at; };
    std::uint64_t next_id = 1;
    for (auto& entry : wakes) {
        auto found = slices.find(entry.first);
        if (found == slices.end()) continue;
        auto& woken_at = entry.second;
        auto& ran = found->second;
        std::sort(woken_at.begin(), woken_at.end(), by_time);
        std::sort(ran.begin(), ran.end(), by_time);
        std::size_t w = 0;
        std::int64_t previous_begin = INT64_MIN;
        for (const TraceEventRef& slice : ran) {
            const TraceEventRef* latest = nullptr;
            for (; w < woken_at.size() && woken_at[w].at <= slice.at; ++w) {
                if (woken_at[w].at > previous_begin) latest = &woken_at[w];
            }
            if (latest) {
                flows.from[latest->thread][latest->index] = next_id;
                flows.to[slice.thread][slice.index] = next_id;
                ++next_id;
            }
            previous_begin = slice.at;
        }
    }
    return flows;
}

void append_common(std::string& out, const char* phase, int tid, std::int64_t at) {
    out += "{\"ph\":\"";
    out += phase;
    out += "\",\"pid\":1,\"tid\":";
    out += std::to_string(tid);
    out += ",\"ts\":";
    append_microseconds(out, at);
}

void append_flow(std::string& out, const char* phase, int tid, std::int64_t at, std::uint64_t id) {
    out += ",\n";
    append_common(out, phase, tid, at);
    out += ",\"id\":";
    out += std::to_string(id);
    out += ",\"name\":\"wake\",\"cat\":\"wake\"";
    if (phase[0] == 'f') out += ",\"bp\":\"e\"";  // bound to the slice it begins
    out += '}';
}

void append_slice(std::string& out, int tid, const TraceEvent& slice) {
    out += ",\n";
    append_common(out, "X", tid, slice.begin);
    out += ",\"dur\":";
    append_microseconds(out, slice.end - slice.begin);
    out += ",\"cat\":\"fiber\",\"name\":";
    if (slice.name) {
        append_json_string(out, slice.name);
    } else {
        out += "\"fiber " + std::to_string(slice.fiber) + '"';
    }
    out += ",\"args\":{\"id\":" + std::to_string(slice.fiber);
    if (slice.name) {
        out += ",\"name\":";
        append_json_string(out, slice.name);
    }
    out += ",\"ended\":\"";
    out += slice.ended;
    out += '"';
    if (slice.parked) {
        out += ",\"parked\":";
        append_json_string(out, slice.parked);
    }
    out += "}}";
}

bool write_trace(std::FILE* file, const std::vector<ThreadTrace>& threads, bool ring, std::size_t capacity) {
    const TraceFlows flows = pair_wakes_with_slices(threads);
    std::string out = "{\"traceEvents\":[\n";
    out += "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"fiber_sched\"}}";
    std::uint64_t dropped = 0;
    bool ok = true;
    auto flush = [&](std::size_t above) {
        if (out.size() < above) return;
        ok = std::fwrite(out.data(), 1, out.size(), file) == out.size() && ok;
        out.clear();
    };
    for (const ThreadTrace& thread : threads) {
        dropped += thread.dropped;
        out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(thread.tid) + ",\"name\":\"thread_name\",\"args\":{\"name\":";
        append_json_string(out, thread.name.c_str());
        out += ",\"dropped_events\":" + std::to_string(thread.dropped) + "}}";
        out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(thread.tid) +
               ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(thread.tid) + "}}";
    }
    for (std::size_t t = 0; t < threads.size(); ++t) {
        const ThreadTrace& thread = threads[t];
        const auto& events = thread.events;
        // A wake's flow starts in the slice it happened in: the first slice this thread
        // closed after it, if that had begun by then. In order of time: each slice, where
        // the flow into it ends, the flows out of it; a wake outside slices between them.
        std::vector<std::vector<std::size_t>> wakes_in(events.size());
        std::vector<bool> enclosed(events.size(), false);
        std::size_t enclosing = events.size();
        for (std::size_t i = events.size(); i-- > 0;) {
            if (events[i].kind == TraceEventKind::Slice) {
                enclosing = i;
            } else if (flows.from[t][i] && enclosing < events.size() && events[enclosing].begin <= events[i].begin) {
                wakes_in[enclosing].push_back(i);
                enclosed[i] = true;
            }
        }
        for (std::size_t i = 0; i < events.size(); ++i) {
            const TraceEvent& event = events[i];
            if (event.kind == TraceEventKind::Slice) {
                append_slice(out, thread.tid, event);
                if (flows.to[t][i]) append_flow(out, "f", thread.tid, event.begin, flows.to[t][i]);
                for (auto w = wakes_in[i].rbegin(); w != wakes_in[i].rend(); ++w) {
                    append_flow(out, "s", thread.tid, events[*w].begin, flows.from[t][*w]);
                }
            } else if (flows.from[t][i] && !enclosed[i]) {
                out += ",\n";
                append_common(out, "X", thread.tid, event.begin);
                out += ",\"dur\":0.000,\"cat\":\"wake\",\"name\":\"wake\",\"args\":{\"id\":" +
                       std::to_string(event.waker) + ",\"woken\":" + std::to_string(event.fiber) + "}}";
                append_flow(out, "s", thread.tid, event.begin, flows.from[t][i]);
            }
            flush(1 << 16);
        }
    }
    out += "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"recorder\":\"fiber_sched\",\"mode\":\"";
    out += ring ? "ring" : "recording";
    out += "\",\"events_per_thread\":" + std::to_string(capacity) + ",\"dropped_events\":" + std::to_string(dropped) + "}}\n";
    flush(0);
    return ok;
}

}  // namespace

// --- the recording, from the switch and wake paths (impl/hooks.ipp) ----------------------

void trace_switch_in(const Fiber& fiber, const Fiber* resumer) noexcept {
    TraceBuffer* buffer = this_thread_trace_buffer();
    if (!buffer) return;
    buffer->lock.lock();
    if (buffer->capacity) {
        const std::int64_t at = buffer->now();
        if (resumer) buffer->close_slice(*resumer, at, "resumed a fiber", nullptr);
        buffer->open_slice(fiber, at);
        try {
            name_worker_thread(*buffer);
        } catch (...) {  // out of memory: the thread keeps its name
        }
    }
    buffer->lock.unlock();
}

void trace_switch_out(const Fiber& fiber, const Fiber* resumer) noexcept {
    TraceBuffer* buffer = this_thread_trace_buffer();
    if (!buffer) return;
    const char* ended = switch_out_reason(fiber);
    // What it parked on (its wait record, written on this thread just before it switched out).
    const char* parked = std::strcmp(ended, "parked") == 0 ? wait_reason(fiber) : nullptr;
    buffer->lock.lock();
    if (buffer->capacity) {
        const std::int64_t at = buffer->now();
        buffer->close_slice(fiber, at, ended, parked);
        if (resumer) buffer->open_slice(*resumer, at);
    }
    buffer->lock.unlock();
}

void trace_wake(const Fiber& woken, const Fiber* by) noexcept {
    TraceBuffer* buffer = this_thread_trace_buffer();
    if (!buffer) return;
    buffer->lock.lock();
    if (buffer->capacity) {
        TraceEvent event;
        event.kind = TraceEventKind::Wake;
        event.begin = event.end = buffer->now();
        event.fiber = woken.id();
        event.waker = by ? by->id() : 0;
        buffer->append(event);
    }
    buffer->lock.unlock();
}

std::size_t parse_event_count(const char* text) noexcept {
    // Digits only: strtoull would take "-1" for the largest value, and skip leading spaces.
    if (!text || text[0] < '0' || text[0] > '9') return 0;
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (*end != '\0' || errno == ERANGE || static_cast<unsigned long long>(static_cast<std::size_t>(value)) != value) return 0;
    return static_cast<std::size_t>(value);
}

// The Tracer's fork handlers (from build_process_state, before any thread of the library
// exists). A fork()ed child inherits no recording: the parent's session, its buffers and
// its file stay the parent's, so the child's stop() or dump() neither writes the parent's
// events nor writes into the parent's file, and its own start() or start_ring() works. The
// parent's buffers are set aside, neither read nor freed: another thread may have been in
// the middle of an event at the fork, its buffer's lock held or its vector halfway through
// growing (its old storage freed, the new not yet in place: freeing it crashed the child).
void build_trace_fork_handlers() {
    (void)tracer();
    os::at_fork([] { tracer().mutex.lock(); }, [] { tracer().mutex.unlock(); },
                [] {
                    Tracer& t = tracer();
                    observe_flags.fetch_and(~observe_trace, std::memory_order_relaxed);
                    // Nothing is written to the file before stop(): its buffer is empty, and
                    // closing the child's copy writes nothing.
                    if (t.file) std::fclose(t.file);
                    t.file = nullptr;
                    t.on = false;
                    t.ring = false;
                    try {
                        for (auto& buffer : t.buffers) t.left_by_fork.push_back(std::move(buffer));
                    } catch (...) {
                        for (auto& buffer : t.buffers) (void)buffer.release();  // no memory: dropped
                    }
                    t.buffers.clear();
                    t.next_tid = 1;
                    t.next_plain_thread = 1;
                    thread_state()->trace_buffer = nullptr;
                    t.mutex.unlock();
                });
}

void set_trace_max_events(std::size_t events) {
    Tracer& t = tracer();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.max_events_override = events;
}

}  // namespace detail

namespace trace {

bool start(const std::string& path) {
    detail::Tracer& t = detail::tracer();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.on) return false;
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) return false;
    if (!detail::begin_trace_session(t, detail::trace_max_events(t), false)) {
        std::fclose(file);
        return false;
    }
    t.file = file;
    return true;
}

bool start_ring(std::size_t events_per_worker) {
    if (events_per_worker == 0) return false;
    detail::Tracer& t = detail::tracer();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.on) return false;
    return detail::begin_trace_session(t, events_per_worker, true);
}

void stop() {
    detail::Tracer& t = detail::tracer();
    std::vector<detail::ThreadTrace> threads;
    std::FILE* file = nullptr;
    std::size_t capacity = 0;
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        if (!t.on) return;
        detail::observe_flags.fetch_and(~detail::observe_trace, std::memory_order_relaxed);
        threads = detail::collect_trace(t, true);
        t.on = false;
        file = t.file;
        t.file = nullptr;
        capacity = t.capacity;
    }
    // Outside the mutex: a thread registering for a new session need not wait for the disk.
    if (!file) return;
    detail::write_trace(file, threads, false, capacity);
    std::fclose(file);
}

bool dump(const std::string& path) {
    detail::Tracer& t = detail::tracer();
    std::vector<detail::ThreadTrace> threads;
    std::size_t capacity = 0;
    std::FILE* file = nullptr;
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        if (!t.on || !t.ring) return false;
        // Opened first: a dump that cannot write takes nothing from the rings.
        file = std::fopen(path.c_str(), "wb");
        if (!file) return false;
        try {
            threads = detail::collect_trace(t, false);
        } catch (...) {
            std::fclose(file);
            throw;
        }
        capacity = t.capacity;
    }
    const bool written = detail::write_trace(file, threads, true, capacity);
    return std::fclose(file) == 0 && written;
}

}  // namespace trace
}  // namespace fsched
