// The context switch: callee-saved and floating-point state survive switches (FTL).
#include "fiber_sched.hpp"
#include "helpers.hpp"

#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

using fsched::Fiber;

// call_with_marked_registers(fn, arg) loads a distinct marker into every callee-saved
// register the ABI names, calls fn(arg), and returns how many registers came back changed.
// fn resumes fibers that scribble over all of them, so a backend that forgets one fails.
extern "C" int call_with_marked_registers(void (*fn)(void*), void* arg);

// Its symbol, as the object format spells it: Mach-O (macOS) puts an underscore before a C
// name and has no .type or .size; ELF's .type says @function, or %function on aarch64.
#if defined(__APPLE__)
#define TEST_MARKED_BEGIN ".globl _call_with_marked_registers\n_call_with_marked_registers:\n"
#define TEST_MARKED_END ""
#elif !defined(_WIN32)
#if defined(__aarch64__)
#define TEST_MARKED_TYPE "%function"
#else
#define TEST_MARKED_TYPE "@function"
#endif
#define TEST_MARKED_BEGIN                                                                 \
    ".globl call_with_marked_registers\n"                                                 \
    ".type call_with_marked_registers," TEST_MARKED_TYPE "\n"                             \
    "call_with_marked_registers:\n"
#define TEST_MARKED_END ".size call_with_marked_registers,.-call_with_marked_registers\n"
#endif

