// ---------------------------------------------------------------------------
// Implementation: the OS interface (impl/os.ipp) on POSIX: mmap for stacks, SIGSEGV/SIGBUS
// on an alternate signal stack for overflows (macOS reports a guard-page hit as SIGBUS),
// pthread for names, CPU pinning (Linux only) and fork. Where macOS differs, a branch on __APPLE__ says how.
// (cpu_relax() is in config.hpp: the public inline SpinLock needs it.)
// ---------------------------------------------------------------------------

#pragma once

#include "impl/os.ipp"
#include "impl/common.ipp"

#include <csignal>
#include <pthread.h>
#if defined(__linux__)
#include <sched.h>  // cpu_set_t, sched_getaffinity (with _GNU_SOURCE, which g++ and clang++ define)
#endif
#include <signal.h>
#include <sys/mman.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

namespace fsched {
namespace detail {
namespace os {

[[noreturn]] void abort_after_report() noexcept { std::abort(); }

std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

std::size_t guard_size() noexcept { return page_size(); }

std::size_t guarded_stack_budget() noexcept {
    // A guarded stack is one mmap of size + one page with the lowest page PROT_NONE: two
    // kernel mappings. Linux allows vm.max_map_count (65,530 by default) mappings per
    // process, and malloc and thread stacks need some too, so at most a quarter of that
    // many stacks (half the mappings) get a guard page. Other systems have no such file
    // and get the Linux default.
    std::size_t max_maps = 65530;
#if !defined(__APPLE__)  // macOS has no /proc and no such count to read
    if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        unsigned long value = 0;
        if (std::fscanf(f, "%lu", &value) == 1 && value > 0) max_maps = value;
        std::fclose(f);
    }
#endif
    return max_maps / 4;
}

void* map_stack_memory(std::size_t bytes) noexcept {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#if defined(MAP_NORESERVE) && !defined(__APPLE__)
    // Reserve address space only; pages are committed when a fiber touches them. (macOS
    // defines the flag but does not implement it: it never reserves swap for such a map.)
    flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
    flags |= MAP_STACK;
#endif
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    return mem == MAP_FAILED ? nullptr : mem;
}

void* map_guarded_stack(std::size_t bytes, std::size_t guard) noexcept {
    void* mem = map_stack_memory(bytes);
    if (!mem) return nullptr;
    // ENOMEM here means the mapping count is reached after all: splitting the mapping
    // needs one more.
    if (mprotect(mem, guard, PROT_NONE) != 0) {
        munmap(mem, bytes);
        return nullptr;
    }
    return mem;
}

void unmap_memory(void* base, std::size_t bytes) noexcept { munmap(base, bytes); }

void discard_memory(void* lo, std::size_t bytes) noexcept {
#if defined(__APPLE__)
    // Darwin's MADV_DONTNEED only lowers the pages' priority and keeps their contents;
    // MADV_FREE lets the kernel take them without writing them anywhere.
    madvise(lo, bytes, MADV_FREE);
#else
    madvise(lo, bytes, MADV_DONTNEED);
#endif
}

void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept { pthread_atfork(prepare, parent, child); }

void name_thread(const std::string& base, int index) noexcept {
#if defined(__linux__)
    // Linux takes 15 characters: up to 11 of base, so that "-index" fits for 1000 workers.
    char name[24];  // room for all that "%.11s-%d" can write
    std::snprintf(name, sizeof name, "%.11s-%d", base.c_str(), index);
    name[15] = '\0';
    pthread_setname_np(pthread_self(), name);
#elif defined(__APPLE__)
    // macOS names only the calling thread (a worker names itself) and takes 63 characters.
    char name[64];
    std::snprintf(name, sizeof name, "%.50s-%d", base.c_str(), index);
    pthread_setname_np(name);
#else
    // The BSDs spell it differently (pthread_set_name_np, pthread_setname_np(t, fmt, arg)).
    (void)base;
    (void)index;
#endif
}

#if defined(__linux__)
int cpu_limit() noexcept {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int cpu = CPU_SETSIZE - 1; cpu >= 0; --cpu) {
            if (CPU_ISSET(cpu, &set)) return cpu + 1;
        }
    }
    const long configured = sysconf(_SC_NPROCESSORS_CONF);  // more CPUs than a cpu_set_t holds
    return configured > 0 ? static_cast<int>(std::min<long>(configured, CPU_SETSIZE)) : 1;
}

bool pin_thread_to_cpu(int cpu, std::error_code& error) noexcept {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
        error = std::make_error_code(std::errc::invalid_argument);
        return false;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    const int result = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (result != 0) error = std::error_code(result, std::generic_category());
    return result == 0;
}
#else
// macOS offers only affinity tags (threads with the same tag share a cache, a hint), not a
// CPU; the BSDs' cpuset_setaffinity / pthread_setaffinity_np(cpuset_t) are not written here.
int cpu_limit() noexcept {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 && online < 0x7fffffff ? static_cast<int>(online) : 1;
}

