// ---------------------------------------------------------------------------
// TaskFunction: the callable a scheduled callback and a fiber's function are kept in.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {
namespace detail {

// A move-only `void()` callable. Unlike std::function (16 bytes inline in libstdc++), it
// keeps a closure of up to inline_size bytes in itself, so a callback that captures a few
// references or numbers costs no heap allocation from schedule() to its end: it moves from
// the queue into its fiber, which lives at the top of its own stack
// (FiberAccess::make_in_stack). Kept inline: trivially copyable closures that fit (moved
// with a plain copy, so no user code runs when a task changes queues under a queue lock),
// and std::function<void()> itself. Anything else (a larger closure, one owning a string or
// a unique_ptr) goes to the heap, as std::function would put it. An empty std::function (of
// any signature) or null function pointer makes an empty TaskFunction. Move-only callables are accepted.
// A TaskFunction never copies what it holds (a closure that captures a
// std::vector<std::unique_ptr<T>> reports itself copyable, yet its copy does not compile):
// copying one is a FIBER_SCHED_ASSERT. TaskCallback, ScheduleTask::cb's type, copies what
// it holds when that is copyable (ScheduleTask stays copyable for the code that copies it);
// what it is given must then be copyable or truly move-only, as for std::function.
class TaskFunction {
public:
    static constexpr std::size_t inline_size = 6 * sizeof(void*);

    TaskFunction() noexcept = default;
    TaskFunction(std::nullptr_t) noexcept {}
    template <class F, class D = std::decay_t<F>,
              class = std::enable_if_t<!std::is_same_v<D, TaskFunction> && !std::is_same_v<D, std::nullptr_t> &&
                                       std::is_invocable_v<D&>>>
    TaskFunction(F&& fn) {  // NOLINT: converts like std::function does
        construct<D, false>(std::forward<F>(fn));
    }
    TaskFunction(TaskFunction&& other) noexcept { take(other); }
    TaskFunction& operator=(TaskFunction&& other) noexcept {
        if (this != &other) {
            clear();
            take(other);
        }
        return *this;
    }
    TaskFunction& operator=(std::nullptr_t) noexcept {
        clear();
        return *this;
    }
    TaskFunction(const TaskFunction& other) {
        if (!other.ops_) return;
        FIBER_SCHED_ASSERT(other.ops_->copy &&
                           "ScheduleTask: its callback is move-only and cannot be copied (move the task instead)");
        // (A TaskFunction made by its own constructor has no copy entry: only TaskCallback's.)
        other.ops_->copy(other.storage_, storage_);
        ops_ = other.ops_;
    }
    TaskFunction& operator=(const TaskFunction& other) {
        if (this != &other) {
            TaskFunction copy(other);
            clear();
            take(copy);
        }
        return *this;
    }
    ~TaskFunction() { clear(); }

    explicit operator bool() const noexcept { return ops_ != nullptr; }
    // Comparisons with nullptr, as std::function has them (code written for a
    // std::function ScheduleTask::cb keeps compiling).
    friend bool operator==(const TaskFunction& f, std::nullptr_t) noexcept { return !f; }
    friend bool operator==(std::nullptr_t, const TaskFunction& f) noexcept { return !f; }
    friend bool operator!=(const TaskFunction& f, std::nullptr_t) noexcept { return static_cast<bool>(f); }
    friend bool operator!=(std::nullptr_t, const TaskFunction& f) noexcept { return static_cast<bool>(f); }
    // Precondition: not empty.
    void operator()() { ops_->invoke(storage_); }

protected:
    // TaskCallback's way in: the same, with a copy entry when D is copyable.
    struct WithCopy {};
    template <class F, class D = std::decay_t<F>>
    TaskFunction(WithCopy, F&& fn) {
        construct<D, true>(std::forward<F>(fn));
    }

private:
    template <class D, bool Copy, class F>
    void construct(F&& fn) {
        if constexpr (std::is_pointer_v<D> || is_std_function<D>::value) {
            if (!fn) return;  // empty, as converting it to std::function<void()> would be
        }
        if constexpr (stored_inline<D>) {
            ::new (static_cast<void*>(storage_)) D(std::forward<F>(fn));
            ops_ = &inline_ops<D, Copy>;
        } else {
            D* boxed = new D(std::forward<F>(fn));
            std::memcpy(storage_, &boxed, sizeof boxed);
            ops_ = &boxed_ops<D, Copy>;
        }
    }

