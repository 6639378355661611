// ---------------------------------------------------------------------------
// Fiber: a stackful, asymmetric coroutine: resume() runs it until it yields or returns.
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "task_function.hpp"
#include "stack.hpp"
#include "fiber_state.hpp"
#include "observe.hpp"
#include "wait_record.hpp"

namespace fsched {

class Fiber;
class Scheduler;

namespace detail {

class FiberLocalSlots;
// Destroys every FiberLocal value in `slots`, newest first, until none is left (a value's
// destructor may make another), then frees `slots` if `free_slots` (fiber_local.ipp).
void clear_fiber_locals(FiberLocalSlots* slots, bool free_slots) noexcept;

struct Worker;
struct SchedulerCore;
struct RegistrySegment;
struct Simulation;

// The C++ runtime's per-thread exception state (the Itanium ABI's __cxa_eh_globals: the
// stack of caught exceptions and the uncaught count). Each fiber keeps its own: a fiber
// that parks inside a catch block must find its own exception there when it resumes.
struct EhState {
    void* caught = nullptr;
    unsigned int uncaught = 0;
};

// How a resume ended, for the scheduler.
enum class SwitchOutcome { Returned, Parked, Yielded };

struct TraceBuffer;  // a thread's trace events (trace.ipp)

// Per-thread state. Read only through thread_state(): fibers move between threads, and a
// compiler may keep a thread-local's address in a register across a context switch.
struct ThreadState {
    Fiber* current = nullptr;          // the fiber running on this thread, innermost first
    Scheduler* scheduler = nullptr;    // the scheduler this thread works for, while it does
    Worker* worker = nullptr;          // and which of its workers it is
    Fiber* task_fiber = nullptr;       // the fiber this worker resumed for the current task
    std::shared_ptr<Fiber>* task_ref = nullptr;  // the worker's reference to task_fiber
    // The use_caller scheduler made last on this thread's own stack and not yet stopped,
    // which the thread helps while it blocks (caller_may_help); each links the one before.
    SchedulerCore* caller_core = nullptr;
    std::uint64_t identity = 0;        // unique among threads and fiber ids; 0 until needed
    bool registered = false;           // known to the stack statistics, cleaned up at exit
    bool has_altstack = false;         // an alternate signal stack is set for this thread
    void* owned_altstack = nullptr;    // the one we mapped, unmapped at thread exit
    std::size_t owned_altstack_size = 0;
    EhState* eh = nullptr;             // this thread's exception state (eh_globals())
    bool eh_exiting = false;           // MinGW g++: the thread exits; eh is looked up each time
    bool exited = false;               // thread-exit clean-up has run; count stacks globally
    void (*context_exit)() = nullptr;  // the context backend's thread-exit clean-up, if any
    RegistrySegment* registry = nullptr;  // where the fibers this thread makes are listed
    FiberLocalSlots* fiber_locals = nullptr;  // FiberLocal values outside fibers; freed at exit
    // The testing::simulate() this thread runs, if any: its fibers run on this thread too,
    // so this is what tells every clock read, queue and choice that it is inside one.
    Simulation* simulation = nullptr;
    // This thread's trace buffer once it records (trace.ipp), and whether its exit clean-up
    // has run (then it records no more). Here, not in thread_locals of their own: MinGW's
    // emutls frees those before the clean-up's destructor could read them.
    TraceBuffer* trace_buffer = nullptr;
    bool trace_gone = false;
    // Freed stacks kept by this thread, so create/destroy takes no lock (see stack.ipp).
    static constexpr unsigned stack_cache_capacity = 32;
    Stack cached_stacks[stack_cache_capacity];
    unsigned cached_stack_count = 0;
    // Stacks acquired minus released by this thread. Written by this thread only (a plain
    // load and store, no locked add), summed by stack_stats() under the registry lock.
    std::atomic<long> stacks_in_use{0};
    // Constant-initialised and trivially destructible, so reading it costs one load with no
    // guard; register_thread() arranges the clean-up at thread exit when there is any.
};

// Lets stack_stats() see this thread and frees its cached stacks and signal stack at exit.
void register_thread(ThreadState* ts);
// At thread exit: gives the thread's part of the fiber registry to the next thread.
void release_registry_segment(ThreadState* ts) noexcept;

// This thread's state; opaque to the optimiser, so every call reads the thread it runs on.
ThreadState* thread_state() noexcept;
// Sets ts->eh to the thread's exception state; returns it.
EhState* eh_globals(ThreadState* ts) noexcept;

// What the sanitizers need to follow a switch; unused fields cost a few bytes.
struct SwitchShadow {
    void* asan_fake_stack = nullptr;          // ASan's fake frames of the switched-out side
    const void* resumer_stack_bottom = nullptr;  // the resumer's stack, as ASan reports it
    std::size_t resumer_stack_size = 0;
    void* tsan_fiber = nullptr;               // TSan's context for this fiber
    unsigned tsan_runs = 0;                   // runs since tsan_fiber was created
    void* tsan_resumer = nullptr;             // TSan's context of whoever resumed it
};

struct FiberAccess;

}  // namespace detail

class Fiber : public std::enable_shared_from_this<Fiber> {
public:
    using ptr = std::shared_ptr<Fiber>;
    enum class State { Ready, Running, Suspended, Term };

