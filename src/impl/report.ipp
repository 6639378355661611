// ---------------------------------------------------------------------------
// Implementation: the fiber report (fiber_report, dump_fibers), backtraces of parked
// fibers, lock-order deadlocks, the watch thread that reports them and hung stop()s, and
// the dump-on-signal handler.
//
// A report is made in two steps: a snapshot under the registry's walk (registry.ipp), which
// copies each fiber's fields and, for a parked one held still, its wait record and the
// return addresses of its frames; then the text, with symbols looked up (dladdr, which may
// take locks) after every fiber has been let go.
//
// Backtraces follow frame pointers from the registers the fiber's context saved
// (saved_frame, in each backend): each frame record is two words, the caller's frame
// pointer and the return address (x86-64, AArch64: at fp; RISC-V: just below fp). A frame
// pointer must lie in the fiber's stack above the last one, or the walk ends; so a frame
// built without frame pointers ends it early (or, where the register holds a stale value
// inside the stack, adds a wrong frame), and it never reads outside the stack.
//
// The watch thread starts the first time a fiber parks on a Mutex or a stop() with a hang
// report begins; it looks once a period (1 s): a lock cycle whose fibers have all waited
// that long, and are found again unchanged a period later, is reported once; a stop() that
// has waited its hang-report time gets the whole report once.
// ---------------------------------------------------------------------------

#pragma once

#include "inspect.hpp"
#include "trace.hpp"
#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"
#include "impl/inspect_os.ipp"
#include "impl/registry.ipp"
#include "impl/context_backend.ipp"

