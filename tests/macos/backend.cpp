// The context-switch backend alone, for a macOS target, compiled with no SDK: only clang's
// own <stddef.h> and <stdint.h> (-ffreestanding -nostdlibinc -nostdinc++), config.hpp,
// context.hpp and the backend's files from src/, in the order the cascade in
// src/fiber_sched.hpp includes them for __x86_64__ / __aarch64__ on __APPLE__.
// check.cmake assembles it for Mach-O, links it with main() below, and reads the result.
#include <stddef.h>
#include <stdint.h>

#if !defined(__APPLE__)
#error "backend.cpp is compiled for a macOS target only (clang++ -target <arch>-apple-macos11)"
#endif

namespace std {
using ::size_t;
using ::uint16_t;
using ::uint32_t;
using ::uint64_t;
using ::uintptr_t;
}  // namespace std

#include "config.hpp"
#include "context.hpp"

#if defined(__x86_64__)
#include "impl/context_x86_64_fp.ipp"
#endif
#include "impl/context_asm_directives.ipp"
#if defined(__x86_64__)
#include "impl/context_x86_64_sysv.ipp"
#elif defined(__aarch64__)
#include "impl/context_aarch64_aapcs.ipp"
#else
#error "backend.cpp: neither __x86_64__ nor __aarch64__"
#endif

// What config.hpp's link check asks of the implementation unit.
int fsched::detail::define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file() noexcept { return 0; }

namespace {

fsched::detail::Context main_context;
fsched::detail::Context fiber_context;
alignas(16) unsigned char fiber_stack[16384];
volatile int steps = 0;

void fiber_entry(void* arg) {
    for (;;) {
        steps = steps + *static_cast<int*>(arg);
        fsched::detail::switch_context(fiber_context, main_context);
    }
}

}  // namespace

// Runs a fiber twice through make_context and switch_context: main() returns 0 when both
// runs came back (on a Mac; here it is only linked).
int main() {
    int increment = 1;
    fsched::detail::make_context(fiber_context, fiber_stack, sizeof fiber_stack, &fiber_entry, &increment);
    fsched::detail::switch_context(main_context, fiber_context);
    fsched::detail::switch_context(main_context, fiber_context);
    return steps == 2 ? 0 : 1;
}
