// ---------------------------------------------------------------------------
// Execution contexts: the interface every context-switch backend implements. The backend is
// chosen once, by the cascade in the implementation section of fiber_sched.hpp, and each
// backend is one file, src/impl/context_<name>.ipp, that defines this trio:
//   make_context(ctx, lo, size, entry, arg)
//                      prepare ctx so that switching to it calls entry(arg) on the stack
//                      [lo, lo + size); entry never returns,
//   fsched_switch_context(&from.sp, to.sp)
//                      save the running context, store its handle in from.sp, continue the
//                      context whose handle is to.sp (assembly, or a function); the x86-64
//                      routines with FIBER_SCHED_SWITCH_FP_CONTROL are named
//                      fsched_switch_context_fp and take a third argument, the running FP
//                      control words, which switch_context() reads for them,
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
    struct Unset {};
    Context() noexcept : sp(nullptr) {}
    // Left unwritten, for a context the switch routine fills before anything reads it.
    explicit Context(Unset) noexcept {}
    void* sp;
};

}  // namespace detail
}  // namespace fsched

// The x86-64 assembly backends (System V and Microsoft x64), under the conditions the
// cascade in impl/context_backend.ipp picks them by; the cascade tests this macro.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    ((defined(_WIN32) && !defined(FIBER_SCHED_USE_WINFIBER)) || (!defined(_WIN32) && !defined(FIBER_SCHED_USE_UCONTEXT)))
#define FIBER_SCHED_X86_64_ASM_SWITCH 1
#endif

// Hidden: each shared object that embeds the implementation has its own.
#if defined(FIBER_SCHED_X86_64_ASM_SWITCH) && FIBER_SCHED_SWITCH_FP_CONTROL
// `fp_control`: the running MXCSR in bits 0-31 and x87 control word in bits 32-47
// (impl/context_x86_64_fp.ipp says why the caller reads them). A name of its own: a
// translation unit built with another FIBER_SCHED_SWITCH_FP_CONTROL or backend than the
// implementation's then fails to link, where it would call the routine with two arguments.
extern "C" void fsched_switch_context_fp(void** save_sp, void* load_sp, std::uint64_t fp_control) noexcept
    FIBER_SCHED_HIDDEN;
#else
extern "C" void fsched_switch_context(void** save_sp, void* load_sp) noexcept FIBER_SCHED_HIDDEN;
#endif

namespace fsched {
namespace detail {

// Saves the running context into `from` and continues `to`. Inline: the switch itself is
// the only call.
#if defined(FIBER_SCHED_X86_64_ASM_SWITCH) && FIBER_SCHED_SWITCH_FP_CONTROL
inline void switch_context(Context& from, Context& to) noexcept {
    std::uint64_t fp_control, x87_part;
    std::uint32_t mxcsr;
    std::uint16_t x87_control;
    // "memory": not moved above the code before it, which may have changed a mode. The
    // words are packed inside the statement: a load of the scratch slots in C++ would be an
    // access ThreadSanitizer sees, made on the resumer's stack after the sanitizer has been
    // told of the switch (Fiber::switch_in), so charged to the fiber (a race report in a
    // fork() child, where the switch back does not order it before the resumer's next use).
    __asm__ volatile(
        "stmxcsr %[m]\n\t"
        "fnstcw %[x]\n\t"
        "movl %[m], %k[r]\n\t"
        "movzwl %[x], %k[t]\n\t"
        "shlq $32, %[t]\n\t"
        "orq %[t], %[r]"
        : [r] "=&r"(fp_control), [t] "=&r"(x87_part), [m] "=m"(mxcsr), [x] "=m"(x87_control)
        :
        : "memory");
    fsched_switch_context_fp(&from.sp, to.sp, fp_control);
}
#else
inline void switch_context(Context& from, Context& to) noexcept { fsched_switch_context(&from.sp, to.sp); }
#endif

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
