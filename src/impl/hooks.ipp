// ---------------------------------------------------------------------------
// Implementation: fiber names (interned) and the profiler hooks (observe.hpp), which also
// feed the trace recorder (impl/trace.ipp) while its bit of observe_flags is set.
//
// Names are interned in one process-wide set: a name's characters never move or go, so a
// Fiber keeps a bare pointer (set_name is one atomic store), a task carries one from
// schedule() to its fiber, and a hook may keep the pointer as a key for the rest of the
// process (Tracy's fiber API asks for that). The set is bounded (max_interned_names): a
// program that names each request would otherwise grow it without end.
//
// Hooks: each is an atomic pointer, read relaxed where it is called, so set_hooks() while
// fibers run is no data race; observe_flags says whether any is set. The switch hooks are
// called from run_claimed(), the one place a fiber is switched in and back out, on the
// resumer's thread: a fiber that resumes another by hand is reported out and back in around
// it, so on each thread the calls alternate in / out and never nest.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber_switch.hpp"
#include "scheduler.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"
#include "impl/trace.ipp"

namespace fsched {
namespace detail {

std::atomic<unsigned> observe_flags{0};

constexpr std::size_t max_interned_names = 100000;

namespace {

struct NameTable {
    std::mutex mutex;
    // std::unordered_set's nodes never move: c_str() of an element is stable.
    std::unordered_set<std::string> names;
};

// Function-local: a global constructor in another translation unit may name a fiber.
NameTable& name_table() {
    static NameTable* table = new NameTable;  // never destroyed: fibers may outlive main()
    return *table;
}

struct HookTable {
    std::atomic<void (*)(Fiber&)> on_create{nullptr};
    std::atomic<void (*)(Fiber&)> on_destroy{nullptr};
    std::atomic<void (*)(Fiber&, int)> on_switch_in{nullptr};
    std::atomic<void (*)(Fiber&, int)> on_switch_out{nullptr};
    std::atomic<void (*)(Fiber&, Fiber*)> on_wake{nullptr};
};
HookTable hook_table;  // constant-initialised: no order of construction to get wrong

}  // namespace

// Its lock's fork handlers (from build_process_state): a child forked while another thread
// names a fiber would otherwise find the lock taken for good.
void build_name_table() {
    (void)name_table();
    os::at_fork([] { name_table().mutex.lock(); }, [] { name_table().mutex.unlock(); },
                [] { name_table().mutex.unlock(); });
}

const char* intern_name(const std::string& name) {
    if (name.empty()) return nullptr;
    NameTable& table = name_table();
    std::lock_guard<std::mutex> lock(table.mutex);
    auto found = table.names.find(name);
    if (found != table.names.end()) return found->c_str();
    if (table.names.size() >= max_interned_names) {
        static const char* const too_many = "(too many names)";
        return too_many;
    }
    return table.names.insert(name).first->c_str();
}

void observe_create(Fiber& fiber) noexcept {
    FiberAccess::announced(fiber) = true;
    if (auto hook = hook_table.on_create.load(std::memory_order_relaxed)) hook(fiber);
}

void observe_destroy(Fiber& fiber) noexcept {
    FiberAccess::announced(fiber) = false;
    if (auto hook = hook_table.on_destroy.load(std::memory_order_relaxed)) hook(fiber);
}

void observe_switch_in(Fiber& fiber, Fiber* resumer) noexcept {
    const int worker = Scheduler::worker_index();
    if (resumer) {
        if (auto hook = hook_table.on_switch_out.load(std::memory_order_relaxed)) hook(*resumer, worker);
    }
    if (auto hook = hook_table.on_switch_in.load(std::memory_order_relaxed)) hook(fiber, worker);
    if (observe_flags.load(std::memory_order_relaxed) & observe_trace) trace_switch_in(fiber, resumer);
}

void observe_switch_out(Fiber& fiber, Fiber* resumer) noexcept {
    if (observe_flags.load(std::memory_order_relaxed) & observe_trace) trace_switch_out(fiber, resumer);
    const int worker = Scheduler::worker_index();
    if (auto hook = hook_table.on_switch_out.load(std::memory_order_relaxed)) hook(fiber, worker);
    if (resumer) {
        if (auto hook = hook_table.on_switch_in.load(std::memory_order_relaxed)) hook(*resumer, worker);
    }
}

void observe_wake(Fiber& woken) noexcept {
    Fiber* by = running_fiber();
    if (auto hook = hook_table.on_wake.load(std::memory_order_relaxed)) hook(woken, by);
    if (observe_flags.load(std::memory_order_relaxed) & observe_trace) trace_wake(woken, by);
}

}  // namespace detail

void set_hooks(const Hooks& hooks) {
    using detail::hook_table;
    hook_table.on_create.store(hooks.on_create, std::memory_order_relaxed);
    hook_table.on_destroy.store(hooks.on_destroy, std::memory_order_relaxed);
    hook_table.on_switch_in.store(hooks.on_switch_in, std::memory_order_relaxed);
    hook_table.on_switch_out.store(hooks.on_switch_out, std::memory_order_relaxed);
    hook_table.on_wake.store(hooks.on_wake, std::memory_order_relaxed);
    const bool any = hooks.on_create || hooks.on_destroy || hooks.on_switch_in || hooks.on_switch_out || hooks.on_wake;
    if (any) {
        detail::observe_flags.fetch_or(detail::observe_hooks, std::memory_order_relaxed);
    } else {
        detail::observe_flags.fetch_and(~detail::observe_hooks, std::memory_order_relaxed);
    }
}

void Scheduler::name_task(detail::NewTask& task, const std::string& name) {
    const char* interned = detail::intern_name(name);
    if (task.fiber) {
        detail::FiberAccess::set_task_name(*task.fiber, interned);
        return;
    }
    // No callback either: left as it is, for submit()'s check (a wrapper would hide it).
    if (!task.cb) return;
    task.cb = [interned, fn = std::move(task.cb)]() mutable {
        detail::FiberAccess::set_task_name(*detail::running_fiber(), interned);
        fn();
    };
}

void Fiber::set_name(std::string name) { name_.store(detail::intern_name(name), std::memory_order_release); }

std::string Fiber::name() const {
    const char* name = name_c_str();
    return name ? std::string(name) : std::string();
}

namespace this_fiber {

void set_name(std::string name) {
    Fiber* fiber = detail::running_fiber();  // a callback's fiber stays poolable
    FIBER_SCHED_ASSERT(fiber && "this_fiber::set_name(): called outside a fiber");
    fiber->set_name(std::move(name));
}

}  // namespace this_fiber
}  // namespace fsched