namespace fsched {
namespace detail {

// What fiber_report() shows of one fiber, copied while the fiber could not go away.
struct FiberSnapshot {
    static constexpr int max_frames = 48;
    std::uint64_t id = 0;
    const char* name = nullptr;  // interned: valid for good
    FiberState state = FiberState::Ready;
    WaitReason kind = WaitReason::None;
    bool held = false;  // parked, and read under its hold: the fields below are its own
    bool woken = false; // its wait is over (wake_fiber): it waits in a run queue
    const void* object = nullptr;
    std::string detail;
    std::string scheduler;
    int worker = -1;
    std::int64_t since_ns = 0;
    std::int64_t deadline_ns = -1;
    std::uint64_t a = 0;
    std::uint64_t b = 0;
    std::uint64_t holder = 0;
    std::size_t stack_size = 0;
    std::size_t touched = SIZE_MAX;
    int frames = 0;
    std::uintptr_t pc[max_frames] = {};
};

// A stop() that prints the report once it has waited `after` (HangWatch).
struct HangWatchEntry {
    const std::string* scheduler;
    std::chrono::steady_clock::time_point began;
    std::chrono::milliseconds after;
    bool reported;
};

namespace {

inline bool is_parked(FiberState s) noexcept { return s == FiberState::Parked || s == FiberState::ParkedResumePending; }

#if defined(__clang__) || defined(__GNUC__)
#define FIBER_SCHED_READS_OTHER_STACKS __attribute__((no_sanitize("address", "thread")))
#else
#define FIBER_SCHED_READS_OTHER_STACKS
#endif

// The return addresses of a switched-out context's frames (see the top comment); `lo`..`hi`
// is the part of its stack in use (from its saved stack pointer to its top).
FIBER_SCHED_READS_OTHER_STACKS FIBER_SCHED_NOINLINE int walk_frames(const SavedFrame& start, std::uintptr_t hi,
                                                                     std::uintptr_t* pcs, int max) noexcept {
    int n = 0;
    if (start.pc == 0) return 0;
    pcs[n++] = start.pc;
    std::uintptr_t fp = start.fp;
    std::uintptr_t floor = start.sp;  // each frame record lies above the one before
    constexpr std::uintptr_t word = sizeof(void*);
    while (n < max) {
#if defined(__riscv)
        if (fp < floor + 2 * word || fp > hi || fp % word != 0) break;
        const auto* record = reinterpret_cast<const std::uintptr_t*>(fp) - 2;
#else
        if (fp < floor || fp > hi - 2 * word || fp % word != 0) break;
        const auto* record = reinterpret_cast<const std::uintptr_t*>(fp);
#endif
        const std::uintptr_t next = record[0];
        const std::uintptr_t ret = record[1];
        if (ret == 0) break;  // the trampoline's null return address: the fiber's first frame
        pcs[n++] = ret;
        if (next <= fp) break;
        floor = fp;
        fp = next;
    }
    return n;
}

void snapshot_one(Fiber& f, bool with_frames, std::vector<FiberSnapshot>& out, std::size_t& finished) {
    FiberLifecycle& life = FiberAccess::lifecycle(f);
    FiberState state = life.load();
    if (state == FiberState::Term) {
        ++finished;
        return;
    }
    out.emplace_back();
    FiberSnapshot& s = out.back();
    s.id = f.id();
    s.name = f.name_c_str();
    s.state = state;
    const WaitRecord& w = FiberAccess::wait(f);
    s.kind = w.kind.load(std::memory_order_relaxed);
    const Stack& stack = FiberAccess::stack(f);
    s.stack_size = f.stack_size();
    if (with_frames) {
        const char* lo;
        const char* hi;
        frames_range(stack.base, FiberAccess::frames_size(f), lo, hi);  // winfiber: the OS's stack
        s.touched = os::resident_bytes(lo, static_cast<std::size_t>(hi - lo));
    }
    if (!is_parked(state)) return;
    std::atomic<bool>& hold = FiberAccess::inspected(f);
    hold.store(true, std::memory_order_seq_cst);
    s.state = life.load_seq_cst();
    s.held = is_parked(s.state);
    if (s.held) {  // this park's
        s.kind = w.kind.load(std::memory_order_relaxed);
        // (A park that recorded no wait keeps the last wake's mark: it says nothing then.)
        s.woken = s.kind != WaitReason::None && FiberAccess::woken(f).load(std::memory_order_relaxed);
    }
    if (s.held && s.kind != WaitReason::None) {  // the record's other fields are this park's too
        s.object = w.object;
        if (s.kind == WaitReason::Other && w.word) s.detail = w.word;
        if (w.scheduler) s.scheduler = w.scheduler->name();  // alive: it waits for this fiber
        s.worker = worker_number(w.worker);  // alive: its scheduler waits for this fiber
        s.since_ns = w.since_ns;
        s.deadline_ns = w.deadline_ns;
        s.a = w.a;
        s.b = w.b;
        if (w.ops && w.ops->holder) s.holder = w.ops->holder(w.object);
        if (w.ops && w.ops->describe) {
            char text[128];
            text[0] = '\0';
            w.ops->describe(w.object, text, sizeof text);
            text[sizeof text - 1] = '\0';
            if (!s.detail.empty() && text[0]) s.detail += ", ";
            s.detail += text;
        }
    }
    SavedFrame start;
    if (s.held && with_frames && saved_frame(FiberAccess::context(f), start)) {
        const auto hi = reinterpret_cast<std::uintptr_t>(stack.base) + FiberAccess::frames_size(f);
        s.frames = walk_frames(start, hi, s.pc, FiberSnapshot::max_frames);
    }
    hold.store(false, std::memory_order_release);
}

struct Snapshot {
    std::vector<FiberSnapshot> fibers;  // by id
    std::size_t finished = 0;
    std::int64_t taken_ns = 0;          // coarse clock
    std::int64_t taken_steady_ns = 0;   // steady_clock, for deadlines
};

Snapshot take_snapshot(bool with_frames) {
    Snapshot snap;
    for_each_live_fiber([&](Fiber& f) { snapshot_one(f, with_frames, snap.fibers, snap.finished); });
    snap.taken_ns = os::coarse_now_ns();
    snap.taken_steady_ns = static_cast<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
    std::sort(snap.fibers.begin(), snap.fibers.end(),
              [](const FiberSnapshot& x, const FiberSnapshot& y) { return x.id < y.id; });
    return snap;
}

const FiberSnapshot* find_fiber(const Snapshot& snap, std::uint64_t id) {
    auto it = std::lower_bound(snap.fibers.begin(), snap.fibers.end(), id,
                               [](const FiberSnapshot& s, std::uint64_t v) { return s.id < v; });
    return it != snap.fibers.end() && it->id == id ? &*it : nullptr;
}

// Appends the formatted text whole, however long (names are the user's, of any length).
template <class... Args>
void append(std::string& out, const char* format, Args... args) {
    char buffer[512];
    const int n = std::snprintf(buffer, sizeof buffer, format, args...);
    if (n <= 0) return;
    const auto length = static_cast<std::size_t>(n);
    if (length < sizeof buffer) {
        out.append(buffer, length);
        return;
    }
    const std::size_t at = out.size();
    out.resize(at + length + 1);  // snprintf's terminating zero, dropped below
    std::snprintf(&out[at], length + 1, format, args...);
    out.resize(at + length);
}

// An address as "0x..." on every system (%p has no 0x on Windows).
unsigned long long address(const void* p) noexcept {
    return static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p));
}

std::string seconds(std::int64_t ns) {
    std::string s;
    if (ns < 0) ns = 0;
    if (ns >= 1000000000) {
        append(s, "%.1f s", static_cast<double>(ns) / 1e9);
    } else {
        append(s, "%.0f ms", static_cast<double>(ns) / 1e6);
    }
    return s;
}

std::string kib(std::size_t bytes) {
    std::string s;
    append(s, "%zu KiB", (bytes + 1023) / 1024);
    return s;
}

// "fiber 12 (net-reader)"; with `bare`, "12".
std::string who(const Snapshot& snap, std::uint64_t id) {
    std::string s;
    if (const FiberSnapshot* f = find_fiber(snap, id)) {
        append(s, "fiber %llu", static_cast<unsigned long long>(id));
        if (f->name) append(s, " (%s)", f->name);
    } else {
        append(s, "%llu (a thread, or a fiber not listed)", static_cast<unsigned long long>(id));
    }
    return s;
}

std::string state_words(const FiberSnapshot& f) {
    switch (f.state) {
    case FiberState::Ready: return "ready (never run)";
    case FiberState::Suspended: return "suspended (Fiber::yield)";
    case FiberState::Running:
    case FiberState::RunningResumePending:
        return f.kind == WaitReason::Yield ? "runnable (yield)" : "running";
    case FiberState::Parked:
    case FiberState::ParkedResumePending: return !f.held ? "running" : f.woken ? "runnable (woken)" : "parked";
    case FiberState::Term: return "finished";
    }
    return "";
}

// What a parked fiber waits for: "Mutex 0x... held by fiber 14 (db-writer)".
std::string wait_words(const Snapshot& snap, const FiberSnapshot& f) {
    std::string s;
    const char* word = wait_reason_word(f.kind);
    if (f.kind == WaitReason::None) {
        s = "an unnamed wait";
    } else if (f.kind == WaitReason::Other) {
        s = f.detail.empty() ? "a wait" : f.detail;
    } else {
        s = word;
    }
    if (f.object) append(s, " 0x%llx", address(f.object));
    if (f.kind == WaitReason::Mutex) {
        s += f.holder ? " held by " + who(snap, f.holder) : std::string(" (free now)");
    }
    // A SharedMutex names its exclusive holder; its readers are not recorded.
    if ((f.kind == WaitReason::SharedMutex || f.kind == WaitReason::SharedMutexShared) && f.holder) {
        s += " held by " + who(snap, f.holder);
    }
    if (f.kind == WaitReason::Io) {
        append(s, " on fd %llu for %s", static_cast<unsigned long long>(f.a),
               f.b == 1 ? "reading" : f.b == 2 ? "writing" : "reading and writing");
    }
    if (f.kind != WaitReason::Other && !f.detail.empty()) s += " (" + f.detail + ")";
    if (f.deadline_ns >= 0 && f.deadline_ns != INT64_MAX) {
        s += ", " + seconds(f.deadline_ns - snap.taken_steady_ns) + " left";
    }
    return s;
}

void append_frames(std::string& out, const FiberSnapshot& f) {
    char module[512];
    for (int i = 0; i < f.frames; ++i) {
        // A return address is the instruction after the call: look up the call's own byte.
        const std::uintptr_t pc = f.pc[i];
        const std::uintptr_t at = pc - 1;
        os::CodeLocation where;
        module[0] = '\0';
        append(out, "    #%-2d 0x%016llx", i, static_cast<unsigned long long>(pc));
        if (!os::locate_code(at, where, module, sizeof module)) {
            out += '\n';
            continue;
        }
#if !defined(_WIN32)  // (no symbol names there: locate_code gives the module only)
        if (where.symbol[0]) {
#if FIBER_SCHED_HAVE_CXXABI
            int status = -1;
            char* demangled = abi::__cxa_demangle(where.symbol, nullptr, nullptr, &status);
            const char* name = status == 0 && demangled ? demangled : where.symbol;
#else
            char* demangled = nullptr;
            const char* name = where.symbol;
#endif
            std::string shown(name);
            if (shown.size() > 160) shown = shown.substr(0, 157) + "...";
            append(out, " %s+0x%llx", shown.c_str(), static_cast<unsigned long long>(where.symbol_offset + 1));
            std::free(demangled);
        }
#endif
        append(out, " [%s @0x%llx]\n", where.module, static_cast<unsigned long long>(where.module_address + 1));
    }
}

std::string fiber_line(const Snapshot& snap, const FiberSnapshot& f) {
    std::string line;
    append(line, "fiber %llu", static_cast<unsigned long long>(f.id));
    if (f.name) append(line, " (%s)", f.name);
    line += ": " + state_words(f);
    if (f.held && f.kind == WaitReason::None) {
        line += " on an unnamed wait";  // a park no primitive recorded (detail::park by hand)
    } else if (f.held && f.woken) {  // "runnable (woken) from Channel receive 0x..., parked 1.2 s ago"
        line += " from " + wait_words(snap, f) + ", parked " + seconds(snap.taken_ns - f.since_ns) + " ago";
        if (!f.scheduler.empty()) append(line, "; worker %d of \"%s\"", f.worker, f.scheduler.c_str());
    } else if (f.held) {
        line += " " + seconds(snap.taken_ns - f.since_ns) + " on " + wait_words(snap, f);
        if (!f.scheduler.empty()) append(line, "; worker %d of \"%s\"", f.worker, f.scheduler.c_str());
    }
    line += "; stack " + kib(f.stack_size);
    if (f.touched != SIZE_MAX) line += ", " + kib(f.touched) + " touched";
    line += '\n';
    return line;
}

// Lock cycles among the snapshot's parked lock waiters: a Mutex, or a SharedMutex held
// exclusively (each waits for one holder, so the graph is functional: one walk per fiber
// finds every cycle). A writer waiting for a SharedMutex's readers is no edge: readers are
// not recorded. Each cycle starts at its smallest id; `min_wait_ns`: each of its fibers has
// waited at least that long. A timed wait (Mutex::try_lock_for) ends by itself, so it is no
// edge: a cycle through it is none.
std::vector<std::vector<const FiberSnapshot*>> find_lock_cycles(const Snapshot& snap, std::int64_t min_wait_ns) {
    std::vector<std::vector<const FiberSnapshot*>> cycles;
    std::unordered_map<std::uint64_t, int> color;  // 1: on the walk now, 2: done
    auto waiting = [&](const FiberSnapshot* f) {
        const bool lock_wait = f && (f->kind == WaitReason::Mutex || f->kind == WaitReason::SharedMutex ||
                                     f->kind == WaitReason::SharedMutexShared);
        // Woken, it waits for no one: a Mutex handed over to it names it as the holder.
        return lock_wait && f->held && !f->woken && f->holder != 0 && f->holder != f->id &&
               (f->deadline_ns < 0 || f->deadline_ns == INT64_MAX) && snap.taken_ns - f->since_ns >= min_wait_ns;
    };
    for (const FiberSnapshot& start : snap.fibers) {
        if (!waiting(&start) || color[start.id] != 0) continue;
        std::vector<const FiberSnapshot*> path;
        const FiberSnapshot* f = &start;
        while (waiting(f) && color[f->id] == 0) {
            color[f->id] = 1;
            path.push_back(f);
            f = find_fiber(snap, f->holder);
        }
        if (f && color[f->id] == 1) {  // back on this walk: a cycle from f
            auto from = std::find(path.begin(), path.end(), f);
            std::vector<const FiberSnapshot*> cycle(from, path.end());
            std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end(),
                                                        [](const FiberSnapshot* x, const FiberSnapshot* y) {
                                                            return x->id < y->id;
                                                        }),
                        cycle.end());
            cycles.push_back(std::move(cycle));
        }
        for (const FiberSnapshot* p : path) color[p->id] = 2;
    }
    return cycles;
}

