// ---------------------------------------------------------------------------
// Context switch on the Win32 fiber API: the default for MSVC's cl.exe (no inline
// assembly), and FIBER_SCHED_USE_WINFIBER anywhere on Windows.
//
// A context's handle is an OS fiber (the address CreateFiberEx returns). Switching saves
// GetCurrentFiber() into *save_sp and calls SwitchToFiber(load_sp); the OS switches the
// callee-saved registers, the floating-point modes (FIBER_FLAG_FLOAT_SWITCH), the stack
// fields of the TIB and the fiber-local storage, so the C runtime's per-fiber state (MSVC
// keeps its exception state in FLS) follows each fiber.
//
// Only a fiber can switch to a fiber: a thread that is not one is converted the first time
// it resumes a fiber (ConvertThreadToFiberEx) and converted back when it exits. A thread
// that already is a fiber (a host engine converted it, or runs its own fibers) is used as
// it is: its current fiber is the resumer, and is never converted back by us.
//
// The OS makes each fiber's stack itself, `size` bytes reserved, with its own guard that
// raises EXCEPTION_STACK_OVERFLOW (os_win32.ipp reports it). The stack the pool hands the
// Fiber holds only the record below at its top: its other pages are never touched, so they
// cost address space and commit charge, no memory. A reset() or a destroyed fiber deletes
// its OS fiber (release_context): the one the pool would have kept is the pool's stack.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

const char* const backend_name = "winfiber";
// The record below, at the top of each pooled stack.
constexpr std::size_t context_stack_reserve = 64;

struct WinFiberStart {
    ContextEntry entry;
    void* arg;
};

// Converts the thread back at exit if we converted it.
struct ThreadFiber {
    bool converted = false;
    ~ThreadFiber() {
        if (converted) ConvertFiberToThread();
    }
};

inline void WINAPI winfiber_start(void* param) {
    auto* start = static_cast<WinFiberStart*>(param);
    start->entry(start->arg);  // never returns: the last switch-out is final
}

// GetCurrentFiber(), which is the TIB's fiber data field. With gcc 12 the header's inline
// gs: read trips -Warray-bounds (a constant address looks like an offset from null), so
// GNU compilers on x86-64 read the field themselves.
inline void* current_os_fiber() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    void* fiber;
    __asm__("movq %%gs:0x20, %0" : "=r"(fiber));
    return fiber;
#else
    return GetCurrentFiber();
#endif
}

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    const auto top = (reinterpret_cast<std::uintptr_t>(stack_lo) + size - sizeof(WinFiberStart)) & ~std::uintptr_t{15};
    auto* start = new (reinterpret_cast<void*>(top)) WinFiberStart{entry, arg};
    // Commit one page now; the OS commits the rest as the fiber's stack grows, up to `size`.
    void* fiber = CreateFiberEx(0, size, FIBER_FLAG_FLOAT_SWITCH, &winfiber_start, start);
    if (!fiber) throw std::bad_alloc();
    ctx.sp = fiber;
}

void release_context(Context& ctx) noexcept {
    if (ctx.sp) DeleteFiber(ctx.sp);
    ctx.sp = nullptr;
}

}  // namespace detail
}  // namespace fsched

extern "C" void fsched_switch_context(void** save_sp, void* load_sp) noexcept {
    if (!IsThreadAFiber()) {
        static thread_local fsched::detail::ThreadFiber thread_fiber;
        const bool converted = ConvertThreadToFiberEx(nullptr, FIBER_FLAG_FLOAT_SWITCH) != nullptr;
        FIBER_SCHED_ASSERT(converted && "resume(): the thread cannot become a fiber (ConvertThreadToFiberEx failed)");
        thread_fiber.converted = true;
    }
    *save_sp = fsched::detail::current_os_fiber();
    SwitchToFiber(load_sp);
}
