// ---------------------------------------------------------------------------
// The context-switch backend: the one cascade that picks it, the only place that names the
// backend files (a part that needs what a backend defines, such as context_stack_reserve,
// includes this file, never a backend's own).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"
#include "context.hpp"
#include "impl/common.ipp"
#include "impl/os.ipp"

// The context-switch backend, chosen here and nowhere else (see context.hpp): assembly where
// there is a routine for the ABI and the compiler takes GNU inline assembly (on Windows:
// MinGW-w64 g++, clang, clang-cl), else the Win32 fiber API on Windows (MSVC's cl.exe, or
// where FIBER_SCHED_USE_WINFIBER asks for it) and ucontext on POSIX systems (or where
// FIBER_SCHED_USE_UCONTEXT asks for it). On macOS clang defines __x86_64__, or __aarch64__
// (and __arm64__) on Apple silicon: the System V and AAPCS64 routines serve there too,
// spelled for Mach-O by context_asm_directives.ipp (ELF elsewhere).
// The assembly backends' shared macros, outside the cascade's branches: each backend that
// uses them includes them too, and a part inlined first inside one branch could not be
// included from another (amalgamate.py). Each file defines nothing where it does not apply.
#include "impl/context_x86_64_fp.ipp"
#include "impl/context_asm_directives.ipp"
#if defined(_WIN32) && defined(FIBER_SCHED_USE_UCONTEXT)
#error "fiber_sched: FIBER_SCHED_USE_UCONTEXT: Windows has no ucontext; FIBER_SCHED_USE_WINFIBER selects the Win32 fiber backend."
#elif defined(_WIN32) && defined(FIBER_SCHED_X86_64_ASM_SWITCH)  // context.hpp
#include "impl/context_x86_64_win64.ipp"
#elif defined(_WIN32)
#include "impl/context_winfiber.ipp"
#elif defined(FIBER_SCHED_X86_64_ASM_SWITCH)
#include "impl/context_x86_64_sysv.ipp"
#elif !defined(FIBER_SCHED_USE_UCONTEXT) && defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include "impl/context_aarch64_aapcs.ipp"
#elif !defined(FIBER_SCHED_USE_UCONTEXT) && defined(__riscv) && __riscv_xlen == 64 && \
    defined(__riscv_float_abi_double) && (defined(__GNUC__) || defined(__clang__))
#include "impl/context_riscv64_lp64d.ipp"
#elif defined(FIBER_SCHED_USE_UCONTEXT) || defined(__unix__) || defined(__APPLE__)
#include "impl/context_ucontext.ipp"
#else
#error "fiber_sched: no context-switch backend for this target. On a POSIX system define FIBER_SCHED_USE_UCONTEXT; to port, add src/impl/context_<abi>.ipp (the trio in src/context.hpp) and a branch to this cascade in src/impl/context_backend.ipp (see src/README.md)."
#endif

namespace fsched {
namespace detail {

#if !defined(FIBER_SCHED_CONTEXT_OWN_STACKS)
// Every backend but winfiber runs a context on the stack make_context() was given, so a
// fiber's frames, and any Fiber object made in them, lie in [stack_lo, stack_lo + size)
// (winfiber's OS makes each fiber a stack of its own: its file has these two).
FIBER_SCHED_ALWAYS_INLINE inline bool in_running_frames(const void* at, const char* stack_lo,
                                                        std::size_t size) noexcept {
    return static_cast<const char*>(at) >= stack_lo && static_cast<const char*>(at) < stack_lo + size;
}
inline void frames_range(const char* stack_lo, std::size_t size, const char*& lo, const char*& hi) noexcept {
    lo = stack_lo;
    hi = stack_lo + size;
}
#endif

}  // namespace detail
}  // namespace fsched

#undef FIBER_SCHED_CONTEXT_OWN_STACKS
#undef FIBER_SCHED_X86_SAVE_FP
#undef FIBER_SCHED_X86_LOAD_FP
#undef FIBER_SCHED_X86_LOAD_FP_COLD
#undef FIBER_SCHED_ASM_FUNCTION_BEGIN
#undef FIBER_SCHED_ASM_FUNCTION_END
#undef FIBER_SCHED_ASM_FUNCTION_TYPE
