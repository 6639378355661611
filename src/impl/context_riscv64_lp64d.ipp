// ---------------------------------------------------------------------------
// Context switch for RISC-V 64, the LP64D ABI (hard-float double; Linux, BSDs).
//
// Callee-saved state (RISC-V psABI, integer and floating-point calling conventions): s0-s11
// (s0 is the frame pointer), sp, fs0-fs11 (the full 64 bits: with FLEN 64 all of each is
// saved), and the dynamic rounding mode frm (unless FIBER_SCHED_SWITCH_FP_CONTROL is 0).
// ra is not callee-saved but is where a switch returns, so the frame holds it too.
// fsched_switch_context(void** save_sp, void* load_sp) stores that state in a 208-byte frame
// below sp, stores sp to *save_sp, loads load_sp, reloads the other side's frame and returns
// through its ra. sp stays 16-byte aligned, as the psABI requires.
//
//   sp + 0    s0  s1         sp + 104  fs0  fs1
//   sp + 16   s2  s3         sp + 120  fs2  fs3
//   sp + 32   s4  s5         sp + 136  fs4  fs5
//   sp + 48   s6  s7         sp + 152  fs6  fs7
//   sp + 64   s8  s9         sp + 168  fs8  fs9
//   sp + 80   s10 s11        sp + 184  fs10 fs11
//   sp + 96   ra             sp + 200  frm
//
// A fresh context holds the same frame with ra = the trampoline, the entry function in s1,
// its argument in s2, and s0 = 0 (no frame above).
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "impl/context_asm_directives.ipp"

extern "C" void fsched_trampoline_riscv64_lp64d() noexcept FIBER_SCHED_HIDDEN;

// FIBER_SCHED_SWITCH_FP_CONTROL 0 keeps the frm slot (one frame layout) but neither fills
// nor reads it.
#if FIBER_SCHED_SWITCH_FP_CONTROL
#define FIBER_SCHED_SAVE_FP "    frrm t0\n    sd t0, 200(sp)\n"
#define FIBER_SCHED_LOAD_FP "    ld t0, 200(sp)\n    fsrm t0\n"
#else
#define FIBER_SCHED_SAVE_FP ""
#define FIBER_SCHED_LOAD_FP ""
#endif

__asm__(
    ".text\n"
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_switch_context)  // context_asm_directives.ipp
    "    addi sp, sp, -208\n"
    "    sd s0, 0(sp)\n"
    "    sd s1, 8(sp)\n"
    "    sd s2, 16(sp)\n"
    "    sd s3, 24(sp)\n"
    "    sd s4, 32(sp)\n"
    "    sd s5, 40(sp)\n"
    "    sd s6, 48(sp)\n"
    "    sd s7, 56(sp)\n"
    "    sd s8, 64(sp)\n"
    "    sd s9, 72(sp)\n"
    "    sd s10, 80(sp)\n"
    "    sd s11, 88(sp)\n"
    "    sd ra, 96(sp)\n"
    "    fsd fs0, 104(sp)\n"
    "    fsd fs1, 112(sp)\n"
    "    fsd fs2, 120(sp)\n"
    "    fsd fs3, 128(sp)\n"
    "    fsd fs4, 136(sp)\n"
    "    fsd fs5, 144(sp)\n"
    "    fsd fs6, 152(sp)\n"
    "    fsd fs7, 160(sp)\n"
    "    fsd fs8, 168(sp)\n"
    "    fsd fs9, 176(sp)\n"
    "    fsd fs10, 184(sp)\n"
    "    fsd fs11, 192(sp)\n"
    FIBER_SCHED_SAVE_FP
    "    sd sp, 0(a0)\n"
    "    mv sp, a1\n"
    "    ld s0, 0(sp)\n"
    "    ld s1, 8(sp)\n"
    "    ld s2, 16(sp)\n"
    "    ld s3, 24(sp)\n"
    "    ld s4, 32(sp)\n"
    "    ld s5, 40(sp)\n"
    "    ld s6, 48(sp)\n"
    "    ld s7, 56(sp)\n"
    "    ld s8, 64(sp)\n"
    "    ld s9, 72(sp)\n"
    "    ld s10, 80(sp)\n"
    "    ld s11, 88(sp)\n"
    "    ld ra, 96(sp)\n"
    "    fld fs0, 104(sp)\n"
    "    fld fs1, 112(sp)\n"
    "    fld fs2, 120(sp)\n"
    "    fld fs3, 128(sp)\n"
    "    fld fs4, 136(sp)\n"
    "    fld fs5, 144(sp)\n"
    "    fld fs6, 152(sp)\n"
    "    fld fs7, 160(sp)\n"
    "    fld fs8, 168(sp)\n"
    "    fld fs9, 176(sp)\n"
    "    fld fs10, 184(sp)\n"
    "    fld fs11, 192(sp)\n"
    FIBER_SCHED_LOAD_FP
    "    addi sp, sp, 208\n"
    "    ret\n"
    FIBER_SCHED_ASM_FUNCTION_END(fsched_switch_context)
    "\n"
    FIBER_SCHED_ASM_FUNCTION_BEGIN(fsched_trampoline_riscv64_lp64d)
    "    .cfi_startproc\n"
    // No caller above this frame: unwinders and debuggers stop here.
    "    .cfi_undefined ra\n"
    "    mv a0, s2\n"
    "    jalr s1\n"
    // The entry function never returns; trap if it ever does.
    "    ebreak\n"
    "    .cfi_endproc\n"
    FIBER_SCHED_ASM_FUNCTION_END(fsched_trampoline_riscv64_lp64d));