#if defined(__x86_64__) && !defined(_WIN32)  // System V: both Linux backends here, and macOS
#define TEST_HAVE_REGISTER_CHECK 1
// rbx, rbp, r12-r15 get markers; after the call each is compared with its marker.
__asm__(
    ".text\n"
    TEST_MARKED_BEGIN
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    movabsq $0x1111111111111111, %rbx\n"
    "    movabsq $0x2222222222222222, %rbp\n"
    "    movabsq $0x3333333333333333, %r12\n"
    "    movabsq $0x4444444444444444, %r13\n"
    "    movabsq $0x5555555555555555, %r14\n"
    "    movabsq $0x6666666666666666, %r15\n"
    "    movq %rdi, %rax\n"
    "    movq %rsi, %rdi\n"
    "    callq *%rax\n"
    "    xorl %eax, %eax\n"
    "    movabsq $0x1111111111111111, %rcx\n"
    "    cmpq %rcx, %rbx\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    movabsq $0x2222222222222222, %rcx\n"
    "    cmpq %rcx, %rbp\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    movabsq $0x3333333333333333, %rcx\n"
    "    cmpq %rcx, %r12\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    movabsq $0x4444444444444444, %rcx\n"
    "    cmpq %rcx, %r13\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    movabsq $0x5555555555555555, %rcx\n"
    "    cmpq %rcx, %r14\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    movabsq $0x6666666666666666, %rcx\n"
    "    cmpq %rcx, %r15\n"
    "    setne %cl\n"
    "    movzbl %cl, %ecx\n"
    "    addl %ecx, %eax\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    TEST_MARKED_END);

// Overwrites every callee-saved register with garbage, as arbitrary fiber code may.
static void scribble_registers() {
    __asm__ volatile(
        "movq $-1, %%rbx\n\t"
        "movq $-1, %%r12\n\t"
        "movq $-1, %%r13\n\t"
        "movq $-1, %%r14\n\t"
        "movq $-1, %%r15\n\t"
        :
        :
        : "rbx", "r12", "r13", "r14", "r15");
}
#elif defined(__x86_64__) && defined(_WIN32)  // the Microsoft x64 ABI (MinGW-w64, clang)
#define TEST_HAVE_REGISTER_CHECK 1
// rbx, rbp, rdi, rsi, r12-r15 and xmm6-xmm15 (their low halves) get markers (marker i =
// i * 0x0101010101010101 + 0x10); fn is called with the 32-byte home area the ABI wants.
__asm__(
    ".text\n"
    ".globl call_with_marked_registers\n"
    ".def call_with_marked_registers; .scl 2; .type 32; .endef\n"
    "call_with_marked_registers:\n"
    "    pushq %rbx\n"
    "    pushq %rbp\n"
    "    pushq %rdi\n"
    "    pushq %rsi\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $200, %rsp\n"
    "    movups %xmm6, 32(%rsp)\n"
    "    movups %xmm7, 48(%rsp)\n"
    "    movups %xmm8, 64(%rsp)\n"
    "    movups %xmm9, 80(%rsp)\n"
    "    movups %xmm10, 96(%rsp)\n"
    "    movups %xmm11, 112(%rsp)\n"
    "    movups %xmm12, 128(%rsp)\n"
    "    movups %xmm13, 144(%rsp)\n"
    "    movups %xmm14, 160(%rsp)\n"
    "    movups %xmm15, 176(%rsp)\n"
    "    movq %rcx, %rax\n"
    "    movq %rdx, %rcx\n"
    "    movabsq $0x0101010101010101, %r10\n"
    "    movl $0x10, %r11d\n"
    "    movq %r11, %rbx\n    addq %r10, %r11\n"
    "    movq %r11, %rbp\n    addq %r10, %r11\n"
    "    movq %r11, %rdi\n    addq %r10, %r11\n"
    "    movq %r11, %rsi\n    addq %r10, %r11\n"
    "    movq %r11, %r12\n    addq %r10, %r11\n"
    "    movq %r11, %r13\n    addq %r10, %r11\n"
    "    movq %r11, %r14\n    addq %r10, %r11\n"
    "    movq %r11, %r15\n    addq %r10, %r11\n"
    "    movq %r11, %xmm6\n    addq %r10, %r11\n"
    "    movq %r11, %xmm7\n    addq %r10, %r11\n"
    "    movq %r11, %xmm8\n    addq %r10, %r11\n"
    "    movq %r11, %xmm9\n    addq %r10, %r11\n"
    "    movq %r11, %xmm10\n    addq %r10, %r11\n"
    "    movq %r11, %xmm11\n    addq %r10, %r11\n"
    "    movq %r11, %xmm12\n    addq %r10, %r11\n"
    "    movq %r11, %xmm13\n    addq %r10, %r11\n"
    "    movq %r11, %xmm14\n    addq %r10, %r11\n"
    "    movq %r11, %xmm15\n    addq %r10, %r11\n"
    "    callq *%rax\n"
    // Recompute the markers in order and count mismatches in eax.
    "    movabsq $0x0101010101010101, %r10\n"
    "    movl $0x10, %r11d\n"
    "    xorl %eax, %eax\n"
    "    cmpq %r11, %rbx\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %rbp\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %rdi\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %rsi\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %r12\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %r13\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %r14\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    cmpq %r11, %r15\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm6, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm7, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm8, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm9, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm10, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm11, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm12, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm13, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm14, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movq %xmm15, %r9\n    cmpq %r11, %r9\n    setne %cl\n    movzbl %cl, %ecx\n    addl %ecx, %eax\n    addq %r10, %r11\n"
    "    movups 32(%rsp), %xmm6\n"
    "    movups 48(%rsp), %xmm7\n"
    "    movups 64(%rsp), %xmm8\n"
    "    movups 80(%rsp), %xmm9\n"
    "    movups 96(%rsp), %xmm10\n"
    "    movups 112(%rsp), %xmm11\n"
    "    movups 128(%rsp), %xmm12\n"
    "    movups 144(%rsp), %xmm13\n"
    "    movups 160(%rsp), %xmm14\n"
    "    movups 176(%rsp), %xmm15\n"
    "    addq $200, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rsi\n"
    "    popq %rdi\n"
    "    popq %rbp\n"
    "    popq %rbx\n"
    "    ret\n");

// Overwrites every callee-saved register but rbp (the frame pointer) with garbage.
static void scribble_registers() {
    __asm__ volatile(
        "movq $-1, %%rbx\n\tmovq $-1, %%rdi\n\tmovq $-1, %%rsi\n\t"
        "movq $-1, %%r12\n\tmovq $-1, %%r13\n\tmovq $-1, %%r14\n\tmovq $-1, %%r15\n\t"
        "pcmpeqd %%xmm6, %%xmm6\n\tpcmpeqd %%xmm7, %%xmm7\n\tpcmpeqd %%xmm8, %%xmm8\n\t"
        "pcmpeqd %%xmm9, %%xmm9\n\tpcmpeqd %%xmm10, %%xmm10\n\tpcmpeqd %%xmm11, %%xmm11\n\t"
        "pcmpeqd %%xmm12, %%xmm12\n\tpcmpeqd %%xmm13, %%xmm13\n\tpcmpeqd %%xmm14, %%xmm14\n\t"
        "pcmpeqd %%xmm15, %%xmm15\n\t"
        :
        :
        : "rbx", "rdi", "rsi", "r12", "r13", "r14", "r15", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}
#elif defined(__aarch64__)
#define TEST_HAVE_REGISTER_CHECK 1
// x19-x29 and d8-d15 get markers (marker i = i * 0x0101010101010101 + 0x10).
__asm__(
    ".text\n"
    TEST_MARKED_BEGIN
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
    "    mov x9, x0\n"
    "    mov x0, x1\n"
    "    mov x10, #0x0101\n"
    "    movk x10, #0x0101, lsl #16\n"
    "    movk x10, #0x0101, lsl #32\n"
    "    movk x10, #0x0101, lsl #48\n"
    "    mov x19, #0x10\n"
    "    add x20, x19, x10\n"
    "    add x21, x20, x10\n"
    "    add x22, x21, x10\n"
    "    add x23, x22, x10\n"
    "    add x24, x23, x10\n"
    "    add x25, x24, x10\n"
    "    add x26, x25, x10\n"
    "    add x27, x26, x10\n"
    "    add x28, x27, x10\n"
    "    add x11, x28, x10\n"
    "    fmov d8, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d9, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d10, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d11, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d12, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d13, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d14, x11\n"
    "    add x11, x11, x10\n"
    "    fmov d15, x11\n"
    "    mov x29, #0\n"
    "    blr x9\n"
    // Recompute the markers in order and count mismatches in w0.
    "    mov x10, #0x0101\n"
    "    movk x10, #0x0101, lsl #16\n"
    "    movk x10, #0x0101, lsl #32\n"
    "    movk x10, #0x0101, lsl #48\n"
    "    mov w0, #0\n"
    "    mov x11, #0x10\n"
    "    cmp x19, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x20, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x21, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x22, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x23, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x24, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x25, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x26, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x27, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    cmp x28, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d8\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d9\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d10\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d11\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d12\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d13\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d14\n    cmp x12, x11\n    cinc w0, w0, ne\n    add x11, x11, x10\n"
    "    fmov x12, d15\n    cmp x12, x11\n    cinc w0, w0, ne\n"
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
    "    add sp, sp, #176\n"
    "    ret\n"
    TEST_MARKED_END);

static void scribble_registers() {
    __asm__ volatile(
        "mov x19, #-1\n\tmov x20, #-1\n\tmov x21, #-1\n\tmov x22, #-1\n\tmov x23, #-1\n\t"
        "mov x24, #-1\n\tmov x25, #-1\n\tmov x26, #-1\n\tmov x27, #-1\n\tmov x28, #-1\n\t"
        "fmov d8, xzr\n\tfmov d9, xzr\n\tfmov d10, xzr\n\tfmov d11, xzr\n\t"
        "fmov d12, xzr\n\tfmov d13, xzr\n\tfmov d14, xzr\n\tfmov d15, xzr\n\t"
        :
        :
        : "x19", "x20", "x21", "x22", "x23", "x24", "x25", "x26", "x27", "x28", "d8", "d9", "d10",
          "d11", "d12", "d13", "d14", "d15");
}
#elif defined(__riscv) && __riscv_xlen == 64 && defined(__riscv_float_abi_double)
#define TEST_HAVE_REGISTER_CHECK 1
// s0-s11 and fs0-fs11 get markers (marker i = i * 0x0101010101010101 + 0x10), and frm
// rounds towards zero, where the backend switches it (the marker is 1, RTZ; the scribblers
// set 3, RUP). The caller's frm comes back on return.
#if FIBER_SCHED_SWITCH_FP_CONTROL || defined(FIBER_SCHED_USE_UCONTEXT)
#define TEST_MARK_FRM "    fsrmi 1\n"
#define TEST_CHECK_FRM "    frrm t4\n    addi t4, t4, -1\n    snez t4, t4\n    add a0, a0, t4\n"
#define TEST_SCRIBBLE_FRM "fsrmi 3\n\t"
#else
#define TEST_MARK_FRM ""
#define TEST_CHECK_FRM ""
#define TEST_SCRIBBLE_FRM ""
#endif
__asm__(
    ".text\n"
    ".globl call_with_marked_registers\n"
    ".type call_with_marked_registers,%function\n"
    "call_with_marked_registers:\n"
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
    "    frrm t0\n"
    "    sd t0, 200(sp)\n"
    "    mv t1, a0\n"
    "    mv a0, a1\n"
    "    li t2, 0x0101010101010101\n"
    "    li s0, 0x10\n"
    "    add s1, s0, t2\n"
    "    add s2, s1, t2\n"
    "    add s3, s2, t2\n"
    "    add s4, s3, t2\n"
    "    add s5, s4, t2\n"
    "    add s6, s5, t2\n"
    "    add s7, s6, t2\n"
    "    add s8, s7, t2\n"
    "    add s9, s8, t2\n"
    "    add s10, s9, t2\n"
    "    add s11, s10, t2\n"
    "    add t3, s11, t2\n"
    "    fmv.d.x fs0, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs1, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs2, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs3, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs4, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs5, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs6, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs7, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs8, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs9, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs10, t3\n    add t3, t3, t2\n"
    "    fmv.d.x fs11, t3\n"
    TEST_MARK_FRM
    "    jalr t1\n"
    // Recompute the markers in order and count mismatches in a0.
    "    li t2, 0x0101010101010101\n"
    "    li a0, 0\n"
    "    li t3, 0x10\n"
    "    xor t4, s0, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s1, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s2, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s3, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s4, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s6, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s7, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s8, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s9, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s10, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    xor t4, s11, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs0\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs1\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs2\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs3\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs4\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs5\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs6\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs7\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs8\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs9\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs10\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    "    fmv.x.d t5, fs11\n    xor t4, t5, t3\n    snez t4, t4\n    add a0, a0, t4\n    add t3, t3, t2\n"
    TEST_CHECK_FRM
    "    ld t0, 200(sp)\n"
    "    fsrm t0\n"
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
    "    addi sp, sp, 208\n"
    "    ret\n"
    ".size call_with_marked_registers,.-call_with_marked_registers\n");

// Overwrites every callee-saved register but s0 (the frame pointer) with garbage, and frm.
static void scribble_registers() {
    __asm__ volatile(
        "li s1, -1\n\tli s2, -1\n\tli s3, -1\n\tli s4, -1\n\tli s5, -1\n\tli s6, -1\n\t"
        "li s7, -1\n\tli s8, -1\n\tli s9, -1\n\tli s10, -1\n\tli s11, -1\n\t"
        "fmv.d.x fs0, zero\n\tfmv.d.x fs1, zero\n\tfmv.d.x fs2, zero\n\tfmv.d.x fs3, zero\n\t"
        "fmv.d.x fs4, zero\n\tfmv.d.x fs5, zero\n\tfmv.d.x fs6, zero\n\tfmv.d.x fs7, zero\n\t"
        "fmv.d.x fs8, zero\n\tfmv.d.x fs9, zero\n\tfmv.d.x fs10, zero\n\tfmv.d.x fs11, zero\n\t"
        TEST_SCRIBBLE_FRM
        :
        :
        : "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "fs0", "fs1", "fs2",
          "fs3", "fs4", "fs5", "fs6", "fs7", "fs8", "fs9", "fs10", "fs11");
}
#undef TEST_MARK_FRM
#undef TEST_CHECK_FRM
#undef TEST_SCRIBBLE_FRM
#endif

#if defined(TEST_HAVE_REGISTER_CHECK)
namespace {

struct Scribblers {
    Fiber first{[] {
        for (;;) {
            scribble_registers();
            Fiber::yield();
        }
    }};
    Fiber second{[] {
        for (;;) {
            scribble_registers();
            Fiber::yield();
        }
    }};
};

void resume_scribblers(void* arg) {
    auto* s = static_cast<Scribblers*>(arg);
    for (int i = 0; i < 3; ++i) {
        s->first.resume();
        s->second.resume();
    }
}

}  // namespace

TEST_CASE("callee-saved registers of the resumer survive fibers that overwrite them") {
    // The scribblers may set the rounding mode (riscv64's frm): the thread's comes back after.
    const int rounding = std::fegetround();
    // The scribblers never finish; their stacks are freed without unwinding.
    Scribblers scribblers;
    CHECK(call_with_marked_registers(&resume_scribblers, &scribblers) == 0);
    // A fiber's own callee-saved registers survive its resumer overwriting them.
    Fiber marked([] {
        Scribblers inner;
        for (int i = 0; i < 3; ++i) {
            CHECK(call_with_marked_registers(&resume_scribblers, &inner) == 0);
            Fiber::yield();
        }
    });
    for (int i = 0; i < 3; ++i) {
        marked.resume();
        scribble_registers();
    }
    std::fesetround(rounding);
}
#endif

namespace {

// Keeps many doubles and integers live across each yield; at -O2 they sit in callee-saved
// registers (aarch64's d8-d15) or spill, and either way must come back intact.
double mix(int seed, int rounds, std::vector<double>& trace) {
    double a = seed * 1.5, b = seed * 2.25, c = seed * 3.125, d = seed * 4.0625;
    double e = seed + 0.5, f = seed + 0.25, g = seed + 0.125, h = seed + 0.0625;
    long i1 = seed * 7, i2 = seed * 11, i3 = seed * 13, i4 = seed * 17;
    for (int r = 0; r < rounds; ++r) {
        Fiber::yield();
        a += b * 0.5; b += c * 0.25; c += d * 0.125; d += e * 0.0625;
        e += f; f += g; g += h; h += 1.0;
        i1 += i2; i2 += i3; i3 += i4; i4 += 1;
        trace.push_back(a + b + c + d + e + f + g + h + static_cast<double>(i1 + i2 + i3 + i4));
    }
    return a + b + c + d + e + f + g + h;
}

}  // namespace

TEST_CASE("floating-point and integer values survive switches between interleaved fibers") {
    constexpr int rounds = 20;
    std::vector<double> expected[2];
    double expected_result[2];
    // Reference: each computation alone, switching only with a fiber that does nothing.
    for (int k = 0; k < 2; ++k) {
        Fiber solo([&, k] { expected_result[k] = mix(k + 3, rounds, expected[k]); });
        while (solo.state() != Fiber::State::Term) solo.resume();
    }
    std::vector<double> trace[2];
    double result[2] = {0, 0};
    Fiber one([&] { result[0] = mix(3, rounds, trace[0]); });
    Fiber two([&] { result[1] = mix(4, rounds, trace[1]); });
    while (one.state() != Fiber::State::Term || two.state() != Fiber::State::Term) {
        if (one.state() != Fiber::State::Term) one.resume();
        if (two.state() != Fiber::State::Term) two.resume();
    }
    for (int k = 0; k < 2; ++k) {
        CHECK(trace[k] == expected[k]);
        CHECK(result[k] == expected_result[k]);
    }
}

#if FIBER_SCHED_SWITCH_FP_CONTROL || defined(FIBER_SCHED_USE_UCONTEXT)
TEST_CASE("each fiber keeps its own floating-point rounding mode") {
    const int original = std::fegetround();
    std::fesetround(FE_UPWARD);
    Fiber fiber([] {
        // Created while the thread rounded upward: the fiber starts that way.
        CHECK(std::fegetround() == FE_UPWARD);
        std::fesetround(FE_DOWNWARD);
        Fiber::yield();
        CHECK(std::fegetround() == FE_DOWNWARD);
        volatile double third = 1.0;
        third /= 3.0;
        std::fesetround(FE_UPWARD);
        volatile double third_up = 1.0;
        third_up /= 3.0;
        CHECK(third < third_up);
    });
    std::fesetround(FE_TONEAREST);
    fiber.resume();
    CHECK(std::fegetround() == FE_TONEAREST);
    std::fesetround(FE_TOWARDZERO);
    fiber.resume();
    CHECK(std::fegetround() == FE_TOWARDZERO);
    CHECK(fiber.state() == Fiber::State::Term);
    std::fesetround(original);
}

#if defined(FIBER_SCHED_X86_64_ASM_SWITCH)
// The x86-64 routines load a frame's FP words only where a control bit differs, and then
// keep the running status flags (impl/context_x86_64_fp.ipp): these cover each word alone,
// both at once, and the flags.
namespace {
constexpr unsigned mxcsr_status = 0x3f, mxcsr_ftz = 0x8000, mxcsr_daz = 0x40, mxcsr_round_up = 0x4000;
constexpr unsigned mxcsr_precision_flag = 0x20, mxcsr_divide_flag = 0x04, mxcsr_denormal_flag = 0x02;
constexpr unsigned short x87_precision_bits = 0x300, x87_rounding_bits = 0xc00;
unsigned short get_x87_control() {
    unsigned short word;
    __asm__ volatile("fnstcw %0" : "=m"(word));
    return word;
}
void set_x87_control(unsigned short word) { __asm__ volatile("fldcw %0" : : "m"(word)); }
}  // namespace

TEST_CASE("x86-64: each fiber keeps its own MXCSR control bits and x87 control word, each alone or both") {
    const unsigned original_csr = _mm_getcsr();
    const unsigned short original_x87 = get_x87_control();
    _mm_setcsr((original_csr | mxcsr_ftz) & ~mxcsr_daz);
    unsigned fiber_csr = 0;
    unsigned short fiber_x87 = 0;
    Fiber fiber([&] {
        // Made while the thread flushed to zero: the fiber starts so.
        CHECK((_mm_getcsr() & mxcsr_ftz) != 0);
        _mm_setcsr((_mm_getcsr() & ~mxcsr_ftz) | mxcsr_daz);  // only MXCSR differs now
        Fiber::yield();
        fiber_csr = _mm_getcsr();
        fiber_x87 = get_x87_control();
        set_x87_control(static_cast<unsigned short>(original_x87 & ~x87_precision_bits));  // x87 too
        Fiber::yield();
        fiber_csr = _mm_getcsr();
        fiber_x87 = get_x87_control();
        _mm_setcsr(_mm_getcsr() & ~mxcsr_daz);
        set_x87_control(original_x87);  // now only MXCSR differs, the other way
        Fiber::yield();
        fiber_csr = _mm_getcsr();
        fiber_x87 = get_x87_control();
    });
    fiber.resume();
    CHECK((_mm_getcsr() & (mxcsr_ftz | mxcsr_daz)) == mxcsr_ftz);
    CHECK(get_x87_control() == original_x87);
    fiber.resume();
    CHECK((fiber_csr & (mxcsr_ftz | mxcsr_daz)) == mxcsr_daz);
    CHECK(fiber_x87 == original_x87);
    CHECK((_mm_getcsr() & (mxcsr_ftz | mxcsr_daz)) == mxcsr_ftz);
    CHECK(get_x87_control() == original_x87);
    // Only the x87 word differs between the two sides on this resume.
    _mm_setcsr((_mm_getcsr() & ~mxcsr_ftz) | mxcsr_daz);
    set_x87_control(static_cast<unsigned short>(original_x87 | x87_rounding_bits));
    fiber.resume();
    CHECK((fiber_csr & (mxcsr_ftz | mxcsr_daz)) == mxcsr_daz);
    CHECK(fiber_x87 == static_cast<unsigned short>(original_x87 & ~x87_precision_bits));
    CHECK(get_x87_control() == static_cast<unsigned short>(original_x87 | x87_rounding_bits));
    fiber.resume();
    CHECK((fiber_csr & (mxcsr_ftz | mxcsr_daz)) == 0);
    CHECK(fiber_x87 == original_x87);
    CHECK((_mm_getcsr() & (mxcsr_ftz | mxcsr_daz)) == mxcsr_daz);
    CHECK(get_x87_control() == static_cast<unsigned short>(original_x87 | x87_rounding_bits));
    CHECK(fiber.state() == Fiber::State::Term);
    _mm_setcsr(original_csr);
    set_x87_control(original_x87);
}

TEST_CASE("x86-64: a switch leaves MXCSR's status flags as the thread has them, with or without a mode to load") {
    const unsigned original_csr = _mm_getcsr();
    _mm_setcsr(original_csr & ~mxcsr_status);
    unsigned seen = 0;
    Fiber fiber([&] {
        // Made with no flag raised; the thread raised one since, and the fiber sees it.
        seen = _mm_getcsr();
        _mm_setcsr((_mm_getcsr() & ~mxcsr_status) | mxcsr_divide_flag);
        Fiber::yield();
        seen = _mm_getcsr();
        _mm_setcsr(_mm_getcsr() | mxcsr_round_up);  // a control bit differs from now on
        Fiber::yield();
        seen = _mm_getcsr();
    });
    _mm_setcsr(_mm_getcsr() | mxcsr_precision_flag);
    fiber.resume();
    CHECK((seen & mxcsr_status) == mxcsr_precision_flag);
    CHECK((_mm_getcsr() & mxcsr_status) == mxcsr_divide_flag);  // what the fiber left
    _mm_setcsr((_mm_getcsr() & ~mxcsr_status) | mxcsr_denormal_flag);
    fiber.resume();
    CHECK((seen & mxcsr_status) == mxcsr_denormal_flag);
    CHECK((_mm_getcsr() & mxcsr_round_up) == 0);  // the resumer's rounding is its own
    _mm_setcsr((_mm_getcsr() & ~mxcsr_status) | mxcsr_precision_flag);
    fiber.resume();
    // Its rounding was loaded, with the thread's flags, not the ones it had left.
    CHECK((seen & mxcsr_round_up) != 0);
    CHECK((seen & mxcsr_status) == mxcsr_precision_flag);
    CHECK(fiber.state() == Fiber::State::Term);
    _mm_setcsr(original_csr);
}
#endif  // FIBER_SCHED_X86_64_ASM_SWITCH
#else
TEST_CASE("FIBER_SCHED_SWITCH_FP_CONTROL 0: the rounding mode stays the thread's across switches") {
    const int original = std::fegetround();
    std::fesetround(FE_TONEAREST);
    Fiber fiber([] {
        CHECK(std::fegetround() == FE_TONEAREST);
        std::fesetround(FE_DOWNWARD);
        Fiber::yield();
        // The resumer's change is what this fiber finds: nothing was switched.
        CHECK(std::fegetround() == FE_UPWARD);
    });
    fiber.resume();
    CHECK(std::fegetround() == FE_DOWNWARD);
    std::fesetround(FE_UPWARD);
    fiber.resume();
    CHECK(fiber.state() == Fiber::State::Term);
    std::fesetround(original);
}
#endif

TEST_CASE("backend() names the backend compiled in") {
    const char* name = fsched::backend();
#if defined(_WIN32) && defined(FIBER_SCHED_USE_WINFIBER)
    CHECK(std::strcmp(name, "winfiber") == 0);
#elif defined(_WIN32) && defined(__x86_64__)
    CHECK(std::strcmp(name, "asm-x86_64-win64") == 0);
#elif defined(FIBER_SCHED_USE_UCONTEXT)
    CHECK(std::strcmp(name, "ucontext") == 0);
#elif defined(__x86_64__)
    CHECK(std::strcmp(name, "asm-x86_64-sysv") == 0);
#elif defined(__aarch64__)
    CHECK(std::strcmp(name, "asm-aarch64") == 0);
#elif defined(__riscv) && __riscv_xlen == 64 && defined(__riscv_float_abi_double)
    CHECK(std::strcmp(name, "asm-riscv64") == 0);
#else
    CHECK(std::strcmp(name, "ucontext") == 0);
#endif
}