// "lock-order deadlock: fiber 12 (net-reader) waits for Mutex 0x... held by fiber 14
// (db-writer), which waits for Mutex 0x... held by 12"
std::string cycle_sentence(const Snapshot& snap, const std::vector<const FiberSnapshot*>& cycle) {
    std::string s = "lock-order deadlock: " + who(snap, cycle[0]->id);
    for (std::size_t i = 0; i < cycle.size(); ++i) {
        const FiberSnapshot* f = cycle[i];
        if (i > 0) s += ", which";
        append(s, " waits for %s 0x%llx held by ", wait_reason_word(f->kind), address(f->object));
        s += i + 1 < cycle.size() ? who(snap, f->holder) : std::to_string(f->holder);
    }
    return s;
}

// A cycle's identity: its fibers and the parks they are in (a fiber that woke and parked
// again is a new cycle).
std::string cycle_key(const std::vector<const FiberSnapshot*>& cycle) {
    std::string key;
    for (const FiberSnapshot* f : cycle) {
        append(key, "%llu:%lld:%llx;", static_cast<unsigned long long>(f->id), static_cast<long long>(f->since_ns),
               address(f->object));
    }
    return key;
}

std::string format_report(const Snapshot& snap) {
    std::size_t running = 0, runnable = 0, parked = 0, other = 0;
    for (const FiberSnapshot& f : snap.fibers) {
        const std::string w = state_words(f);
        if (w == "running") {
            ++running;
        } else if (w == "runnable (yield)" || w == "runnable (woken)") {
            ++runnable;
        } else if (w == "parked") {
            ++parked;
        } else {
            ++other;
        }
    }
    std::string out;
    append(out, "fiber_sched: %zu live fibers: %zu running, %zu runnable, %zu parked, %zu ready or suspended", snap.fibers.size(),
           running, runnable, parked, other);
    if (snap.finished) append(out, "; %zu finished (kept for reuse or not yet destroyed)", snap.finished);
    out += '\n';
    for (const FiberSnapshot& f : snap.fibers) {
        out += fiber_line(snap, f);
        if (f.held) append_frames(out, f);
    }
    for (const auto& cycle : find_lock_cycles(snap, 0)) out += cycle_sentence(snap, cycle) + '\n';
    return out;
}

