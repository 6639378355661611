// ---------------------------------------------------------------------------
// Implementation: what the fiber report needs from the OS: a cheap clock for "parked since",
// the asymmetric barrier that keeps the registry's destroy path free of fences, the pages of
// a stack that were touched, and a code address's symbol and module.
//
// The barrier: a destroyed fiber leaves its registry slot with a plain store, then reads
// whether a report is walking its segment; the report sets that flag, then makes every
// thread's earlier stores visible at once (Linux membarrier(PRIVATE_EXPEDITED): an IPI to
// each CPU running the process, a full barrier there), then reads the slots. So one side
// pays a system call per report instead of each destroy paying a locked instruction.
// Where that call is missing (older kernels, qemu-user, other systems) both sides fence.
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"

#if defined(_WIN32)
// <windows.h> is included by fiber_sched.hpp.
#else
#include <dlfcn.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#endif

namespace fsched {
namespace detail {
namespace os {

// Monotonic nanoseconds from a clock that may be a few milliseconds coarse (Linux:
// CLOCK_MONOTONIC_COARSE, about 5 ns a read), for "parked since". Not steady_clock's epoch.
inline std::int64_t coarse_now_ns() noexcept {
#if defined(_WIN32)
    return static_cast<std::int64_t>(GetTickCount64()) * 1000000;
#else
#if defined(CLOCK_MONOTONIC_COARSE)
    const clockid_t clock = CLOCK_MONOTONIC_COARSE;
#else
    const clockid_t clock = CLOCK_MONOTONIC;
#endif
    timespec t{};
    clock_gettime(clock, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
#endif
}

#if defined(__linux__) && defined(SYS_membarrier)
constexpr int membarrier_private_expedited = 1 << 3;           // MEMBARRIER_CMD_PRIVATE_EXPEDITED
constexpr int membarrier_register_private_expedited = 1 << 4;  // ..._REGISTER_PRIVATE_EXPEDITED
#endif

// Asks for the heavy barrier; true when heavy_barrier() works in this process from now on.
inline bool enable_heavy_barrier() noexcept {
#if defined(__linux__) && defined(SYS_membarrier) && !defined(FIBER_SCHED_TSAN)
    // (ThreadSanitizer does not know the system call orders anything: fences there.)
    return syscall(SYS_membarrier, membarrier_register_private_expedited, 0) == 0;
#else
    return false;
#endif
}

// Every thread's stores made before the call are visible to the caller after it. Only
// after enable_heavy_barrier() returned true; false when the call failed.
inline bool heavy_barrier() noexcept {
#if defined(__linux__) && defined(SYS_membarrier)
    return syscall(SYS_membarrier, membarrier_private_expedited, 0) == 0;
#else
    return false;
#endif
}

// Bytes of [lo, lo + bytes) backed by memory now (pages touched since mapped or discarded);
// SIZE_MAX when the system cannot tell.
inline std::size_t resident_bytes(const void* lo, std::size_t bytes) noexcept {
#if defined(_WIN32)
    std::size_t committed = 0;
    const char* p = static_cast<const char*>(lo);
    const char* end = p + bytes;
    while (p < end) {
        MEMORY_BASIC_INFORMATION info{};
        if (VirtualQuery(p, &info, sizeof info) == 0) return SIZE_MAX;
        const char* region_end = static_cast<const char*>(info.BaseAddress) + info.RegionSize;
        if (region_end > end) region_end = end;
        if (info.State == MEM_COMMIT) committed += static_cast<std::size_t>(region_end - p);
        p = region_end;
    }
    return committed;
#else
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const auto first = reinterpret_cast<std::uintptr_t>(lo) / page * page;
    const auto last = reinterpret_cast<std::uintptr_t>(lo) + bytes;
    std::size_t resident = 0;
    // A chunk at a time: a 1 GiB stack needs no 256 KiB vector.
#if defined(__APPLE__)
    char vec[256];
#else
    unsigned char vec[256];
#endif
    for (std::uintptr_t at = first; at < last;) {
        const std::size_t pages = std::min<std::size_t>(sizeof vec, (last - at + page - 1) / page);
        if (mincore(reinterpret_cast<void*>(at), pages * page, vec) != 0) return SIZE_MAX;
        for (std::size_t i = 0; i < pages; ++i) resident += (vec[i] & 1) ? page : 0;
        at += pages * page;
    }
    return resident;
#endif
}

// Where a code address is: its symbol (mangled; "" when not exported) and its offset, the
// module's path, and the address addr2line (or atos) takes for it in that module. False
// when nothing is known (a JIT's code, or Windows without a symbol reader: the module only).
struct CodeLocation {
    const char* symbol = "";
    std::uintptr_t symbol_offset = 0;
    const char* module = "";
    std::uintptr_t module_address = 0;
};
inline bool locate_code(std::uintptr_t pc, CodeLocation& out, char* module_buffer, std::size_t buffer_size) noexcept {
#if defined(_WIN32)
    HMODULE module = nullptr;
    if (!GetModuleHandleExA(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                            reinterpret_cast<LPCSTR>(pc), &module)) {
        return false;
    }
    const DWORD n = GetModuleFileNameA(module, module_buffer, static_cast<DWORD>(buffer_size));
    if (n == 0 || n >= buffer_size) module_buffer[0] = '\0';
    out.module = module_buffer;
    out.module_address = pc - reinterpret_cast<std::uintptr_t>(module);  // an RVA
    return true;
#else
    (void)module_buffer;
    (void)buffer_size;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(pc), &info) == 0) return false;
    out.module = info.dli_fname ? info.dli_fname : "";
    const auto base = reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    out.module_address = pc - base;
#if defined(__ELF__)
    // A position-dependent executable (ELF type ET_EXEC) is linked at its load address:
    // addr2line takes the address itself there, an offset from the base elsewhere.
    if (base && reinterpret_cast<const unsigned char*>(base)[16] == 2) out.module_address = pc;
#endif
    if (info.dli_sname && info.dli_saddr) {
        out.symbol = info.dli_sname;
        out.symbol_offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
    }
    return true;
#endif
}

}  // namespace os
}  // namespace detail
}  // namespace fsched
