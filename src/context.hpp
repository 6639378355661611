// ---------------------------------------------------------------------------
// Execution contexts. Each backend provides the same internal trio:
//   detail::Context                     a saved execution context,
//   detail::make_context(ctx, lo, size, entry, arg)
//                                       prepare ctx so that switching to it calls entry(arg)
//                                       on the stack [lo, lo + size); entry never returns,
//   detail::switch_context(from, to)    save the running context into `from`, continue `to`.
// Only the Context type is public (Fiber stores one); the functions live in the
// implementation section, one file per backend, so nothing above them knows which is used.
// ---------------------------------------------------------------------------

#if defined(FIBER_SCHED_BACKEND_UCONTEXT)
#include <ucontext.h>
#endif

namespace fsched {
namespace detail {

using ContextEntry = void (*)(void* arg);

#if defined(FIBER_SCHED_BACKEND_UCONTEXT)
struct Context {
    ucontext_t uc;
    // makecontext() passes only ints, so the entry and its argument wait here.
    ContextEntry entry = nullptr;
    void* arg = nullptr;
};
#else
struct Context {
    // The stack pointer of a switched-out context; everything else it needs was pushed
    // onto its own stack by the switch routine.
    void* sp = nullptr;
};
#endif

// Saves the running context into `from` and continues `to`.
#if defined(FIBER_SCHED_BACKEND_X86_64_SYSV)
}  // namespace detail
}  // namespace fsched
extern "C" void fsched_switch_x86_64_sysv(void** save_sp, void* load_sp) noexcept
    __attribute__((visibility("hidden")));
namespace fsched {
namespace detail {
inline void switch_context(Context& from, Context& to) noexcept { fsched_switch_x86_64_sysv(&from.sp, to.sp); }
#elif defined(FIBER_SCHED_BACKEND_AARCH64_AAPCS)
}  // namespace detail
}  // namespace fsched
extern "C" void fsched_switch_aarch64_aapcs(void** save_sp, void* load_sp) noexcept
    __attribute__((visibility("hidden")));
namespace fsched {
namespace detail {
inline void switch_context(Context& from, Context& to) noexcept { fsched_switch_aarch64_aapcs(&from.sp, to.sp); }
#else
void switch_context(Context& from, Context& to) noexcept;
#endif

}  // namespace detail
}  // namespace fsched