// --- the watch thread ---------------------------------------------------------------------

struct WatchState {
    std::mutex mutex;
    std::condition_variable wake;
    std::function<void(const std::string&)> sink;
    std::chrono::milliseconds period{1000};
    std::chrono::milliseconds deadlock_after{1000};
    std::vector<HangWatchEntry*> hangs;
    std::unordered_set<std::string> candidates;  // cycles seen at the last look
    std::unordered_set<std::string> reported;    // cycles reported (never again)
    bool running = false;  // a watch thread runs (or is about to)
    bool quiesce = false;  // quiesce_watch(): the thread is to end now
    bool hangs_changed = false;  // a stop() began watching: the next wake may come sooner
    // The running watch thread. One that ends by itself detaches itself; one that
    // quiesce_watch() ends is joined there, so that no thread of ours is still on its way out
    // at the fork() that follows (qemu-user aborts a child forked beside an exiting thread).
    // A pointer, so that a fork() child can drop the parent's (its destructor would
    // terminate a joinable one).
    std::thread* thread = nullptr;
};

// Joins and deletes a watch thread that quiesce_watch() ended, if any. Under the mutex, with
// `running` false.
void join_ended_watch(WatchState& w) noexcept {
    if (!w.thread) return;
    if (w.thread->joinable()) w.thread->join();  // it has left watch_loop(): microseconds
    delete w.thread;
    w.thread = nullptr;
}

