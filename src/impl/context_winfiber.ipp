// ---------------------------------------------------------------------------
// Context switch on the Win32 fiber API: the default for MSVC's cl.exe (no inline
// assembly), and FIBER_SCHED_USE_WINFIBER anywhere on Windows.
//
// A context's handle is an OS fiber (the address CreateFiberEx returns). Switching saves
// GetCurrentFiber() into *save_sp and calls SwitchToFiber(load_sp); the OS switches the
// callee-saved registers, the stack fields of the TIB and the fiber-local storage, so the C
// runtime's per-fiber state (MSVC keeps its exception state in FLS) follows each fiber. The
// floating-point control state (MXCSR, the x87 control word) is kept here, around the
// switch, in the frame of the side switching out: FIBER_FLAG_FLOAT_SWITCH asks Windows for
// it, but wine ignores the flag; a new fiber starts with its creator's modes.
//
// Only a fiber can switch to a fiber: a thread that is not one is converted the first time
// it resumes a fiber (ConvertThreadToFiberEx) and converted back when it exits. A thread
// that already is a fiber (a host engine converted it, or runs its own fibers) is used as
// it is: its current fiber is the resumer, and is never converted back by us.
//
// The OS makes each fiber's stack itself, `size` bytes reserved, with its own guard that
// raises EXCEPTION_STACK_OVERFLOW (os_win32.ipp reports it). The stack the pool hands the
// Fiber holds only the record below at its top: its other pages are never touched nor
// committed (os_win32.ipp commits a guarded stack as it grows), so they cost address space
// only. A reset() or a destroyed fiber deletes
// its OS fiber (release_context): the one the pool would have kept is the pool's stack.
// So a fiber's frames, and any Fiber object made in them, lie on the OS's stack, not the
// pool's: in_running_frames() and frames_range() below say where (the registry needs it:
// registry_forget_range).
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"

// The frames of a context lie off the stack make_context() is given (context_backend.ipp).
#define FIBER_SCHED_CONTEXT_OWN_STACKS 1

namespace fsched {
namespace detail {

const char* const backend_name = "winfiber";
// The record below, at the top of each pooled stack.
constexpr std::size_t context_stack_reserve = 64;  // >= sizeof(WinFiberStart) + 16
// The record is at the fiber's top, below a Fiber that lives in the stack: none above it.
constexpr std::size_t context_stack_record = 0;

// The floating-point control state a fiber must find again when it resumes.
struct FloatControl {
#if defined(_M_X64) || defined(__x86_64__)
    unsigned int mxcsr;
#if defined(__GNUC__) || defined(__clang__)
    unsigned short x87_control;  // MSVC's x64 code never uses the x87 unit
#endif
#endif
};

inline FloatControl save_float_control() noexcept {
    FloatControl fc{};
#if FIBER_SCHED_SWITCH_FP_CONTROL && (defined(_M_X64) || defined(__x86_64__))
    fc.mxcsr = _mm_getcsr();
#if defined(__GNUC__) || defined(__clang__)
    __asm__ volatile("fnstcw %0" : "=m"(fc.x87_control));
#endif
#endif
    return fc;
}

// Loads only what differs, and keeps the running MXCSR status flags (the thread's, not the
// fiber's; context_x86_64_fp.ipp says why).
inline void restore_float_control(const FloatControl& fc) noexcept {
#if FIBER_SCHED_SWITCH_FP_CONTROL && (defined(_M_X64) || defined(__x86_64__))
    constexpr unsigned int status_flags = 0x3f;
    const unsigned int running = _mm_getcsr();
    if ((running ^ fc.mxcsr) & ~status_flags) _mm_setcsr((fc.mxcsr & ~status_flags) | (running & status_flags));
#if defined(__GNUC__) || defined(__clang__)
    unsigned short running_x87;
    __asm__ volatile("fnstcw %0" : "=m"(running_x87));
    if (running_x87 != fc.x87_control) __asm__ volatile("fldcw %0" : : "m"(fc.x87_control));
#endif
#else
    (void)fc;
#endif
}

struct WinFiberStart {
    ContextEntry entry;
    void* arg;
    FloatControl float_control;  // the creator's, for the fiber's start
    // The OS stack's top, written when the fiber starts; atomic: a report on another
    // thread may read it meanwhile (frames_range).
    std::atomic<const char*> os_stack_top;
};
static_assert(sizeof(WinFiberStart) + 16 <= context_stack_reserve, "the start record outgrew its reserve");

// The running OS fiber's stack as its TIB has it: [StackLimit, StackBase), the limit being
// how far the stack is committed so far (so every live frame lies above it). Volatile, and
// ordered with memory: the fields change with every switch, which the compiler cannot see.
inline void running_os_stack(const char*& limit, const char*& top) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __asm__ volatile("movq %%gs:0x08, %0" : "=r"(top) : : "memory");
    __asm__ volatile("movq %%gs:0x10, %0" : "=r"(limit) : : "memory");
#else
    const auto* tib = reinterpret_cast<const NT_TIB*>(NtCurrentTeb());
    top = static_cast<const char*>(tib->StackBase);
    limit = static_cast<const char*>(tib->StackLimit);
#endif
}

// The thread-exit clean-up of a thread we converted (ThreadState::context_exit). Not a
// thread_local with a destructor: MinGW's emutls frees those before their destructors run.
inline void convert_back_to_thread() { ConvertFiberToThread(); }

inline void WINAPI winfiber_start(void* param) {
    auto* start = static_cast<WinFiberStart*>(param);
    const char* limit;
    const char* top;
    running_os_stack(limit, top);
    start->os_stack_top.store(top, std::memory_order_relaxed);
    restore_float_control(start->float_control);
    start->entry(start->arg);  // never returns: the last switch-out is final
}

// GetCurrentFiber(), which is the TIB's fiber data field. With gcc 12 the header's inline
// gs: read trips -Warray-bounds (a constant address looks like an offset from null), so
// GNU compilers on x86-64 read the field themselves (volatile, as above).
inline void* current_os_fiber() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    void* fiber;
    __asm__ volatile("movq %%gs:0x20, %0" : "=r"(fiber) : : "memory");
    return fiber;
#else
    return GetCurrentFiber();
#endif
}

