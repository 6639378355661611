// ---------------------------------------------------------------------------
// testing::simulate() (its contract: the top of testing.hpp). A Simulation is what every
// SchedulerCore made on its thread queues into instead of its workers' queues
// (SchedulerCore::enqueue): one list of ready tasks for all of them. Its driver loop, on
// the calling thread, takes one step at a time:
//   1. a ready task, chosen by the strategy (uniform, or PCT's priorities), runs once on a
//      worker drawn at random (its own worker when pinned), through Worker::run_task as on
//      a real worker, until it parks, yields (a park and a wake in a simulation:
//      this_fiber::yield) or ends;
//   2. with nothing ready, ready fds (polled without blocking), then the fibers in
//      wait_until_blocked(), then the virtual clock jumps to the earliest timer of any
//      worker, whose due timers fire;
//   3. with none of that, the run is over: complete if no task is outstanding, else a
//      deadlock, with the fiber report.
// Each step mixes the task's ordinal (the order tasks were made in this run) and the
// worker into trace_hash, so equal hashes mean equal schedules. A callback task gets its
// own fiber when it is queued, so every ready task is a fiber known from its first step.
// A run that ends in a deadlock or past its budget abandons its fibers: they are kept
// (never destroyed, so no frame of theirs is freed under a primitive that lists it), their
// wait records cleared and taken out of the registry, so a later report reads nothing of
// the dead simulation.
// Relies on: sched_core.ipp, sched_run_loop.ipp (run_task), sched_timers.ipp
// (fire_due_timers), sched_park.ipp (park, wake_fiber), the idle wait (poll_io).
// ---------------------------------------------------------------------------

#pragma once

#include "testing.hpp"
#include "inspect.hpp"
#include "impl/sched_core.ipp"
#include "impl/sched_run_loop.ipp"
#include "impl/sched_timers.ipp"
#include "impl/sched_park.ipp"
#include "impl/registry_slots.ipp"

namespace fsched {
namespace detail {

struct Simulation {
    Simulation(std::uint64_t seed_, const testing::SimulationOptions& options_)
        : options(options_), seed(seed_), rng(seed_ * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull),
          thread(std::this_thread::get_id()) {}

    const testing::SimulationOptions options;
    const std::uint64_t seed;
    std::uint64_t rng;
    const std::thread::id thread;
    // The virtual clock: starts at the same point in every run (an hour after steady_clock's
    // epoch, so that a deadline computed as now() - d stays after the epoch).
    const TimePoint start{std::chrono::hours(1)};
    TimePoint now = start;

    std::vector<SchedulerCore*> cores;  // every scheduler made on this thread meanwhile
    struct Ready {
        SchedulerCore* core;
        QueuedTask task;
    };
    std::vector<Ready> ready;
    // Every task fiber of the run: its ordinal (for the trace) and its PCT priority. Weak: a
    // fiber ends as it would elsewhere; the entry goes when its task does.
    struct Info {
        std::uint64_t ordinal = 0;
        std::uint64_t priority = 0;
        std::weak_ptr<Fiber> fiber;
    };
    std::unordered_map<const Fiber*, Info> fibers;
    std::uint64_t tasks_made = 0;
    std::uint64_t pct_steps = 0;               // PCT: the switches its change points are drawn among
    std::vector<std::uint64_t> change_points;  // PCT: the switches after which priority drops
    std::size_t next_change = 0;

    std::uint64_t switches = 0;
    std::uint64_t hash = 0xcbf29ce484222325ull;
    std::exception_ptr error;
    bool runaway = false;
    // Fibers in stop() of a simulated scheduler, until it has no task left; fibers in
    // wait_until_blocked(), until nothing else can run.
    std::vector<std::pair<SchedulerCore*, Fiber::ptr>> drains;
    std::vector<Fiber::ptr> blocked;

