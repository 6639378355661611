// ---------------------------------------------------------------------------
// FiberLocal<T>: a value per fiber (Boost.Fiber's fiber_specific_ptr, folly's local()).
//
// get() returns the running fiber's T, default-constructed on the fiber's first get();
// outside fibers, the calling thread's. Fibers change threads at every wait, so a
// thread_local read before a wait may be another thread's after it; a FiberLocal stays the
// fiber's wherever it runs (the lookup starts from the running fiber each time, never from
// a cached address). A fiber's values are destroyed, newest first, when its function
// returns (on the fiber: a destructor may wait), or when the Fiber is destroyed before
// that; a scheduler's callback task sees fresh values in each task, though the worker
// reuses the fiber. A thread's values are destroyed when it exits. Values made by a
// destructor during a clean-up are destroyed in it too, in up to four rounds (as POSIX's
// thread-specific data); destructors that still make more are a FIBER_SCHED_ASSERT.
//
// Cost: get() is a look-up in the fiber's small vector (linear: a fiber has a few); the
// first get() on a fiber allocates its T and, for its first value, the vector. The object
// itself holds only its key: destroying a FiberLocal leaves the values fibers made with it
// to be destroyed with those fibers.
// ---------------------------------------------------------------------------

#pragma once

#include "fiber.hpp"

namespace fsched {
namespace detail {

// The FiberLocal values of one fiber (or one thread outside fibers).
class FiberLocalSlots {
public:
    FiberLocalSlots() = default;
    FiberLocalSlots(const FiberLocalSlots&) = delete;
    FiberLocalSlots& operator=(const FiberLocalSlots&) = delete;

    bool empty() const noexcept { return slots_.empty(); }
    std::size_t size() const noexcept { return slots_.size(); }
    void* find(std::uint64_t key) const noexcept {
        for (const Slot& s : slots_) {
            if (s.key == key) return s.value;
        }
        return nullptr;
    }
    // Takes `value`; throws std::bad_alloc without taking it.
    void add(std::uint64_t key, void* value, void (*destroy)(void*)) { slots_.push_back(Slot{key, value, destroy}); }
    // Destroys the newest value; false if there was none.
    bool destroy_newest() noexcept {
        if (slots_.empty()) return false;
        const Slot s = slots_.back();
        slots_.pop_back();  // first: its destructor may add or look up others
        s.destroy(s.value);
        return true;
    }

private:
    struct Slot {
        std::uint64_t key;
        void* value;
        void (*destroy)(void*);
    };
    std::vector<Slot> slots_;
};

// The running fiber's slots (made on first use), else the calling thread's.
FiberLocalSlots& current_fiber_locals();
// A key no other FiberLocal has had in this process.
std::uint64_t new_fiber_local_key() noexcept;

}  // namespace detail

template <class T>
class FiberLocal {
public:
    FiberLocal() : key_(detail::new_fiber_local_key()) {}
    FiberLocal(const FiberLocal&) = delete;
    FiberLocal& operator=(const FiberLocal&) = delete;

    // The running fiber's value (outside fibers, the thread's), default-constructed on
    // first use. Throws what T() throws (nothing is kept then; the next get() tries again)
    // or std::bad_alloc.
    T& get() {
        detail::FiberLocalSlots& slots = detail::current_fiber_locals();
        if (void* value = slots.find(key_)) return *static_cast<T*>(value);
        std::unique_ptr<T> made(new T());
        slots.add(key_, made.get(), [](void* p) { delete static_cast<T*>(p); });
        return *made.release();
    }
    T* operator->() { return &get(); }
    T& operator*() { return get(); }

private:
    const std::uint64_t key_;
};

}  // namespace fsched