// Where make_context() keeps a context's start record: at the top of the pool's stack.
inline WinFiberStart* start_record(const void* stack_lo, std::size_t size) noexcept {
    const auto top = (reinterpret_cast<std::uintptr_t>(stack_lo) + size - sizeof(WinFiberStart)) & ~std::uintptr_t{15};
    return reinterpret_cast<WinFiberStart*>(top);
}

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    // (Where reset() or a worker's reuse makes a listed fiber's context again, a report may
    // be loading os_stack_top meanwhile; the record's construction stores it plainly, one
    // aligned pointer, which no Windows target tears, and frames_range() copes with either.)
    auto* start = new (start_record(stack_lo, size)) WinFiberStart{entry, arg, save_float_control(), nullptr};
    // Commit one page now (0 would take the executable's SizeOfStackCommit, which a program
    // linked with /STACK:reserve,commit may have set large); the OS commits the rest as the
    // fiber's stack grows, up to `size`. (Wine commits an OS fiber's stack whole, at least
    // 1 MiB of it.)
    void* fiber = CreateFiberEx(os::page_size(), size, FIBER_FLAG_FLOAT_SWITCH, &winfiber_start, start);
    if (!fiber) throw std::bad_alloc();
    ctx.sp = fiber;
}

void release_context(Context& ctx) noexcept {
    if (ctx.sp) DeleteFiber(ctx.sp);
    ctx.sp = nullptr;
}

// Whether `at` lies in the running fiber's frames: on its OS stack, whatever the pool gave.
inline bool in_running_frames(const void* at, const char*, std::size_t) noexcept {
    const char* limit;
    const char* top;
    running_os_stack(limit, top);
    return static_cast<const char*>(at) >= limit && static_cast<const char*>(at) < top;
}

// Where the frames of the fiber whose context was made on [stack_lo, stack_lo + size) lie:
// the whole reservation of its OS stack, below the top its start recorded; empty for a
// fiber that never ran (it has no frames). Exact for a switched-out fiber not yet released
// (~Fiber: its OS fiber, and so its stack, still exists). A report also asks about fibers
// it does not hold, which a worker may reuse meanwhile (a new OS fiber, the old stack
// freed): VirtualQuery never faults, a freed stack gives an empty range, and a region
// larger than any stack of this size gives the size asked for, not a walk of it.
inline void frames_range(const char* stack_lo, std::size_t size, const char*& lo, const char*& hi) noexcept {
    const WinFiberStart* start = start_record(stack_lo, size);
    const char* const top = start->os_stack_top.load(std::memory_order_relaxed);
    lo = hi = top;
    if (!top) return;
    MEMORY_BASIC_INFORMATION info{};
    const bool known = VirtualQuery(top - 1, &info, sizeof info) != 0;
    if (known && info.State == MEM_FREE) return;
    const char* const base = known ? static_cast<const char*>(info.AllocationBase) : nullptr;
    // Windows reserves the size asked for in 64 KiB steps, wine at least 1 MiB.
    constexpr std::size_t slack = std::size_t{1} << 20;
    const bool plausible = base && base < top && static_cast<std::size_t>(top - base) <= std::max(size, slack) + slack;
    lo = plausible ? base : top - size;
}

// An OS fiber keeps its registers to itself: no backtrace of a parked fiber.
bool saved_frame(const Context&, SavedFrame&) noexcept { return false; }

}  // namespace detail
}  // namespace fsched

extern "C" void fsched_switch_context(void** save_sp, void* load_sp) noexcept {
    if (!IsThreadAFiber()) {
        const bool converted = ConvertThreadToFiberEx(nullptr, FIBER_FLAG_FLOAT_SWITCH) != nullptr;
        FIBER_SCHED_ASSERT(converted && "resume(): the thread cannot become a fiber (ConvertThreadToFiberEx failed)");
        fsched::detail::ThreadState* ts = fsched::detail::thread_state();
        ts->context_exit = &fsched::detail::convert_back_to_thread;
        fsched::detail::register_thread(ts);  // so that the clean-up runs at thread exit
    }
    const fsched::detail::FloatControl float_control = fsched::detail::save_float_control();
    *save_sp = fsched::detail::current_os_fiber();
    SwitchToFiber(load_sp);
    fsched::detail::restore_float_control(float_control);
}
