// ---------------------------------------------------------------------------
// Context switch for x86-64, Microsoft x64 ABI (Windows; MinGW-w64 g++, clang for
// x86_64-w64-mingw32 or x86_64-pc-windows-msvc, clang-cl: compilers with GNU inline
// assembly; MSVC's cl.exe has none and gets the winfiber backend).
//
// Callee-saved state: rbx, rbp, rdi, rsi, r12-r15, xmm6-xmm15, the MXCSR control bits and
// the x87 control word; and three fields of the Thread Information Block (the TEB, at gs:0)
// that describe the running stack:
//   gs:0x08    StackBase           the top of the stack
//   gs:0x10    StackLimit          its lowest usable byte
//   gs:0x1478  DeallocationStack   the lowest byte of its allocation
//   gs:0x00    ExceptionList       unused by Windows on x64; wine keeps its own handler
//                                  frames there, and walks them by address with the stack
// Windows' unwinder (RtlUnwindEx, behind SEH and the C++ exceptions of MinGW and MSVC alike)
// rejects any frame outside [StackLimit, StackBase], so these follow the fiber (under wine,
// a thread's ExceptionList frames would otherwise be taken for frames of the fiber); the
// fiber-local storage and fiber data fields (gs:0x20, gs:0x17c8) are not switched: these
// fibers are not OS fibers, so the thread's stay the thread's (docs/things-to-know.md).
//
// fsched_switch_context(void** save_sp, void* load_sp), with save_sp in rcx and load_sp in
// rdx (with the FP control, fsched_switch_context_fp(..., uint64_t fp_control), the FP words
// from the caller, context.hpp, in r8), pushes that state onto the running stack, stores rsp
// to *save_sp, loads load_sp and pops the other side's state. A switched-out stack, from its saved sp upwards:
//
//   sp + 0     MXCSR (4 bytes) | x87 control word (2 bytes) | padding
//   sp + 8     DeallocationStack
//   sp + 16    StackLimit
//   sp + 24    StackBase
//   sp + 32    xmm6   (16 bytes each, 16-byte aligned: sp % 16 == 0)
//   ...
//   sp + 176   xmm15
//   sp + 192   ExceptionList (here: the slot keeps the xmm ones aligned, as the call left
//              rsp % 16 == 8)
//   sp + 200   r15
//   sp + 208   r14
//   sp + 216   r13
//   sp + 224   r12
//   sp + 232   rsi
//   sp + 240   rdi
//   sp + 248   rbx
//   sp + 256   rbp
//   sp + 264   return address
//
// A fresh context holds the same frame with the trampoline as its return address, the entry
// function in r12 and its argument in r13, the stack's bounds in the TIB slots, and above
// it a null return address for the trampoline, whose unwind data ends every walk there, and
// the top slot, the stack record: the StackLimit the stack's last fiber left (make_context).
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"
#include "impl/common.ipp"
// The OS layer itself, not only its interface: query_stack_bounds() is os_win32.ipp's own.
#include "impl/os_layer.ipp"
#include "impl/context_x86_64_fp.ipp"

extern "C" void fsched_trampoline_x86_64_win64() noexcept;

// The routine's name, the one context.hpp declares.
#if FIBER_SCHED_SWITCH_FP_CONTROL
#define FIBER_SCHED_WIN64_SWITCH "fsched_switch_context_fp"
#else
#define FIBER_SCHED_WIN64_SWITCH "fsched_switch_context"
#endif