    // Creates a Ready fiber that will run `fn` on its own stack of `stack_size` bytes
    // (0: FIBER_SCHED_DEFAULT_STACK_SIZE; rounded up to pages). `fn` must not be empty; any
    // callable void() converts, a std::function or a move-only lambda (TaskFunction).
    // Throws std::length_error above detail::max_stack_size (1 TiB), std::bad_alloc when
    // the stack cannot be mapped. The fiber has its own C++ exception state.
    explicit Fiber(detail::TaskFunction fn, std::size_t stack_size = 0);
    // Frees the stack (without unwinding a Suspended fiber's frames). Must not be Running.
    // A Fiber made in those frames by the fiber itself is forgotten by fiber_report() with
    // them; one constructed there from elsewhere (emplaced into the frame by another
    // thread or fiber) must be destroyed first.
    ~Fiber();
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;

    // Runs this fiber on the calling thread until it yields or returns. Precondition: Ready
    // or Suspended. If `fn` threw, the fiber is Term and resume() rethrows the exception.
    void resume();
    // Suspends the current fiber and returns to whoever resumed it. Precondition: called
    // inside a fiber.
    static void yield();
    // Gives the fiber a new function on the same stack (any callable void(), move-only ones
    // too). Precondition: Ready or Term.
    void reset(detail::TaskFunction fn);

    // Ready (never run), Running, Suspended (yielded) or Term (returned or threw).
    State state() const noexcept {
        switch (state_.load()) {  // the mapping is drawn in fiber_state.hpp
        case detail::FiberState::Ready: return State::Ready;
        case detail::FiberState::Running:
        case detail::FiberState::RunningResumePending: return State::Running;
        case detail::FiberState::Term: return State::Term;
        default: return State::Suspended;  // Suspended, Parked, ParkedResumePending
        }
    }
    // Unique, non-zero, increasing in creation order.
    std::uint64_t id() const noexcept { return id_.load(std::memory_order_relaxed); }
    // Usable bytes of stack: the size asked for, rounded up to pages.
    // (A scheduler's callback fiber keeps its Fiber object at the top of its stack, so its
    // stack_size() is a few hundred bytes less than the default size.)
    std::size_t stack_size() const noexcept { return stack_.size - detail::stack_reserve() - top_block_; }

    // The fiber running on this thread; nullptr outside fibers. A scheduler's callback fiber
    // seen here belongs to its task: it is not reused for a later task, so every shared_ptr
    // or weak_ptr taken from it (shared_from_this(), weak_from_this(), current_ptr()) refers
    // to that task's fiber only, and a weak_ptr expires when the task ends unless a shared_ptr
    // is still kept (then it reaches that task's Term fiber). A weak_ptr, expired or not,
    // keeps the fiber's stack until it goes (the control block lives there).
    // this_fiber::id() reads the id without this, and leaves the fiber to be pooled.
    static Fiber* current() noexcept;
    // Shared owner of current(); empty outside fibers or when it is not owned by a shared_ptr.
    static Fiber::ptr current_ptr();

    // Names the fiber for the hooks and in the stack-overflow message. From any
    // thread, at any time. A callback's fiber carries its task's name (ScheduleTask::name)
    // while that task runs; set_name() inside the task renames the task. Names are
    // interned: each distinct name is kept once for the rest of the process, so name kinds
    // of work ("net-reader"), not each request; past detail::max_interned_names distinct
    // names (100,000) a new one is shown as "(too many names)".
    void set_name(std::string name);
    // The name; empty when it has none.
    std::string name() const;
    // The same as a C string that stays valid for the rest of the process (a profiler may
    // key fibers by the pointer, as Tracy does); nullptr when it has none.
    const char* name_c_str() const noexcept { return name_.load(std::memory_order_acquire); }

private:
    friend struct detail::FiberAccess;