WatchState& watch_state() {
    static WatchState* w = new WatchState;  // never destroyed: the thread outlives main()
    return *w;
}
std::atomic<bool> watch_started{false};

void emit_report(const std::string& text) {
    std::function<void(const std::string&)> sink;
    {
        std::lock_guard<std::mutex> lock(watch_state().mutex);
        sink = watch_state().sink;
    }
    if (sink) {
        sink(text);
    } else {
        os::write_stderr(text.data(), text.size());
    }
}

void look_for_deadlocks() {
    WatchState& w = watch_state();
    std::chrono::milliseconds after;
    {
        std::lock_guard<std::mutex> lock(w.mutex);
        after = w.deadlock_after;
    }
    const Snapshot snap = take_snapshot(false);
    std::unordered_set<std::string> seen;
    std::vector<std::string> texts;
    const auto cycles = find_lock_cycles(snap, std::chrono::duration_cast<std::chrono::nanoseconds>(after).count());
    {
        std::lock_guard<std::mutex> lock(w.mutex);
        for (const auto& cycle : cycles) {
            std::string key = cycle_key(cycle);
            if (w.reported.count(key)) continue;
            if (w.candidates.count(key)) {
                w.reported.insert(key);
                texts.push_back("fiber_sched: " + cycle_sentence(snap, cycle) + '\n');
            } else {
                seen.insert(std::move(key));
            }
        }
        w.candidates = std::move(seen);
    }
    for (const std::string& t : texts) emit_report(t);
}