    template <class D>
    struct is_std_function : std::false_type {};
    template <class Signature>
    struct is_std_function<std::function<Signature>> : std::true_type {};

    struct Ops {
        void (*invoke)(void* storage);
        void (*relocate)(void* from, void* to) noexcept;  // moves the callable over, ends `from`'s
        void (*destroy)(void* storage) noexcept;
        void (*copy)(const void* from, void* to);  // null: the callable is move-only
    };

    template <class D>
    static constexpr bool fits = sizeof(D) <= inline_size && alignof(D) <= alignof(void*);
    template <class D>
    static constexpr bool stored_inline =
        fits<D> && (std::is_trivially_copyable_v<D> || std::is_same_v<D, std::function<void()>>);

    template <class D>
    static D& inline_target(void* storage) noexcept {
        return *std::launder(static_cast<D*>(storage));
    }
    template <class D>
    static D* boxed_target(void* storage) noexcept {
        D* boxed;
        std::memcpy(&boxed, storage, sizeof boxed);
        return boxed;
    }

    // The copy entry of an Ops table: null without Copy (D's copy constructor is then never
    // instantiated) or for a callable that cannot be copied.
    template <class D, bool Boxed, bool Copy>
    static constexpr void (*copier())(const void*, void*) {
        if constexpr (!Copy || !std::is_copy_constructible_v<D>) {
            return nullptr;
        } else if constexpr (Boxed) {
            return [](const void* from, void* to) {
                D* boxed = new D(static_cast<const D&>(*boxed_target<D>(const_cast<void*>(from))));
                std::memcpy(to, &boxed, sizeof boxed);
            };
        } else {
            return [](const void* from, void* to) {
                ::new (to) D(static_cast<const D&>(inline_target<D>(const_cast<void*>(from))));
            };
        }
    }

    template <class D, bool Copy>
    static constexpr Ops inline_ops = {
        [](void* s) { static_cast<void>(std::invoke(inline_target<D>(s))); },
        [](void* from, void* to) noexcept {
            if constexpr (std::is_trivially_copyable_v<D>) {
                std::memcpy(to, from, sizeof(D));
            } else {  // std::function, moved as std::function moves
                D& source = inline_target<D>(from);
                ::new (to) D(std::move(source));
                source.~D();
            }
        },
        [](void* s) noexcept {
            if constexpr (!std::is_trivially_destructible_v<D>) inline_target<D>(s).~D();
        },
        copier<D, false, Copy>(),
    };
    template <class D, bool Copy>
    static constexpr Ops boxed_ops = {
        [](void* s) { static_cast<void>(std::invoke(*boxed_target<D>(s))); },
        [](void* from, void* to) noexcept { std::memcpy(to, from, sizeof(D*)); },
        [](void* s) noexcept { delete boxed_target<D>(s); },
        copier<D, true, Copy>(),
    };

    void take(TaskFunction& other) noexcept {
        if (!other.ops_) return;
        other.ops_->relocate(other.storage_, storage_);
        ops_ = other.ops_;
        other.ops_ = nullptr;
    }
    void clear() noexcept {
        if (!ops_) return;
        const Ops* ops = ops_;
        ops_ = nullptr;  // a destructor that reaches this function again finds it empty
        ops->destroy(storage_);
    }

    alignas(void*) unsigned char storage_[inline_size];
    const Ops* ops_ = nullptr;
};

// ScheduleTask::cb: a TaskFunction that copies what it holds when that is copyable (a
// std::function, a lambda of copyable captures), so that a ScheduleTask copies as it did
// when cb was a std::function; a move-only callable makes a move-only one (copying it is a
// FIBER_SCHED_ASSERT). Like std::function, it needs a callable whose copyability its type
// tells truly: a lambda capturing a std::vector<std::unique_ptr<T>> does not compile here
// (give it to schedule() directly, which never copies).
class TaskCallback : public TaskFunction {
public:
    TaskCallback() noexcept = default;
    TaskCallback(std::nullptr_t) noexcept {}
    template <class F, class D = std::decay_t<F>,
              class = std::enable_if_t<!std::is_same_v<D, TaskCallback> && !std::is_same_v<D, TaskFunction> &&
                                       !std::is_same_v<D, std::nullptr_t> && std::is_invocable_v<D&>>>
    TaskCallback(F&& fn) : TaskFunction(WithCopy{}, std::forward<F>(fn)) {}  // NOLINT: as std::function
};

}  // namespace detail
}  // namespace fsched
