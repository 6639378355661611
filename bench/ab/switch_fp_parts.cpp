// What each part of the x86-64 switch's FP control state costs this core, apart from any
// bookkeeping: bare switch routines (fiber_sched's frame layout: 8 bytes of FP words, six
// callee-saved registers, the return address) ping-pong between the thread and one context,
// each variant in turn batch by batch, as round_trip.sh does with whole builds. Prints each
// variant's min, p10 and median ns per round trip (two switches). x86-64 System V, GNU asm.
//
//   g++ -std=c++17 -O2 bench/ab/switch_fp_parts.cpp -o /tmp/fp_parts && /tmp/fp_parts
//   (built as build-bench/bench/bench_switch_fp_parts too; --quick: 20 batches, a smoke test)
//
// The variants:
//   none         no FP state (FIBER_SCHED_SWITCH_FP_CONTROL=0, marl, Go)
//   stores       stmxcsr + fnstcw into the frame left, nothing loaded
//   loads        ldmxcsr + fldcw from the frame entered (the words stored there are constant)
//   boost        stores + loads: Boost.Context's way (the status flags travel with the context)
//   mxcsr-only   stmxcsr + ldmxcsr;   x87-only   fnstcw + fldcw
//   kept         fiber_sched's way: the caller reads both words into a register (stmxcsr and
//                fnstcw, then loads of what they stored), the routine stores that register and
//                loads the entered words only where a control bit differs (never here), so the
//                thread keeps its status flags
//   kept-mxcsr   the same, reading back only MXCSR (the x87 half a constant)
//   kept-x87     the same, reading back only the x87 word (the MXCSR half a constant)
// docs/performance-notes.md has the figures of each host measured.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if !defined(__x86_64__) || defined(_WIN32) || defined(__APPLE__)
int main() {
    std::puts("switch_fp_parts: x86-64 System V with ELF only");
}
#else