void look_for_hangs() {
    WatchState& w = watch_state();
    std::vector<std::string> names;
    std::vector<double> waited;
    {
        std::lock_guard<std::mutex> lock(w.mutex);
        const auto now = std::chrono::steady_clock::now();
        for (HangWatchEntry* h : w.hangs) {
            if (h->reported || now - h->began < h->after) continue;
            h->reported = true;
            names.push_back(*h->scheduler);
            waited.push_back(std::chrono::duration<double>(now - h->began).count());
        }
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
        std::string text;
        append(text, "fiber_sched: Scheduler \"%s\": stop() has waited %.1f s for its tasks; every fiber:\n",
               names[i].c_str(), waited[i]);
        text += format_report(take_snapshot(true));
        // With the flight recorder on, its events go beside the report.
        static std::atomic<unsigned> hang_traces{0};
#if defined(_WIN32)
        const unsigned long pid = GetCurrentProcessId();
#else
        const unsigned long pid = static_cast<unsigned long>(getpid());
#endif
        std::string path;
        append(path, "fiber_sched-hang-%lu-%u.json", pid, ++hang_traces);
        if (trace::dump(path)) text += "fiber_sched: the flight recorder's events are in " + path + '\n';
        emit_report(text);
    }
}

// Runs while there is something to watch (fibers parked on a Mutex, a stop() with a hang
// report), then ends: a program whose Mutexes are quiet has no watch thread. It decides to
// end under the mutex, after clearing watch_started and looking again (seq_cst, against a
// new waiter's increment and look in ensure_watchdog()): either the waiter sees it gone and
// starts another, or it sees the waiter and goes on.
void watch_loop() noexcept {
    WatchState& w = watch_state();
    auto last_deadlock_look = std::chrono::steady_clock::now();
    for (;;) {
        std::chrono::milliseconds period;
        {
            std::unique_lock<std::mutex> lock(w.mutex);
            period = w.period;
            // A period, or less when a stop()'s hang report is due sooner (hang_report_after
            // under a second is kept to the millisecond, not to the period).
            auto until = std::chrono::steady_clock::now() + w.period;
            for (const HangWatchEntry* h : w.hangs) {
                if (!h->reported && h->began + h->after < until) until = h->began + h->after;
            }
            w.wake.wait_until(lock, until, [&] { return w.quiesce || w.hangs_changed; });
            w.hangs_changed = false;
            if (w.quiesce || (w.hangs.empty() && mutex_waiters.load(std::memory_order_seq_cst) == 0)) {
                watch_started.store(false, std::memory_order_seq_cst);
                if (w.quiesce || (w.hangs.empty() && mutex_waiters.load(std::memory_order_seq_cst) == 0)) {
                    w.running = false;
                    w.candidates.clear();
                    if (!w.quiesce && w.thread) {
                        // Ending by itself: no one joins it (TSan would call a finished,
                        // unjoined thread a leak at exit). quiesce_watch() joins it instead.
                        w.thread->detach();
                        delete w.thread;
                        w.thread = nullptr;
                    }
                    w.wake.notify_all();  // quiesce_watch() waits for this
                    return;
                }
                watch_started.store(true, std::memory_order_seq_cst);
            }
        }
        try {
            look_for_hangs();
            // Deadlocks once a period: a cycle is reported when a look finds it again.
            const auto now = std::chrono::steady_clock::now();
            if (now - last_deadlock_look >= period && mutex_waiters.load(std::memory_order_relaxed) > 0) {
                last_deadlock_look = now;
                look_for_deadlocks();
            }
        } catch (...) {
            // Out of memory for a report: look again next time.
        }
    }
}

}  // namespace

void ensure_watchdog() noexcept {
    if (FIBER_SCHED_LIKELY(watch_started.load(std::memory_order_seq_cst))) return;
    WatchState& w = watch_state();
    std::lock_guard<std::mutex> lock(w.mutex);
    if (w.running || w.quiesce) return;  // it goes on (watch_loop), or tests keep it off
    join_ended_watch(w);
    try {
        w.thread = new std::thread([] {
            os::name_thread("fsched-watch", 0);
            watch_loop();
        });
        w.running = true;
        watch_started.store(true, std::memory_order_seq_cst);
    } catch (...) {
        // No thread: no watch; the next park on a Mutex tries again.
    }
}