#undef FIBER_SCHED_SAVE_FP
#undef FIBER_SCHED_LOAD_FP

namespace fsched {
namespace detail {

const char* const backend_name = "asm-riscv64";
// Nothing of the switch stays on a fiber's stack beyond its frames.
constexpr std::size_t context_stack_reserve = 0;
constexpr std::size_t context_stack_record = 0;

struct Riscv64SwitchFrame {
    void* s0_s11[12];
    void* ra;
    double fs0_fs11[12];
    std::uint64_t frm;
};
static_assert(offsetof(Riscv64SwitchFrame, ra) == 96, "layout drawn above the switch routine");
static_assert(offsetof(Riscv64SwitchFrame, fs0_fs11) == 104, "fs0 slot");
static_assert(offsetof(Riscv64SwitchFrame, frm) == 200, "frm slot");
static_assert(sizeof(Riscv64SwitchFrame) == 208 && sizeof(Riscv64SwitchFrame) % 16 == 0,
              "the switch routine reserves 208 bytes, keeping sp 16-byte aligned");

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    auto top = (reinterpret_cast<std::uintptr_t>(stack_lo) + size) & ~std::uintptr_t{15};
    // After the switch pops the frame, sp = top - 16: 16-byte aligned at the entry's call.
    auto* frame = reinterpret_cast<Riscv64SwitchFrame*>(top - 16 - sizeof(Riscv64SwitchFrame));
    *frame = Riscv64SwitchFrame{};
    std::uint64_t frm = 0;
    // A new fiber starts with the creating thread's rounding mode.
    __asm__ volatile("frrm %0" : "=r"(frm));
    frame->frm = frm;
    frame->s0_s11[1] = reinterpret_cast<void*>(entry);
    frame->s0_s11[2] = arg;
    frame->ra = reinterpret_cast<void*>(&fsched_trampoline_riscv64_lp64d);
    ctx.sp = frame;
}

void release_context(Context&) noexcept {}

bool saved_frame(const Context& ctx, SavedFrame& out) noexcept {
    const auto* frame = static_cast<const Riscv64SwitchFrame*>(ctx.sp);
    if (!frame) return false;
    out.pc = reinterpret_cast<std::uintptr_t>(frame->ra);
    out.fp = reinterpret_cast<std::uintptr_t>(frame->s0_s11[0]);
    out.sp = reinterpret_cast<std::uintptr_t>(frame);
    return true;
}

}  // namespace detail
}  // namespace fsched