#define PUSHES "pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n subq $8, %rsp\n"
#define SWAP "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
#define POPS "addq $8, %rsp\n popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n popq %rcx\n jmpq *%rcx\n"
#define ROUTINE(name, body) \
    __asm__(".text\n .globl " #name "\n .type " #name ",@function\n .p2align 4\n" #name ":\n" body ".size " #name ", .-" #name "\n");
// The kept routine's compare of the control bits (MXCSR 6-31, x87 word 32-47) and its cold load:
// a copy of FIBER_SCHED_X86_LOAD_FP and _COLD (src/impl/context_x86_64_fp.ipp, undefined
// after the header's backend cascade); keep the two alike.
#define KEPT_LOAD                                                                                      \
    "movq (%rsp), %rax\n xorq %rdx, %rax\n movabsq $0xffffffffffc0, %r11\n testq %r11, %rax\n jnz 71f\n" \
    "70:\n"
#define KEPT_COLD "71:\n andq $-64, %rax\n xorq %rdx, %rax\n movq %rax, (%rsp)\n ldmxcsr (%rsp)\n fldcw 4(%rsp)\n jmp 70b\n"

extern "C" {
std::uint64_t fp_parts_constant_words;  // the words the loads-only variant stores
void fp_parts_none(void**, void*, std::uint64_t);
void fp_parts_stores(void**, void*, std::uint64_t);
void fp_parts_loads(void**, void*, std::uint64_t);
void fp_parts_boost(void**, void*, std::uint64_t);
void fp_parts_mxcsr(void**, void*, std::uint64_t);
void fp_parts_x87(void**, void*, std::uint64_t);
void fp_parts_kept(void**, void*, std::uint64_t);
void fp_parts_trampoline();
}
ROUTINE(fp_parts_none, PUSHES SWAP POPS)
ROUTINE(fp_parts_stores, PUSHES "stmxcsr (%rsp)\n fnstcw 4(%rsp)\n" SWAP POPS)
ROUTINE(fp_parts_loads,
        PUSHES "movq fp_parts_constant_words(%rip), %rax\n movq %rax, (%rsp)\n" SWAP
               "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n" POPS)
ROUTINE(fp_parts_boost, PUSHES "stmxcsr (%rsp)\n fnstcw 4(%rsp)\n" SWAP "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n" POPS)
ROUTINE(fp_parts_mxcsr, PUSHES "stmxcsr (%rsp)\n" SWAP "ldmxcsr (%rsp)\n" POPS)
ROUTINE(fp_parts_x87, PUSHES "fnstcw 4(%rsp)\n" SWAP "fldcw 4(%rsp)\n" POPS)
ROUTINE(fp_parts_kept, PUSHES "movq %rdx, (%rsp)\n" SWAP KEPT_LOAD POPS KEPT_COLD)
__asm__(".text\n .globl fp_parts_trampoline\nfp_parts_trampoline:\n movq %r13, %rdi\n callq *%r12\n ud2\n");

namespace {

using Routine = void (*)(void**, void*, std::uint64_t);
enum class Read { none, both, mxcsr, x87 };

// The running words as fiber_sched's caller reads them, or the parts a variant reads.
__attribute__((always_inline)) inline std::uint64_t read_words(Read read) {
    std::uint32_t mxcsr;
    std::uint16_t x87;
    std::uint64_t low = 0, high = 0;
    switch (read) {
    case Read::none:
        return 0;
    case Read::both:
        __asm__ volatile("stmxcsr %[m]\n fnstcw %[x]\n movl %[m], %k[l]\n movzwl %[x], %k[h]"
                         : [l] "=&r"(low), [h] "=&r"(high), [m] "=m"(mxcsr), [x] "=m"(x87)::"memory");
        return low | high << 32;
    case Read::mxcsr:
        __asm__ volatile("stmxcsr %[m]\n movl %[m], %k[l]" : [l] "=&r"(low), [m] "=m"(mxcsr)::"memory");
        return low | (fp_parts_constant_words & ~std::uint64_t{0xffffffff});
    case Read::x87:
        __asm__ volatile("fnstcw %[x]\n movzwl %[x], %k[h]" : [h] "=&r"(high), [x] "=m"(x87)::"memory");
        return (fp_parts_constant_words & 0xffffffff) | high << 32;
    }
    return 0;
}

struct Variant {
    Variant(const char* n, Routine r, Read how) : name(n), routine(r), read(how) {}
    const char* name;
    Routine routine;
    Read read;
    void* thread_sp = nullptr;
    void* context_sp = nullptr;
    std::vector<double> ns;
};

void context_loop(void* arg) {
    auto* v = static_cast<Variant*>(arg);
    for (;;) v->routine(&v->context_sp, v->thread_sp, read_words(v->read));
}

void* make_context(Variant& v) {
    constexpr std::size_t size = 64 * 1024;
    auto* stack = static_cast<char*>(std::aligned_alloc(64, size));
    auto top = (reinterpret_cast<std::uintptr_t>(stack) + size) & ~std::uintptr_t{15};
    auto** frame = reinterpret_cast<void**>(top - 16 - 64);
    reinterpret_cast<void**>(top - 16)[0] = reinterpret_cast<void**>(top - 16)[1] = nullptr;
    frame[0] = reinterpret_cast<void*>(fp_parts_constant_words);
    frame[1] = frame[2] = frame[5] = frame[6] = nullptr;
    frame[3] = &v;
    frame[4] = reinterpret_cast<void*>(&context_loop);
    frame[7] = reinterpret_cast<void*>(&fp_parts_trampoline);
    return frame;
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    fp_parts_constant_words = read_words(Read::both);
    std::vector<Variant> variants = {
        {"none", fp_parts_none, Read::none},        {"stores", fp_parts_stores, Read::none},
        {"loads", fp_parts_loads, Read::none},      {"boost", fp_parts_boost, Read::none},
        {"mxcsr-only", fp_parts_mxcsr, Read::none}, {"x87-only", fp_parts_x87, Read::none},
        {"kept", fp_parts_kept, Read::both},        {"kept-mxcsr", fp_parts_kept, Read::mxcsr},
        {"kept-x87", fp_parts_kept, Read::x87},
    };
    for (auto& v : variants) v.context_sp = make_context(v);
    const int batches = quick ? 20 : 1000;
    constexpr int per_batch = 20000;
    for (int b = 0; b < batches; ++b) {
        for (auto& v : variants) {
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < per_batch; ++i) v.routine(&v.thread_sp, v.context_sp, read_words(v.read));
            const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
            v.ns.push_back(took.count() / per_batch);
        }
    }
    std::printf("bare switch round trip, ns: %d batches of %d, each variant in turn\n", batches, per_batch);
    for (auto& v : variants) {
        std::sort(v.ns.begin(), v.ns.end());
        std::printf("  %-11s min %6.2f  p10 %6.2f  p50 %6.2f\n", v.name, v.ns[0], v.ns[batches / 10], v.ns[batches / 2]);
    }
}
#endif