void quiesce_watch() noexcept {
    WatchState& w = watch_state();
    std::unique_lock<std::mutex> lock(w.mutex);
    w.quiesce = true;
    w.wake.notify_all();
    w.wake.wait(lock, [&] { return !w.running; });
    join_ended_watch(w);  // gone, not only ending
    w.quiesce = false;
}

// Registers a stop() that prints the report once it has waited `after` (0: never).
class HangWatch {
public:
    HangWatch(const std::string& scheduler, std::chrono::milliseconds after) noexcept
        : entry_{&scheduler, std::chrono::steady_clock::now(), after, false} {
        if (after.count() <= 0) return;
        {
            // First listed, then the thread started: one ending now sees the entry, or has
            // ended and a new one starts (watch_loop).
            std::lock_guard<std::mutex> lock(watch_state().mutex);
            try {
                watch_state().hangs.push_back(&entry_);
                watch_state().hangs_changed = true;
                registered_ = true;
            } catch (...) {
                return;
            }
        }
        watch_state().wake.notify_all();  // a running watch counts this one's time
        ensure_watchdog();
    }
    ~HangWatch() {
        if (!registered_) return;
        std::lock_guard<std::mutex> lock(watch_state().mutex);
        auto& hangs = watch_state().hangs;
        hangs.erase(std::remove(hangs.begin(), hangs.end(), &entry_), hangs.end());
    }
    HangWatch(const HangWatch&) = delete;
    HangWatch& operator=(const HangWatch&) = delete;

private:
    HangWatchEntry entry_;
    bool registered_ = false;
};

// FIBER_SCHED_HANG_REPORT_S, read at each stop(): seconds (a decimal number) it waits before
// it prints the report; unset, empty, 0 or not a number: never.
std::chrono::milliseconds hang_report_from_environment() noexcept {
    const char* text = std::getenv("FIBER_SCHED_HANG_REPORT_S");
    if (!text || !*text) return std::chrono::milliseconds(0);
    char* end = nullptr;
    const double s = std::strtod(text, &end);
    while (end != text && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) ++end;
    if (end == text || *end != '\0' || !(s > 0) || s > 1e9) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

void set_report_sink(std::function<void(const std::string&)> sink) {
    std::lock_guard<std::mutex> lock(watch_state().mutex);
    watch_state().sink = std::move(sink);
}

void set_watch_timing(std::chrono::milliseconds period, std::chrono::milliseconds deadlock_after) {
    FIBER_SCHED_ASSERT(period.count() > 0 && deadlock_after.count() >= 0 &&
                       "set_watch_timing(): the period must be positive, the wait not negative");
    {
        std::lock_guard<std::mutex> lock(watch_state().mutex);
        watch_state().period = period;
        watch_state().deadlock_after = deadlock_after;
    }
    watch_state().wake.notify_all();
}

const char* wait_reason(const Fiber& f) noexcept {
    const WaitReason kind = FiberAccess::wait(const_cast<Fiber&>(f)).kind.load(std::memory_order_relaxed);
    return kind == WaitReason::None || kind == WaitReason::Other ? nullptr : wait_reason_word(kind);
}

// --- the dump handler -------------------------------------------------------------------

namespace {

struct DumpState {
    std::mutex mutex;
    std::vector<int> signals;
    bool thread_started = false;
#if defined(_WIN32)
    HANDLE semaphore = nullptr;
#else
    int read_fd = -1;
#endif
};
DumpState& dump_state() {
    static DumpState* d = new DumpState;
    return *d;
}

#if defined(_WIN32)
std::atomic<HANDLE> dump_semaphore{nullptr};
void fsched_dump_signal(int signo) {
    std::signal(signo, &fsched_dump_signal);  // the CRT resets it to SIG_DFL before the call
    if (HANDLE s = dump_semaphore.load()) ReleaseSemaphore(s, 1, nullptr);
}
#else
std::atomic<int> dump_write_fd{-1};  // lock-free: read in the signal handler
void fsched_dump_signal(int) {
    const int saved = errno;
    const int fd = dump_write_fd.load(std::memory_order_relaxed);
    if (fd >= 0) {
        const char byte = 1;
        ssize_t ignored = ::write(fd, &byte, 1);  // non-blocking: a full pipe has a dump coming
        (void)ignored;
    }
    errno = saved;
}
#endif

std::atomic<std::uint64_t> dumps_printed{0};

void dump_loop() noexcept {
    for (;;) {
#if defined(_WIN32)
        if (WaitForSingleObject(dump_semaphore.load(), INFINITE) != WAIT_OBJECT_0) return;
#else
        char bytes[64];
        const int fd = dump_state().read_fd;
        const ssize_t n = ::read(fd, bytes, sizeof bytes);  // several signals: one report
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // closed (a fork()ed child closed its copy)
#endif
        try {
            dump_fibers(stderr);
        } catch (...) {
        }
        dumps_printed.fetch_add(1, std::memory_order_relaxed);
    }
}

}  // namespace

std::uint64_t dump_handler_reports() noexcept { return dumps_printed.load(std::memory_order_relaxed); }

void build_report_state() {
    (void)watch_state();
    (void)dump_state();
    os::at_fork([] { watch_state().mutex.lock(); dump_state().mutex.lock(); },
                [] { dump_state().mutex.unlock(); watch_state().mutex.unlock(); },
                [] {
                    // The watch and dump threads are the parent's: none here until asked again.
                    watch_started.store(false, std::memory_order_relaxed);
                    watch_state().running = false;
                    watch_state().thread = nullptr;  // the parent's (left allocated)
                    watch_state().hangs.clear();
                    DumpState& d = dump_state();
#if !defined(_WIN32)
                    // No dump thread here: the signals go back to their default action
                    // (they were swallowed), until the child installs the handler again.
                    for (int signo : d.signals) ::signal(signo, SIG_DFL);
                    const int w = dump_write_fd.exchange(-1);
                    if (w >= 0) ::close(w);
                    if (d.read_fd >= 0) ::close(d.read_fd);
                    d.read_fd = -1;
#endif
                    d.thread_started = false;
                    d.signals.clear();
                    dump_state().mutex.unlock();
                    watch_state().mutex.unlock();
                });
}

}  // namespace detail

