// ---------------------------------------------------------------------------
// Context switch, portable fallback: POSIX ucontext. swapcontext() also saves the signal
// mask with a system call, so it is about thirty times slower than the assembly backends.
//
// A context's handle is the address of its saved ucontext_t. A switched-out side saves its
// ucontext_t in fsched_switch_context()'s own frame, which lives exactly as long as the
// side stays switched out; a fresh fiber's first one sits at the top of its stack, above
// the frames it will run, with the entry function and its argument beside it.
// ---------------------------------------------------------------------------

#pragma once

#include "context.hpp"

#include <ucontext.h>

namespace fsched {
namespace detail {

const char* const backend_name = "ucontext";

struct FreshContext {
    ContextEntry entry;
    void* arg;
    // The ucontext_t, made here by make_context. Raw storage: glibc's riscv64 ucontext_t ends
    // in a zero-length array, and -Wpedantic refuses such a struct as a member.
    alignas(ucontext_t) unsigned char uc_storage[sizeof(ucontext_t)];
};

// makecontext() passes int arguments only: the FreshContext's address arrives in two halves.
// What this backend keeps on a fiber's stack besides the fiber's frames: the fresh context
// at its top for the whole run, and a saved ucontext_t in the switch's frame while it is
// switched out. The stack pool adds it to every stack, so a fiber can use what it asked for.
constexpr std::size_t context_stack_reserve = sizeof(FreshContext) + 64 + sizeof(ucontext_t) + 256;
constexpr std::size_t context_stack_record = 0;

extern "C" inline void ucontext_trampoline(unsigned int high, unsigned int low) {
    auto bits = (static_cast<std::uintptr_t>(high) << 16 << 16) | static_cast<std::uintptr_t>(low);
    auto* fresh = reinterpret_cast<FreshContext*>(bits);
    fresh->entry(fresh->arg);
}

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) {
    const auto lo = reinterpret_cast<std::uintptr_t>(stack_lo);
    const auto record = (lo + size - sizeof(FreshContext)) & ~std::uintptr_t{63};
    auto* fresh = new (reinterpret_cast<void*>(record)) FreshContext;
    auto* uc = new (fresh->uc_storage) ucontext_t;
    const int rc = getcontext(uc);
    FIBER_SCHED_ASSERT(rc == 0 && "make_context(): getcontext() failed");
    uc->uc_stack.ss_sp = stack_lo;
    uc->uc_stack.ss_size = record - lo;  // the frames run below the record
    uc->uc_link = nullptr;
    fresh->entry = entry;
    fresh->arg = arg;
    makecontext(uc, reinterpret_cast<void (*)()>(&ucontext_trampoline), 2,
                static_cast<unsigned int>(record >> 16 >> 16), static_cast<unsigned int>(record & 0xffffffffu));
    ctx.sp = uc;
}

void release_context(Context&) noexcept {}

// A switched-out side's registers, from the ucontext_t that swapcontext() saved in the
// switch's frame (glibc's layouts on x86-64 and AArch64; elsewhere no backtrace).
bool saved_frame(const Context& ctx, SavedFrame& out) noexcept {
    const auto* uc = static_cast<const ucontext_t*>(ctx.sp);
    if (!uc) return false;
#if defined(__linux__) && defined(__x86_64__) && defined(REG_RIP)
    out.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
    out.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RBP]);
    out.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
    return true;
#elif defined(__linux__) && defined(__aarch64__)
    out.pc = static_cast<std::uintptr_t>(uc->uc_mcontext.pc);
    out.fp = static_cast<std::uintptr_t>(uc->uc_mcontext.regs[29]);
    out.sp = static_cast<std::uintptr_t>(uc->uc_mcontext.sp);
    return true;
#else
    (void)out;
    return false;
#endif
}

}  // namespace detail
}  // namespace fsched

extern "C" void fsched_switch_context(void** save_sp, void* load_sp) noexcept {
    ucontext_t self;
    // swapcontext() does not write uc_stack, and ASan's interceptor unpoisons the range that
    // the context being resumed names there: leftover stack words would unpoison memory at
    // random. An empty range tells it nothing.
    self.uc_stack.ss_sp = nullptr;
    self.uc_stack.ss_size = 0;
    self.uc_stack.ss_flags = 0;
    *save_sp = &self;
    const int rc = swapcontext(&self, static_cast<ucontext_t*>(load_sp));
    FIBER_SCHED_ASSERT(rc == 0 && "switch_context(): swapcontext() failed");
}
