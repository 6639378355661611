// ---------------------------------------------------------------------------
// fsched::testing: a user's concurrent code run in a deterministic simulation.
//
// simulate(seed, fn) runs fn as the first task of a scheduler whose workers are logical: all
// of them take turns on the calling thread, and every choice a real scheduler leaves to
// timing comes from a pseudo-random generator seeded with `seed`: which ready task runs next
// (among every ready task of every scheduler in the simulation), on which worker an unpinned
// task runs, which ready case a select() takes. So one seed is one interleaving, the same
// every time; another seed is another. Time is virtual (now()): when nothing is ready the
// clock jumps to the next deadline, so sleeps and timed waits cost no wall time. When
// nothing is ready, no deadline is pending and fibers are still parked, the run ends as a
// deadlock, with the fiber report; a run past its switch budget ends as a runaway.
//
// explore(fn, count) runs seeds until one fails (fn or a task threw, a FIBER_SCHED_ASSERT
// failed, a deadlock, a runaway) and returns it; simulate() with that seed (and the same
// options) replays the failing run switch for switch. Strategy::pct draws priorities
// instead (probabilistic concurrency testing: the highest-priority ready task runs, and at
// a few random switches the running one drops below all others), which finds bugs that
// need a few specific preemptions much sooner than uniform choices.
//
// Inside a simulation everything works as usual: Scheduler::current(), schedule(),
// schedulers the code makes (their workers join the simulation; start() starts no thread,
// stop() waits in virtual time), every primitive, this_fiber::*, fsched::io (fds polled
// without blocking). Plain threads started inside are outside it: they see real time, and
// must not touch the simulation's schedulers or primitives (a FIBER_SCHED_ASSERT says so
// where it can). Priorities are not honoured: any ready task may be chosen, which covers
// every order a real scheduler could take and more. A task that loops without ever waiting
// or yielding cannot be interrupted (fibers are cooperative), so the budget cannot end it.
// A failed or abandoned run's fibers (a deadlock, a runaway) cannot be unwound safely: they
// stay parked for good, with their stacks, out of later reports; a primitive that outlives
// the run and wakes one later has that wake dropped (said on stderr). A Fiber resumed by
// hand inside a task may not wait or sleep. Deadlines on clocks other than steady_clock go
// through the real clock and do not replay exactly. Fiber ids are process-wide counters:
// a replay's differ (its schedule does not).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {
namespace testing {

// How simulate() chooses among the ready tasks.
enum class Strategy {
    uniform,  // each ready task equally likely
    pct,      // priorities, with pct_depth - 1 change points (see the top comment)
};

struct SimulationOptions {
    std::size_t workers = 4;  // logical workers of the simulation's own scheduler (at least 1)
    Strategy strategy = Strategy::uniform;
    // PCT: the bug depth looked for (d); d - 1 change points are drawn among the first
    // pct_steps switches, and past pct_steps the choices are uniform (so that a task spinning
    // on yield() cannot starve the rest for good). 0: explore() measures it by a first
    // uniform run (and returns the options it used, to replay with); simulate() takes 1000.
    int pct_depth = 3;
    std::uint64_t pct_steps = 0;
    std::uint64_t max_switches = 1000000;  // the step budget: past it the run is a runaway
};

struct SimulationResult {
    bool completed = false;   // every task finished
    bool deadlock = false;    // nothing ready, no timer pending, fibers still parked
    std::uint64_t switches = 0;  // scheduling decisions taken
    // fiber_report() at the end when not completed; when every task finished but one threw,
    // as the fibers were when the first exception left its task; else empty.
    std::string report;
    // Beyond API.md:
    bool runaway = false;               // the switch budget ran out
    std::exception_ptr error;           // the first exception fn or a task threw (or a failed assert)
    std::string error_message;          // its what(), when it had one
    std::string error_task;             // the task it came from: "fiber 12 (name)"
    std::uint64_t seed = 0;
    std::uint64_t trace_hash = 0;       // of every switch (which task, which worker): equal runs, equal hashes
    std::chrono::nanoseconds virtual_time{0};  // how far the virtual clock went
    bool failed() const noexcept { return !completed || error != nullptr; }
};

// A FIBER_SCHED_ASSERT that failed inside a simulation: thrown instead of aborting, so that
// explore() can report the seed. One in a noexcept function still terminates.
class AssertionFailed : public std::logic_error {
public:
    using std::logic_error::logic_error;
};

// Runs `fn` as the first task of a simulated scheduler of `workers` logical workers on this
// thread; every scheduling choice comes from `seed`; time is virtual.
SimulationResult simulate(std::uint64_t seed, std::function<void()> fn, std::size_t workers = 4);
SimulationResult simulate(std::uint64_t seed, std::function<void()> fn, const SimulationOptions& options);

// simulate() for seeds first_seed .. first_seed + count - 1: the first on which fn threw,
// failed a FIBER_SCHED_ASSERT, deadlocked or ran away, or nullopt.
std::optional<std::uint64_t> explore(std::function<void()> fn, std::uint64_t count, std::uint64_t first_seed = 0,
                                     std::size_t workers = 4);

struct ExploreResult {
    std::optional<std::uint64_t> seed;  // the first failing seed, if any
    SimulationResult result;            // that seed's run (else the last run's)
    SimulationOptions options;          // what to pass simulate() to replay it
    std::uint64_t runs = 0;             // seeds tried
};
ExploreResult explore(std::function<void()> fn, std::uint64_t count, std::uint64_t first_seed,
                      const SimulationOptions& options);

// The virtual clock inside simulate() (on its thread); steady_clock::now() elsewhere.
std::chrono::steady_clock::time_point now();

// Inside simulate(): returns once every other fiber of the simulation is parked on an
// fsched primitive, a sleep or an io wait (Go's synctest.Wait), before the clock moves.
// Outside: FIBER_SCHED_ASSERT.
void wait_until_blocked();

// True on the thread (and in the fibers) of a running simulate().
bool in_simulation() noexcept;

}  // namespace testing
}  // namespace fsched
