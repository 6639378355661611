// ---------------------------------------------------------------------------
// Context switch for x86-64, System V ABI (Linux, BSDs, macOS use the same registers;
// context_asm_directives.ipp spells the routines' symbols for ELF or Mach-O).
//
// Callee-saved state: rbx, rbp, r12-r15, the MXCSR control bits and the x87 control word
// (these two unless FIBER_SCHED_SWITCH_FP_CONTROL is 0; loaded only where they differ,
// context_x86_64_fp.ipp).
// fsched_switch_context(void** save_sp, void* load_sp) pushes that state onto the running
// stack, stores rsp to *save_sp, loads load_sp and pops the other side's state; with the FP
// control it is fsched_switch_context_fp(..., uint64_t fp_control), the FP words from the
// caller (context.hpp) in rdx.
// A switched-out stack, from its saved sp upwards:
//
//   sp + 0   MXCSR (4 bytes) | x87 control word (2 bytes) | padding
//   sp + 8   r15
//   sp + 16  r14
//   sp + 24  r13
//   sp + 32  r12
//   sp + 40  rbx
//   sp + 48  rbp
//   sp + 56  return address
//
// A fresh context holds the same frame with the trampoline as its return address,
// the entry function in r12 and its argument in r13.
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "impl/context_x86_64_fp.ipp"
#include "impl/context_asm_directives.ipp"

extern "C" void fsched_trampoline_x86_64_sysv() noexcept FIBER_SCHED_HIDDEN;

#if defined(__CET__)
#define FIBER_SCHED_ENDBR "endbr64\n"
#else
#define FIBER_SCHED_ENDBR ""
#endif

__asm__(
    ".text\n"
#if FIBER_SCHED_SWITCH_FP_CONTROL  // the name context.hpp declares
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_switch_context_fp)  // context_asm_directives.ipp
#else
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_switch_context)
#endif
    FIBER_SCHED_ENDBR
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    FIBER_SCHED_X86_SAVE_FP("%rdx")  // context_x86_64_fp.ipp
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    FIBER_SCHED_X86_LOAD_FP("%rdx")
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    // pop + jmp instead of ret: the return-stack predictor would guess the caller of this
    // call, which is never where a switch returns, and mispredict every switch.
    "    popq %rcx\n"
    "    jmpq *%rcx\n"
    FIBER_SCHED_X86_LOAD_FP_COLD("%rdx")
#if FIBER_SCHED_SWITCH_FP_CONTROL
    FIBER_SCHED_ASM_FUNCTION_END(fsched_switch_context_fp)
#else
    FIBER_SCHED_ASM_FUNCTION_END(fsched_switch_context)
#endif
    "\n"
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_trampoline_x86_64_sysv)
    "    .cfi_startproc\n"
    // No caller above this frame: unwinders and debuggers stop here.
    "    .cfi_undefined rip\n"
    FIBER_SCHED_ENDBR
    "    movq %r13, %rdi\n"
    "    callq *%r12\n"
    // The entry function never returns; trap if it ever does.
    "    ud2\n"
    "    .cfi_endproc\n"
    FIBER_SCHED_ASM_FUNCTION_END(fsched_trampoline_x86_64_sysv));

#undef FIBER_SCHED_ENDBR

namespace fsched {
namespace detail {

const char* const backend_name = "asm-x86_64-sysv";
// Nothing of the switch stays on a fiber's stack beyond its frames.
constexpr std::size_t context_stack_reserve = 0;
constexpr std::size_t context_stack_record = 0;

struct X86_64SwitchFrame {
    std::uint32_t mxcsr;
    std::uint16_t x87_control;
    std::uint16_t padding;
    void* r15;
    void* r14;
    void* r13;
    void* r12;
    void* rbx;
    void* rbp;
    void* return_address;
};
static_assert(offsetof(X86_64SwitchFrame, r15) == 8, "layout drawn above the switch routine");
static_assert(offsetof(X86_64SwitchFrame, r13) == 24, "entry argument slot");
static_assert(offsetof(X86_64SwitchFrame, r12) == 32, "entry function slot");
static_assert(offsetof(X86_64SwitchFrame, return_address) == 56, "return address slot");
static_assert(sizeof(X86_64SwitchFrame) == 64, "the switch routine pops 64 bytes");

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    auto top = (reinterpret_cast<std::uintptr_t>(stack_lo) + size) & ~std::uintptr_t{15};
    // 16 bytes above the frame hold a null "return address" for the trampoline's frame.
    // After `ret` pops the frame, rsp = top - 16, 16-byte aligned, so the `call` in the
    // trampoline enters the entry function with rsp % 16 == 8 as the ABI requires.
    auto* frame = reinterpret_cast<X86_64SwitchFrame*>(top - 16 - sizeof(X86_64SwitchFrame));
    reinterpret_cast<void**>(top - 16)[0] = nullptr;
    reinterpret_cast<void**>(top - 16)[1] = nullptr;
    std::uint32_t mxcsr = 0;
    std::uint16_t x87_control = 0;
    // A new fiber starts with the creating thread's floating-point modes.
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87_control));
    frame->mxcsr = mxcsr;
    frame->x87_control = x87_control;
    frame->padding = 0;
    frame->r15 = frame->r14 = frame->rbx = frame->rbp = nullptr;
    frame->r13 = arg;
    frame->r12 = reinterpret_cast<void*>(entry);
    frame->return_address = reinterpret_cast<void*>(&fsched_trampoline_x86_64_sysv);
    ctx.sp = frame;
}

void release_context(Context&) noexcept {}

bool saved_frame(const Context& ctx, SavedFrame& out) noexcept {
    const auto* frame = static_cast<const X86_64SwitchFrame*>(ctx.sp);
    if (!frame) return false;
    out.pc = reinterpret_cast<std::uintptr_t>(frame->return_address);
    out.fp = reinterpret_cast<std::uintptr_t>(frame->rbp);
    out.sp = reinterpret_cast<std::uintptr_t>(frame);
    return true;
}

}  // namespace detail
}  // namespace fsched
