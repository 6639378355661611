// ---------------------------------------------------------------------------
// Portable fallback: POSIX ucontext. swapcontext() also saves the signal mask with a
// system call, so it is about thirty times slower than the assembly backends.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

const char* const backend_name = "ucontext";

// makecontext() passes int arguments only: the Context's address arrives in two halves.
extern "C" inline void ucontext_trampoline(unsigned int high, unsigned int low) {
    auto bits = (static_cast<std::uintptr_t>(high) << 16 << 16) | static_cast<std::uintptr_t>(low);
    auto* ctx = reinterpret_cast<Context*>(bits);
    ctx->entry(ctx->arg);
}

void make_context(Context& ctx, void* stack_lo, std::size_t size, ContextEntry entry, void* arg) noexcept {
    int rc = getcontext(&ctx.uc);
    FIBER_SCHED_ASSERT(rc == 0 && "make_context(): getcontext() failed");
    ctx.uc.uc_stack.ss_sp = stack_lo;
    ctx.uc.uc_stack.ss_size = size;
    ctx.uc.uc_link = nullptr;
    ctx.entry = entry;
    ctx.arg = arg;
    auto bits = reinterpret_cast<std::uintptr_t>(&ctx);
    makecontext(&ctx.uc, reinterpret_cast<void (*)()>(&ucontext_trampoline), 2,
                static_cast<unsigned int>(bits >> 16 >> 16), static_cast<unsigned int>(bits & 0xffffffffu));
}

void switch_context(Context& from, Context& to) noexcept {
    int rc = swapcontext(&from.uc, &to.uc);
    FIBER_SCHED_ASSERT(rc == 0 && "switch_context(): swapcontext() failed");
}

}  // namespace detail
}  // namespace fsched