__asm__(
    ".text\n"
    ".globl " FIBER_SCHED_WIN64_SWITCH "\n"
    ".def " FIBER_SCHED_WIN64_SWITCH "; .scl 2; .type 32; .endef\n"
    ".p2align 4\n"
    FIBER_SCHED_WIN64_SWITCH ":\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %rdi\n"
    "    pushq %rsi\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $200, %rsp\n"
    "    movaps %xmm6, 32(%rsp)\n"
    "    movaps %xmm7, 48(%rsp)\n"
    "    movaps %xmm8, 64(%rsp)\n"
    "    movaps %xmm9, 80(%rsp)\n"
    "    movaps %xmm10, 96(%rsp)\n"
    "    movaps %xmm11, 112(%rsp)\n"
    "    movaps %xmm12, 128(%rsp)\n"
    "    movaps %xmm13, 144(%rsp)\n"
    "    movaps %xmm14, 160(%rsp)\n"
    "    movaps %xmm15, 176(%rsp)\n"
    FIBER_SCHED_X86_SAVE_FP("%r8")  // context_x86_64_fp.ipp
    "    movq %gs:0x1478, %rax\n"
    "    movq %rax, 8(%rsp)\n"
    "    movq %gs:0x10, %rax\n"
    "    movq %rax, 16(%rsp)\n"
    "    movq %gs:0x08, %rax\n"
    "    movq %rax, 24(%rsp)\n"
    "    movq %gs:0x00, %rax\n"
    "    movq %rax, 192(%rsp)\n"
    "    movq %rsp, (%rcx)\n"
    "    movq %rdx, %rsp\n"
    "    movq 24(%rsp), %rax\n"
    "    movq %rax, %gs:0x08\n"
    "    movq 16(%rsp), %rax\n"
    "    movq %rax, %gs:0x10\n"
    "    movq 8(%rsp), %rax\n"
    "    movq %rax, %gs:0x1478\n"
    "    movq 192(%rsp), %rax\n"
    "    movq %rax, %gs:0x00\n"
    FIBER_SCHED_X86_LOAD_FP("%r8")
    "    movaps 32(%rsp), %xmm6\n"
    "    movaps 48(%rsp), %xmm7\n"
    "    movaps 64(%rsp), %xmm8\n"
    "    movaps 80(%rsp), %xmm9\n"
    "    movaps 96(%rsp), %xmm10\n"
    "    movaps 112(%rsp), %xmm11\n"
    "    movaps 128(%rsp), %xmm12\n"
    "    movaps 144(%rsp), %xmm13\n"
    "    movaps 160(%rsp), %xmm14\n"
    "    movaps 176(%rsp), %xmm15\n"
    "    addq $200, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rsi\n"
    "    popq %rdi\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    // pop + jmp instead of ret: the return-stack predictor would guess the caller of this
    // call, which is never where a switch returns, and mispredict every switch.
    "    popq %r10\n"
    "    jmpq *%r10\n"
    FIBER_SCHED_X86_LOAD_FP_COLD("%r8")
    "\n"
    ".globl fsched_trampoline_x86_64_win64\n"
    ".def fsched_trampoline_x86_64_win64; .scl 2; .type 32; .endef\n"
    ".p2align 4\n"
    // Entered by the switch's jmp with rsp on the null return address and 16-byte aligned
    // (where a switch's caller resumes). Its unwind data says: 32 bytes of frame, then the
    // return address, so an unwinder leaving the entry function lands on that null and stops.
    ".seh_proc fsched_trampoline_x86_64_win64\n"
    "fsched_trampoline_x86_64_win64:\n"
    "    subq $32, %rsp\n"  // the callee's 32-byte home area; rsp % 16 == 0 at the call
    "    .seh_stackalloc 32\n"
    "    .seh_endprologue\n"
    "    movq %r13, %rcx\n"
    "    callq *%r12\n"
    // The entry function never returns; trap if it ever does.
    "    ud2\n"
    "    nop\n"  // the return address of the call must lie inside the function's range
    ".seh_endproc\n");

#undef FIBER_SCHED_WIN64_SWITCH

