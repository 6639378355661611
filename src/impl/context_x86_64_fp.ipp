// ---------------------------------------------------------------------------
// The floating-point control state in the x86-64 switch routines (context_x86_64_sysv.ipp,
// context_x86_64_win64.ipp): MXCSR and the x87 control word, kept in the frame's first
// 8 bytes on the stack being left (MXCSR in bytes 0-3, the x87 word in 4-5, 6-7 zero), and
// loaded from the frame being entered only where its control bits differ from the running
// ones, which they almost never do.
//
// Both ABIs make MXCSR's control bits (rounding, FTZ/DAZ, exception masks) and the x87
// control word callee-saved, and MXCSR's six status bits (the sticky exception flags that
// fetestexcept() reads) caller-saved. So a switch keeps each fiber's control bits and leaves
// the status flags as the thread has them. Loading the words on every switch, as
// Boost.Context does, costs an Intel core about 35 ns a load whenever the two words differ
// at all, status flags included: a thread that has rounded one division has the precision
// flag, which a fiber made before that lacks (75 ns a round trip against 8 ns).
//
// The routine's caller reads the running words (detail::switch_context() in context.hpp,
// stmxcsr and fnstcw into its frame) and passes them in a register, which the routine
// stores and compares with the entered frame's: reading them back from the routine's own
// frame after stmxcsr cost 0.8 ns more a round trip (docs/performance-notes.md, "The
// switch's FP control state, third round").
//
// FIBER_SCHED_X86_SAVE_FP(W)  stores W, the register with the running words (the routine's
//                             third argument), at (%rsp) on the stack being left;
// FIBER_SCHED_X86_LOAD_FP(W)  once rsp is the frame being entered: compares, and branches
//                             out of line to
// FIBER_SCHED_X86_LOAD_FP_COLD(W), which the routine places after its final jump: it loads
//                             the entered frame's control bits with the running status
//                             flags (running ^ (differences & ~0x3f)), written over its slot.
// rax and r11 are scratch (caller-saved in both ABIs, unused by both routines there).
// FIBER_SCHED_SWITCH_FP_CONTROL 0 keeps the slot (one frame layout) but neither fills nor
// reads it. Undefined again after the backend cascade (context_backend.ipp).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#if FIBER_SCHED_SWITCH_FP_CONTROL
#define FIBER_SCHED_X86_SAVE_FP(words) "    movq " words ", (%rsp)\n"
// The control bits: MXCSR's bits 6-31 and the x87 word's 0-15 (bits 32-47 here).
#define FIBER_SCHED_X86_LOAD_FP(words)        \
    "    movq (%rsp), %rax\n"                 \
    "    xorq " words ", %rax\n"              \
    "    movabsq $0xffffffffffc0, %r11\n"     \
    "    testq %r11, %rax\n"                  \
    "    jnz 71f\n"                           \
    "70:\n"
#define FIBER_SCHED_X86_LOAD_FP_COLD(words)   \
    "71:\n"                                   \
    "    andq $-64, %rax\n"                   \
    "    xorq " words ", %rax\n"              \
    "    movq %rax, (%rsp)\n"                 \
    "    ldmxcsr (%rsp)\n"                    \
    "    fldcw 4(%rsp)\n"                     \
    "    jmp 70b\n"
#else
#define FIBER_SCHED_X86_SAVE_FP(words) ""
#define FIBER_SCHED_X86_LOAD_FP(words) ""
#define FIBER_SCHED_X86_LOAD_FP_COLD(words) ""
#endif
#endif  // x86-64 with GNU inline assembly
