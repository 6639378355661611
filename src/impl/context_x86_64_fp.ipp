// ---------------------------------------------------------------------------
// The floating-point control state in the x86-64 switch routines (context_x86_64_sysv.ipp,
// context_x86_64_win64.ipp): MXCSR and the x87 control word, saved in the frame's first
// 8 bytes on the stack being left and loaded from the one being entered.
// FIBER_SCHED_SWITCH_FP_CONTROL 0 keeps the slot (one frame layout) but neither fills nor
// reads it. Undefined again after the backend cascade (context_backend.ipp).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#if FIBER_SCHED_SWITCH_FP_CONTROL
#define FIBER_SCHED_X86_SAVE_FP "    stmxcsr (%rsp)\n    fnstcw 4(%rsp)\n"
#define FIBER_SCHED_X86_LOAD_FP "    ldmxcsr (%rsp)\n    fldcw 4(%rsp)\n"
#else
#define FIBER_SCHED_X86_SAVE_FP ""
#define FIBER_SCHED_X86_LOAD_FP ""
#endif
#endif  // x86-64 with GNU inline assembly