    std::uint64_t next_random() noexcept {
        std::uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    std::size_t below(std::size_t n) noexcept { return n <= 1 ? 0 : static_cast<std::size_t>(next_random() % n); }
    // A new task's PCT priority: above every lowered one (those are below pct_depth).
    std::uint64_t fresh_priority() noexcept { return (next_random() >> 2) | (std::uint64_t{1} << 61); }

    void mix(std::uint64_t v) noexcept {
        for (int i = 0; i < 8; ++i) {
            hash ^= (v >> (8 * i)) & 0xff;
            hash *= 0x100000001b3ull;
        }
    }

    // The first failure, and the fibers as they were when it came (the report at the end
    // would show only what was left).
    std::string error_report;
    std::string error_task;  // "fiber N (name)" of the task the first failure came from
    void record_error(std::exception_ptr e) noexcept {
        if (error) return;
        error = std::move(e);
        try {
            error_report = fiber_report();
        } catch (...) {
            error_report.clear();  // no memory for it: the run's end report stands in
        }
    }

    void push(SchedulerCore& core, QueuedTask&& task);
    void run();
    void step();
    bool poll_io() noexcept;
    bool advance_clock() noexcept;
    bool io_waiting() const noexcept;
    void wake_drained() noexcept;
    std::int64_t outstanding() const noexcept;
    void abandon() noexcept;
};

TimePoint clock_now() noexcept {
    const Simulation* sim = thread_state()->simulation;
    return sim ? sim->now : std::chrono::steady_clock::now();
}

void sim_attach(Simulation& sim, SchedulerCore& core) { sim.cores.push_back(&core); }

void sim_detach(Simulation& sim, SchedulerCore& core) noexcept {
    sim.cores.erase(std::remove(sim.cores.begin(), sim.cores.end(), &core), sim.cores.end());
}

void sim_enqueue(Simulation& sim, SchedulerCore& core, QueuedTask&& task) { sim.push(core, std::move(task)); }

void sim_record_error(Simulation& sim, std::exception_ptr error) noexcept { sim.record_error(std::move(error)); }

std::size_t sim_random_below(Simulation& sim, std::size_t n) noexcept { return sim.below(n); }

[[noreturn]] void sim_fatal(const char* rule) noexcept {
    std::fprintf(stderr, "fiber_sched: %s\n", rule);
    std::fflush(stderr);
    std::abort();
}

void drop_abandoned_wake(Fiber& fiber) noexcept {
    const char* name = fiber.name_c_str();
    std::fprintf(stderr,
                 "fiber_sched: a primitive woke fiber %llu%s%s%s, which a failed testing::simulate() run abandoned: "
                 "the wake is dropped, and what it handed over stays with that fiber (make the primitives a "
                 "simulated run waits on inside its fn)\n",
                 static_cast<unsigned long long>(fiber.id()), name && *name ? " (" : "", name && *name ? name : "",
                 name && *name ? ")" : "");
    std::fflush(stderr);
}

void Simulation::push(SchedulerCore& core, QueuedTask&& task) {
    FIBER_SCHED_ASSERT(std::this_thread::get_id() == thread &&
                       "testing::simulate(): a plain thread used a scheduler of the simulation (plain threads are "
                       "outside it: they must not schedule or wake its tasks)");
    ready.reserve(ready.size() + 1);  // first: from the push_back on nothing throws
    if (!task.fiber) {
        // A callback: its own fiber now, never a pooled one, so the run knows it from here.
        // Out of memory or stacks, schedule() throws (a worker would report it instead).
        if (FIBER_SCHED_FAULT(FiberAlloc)) throw std::bad_alloc();
        task.fiber = FiberAccess::make_in_stack(std::move(task.cb), core.options.stack_size);
    }
    Info& info = fibers[task.fiber.get()];  // may throw std::bad_alloc
    if (task.kind == TaskKind::Fresh || info.ordinal == 0) {
        info.ordinal = ++tasks_made;
        info.priority = fresh_priority();
        info.fiber = task.fiber;
    }
    ready.push_back(Ready{&core, std::move(task)});
}

void Simulation::step() {
    std::size_t i = 0;
    // PCT past its pct_steps switches (a run longer than it was sized for: a task spinning on
    // yield() at the highest priority would starve the one it waits for): uniform choices.
    if (options.strategy == testing::Strategy::pct && switches < pct_steps) {
        std::uint64_t best = 0;
        for (std::size_t k = 0; k < ready.size(); ++k) {
            const std::uint64_t p = fibers[ready[k].task.fiber.get()].priority;
            if (k == 0 || p > best) {
                best = p;
                i = k;
            }
        }
    } else {
        i = below(ready.size());
    }
    Ready r = std::move(ready[i]);
    if (i + 1 != ready.size()) ready[i] = std::move(ready.back());
    ready.pop_back();
    SchedulerCore& core = *r.core;
    Worker& w = r.task.worker >= 0 ? *core.workers[static_cast<std::size_t>(r.task.worker)]
                                   : *core.workers[below(core.workers.size())];
    const Fiber::ptr fiber = r.task.fiber;  // to know, after the step, whether its task ended
    const Fiber* key = fiber.get();
    mix(fibers[key].ordinal);
    mix((static_cast<std::uint64_t>(std::find(cores.begin(), cores.end(), &core) - cores.begin()) << 32) |
        static_cast<std::uint64_t>(w.index));
    ++switches;
    const bool failed_before = error != nullptr;
    ThreadState* ts = thread_state();
    ts->scheduler = &core.owner;
    ts->worker = &w;
    w.run_task(r.task);
    if (!failed_before && error) {
        const char* name = fiber->name_c_str();
        error_task = "fiber " + std::to_string(fiber->id()) + (name && *name ? std::string(" (") + name + ")" : "");
    }
    ts->scheduler = nullptr;
    ts->worker = nullptr;
    ts->task_fiber = nullptr;
    ts->task_ref = nullptr;
    // PCT: past a change point, the task that ran drops below every other.
    if (next_change < change_points.size() && switches >= change_points[next_change]) {
        auto it = fibers.find(key);
        if (it != fibers.end()) it->second.priority = static_cast<std::uint64_t>(change_points.size() - next_change);
        ++next_change;
    }
    if (fiber->state() == Fiber::State::Term) fibers.erase(key);
}

bool Simulation::poll_io() noexcept {
    bool any = false;
    for (SchedulerCore* core : cores) any = core->idle.poll_io(false) || any;
    return any;
}

bool Simulation::io_waiting() const noexcept {
#if defined(FIBER_SCHED_HAVE_EPOLL)
    for (SchedulerCore* core : cores) {
        if (core->idle.io_waiters.load(std::memory_order_relaxed) > 0) return true;
    }
#endif
    return false;
}

bool Simulation::advance_clock() noexcept {
    std::int64_t earliest = no_deadline;
    for (SchedulerCore* core : cores) {
        for (auto& w : core->workers) earliest = std::min(earliest, w->timers.earliest.load(std::memory_order_relaxed));
    }
    if (earliest == no_deadline) return false;
    const TimePoint due{std::chrono::steady_clock::duration(earliest)};
    if (due > now) now = due;
    ThreadState* ts = thread_state();
    for (SchedulerCore* core : cores) {
        for (auto& w : core->workers) {
            ts->scheduler = &core->owner;
            ts->worker = w.get();
            w->fire_due_timers(*w);
        }
    }
    ts->scheduler = nullptr;
    ts->worker = nullptr;
    return true;
}

std::int64_t Simulation::outstanding() const noexcept {
    std::int64_t n = 0;
    for (const SchedulerCore* core : cores) {
        n += core->outstanding.load(std::memory_order_relaxed) & ~(SchedulerCore::exit_bit | SchedulerCore::closed_bit);
    }
    return n;
}

void Simulation::wake_drained() noexcept {
    for (std::size_t i = 0; i < drains.size();) {
        SchedulerCore& core = *drains[i].first;
        if ((core.outstanding.load(std::memory_order_relaxed) & ~SchedulerCore::closed_bit) != 0) {
            ++i;
            continue;
        }
        Fiber::ptr fiber = std::move(drains[i].second);
        drains.erase(drains.begin() + static_cast<std::ptrdiff_t>(i));
        wake_fiber(std::move(fiber));
    }
}

void Simulation::run() {
    int io_naps = 0;
    for (;;) {
        if (!drains.empty()) wake_drained();
        if (!ready.empty()) {
            if (switches >= options.max_switches) {
                runaway = true;
                return;
            }
            step();
            io_naps = 0;
            continue;
        }
        if (poll_io()) continue;
        if (!blocked.empty()) {
            std::vector<Fiber::ptr> woken;
            woken.swap(blocked);
            for (Fiber::ptr& f : woken) wake_fiber(std::move(f));
            continue;
        }
        if (advance_clock()) continue;
        // Only fds outside the simulation can end these waits: real time, a little at a
        // time, for at most two seconds with nothing else happening; then a deadlock.
        if (io_waiting() && io_naps < 2000) {
            ++io_naps;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            continue;
        }
        return;
    }
}

// Keeps every fiber the run left (their frames may be listed by primitives that outlive
// the run: freeing them would leave those lists pointing into freed stacks) and clears what
// their wait records point to (the primitives and schedulers of the run go away).
void Simulation::abandon() noexcept {
    static std::vector<Fiber::ptr>* kept = new std::vector<Fiber::ptr>();  // never freed: see above
    static std::mutex kept_lock;
    std::lock_guard<std::mutex> lock(kept_lock);
    auto keep = [&](Fiber::ptr f) {
        if (!f || f->state() == Fiber::State::Term) return;
        // Out of the registry first (it returns once no report reads the fiber): a report
        // must not list what cannot run again, nor read the record while it changes.
        registry_remove(*f, thread_state());
        FiberAccess::registry_slot(*f) = nullptr;
        // No scheduler to go back to: a primitive that outlived the run and wakes it now
        // finds that in wake_fiber(), which drops the wake.
        FiberAccess::lifecycle(*f).abandon();
#if defined(FIBER_SCHED_ASAN)
        // What its frames own is reachable from them, not lost: LeakSanitizer looks there too.
        const Stack& stack = FiberAccess::stack(*f);
        __lsan_register_root_region(stack.base, stack.size);
#endif
        WaitRecord& w = FiberAccess::wait(*f);
        w.word = "abandoned by testing::simulate() (a deadlock or a runaway)";
        w.object = nullptr;
        w.ops = nullptr;
        w.scheduler = nullptr;
        w.worker = nullptr;
        w.deadline_ns = -1;
        w.kind.store(WaitReason::Other, std::memory_order_relaxed);
        try {
            kept->push_back(std::move(f));
        } catch (...) {
            new Fiber::ptr(std::move(f));  // out of memory for the list: leak the handle itself
        }
    };
    for (Ready& r : ready) keep(std::move(r.task.fiber));
    ready.clear();
    for (auto& d : drains) keep(std::move(d.second));
    drains.clear();
    for (Fiber::ptr& f : blocked) keep(std::move(f));
    blocked.clear();
    for (SchedulerCore* core : cores) {
        for (auto& w : core->workers) {
            std::lock_guard<SpinLock> timers_lock(w->timers.lock);
            for (Timer& t : w->timers.heap) {
                keep(std::move(t.fiber));
                if (t.wait) keep(std::move(t.wait->fiber));
            }
            w->timers.heap.clear();
            w->timers.earliest.store(no_deadline, std::memory_order_relaxed);
        }
    }
    for (auto& entry : fibers) keep(entry.second.fiber.lock());
    fibers.clear();
}

bool SchedulerCore::sim_stop() {
    if (closed()) return false;
    started.store(true, std::memory_order_release);  // start() after stop() does nothing
    stopping.store(true, std::memory_order_seq_cst);
    for (;;) {
        std::int64_t idle = 0;
        if (outstanding.compare_exchange_strong(idle, closed_bit, std::memory_order_seq_cst)) return true;
        if (!in_scheduler_task()) {
            // The simulation's own thread, once the run is over: what is left was abandoned.
            outstanding.fetch_or(closed_bit, std::memory_order_seq_cst);
            return true;
        }
        // Wait, parked, until the simulation has run this scheduler's tasks to their end.
        sim->drains.reserve(sim->drains.size() + 1);  // the hook below cannot throw
        note_wait(WaitReason::Other, this);
        FiberAccess::wait(*running_fiber()).word = "Scheduler::stop() in a simulation";
        park([](Fiber*, void* core) {
            SchedulerCore* c = static_cast<SchedulerCore*>(core);
            c->sim->drains.emplace_back(c, take_task_ref());
        }, this);
    }
}

}  // namespace detail

namespace testing {

bool in_simulation() noexcept { return detail::thread_state()->simulation != nullptr; }

std::chrono::steady_clock::time_point now() { return detail::clock_now(); }

void wait_until_blocked() {
    detail::ThreadState* ts = detail::thread_state();
    detail::Simulation* sim = ts->simulation;
    FIBER_SCHED_ASSERT(sim && detail::in_scheduler_task() &&
                       "testing::wait_until_blocked(): call it from a task inside testing::simulate()");
    sim->blocked.reserve(sim->blocked.size() + 1);  // the hook below cannot throw
    detail::note_wait(detail::WaitReason::Other, nullptr);
    detail::FiberAccess::wait(*ts->current).word = "testing::wait_until_blocked()";
    detail::park([](Fiber*, void* s) { static_cast<detail::Simulation*>(s)->blocked.push_back(detail::take_task_ref()); },
                 sim);
}

SimulationResult simulate(std::uint64_t seed, std::function<void()> fn, std::size_t workers) {
    SimulationOptions options;
    options.workers = workers;
    return simulate(seed, std::move(fn), options);
}

SimulationResult simulate(std::uint64_t seed, std::function<void()> fn, const SimulationOptions& options) {
    FIBER_SCHED_ASSERT(fn && "testing::simulate(): fn is empty");
    FIBER_SCHED_ASSERT(options.workers >= 1 && "testing::simulate(): workers must be at least 1");
    FIBER_SCHED_ASSERT(options.pct_depth >= 1 && "testing::simulate(): pct_depth must be at least 1");
    detail::ThreadState* ts = detail::thread_state();
    FIBER_SCHED_ASSERT(!ts->simulation && "testing::simulate(): already inside a simulation (they do not nest)");
    FIBER_SCHED_ASSERT(!ts->current && !ts->worker &&
                       "testing::simulate(): call it from a plain thread, outside fibers and scheduler tasks");
    detail::Simulation sim(seed, options);
    if (options.strategy == Strategy::pct) {
        const std::uint64_t steps = options.pct_steps ? options.pct_steps : 1000;
        sim.pct_steps = steps;
        for (int j = 1; j < options.pct_depth; ++j) sim.change_points.push_back(1 + sim.next_random() % steps);
        std::sort(sim.change_points.begin(), sim.change_points.end());
    }
    SimulationResult result;
    result.seed = seed;
    struct Scope {  // the thread leaves the simulation however this returns
        detail::ThreadState* ts;
        ~Scope() { ts->simulation = nullptr; }
    } scope{ts};
    ts->simulation = &sim;
    {
        SchedulerOptions so;
        so.threads = options.workers;
        so.name = "simulation";
        Scheduler scheduler(so);
        scheduler.set_exception_handler([&sim](std::exception_ptr e) { sim.record_error(std::move(e)); });
        scheduler.start();
        scheduler.schedule(ScheduleTask{nullptr, std::move(fn), -1, Priority::Normal, "simulate"});
        sim.run();
        result.switches = sim.switches;
        result.trace_hash = sim.hash;
        result.runaway = sim.runaway;
        result.completed = !sim.runaway && sim.outstanding() == 0;
        result.deadlock = !sim.runaway && !result.completed;
        result.virtual_time = sim.now - sim.start;
        if (!result.completed) {
            result.report = fiber_report();
        } else if (sim.error) {
            result.report = sim.error_report.empty() ? fiber_report() : sim.error_report;
        }
        if (!result.completed) sim.abandon();
        scheduler.stop();
    }
    result.error = sim.error;
    result.error_task = sim.error_task;
    if (result.error) {
        try {
            std::rethrow_exception(result.error);
        } catch (const std::exception& e) {
            result.error_message = e.what();
        } catch (...) {
            result.error_message = "(an exception not derived from std::exception)";
        }
    }
    // Schedulers made inside and abandoned with their tasks (on the kept fibers' stacks).
    for (detail::SchedulerCore* core : sim.cores) core->sim = nullptr;
    return result;
}

std::optional<std::uint64_t> explore(std::function<void()> fn, std::uint64_t count, std::uint64_t first_seed,
                                     std::size_t workers) {
    SimulationOptions options;
    options.workers = workers;
    return explore(std::move(fn), count, first_seed, options).seed;
}

ExploreResult explore(std::function<void()> fn, std::uint64_t count, std::uint64_t first_seed,
                      const SimulationOptions& options) {
    FIBER_SCHED_ASSERT(fn && "testing::explore(): fn is empty");
    ExploreResult out;
    out.options = options;
    if (options.strategy == Strategy::pct && options.pct_steps == 0) {
        // PCT draws its change points among a run's switches: measure how many there are.
        SimulationOptions probe = options;
        probe.strategy = Strategy::uniform;
        const SimulationResult r = simulate(first_seed, fn, probe);
        out.options.pct_steps = std::max<std::uint64_t>(1, r.switches);
    }
    for (std::uint64_t i = 0; i < count; ++i) {
        out.result = simulate(first_seed + i, fn, out.options);
        ++out.runs;
        if (out.result.failed()) {
            out.seed = first_seed + i;
            return out;
        }
    }
    return out;
}

}  // namespace testing
}  // namespace fsched