std::string fiber_report() { return detail::format_report(detail::take_snapshot(true)); }

void dump_fibers(std::FILE* out) {
    FIBER_SCHED_ASSERT(out && "dump_fibers(): the FILE is null");
    const std::string text = fiber_report();
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
}

void install_fiber_dump_handler(int signo) {
    detail::build_process_state();
    detail::DumpState& d = detail::dump_state();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (std::find(d.signals.begin(), d.signals.end(), signo) != d.signals.end()) return;
    d.signals.reserve(d.signals.size() + 1);
    if (!d.thread_started) {
#if defined(_WIN32)
        HANDLE s = CreateSemaphoreA(nullptr, 0, 1 << 20, nullptr);
        if (!s) throw std::system_error(static_cast<int>(GetLastError()), std::system_category(), "install_fiber_dump_handler(): CreateSemaphore");
        detail::dump_semaphore.store(s);
#else
        int fds[2];
        if (::pipe(fds) != 0) throw std::system_error(errno, std::generic_category(), "install_fiber_dump_handler(): pipe");
        for (int fd : fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
        d.read_fd = fds[0];
        detail::dump_write_fd.store(fds[1]);
#endif
        try {
            std::thread([] {
                detail::os::name_thread("fsched-dump", 0);
                detail::dump_loop();
            }).detach();
        } catch (const std::system_error&) {
#if defined(_WIN32)
            CloseHandle(detail::dump_semaphore.exchange(nullptr));
#else
            ::close(detail::dump_write_fd.exchange(-1));
            ::close(d.read_fd);
            d.read_fd = -1;
#endif
            throw;
        }
        d.thread_started = true;
    }
#if defined(_WIN32)
    if (std::signal(signo, &detail::fsched_dump_signal) == SIG_ERR) {
        throw std::system_error(EINVAL, std::generic_category(), "install_fiber_dump_handler(): signal");
    }
#else
    struct sigaction action {};
    action.sa_handler = &detail::fsched_dump_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(signo, &action, nullptr) != 0) {
        throw std::system_error(errno, std::generic_category(), "install_fiber_dump_handler(): sigaction");
    }
#endif
    d.signals.push_back(signo);
}

}  // namespace fsched
