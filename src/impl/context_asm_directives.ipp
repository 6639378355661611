// ---------------------------------------------------------------------------
// The assembler directives around each routine of the System V and AAPCS64 switch backends
// (context_x86_64_sysv.ipp, context_aarch64_aapcs.ipp), for the two object formats they
// are assembled into: ELF (Linux, the BSDs) and Mach-O (macOS).
//
//   FIBER_SCHED_ASM_FUNCTION_BEGIN(name)   a global, hidden, 16-byte aligned function
//                                          `name` starts here
//   FIBER_SCHED_ASM_FUNCTION_END(name)     and ends here
//
// `name` is the C name, the one the C++ side declares extern "C". Mach-O spells a C
// symbol with a leading underscore, marks it hidden with .private_extern, and has no
// .type or .size. ELF: .hidden, .type (@function; %function on aarch64, where @ starts
// a comment) and .size, so that debuggers and profilers see each routine's extent.
// Undefined again after the backend cascade (fiber_sched.hpp).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

#if !defined(_WIN32)
#if defined(__APPLE__)
#define FIBER_SCHED_ASM_FUNCTION_BEGIN(name) \
    ".globl _" #name "\n"                    \
    ".private_extern _" #name "\n"           \
    ".p2align 4\n"                           \
    "_" #name ":\n"
#define FIBER_SCHED_ASM_FUNCTION_END(name) ""
#else
#if defined(__aarch64__) || defined(__riscv)
#define FIBER_SCHED_ASM_FUNCTION_TYPE "%function"  // @ starts a comment in their assemblers

#else
#define FIBER_SCHED_ASM_FUNCTION_TYPE "@function"
#endif
#define FIBER_SCHED_ASM_FUNCTION_BEGIN(name)                   \
    ".globl " #name "\n"                                       \
    ".hidden " #name "\n"                                      \
    ".type " #name "," FIBER_SCHED_ASM_FUNCTION_TYPE "\n"      \
    ".p2align 4\n"                                             \
    #name ":\n"
#define FIBER_SCHED_ASM_FUNCTION_END(name) ".size " #name ",.-" #name "\n"
#endif
#endif  // !_WIN32
