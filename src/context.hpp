// ---------------------------------------------------------------------------
// Execution contexts: the interface every context-switch backend implements. The backend is
// chosen once, by the cascade in the implementation section of fiber_sched.hpp, and each
// backend is one file, src/impl/context_<name>.ipp, that defines this trio:
//   make_context(ctx, lo, size, entry, arg)
//                      prepare ctx so that switching to it calls entry(arg) on the stack
//                      [lo, lo + size); entry never returns,
//   fsched_switch_context(&from.sp, to.sp)
//                      save the running context, store its handle in from.sp, continue the
//                      context whose handle is to.sp (assembly, or a function),
//   backend_name       what fsched::backend() returns,
//   release_context(ctx)
//                      free what make_context() acquired besides the stack (only the
//                      winfiber backend has anything: its OS fiber),
// context_stack_reserve, the bytes of each fiber stack the backend uses itself (the stack
// pool adds them to the size asked for), and context_stack_record, the bytes at the very
// top of every stack that the backend keeps there across the fibers made on it (the win64
// backend's record; 0 for the others): a Fiber that lives at its stack's top stays below.
// A context is one pointer-sized handle whatever the backend (a saved stack pointer, the
// address of a saved ucontext_t, an OS fiber), so nothing above this file knows which
// backend is in use.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

namespace fsched {
namespace detail {

using ContextEntry = void (*)(void* arg);

// A switched-out context: the handle its backend saved.
struct Context {
    void* sp = nullptr;
};

}  // namespace detail
}  // namespace fsched

// Hidden: each shared object that embeds the implementation has its own.
extern "C" void fsched_switch_context(void** save_sp, void* load_sp) noexcept FIBER_SCHED_HIDDEN;

namespace fsched {
namespace detail {

// Saves the running context into `from` and continues `to`. Inline: the switch itself is
// the only call.
inline void switch_context(Context& from, Context& to) noexcept { fsched_switch_context(&from.sp, to.sp); }

// Prepares `ctx` to run entry(arg) on [stack_lo, stack_lo + size). In the backend's file.
// Throws std::bad_alloc where the backend needs memory of its own (winfiber: an OS fiber).
void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg);
// Frees what make_context() acquired besides the stack; `ctx` must not be running. Called
// before a context is made again on the same stack and when its fiber is destroyed.
void release_context(Context& ctx) noexcept;

// Where a backtrace of a switched-out context starts: the address it resumes at, its frame
// pointer and stack pointer. False where the backend cannot tell (winfiber; ucontext off
// x86-64 and AArch64 Linux). In the backend's file.
struct SavedFrame {
    std::uintptr_t pc = 0;
    std::uintptr_t fp = 0;
    std::uintptr_t sp = 0;
};
bool saved_frame(const Context& ctx, SavedFrame& out) noexcept;

}  // namespace detail
}  // namespace fsched