namespace fsched {
namespace detail {

const char* const backend_name = "asm-x86_64-win64";
// Nothing of the switch stays on a fiber's stack beyond its frames.
constexpr std::size_t context_stack_reserve = 0;
// The stack record (make_context): the last StackLimit of the stack's fibers, in its top word.
constexpr std::size_t context_stack_record = sizeof(std::uintptr_t);

struct alignas(16) Win64SwitchFrame {
    std::uint32_t mxcsr;
    std::uint16_t x87_control;
    std::uint16_t padding0;
    void* deallocation_stack;
    void* stack_limit;
    void* stack_base;
    unsigned char xmm[10][16];
    void* exception_list;
    void* r15;
    void* r14;
    void* r13;
    void* r12;
    void* rsi;
    void* rdi;
    void* rbx;
    void* rbp;
    void* return_address;
};
static_assert(offsetof(Win64SwitchFrame, deallocation_stack) == 8, "layout drawn above the switch routine");
static_assert(offsetof(Win64SwitchFrame, stack_limit) == 16, "TIB StackLimit slot");
static_assert(offsetof(Win64SwitchFrame, stack_base) == 24, "TIB StackBase slot");
static_assert(offsetof(Win64SwitchFrame, xmm) == 32, "xmm6 slot, 16-byte aligned");
static_assert(offsetof(Win64SwitchFrame, exception_list) == 192, "TIB ExceptionList slot");
static_assert(offsetof(Win64SwitchFrame, r15) == 200, "first pushed register (the last pushed)");
static_assert(offsetof(Win64SwitchFrame, r13) == 216, "entry argument slot");
static_assert(offsetof(Win64SwitchFrame, r12) == 224, "entry function slot");
static_assert(offsetof(Win64SwitchFrame, rbp) == 256, "first push");
static_assert(offsetof(Win64SwitchFrame, return_address) == 264, "return address slot");
static_assert(sizeof(Win64SwitchFrame) == 272, "the switch routine pops 264 bytes and the return address");

// The end of the stack that ends at or a little above `top`: stacks are whole pages.
inline std::uintptr_t stack_record_end(std::uintptr_t top) noexcept {
    const std::uintptr_t page = os::page_size();
    return (top + page - 1) / page * page;
}

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    const auto lo = reinterpret_cast<std::uintptr_t>(stack_lo);
    const auto top = (lo + size) & ~std::uintptr_t{15};
    // The trampoline's null return address sits at top - 16 (the stack record above it); the
    // frame directly below, 16-byte aligned for the xmm slots. After the switch pops the
    // frame, rsp = top - 16, aligned as where a caller of the switch resumes, and the
    // trampoline's 32-byte home area keeps it aligned at its call.
    reinterpret_cast<void**>(top - 16)[0] = nullptr;
    auto* frame = reinterpret_cast<Win64SwitchFrame*>(top - 16 - sizeof(Win64SwitchFrame));
    std::memset(static_cast<void*>(frame), 0, sizeof(Win64SwitchFrame));
    std::uint32_t mxcsr = 0;
    std::uint16_t x87_control = 0;
    // A new fiber starts with the creating thread's floating-point modes.
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87_control));
    frame->mxcsr = mxcsr;
    frame->x87_control = x87_control;
    // StackBase is the top; DeallocationStack the reservation's base, below the guard, and
    // StackLimit the lowest committed byte, where the stack grows (os_win32.ipp). Both are
    // the stack's lowest byte on a slab's stack, committed whole. A pooled stack keeps the
    // pages it committed: its last fiber's StackLimit is kept in the top slot (the
    // stack_record), with bit 0 set for a guarded stack; a new stack asks the OS.
    // The record is at the stack's own top, above a Fiber that lives in the stack (those
    // pass a size up to a page short of it: FiberAccess::make_in_stack leaves that slot).
    auto* record = reinterpret_cast<std::uintptr_t*>(stack_record_end(lo + size) - context_stack_record);
    const std::uintptr_t kept = *record & ~std::uintptr_t{1};
    if (kept >= lo && kept < top && kept % os::page_size() == 0) {
        const bool guarded = (*record & 1) != 0;
        frame->stack_limit = reinterpret_cast<void*>(kept);
        frame->deallocation_stack = guarded ? static_cast<char*>(stack_lo) - os::guard_size() : stack_lo;
    } else {
        const os::StackBounds bounds = os::query_stack_bounds(stack_lo, size);
        frame->stack_limit = bounds.limit;
        frame->deallocation_stack = bounds.deallocation;
        *record = reinterpret_cast<std::uintptr_t>(bounds.limit) | (bounds.guarded ? 1u : 0u);
    }
    frame->stack_base = reinterpret_cast<void*>(lo + size);
    // An empty handler list, as wine's CreateFiber sets it (and Windows never reads it).
    frame->exception_list = reinterpret_cast<void*>(~std::uintptr_t{0});
    frame->r13 = arg;
    frame->r12 = reinterpret_cast<void*>(entry);
    frame->return_address = reinterpret_cast<void*>(&fsched_trampoline_x86_64_win64);
    ctx.sp = frame;
}

bool saved_frame(const Context& ctx, SavedFrame& out) noexcept {
    const auto* frame = static_cast<const Win64SwitchFrame*>(ctx.sp);
    if (!frame) return false;
    out.pc = reinterpret_cast<std::uintptr_t>(frame->return_address);
    out.fp = reinterpret_cast<std::uintptr_t>(frame->rbp);
    out.sp = reinterpret_cast<std::uintptr_t>(frame);
    return true;
}

// The context's last switch-out saved the TIB's StackLimit in its frame: kept in the top
// slot for the stack's next fiber (make_context), with the guarded bit already there.
void release_context(Context& ctx) noexcept {
    if (!ctx.sp) return;
    const auto* frame = static_cast<const Win64SwitchFrame*>(ctx.sp);
    auto* record = reinterpret_cast<std::uintptr_t*>(stack_record_end(reinterpret_cast<std::uintptr_t>(frame->stack_base)) -
                                                      context_stack_record);
    *record = reinterpret_cast<std::uintptr_t>(frame->stack_limit) | (*record & 1);
    ctx.sp = nullptr;
}

}  // namespace detail
}  // namespace fsched