    // Constructs a fiber that lives at the top of `stack` (make_in_stack, impl/fiber.ipp),
    // without its context: make_in_stack sets top_block_, the bytes its frames run below,
    // then calls finish_construction(). ~Fiber leaves the stack to whoever frees that memory.
    // The public constructor's body, with the thread's state at hand.
    Fiber(detail::TaskFunction&& fn, std::size_t stack_size, detail::ThreadState* ts);
    struct InStackTag {};
    Fiber(InStackTag, const detail::Stack& stack, detail::TaskFunction&& fn) noexcept;
    void reset_function(detail::TaskFunction&& fn);
    // Both constructors' common part, once the stack and function are in place: checks the
    // function, makes the context (may throw; the caller frees the stack).
    void finish_construction(detail::ThreadState* ts);

    static void entry(void* self) noexcept;
    void switch_to_resumer(bool terminating) noexcept;
    void prepare_context();
    // Runs a fiber already moved to Running; rethrows what its function threw. `scheduled`:
    // run by a Scheduler, so a concurrent schedule() may mark it RunningResumePending.
    detail::SwitchOutcome run_claimed(bool scheduled);
    // run_claimed()'s steps: the switch in and back, with the sanitizers told, and what the
    // fiber left behind when it switched out (returned, parked or yielded).
    void switch_in(detail::Context& resumer_context) noexcept;
    detail::SwitchOutcome after_switch_back(bool scheduled);

    detail::Context context_;                    // this fiber, while switched out
    detail::Context* resumer_context_ = nullptr; // where yield() goes: the resumer's frame
    detail::Stack stack_;
    std::size_t top_block_ = 0;                  // bytes at the stack's top this Fiber lives in; 0: none
    detail::TaskFunction fn_;
    std::exception_ptr exception_;
    detail::FiberLifecycle state_;               // every state and transition: fiber_state.hpp
    // Its wait is over (wake_fiber() sets it, note_wait() clears it): for fiber_report(),
    // which reads it under its hold. Beside state_, whose line the waker reads anyway.
    std::atomic<bool> woken_{false};
    bool returned_ = false;                      // fn_ has finished; the next switch-out is final
    // Atomic (relaxed: a plain load) because fiber_report() reads it while a pooled fiber is
    // given its next task's id.
    std::atomic<std::uint64_t> id_{0};
    // Set by a fiber that parks itself; resume() runs it on the resumer's stack once the
    // fiber has fully switched out (the scheduler's race-free park, see impl/sched_park.ipp).
    void (*after_switch_)(Fiber*, void*) = nullptr;
    void* after_switch_arg_ = nullptr;
    // The park is this_fiber::yield(): the fiber goes straight back to a run queue and stays
    // claimed (Running) while it waits there, so the switch-out and its next run need no
    // atomic read-modify-write.
    bool park_stays_running_ = false;
    bool handed_out_ = false;  // current() showed it to user code: a worker must not reuse it
    detail::EhState eh_;                         // the fiber's exception state, while switched out
    detail::SwitchShadow shadow_;
    // Interned (never freed); release/acquire: its characters are seen by whoever reads it.
    std::atomic<const char*> name_{nullptr};
    bool announced_ = false;  // Hooks::on_create was called for it and on_destroy not yet
    // Its FiberLocal values (fiber_local.hpp): made on the first get(), destroyed when fn_
    // returns (the slots are kept for the next run) or with the Fiber.
    detail::FiberLocalSlots* locals_ = nullptr;
    // The scheduler worker that ran it last (so, while it waits, the one it waited on):
    // where SchedulerOptions::debug_migrate must not resume it.
    const detail::Worker* last_worker_ = nullptr;
    // What it waits for while parked, for fiber_report() (wait_record.hpp).
    detail::WaitRecord wait_;
    // A report reads its stack and wait record: a wake-up that claims it waits (registry.ipp).
    std::atomic<bool> inspected_{false};
    // Its slot in the registry of live fibers, and the registry's part that holds the slot;
    // null: not listed (made by a thread after its thread-exit clean-up).
    std::atomic<Fiber*>* registry_slot_ = nullptr;
    detail::RegistrySegment* registry_segment_ = nullptr;
    // A Fiber object was made on this fiber's stack (registry_add): if this one is destroyed
    // Suspended, that object is never destroyed, and the registry forgets it (~Fiber).
    bool hosts_fibers_ = false;
};

}  // namespace fsched
