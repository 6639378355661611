// ---------------------------------------------------------------------------
// Implementation: the OS interface (impl/os.ipp) on POSIX: mmap for stacks, pthread_atfork.
// (cpu_relax() is in config.hpp: the public inline SpinLock needs it.)
// ---------------------------------------------------------------------------

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

namespace fsched {
namespace detail {
namespace os {

std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

std::size_t guarded_stack_budget() noexcept {
    // A guarded stack is one mmap of size + one page with the lowest page PROT_NONE: two
    // kernel mappings. Linux allows vm.max_map_count (65,530 by default) mappings per
    // process, and malloc and thread stacks need some too, so at most a quarter of that
    // many stacks (half the mappings) get a guard page. Other systems have no such file
    // and get the Linux default.
    std::size_t max_maps = 65530;
    if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        unsigned long value = 0;
        if (std::fscanf(f, "%lu", &value) == 1 && value > 0) max_maps = value;
        std::fclose(f);
    }
    return max_maps / 4;
}

void* map_stack_memory(std::size_t bytes) noexcept {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
    // Reserve address space only; pages are committed when a fiber touches them.
    flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
    flags |= MAP_STACK;
#endif
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    return mem == MAP_FAILED ? nullptr : mem;
}

bool guard_pages(void* lo, std::size_t bytes) noexcept {
    // ENOMEM here means the mapping count is reached after all: splitting the mapping
    // needs one more.
    return mprotect(lo, bytes, PROT_NONE) == 0;
}

void unmap_memory(void* base, std::size_t bytes) noexcept { munmap(base, bytes); }

void discard_memory(void* lo, std::size_t bytes) noexcept { madvise(lo, bytes, MADV_DONTNEED); }

void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept { pthread_atfork(prepare, parent, child); }

}  // namespace os
}  // namespace detail
}  // namespace fsched