bool pin_thread_to_cpu(int, std::error_code& error) noexcept {
    error = std::make_error_code(std::errc::not_supported);
    return false;
}
#endif

namespace {
pthread_key_t thread_end_key;
std::atomic<bool> thread_end_key_made{false};
}  // namespace

bool make_thread_end_hook(void (*fn)(void*)) noexcept {
    if (thread_end_key_made.load(std::memory_order_acquire)) return true;
    if (pthread_key_create(&thread_end_key, fn) != 0) return false;
    thread_end_key_made.store(true, std::memory_order_release);
    return true;
}

bool arm_thread_end_hook(void* arg) noexcept {
    return thread_end_key_made.load(std::memory_order_acquire) && pthread_setspecific(thread_end_key, arg) == 0;
}

bool reusable_thread_stack(const char*& lo, const char*& hi) noexcept {
#if defined(__linux__)
    // (The main thread's attributes would be read from /proc/self/maps: long, and not needed.)
    if (static_cast<pid_t>(syscall(SYS_gettid)) == getpid()) return false;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
    void* base = nullptr;
    std::size_t size = 0;
    const bool known = pthread_attr_getstack(&attr, &base, &size) == 0 && base && size;
    pthread_attr_destroy(&attr);
    if (!known) return false;
    lo = static_cast<const char*>(base);
    hi = lo + size;
    return true;
#elif defined(__APPLE__)
    if (pthread_main_np()) return false;
    hi = static_cast<const char*>(pthread_get_stackaddr_np(pthread_self()));  // its top
    lo = hi - pthread_get_stacksize_np(pthread_self());
    return hi != nullptr;
#else
    (void)lo;
    (void)hi;
    return false;  // the BSDs: not written yet
#endif
}

void set_timer_slack(std::chrono::nanoseconds slack) noexcept {
#if defined(__linux__)
    prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack.count()), 0UL, 0UL, 0UL);
#else
    (void)slack;  // macOS and the BSDs have no per-thread timer slack to set
#endif
}

void write_stderr(const char* text, std::size_t bytes) noexcept {
    while (bytes > 0) {
        ssize_t written = ::write(STDERR_FILENO, text, bytes);
        if (written <= 0) return;
        text += written;
        bytes -= static_cast<std::size_t>(written);
    }
}

namespace {

struct sigaction previous_segv_action;
struct sigaction previous_bus_action;

void pass_to_previous_handler(int sig, siginfo_t* info, void* uctx) noexcept {
    const struct sigaction& previous = sig == SIGBUS ? previous_bus_action : previous_segv_action;
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) previous.sa_sigaction(sig, info, uctx);
        return;
    }
    if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        // Back to the default action: a real fault happens again on return and kills the
        // process as if we had never been here; a signal sent by kill() is re-raised.
        signal(sig, SIG_DFL);
#if defined(__APPLE__)
        // Darwin's codes for kill() and sigqueue() are positive (SI_USER is 0x10001).
        if (info->si_code <= 0 || info->si_code == SI_USER || info->si_code == SI_QUEUE) raise(sig);
#else
        if (info->si_code <= 0) raise(sig);
#endif
        return;
    }
    previous.sa_handler(sig);
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
    report_if_stack_overflow(info->si_addr);
    pass_to_previous_handler(sig, info, uctx);
}

}  // namespace

void install_fault_handler() {
    struct sigaction action {};
    action.sa_sigaction = &on_fault;
    // SA_ONSTACK: a fiber that ran into its guard page faults with its stack pointer in that
    // page, so the handler runs on the thread's alternate signal stack (install_fault_stack).
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &previous_segv_action) != 0 ||
        sigaction(SIGBUS, &action, &previous_bus_action) != 0) {
        throw std::system_error(errno, std::generic_category(),
                                "fiber_sched: install_stack_overflow_handler(): sigaction failed");
    }
}

void* install_fault_stack(std::size_t bytes) noexcept {
    stack_t current{};
    if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE) && current.ss_size >= bytes / 2) {
        return nullptr;  // someone (a sanitizer runtime, the application) already gave it one
    }
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    stack_t ss{};
    ss.ss_sp = mem;
    ss.ss_size = bytes;
    ss.ss_flags = 0;
    if (sigaltstack(&ss, nullptr) != 0) {
        munmap(mem, bytes);
        return nullptr;
    }
    return mem;
}

void remove_fault_stack(void* stack, std::size_t bytes) noexcept {
    stack_t ss{};
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
    munmap(stack, bytes);
}

}  // namespace os
}  // namespace detail
}  // namespace fsched
