// ---------------------------------------------------------------------------
// Context switch for aarch64, AAPCS64 (Linux, BSDs, and macOS on Apple silicon, whose arm64
// ABI keeps the same callee-saved registers; context_asm_directives.ipp spells the
// routines' symbols for ELF or Mach-O). x18 is never touched: Apple (and Windows) reserve
// it as the platform register, so the only scratch register here is x9.
//
// Callee-saved state: x19-x28, the frame pointer x29, the link register x30, sp, the low
// halves d8-d15 of v8-v15, and FPCR (unless FIBER_SCHED_SWITCH_FP_CONTROL is 0). fsched_switch_context(void** save_sp,
// void* load_sp) stores that state in a 176-byte frame below sp, stores sp to *save_sp,
// loads load_sp, reloads the other side's frame and returns through its x30.
//
//   sp + 0    x19 x20        sp + 96   d8  d9
//   sp + 16   x21 x22        sp + 112  d10 d11
//   sp + 32   x23 x24        sp + 128  d12 d13
//   sp + 48   x25 x26        sp + 144  d14 d15
//   sp + 64   x27 x28        sp + 160  FPCR, padding
//   sp + 80   x29 x30
//
// A fresh context holds the same frame with x30 = the trampoline, the entry function in
// x19 and its argument in x20.
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "impl/context_asm_directives.ipp"

extern "C" void fsched_trampoline_aarch64_aapcs() noexcept FIBER_SCHED_HIDDEN;

// FIBER_SCHED_SWITCH_FP_CONTROL 0 keeps the FPCR slot (one frame layout) but neither fills
// nor reads it.
#if FIBER_SCHED_SWITCH_FP_CONTROL
#define FIBER_SCHED_SAVE_FP "    mrs x9, fpcr\n    str x9, [sp, #160]\n"
#define FIBER_SCHED_LOAD_FP "    ldr x9, [sp, #160]\n    msr fpcr, x9\n"
#else
#define FIBER_SCHED_SAVE_FP ""
#define FIBER_SCHED_LOAD_FP ""
#endif

__asm__(
    ".text\n"
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_switch_context)  // context_asm_directives.ipp
    "    sub sp, sp, #176\n"
    "    stp x19, x20, [sp, #0]\n"
    "    stp x21, x22, [sp, #16]\n"
    "    stp x23, x24, [sp, #32]\n"
    "    stp x25, x26, [sp, #48]\n"
    "    stp x27, x28, [sp, #64]\n"
    "    stp x29, x30, [sp, #80]\n"
    "    stp d8, d9, [sp, #96]\n"
    "    stp d10, d11, [sp, #112]\n"
    "    stp d12, d13, [sp, #128]\n"
    "    stp d14, d15, [sp, #144]\n"
    FIBER_SCHED_SAVE_FP
    "    mov x9, sp\n"
    "    str x9, [x0]\n"
    "    mov sp, x1\n"
    "    ldp x19, x20, [sp, #0]\n"
    "    ldp x21, x22, [sp, #16]\n"
    "    ldp x23, x24, [sp, #32]\n"
    "    ldp x25, x26, [sp, #48]\n"
    "    ldp x27, x28, [sp, #64]\n"
    "    ldp x29, x30, [sp, #80]\n"
    "    ldp d8, d9, [sp, #96]\n"
    "    ldp d10, d11, [sp, #112]\n"
    "    ldp d12, d13, [sp, #128]\n"
    "    ldp d14, d15, [sp, #144]\n"
    FIBER_SCHED_LOAD_FP
    "    add sp, sp, #176\n"
    "    ret\n"
    FIBER_SCHED_ASM_FUNCTION_END(fsched_switch_context)
    "\n"
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_trampoline_aarch64_aapcs)
    "    .cfi_startproc\n"
    // No caller above this frame: unwinders and debuggers stop here.
    "    .cfi_undefined x30\n"
    "    mov x0, x20\n"
    "    blr x19\n"
    // The entry function never returns; trap if it ever does.
    "    brk #0\n"
    "    .cfi_endproc\n"
    FIBER_SCHED_ASM_FUNCTION_END(fsched_trampoline_aarch64_aapcs));

#undef FIBER_SCHED_SAVE_FP
#undef FIBER_SCHED_LOAD_FP

namespace fsched {
namespace detail {

const char* const backend_name = "asm-aarch64";
// Nothing of the switch stays on a fiber's stack beyond its frames.
constexpr std::size_t context_stack_reserve = 0;
constexpr std::size_t context_stack_record = 0;

struct Aarch64SwitchFrame {
    void* x19_x28[10];
    void* x29;
    void* x30;
    double d8_d15[8];
    std::uint64_t fpcr;
    std::uint64_t padding;
};
static_assert(offsetof(Aarch64SwitchFrame, x29) == 80, "layout drawn above the switch routine");
static_assert(offsetof(Aarch64SwitchFrame, d8_d15) == 96, "d8 slot");
static_assert(offsetof(Aarch64SwitchFrame, fpcr) == 160, "FPCR slot");
static_assert(sizeof(Aarch64SwitchFrame) == 176, "the switch routine reserves 176 bytes");

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    auto top = (reinterpret_cast<std::uintptr_t>(stack_lo) + size) & ~std::uintptr_t{15};
    // sp stays 16-byte aligned, as AAPCS64 requires at every access through it.
    auto* frame = reinterpret_cast<Aarch64SwitchFrame*>(top - 16 - sizeof(Aarch64SwitchFrame));
    *frame = Aarch64SwitchFrame{};
    std::uint64_t fpcr = 0;
    // A new fiber starts with the creating thread's floating-point modes.
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    frame->fpcr = fpcr;
    frame->x19_x28[0] = reinterpret_cast<void*>(entry);
    frame->x19_x28[1] = arg;
    frame->x30 = reinterpret_cast<void*>(&fsched_trampoline_aarch64_aapcs);
    ctx.sp = frame;
}

void release_context(Context&) noexcept {}

bool saved_frame(const Context& ctx, SavedFrame& out) noexcept {
    const auto* frame = static_cast<const Aarch64SwitchFrame*>(ctx.sp);
    if (!frame) return false;
    out.pc = reinterpret_cast<std::uintptr_t>(frame->x30);
    out.fp = reinterpret_cast<std::uintptr_t>(frame->x29);
    out.sp = reinterpret_cast<std::uintptr_t>(frame);
    return true;
}

}  // namespace detail
}  // namespace fsched
