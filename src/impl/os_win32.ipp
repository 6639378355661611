// ---------------------------------------------------------------------------
// Implementation: the OS interface (impl/os.ipp) on Windows: VirtualAlloc for stacks, a
// vectored exception handler for overflows, SetThreadDescription for names.
//
// A guarded stack grows as Windows grows a thread's stack. VirtualAlloc reserves the whole
// range (address space only) and commits the top page, with a PAGE_GUARD page below it:
//
//   top (StackBase)  [ committed, read/write ]   the fiber's frames
//   StackLimit       [ PAGE_GUARD, committed ]   a touch is caught by the memory manager
//                    [ reserved ... ]            the rest of the usable stack
//   base             [ reserved: guard_size() ]  handler_room above a floor page
//   DeallocationStack, the reservation's base
//
// When a fiber touches the PAGE_GUARD page, the memory manager (Windows' kernel; wine's
// virtual_handle_fault) finds the address inside the current thread's stack according to
// the TIB (DeallocationStack <= address < StackBase; context_x86_64_win64.ipp switches
// those with each fiber), makes the page ordinary memory, commits the page below as the new
// guard and moves StackLimit down: no exception reaches the program. Frames of more than a
// page call ___chkstk_ms / __chkstk, which touch each page in order, so none skips the
// guard. Once the guard would come within the thread's guarantee (GuaranteedStackBytes, at
// least two pages; SetThreadStackGuarantee raises it) of DeallocationStack + one page, the
// memory manager commits that guarantee instead and raises EXCEPTION_STACK_OVERFLOW, which
// the vectored handler below runs in: the guarantee is its room (wine's dispatcher needs
// about 12 KiB, and gives up silently below DeallocationStack + one page). So the guard
// below the usable stack is a floor page and handler_room, the guarantee
// install_fault_stack() asks for: a fiber gets all of its usable size before the overflow
// is raised (more without the handler, whose guarantee is smaller; less on a thread whose
// guarantee someone set above handler_room). The floor page is never committed: whatever
// runs past the guarantee faults there. PAGE_GUARD rather than PAGE_NOACCESS at the growing
// end, because growth needs it.
//
// Only what a fiber touched is committed, and charged to the system's commit limit (RAM +
// page file): 100,000 fibers of 256 KiB that touch two pages each commit 800 MiB, not
// 25 GiB. A pooled stack keeps what it committed for its next fiber, as a pooled stack
// keeps its touched pages on POSIX (context_x86_64_win64.ipp keeps its StackLimit at its
// top); trimming releases the surplus stacks whole, and nothing is decommitted otherwise.
//
// Slabs (the stacks past the guarded budget, stack.ipp) are reserved and committed in one
// call, with no guard to grow by: that charges the commit limit for all of them, though no
// physical page is taken until touched.
// ---------------------------------------------------------------------------

#pragma once

#include "impl/os.ipp"
#include "impl/common.ipp"

namespace fsched {
namespace detail {

// The overflow report for a fiber whose stack the OS manages (winfiber backend), in
// stack_overflow.ipp: names the current fiber, aborts. Returns when no fiber is running.
void report_overflow_of_current_fiber() noexcept;

namespace os {

// What the TIB must say of a stack the pool made (for asm-x86_64-win64): where its
// reservation begins (DeallocationStack), its lowest committed byte (StackLimit), and
// whether it grows (a guarded stack) or was committed whole (a slab's; then both are lo).
// Asks VirtualQuery, once per stack: the backend keeps the answer on the stack itself.
struct StackBounds {
    char* deallocation;
    char* limit;
    bool guarded;
};
StackBounds query_stack_bounds(void* lo, std::size_t size) noexcept;

// What abort() does on Windows, in what little stack an overflow leaves: abort() itself
// goes through raise() and the C runtime's reporting, which need more.
[[noreturn]] void abort_after_report() noexcept {
    TerminateProcess(GetCurrentProcess(), 3);
    std::abort();  // not reached
}

std::size_t page_size() noexcept {
    static const std::size_t page = [] {
        SYSTEM_INFO info;
        GetSystemInfo(&info);
        return static_cast<std::size_t>(info.dwPageSize);
    }();
    return page;
}

// The stack guarantee install_fault_stack() asks for: the room the overflow handler runs in.
constexpr std::size_t handler_room = 32 * 1024;

std::size_t guard_size() noexcept { return page_size() + handler_room; }

std::size_t guarded_stack_budget() noexcept {
    // A guard costs a split of the allocation's descriptor, and Windows has no cap on those
    // like vm.max_map_count: the address space is the limit (a million guarded stacks of
    // the default size are 256 GiB of it). Under wine each protection run is a Linux
    // mapping (four per guarded stack here) and Linux's default vm.max_map_count of 65,530
    // applies: half of it for stacks, as os_posix.ipp allows. A guarded stack is two runs
    // (reserved, committed); four are counted, leaving room for wine's own.
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    if (ntdll && GetProcAddress(ntdll, "wine_get_version")) return 65530 / 2 / 4;
    return std::size_t{1} << 20;
}

void* map_stack_memory(std::size_t bytes) noexcept {
    return VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

void* map_guarded_stack(std::size_t bytes, std::size_t) noexcept {
    const std::size_t page = page_size();
    char* const base = static_cast<char*>(VirtualAlloc(nullptr, bytes, MEM_RESERVE, PAGE_READWRITE));
    if (!base) return nullptr;
    char* const top = base + bytes;
    if (!VirtualAlloc(top - page, page, MEM_COMMIT, PAGE_READWRITE) ||
        !VirtualAlloc(top - 2 * page, page, MEM_COMMIT, PAGE_READWRITE | PAGE_GUARD)) {
        VirtualFree(base, 0, MEM_RELEASE);
        return nullptr;
    }
    return base;
}

StackBounds query_stack_bounds(void* lo, std::size_t size) noexcept {
    char* const bottom = static_cast<char*>(lo);
    char* const top = bottom + size;
    StackBounds bounds{bottom, bottom, false};
    // VirtualQuery describes the run of equal pages from the page asked about upwards. A
    // slab's stack is committed from its lowest byte; a guarded one is reserved there, and
    // its first committed page that is not the guard is its StackLimit.
    MEMORY_BASIC_INFORMATION info;
    if (VirtualQuery(bottom, &info, sizeof info) != sizeof info || info.State != MEM_RESERVE) return bounds;
    char* const deallocation = static_cast<char*>(info.AllocationBase);
    for (char* at = bottom; at < top; at = static_cast<char*>(info.BaseAddress) + info.RegionSize) {
        if (VirtualQuery(at, &info, sizeof info) != sizeof info) return bounds;
        if (info.State == MEM_COMMIT && (info.Protect & PAGE_GUARD) == 0) {
            bounds.deallocation = deallocation;
            bounds.limit = at;
            bounds.guarded = true;
            return bounds;
        }
    }
    return bounds;
}

// MEM_RELEASE takes the whole reservation, and size 0: `bytes` is implied by the base.
void unmap_memory(void* base, std::size_t) noexcept { VirtualFree(base, 0, MEM_RELEASE); }

void discard_memory(void* lo, std::size_t bytes) noexcept {
    // MEM_RESET: the pages' contents are not needed; the OS takes them without writing them
    // to the page file, and the range stays committed and usable.
    VirtualAlloc(lo, bytes, MEM_RESET, PAGE_READWRITE);
}

void at_fork(void (*)(), void (*)(), void (*)()) noexcept {}

void name_thread(const std::string& base, int index) noexcept {
    // SetThreadDescription exists from Windows 10 1607: looked up, not linked, so the
    // program still starts on older systems. No length limit.
    using SetDescription = HRESULT(WINAPI*)(HANDLE, PCWSTR);
    HMODULE kernel = GetModuleHandleW(L"kernel32.dll");
    if (!kernel) return;
    FARPROC proc = GetProcAddress(kernel, "SetThreadDescription");
    if (!proc) return;
    SetDescription set_description;
    std::memcpy(&set_description, &proc, sizeof proc);  // no cast between function types
    const std::string name = base + "-" + std::to_string(index);
    std::wstring wide(name.begin(), name.end());  // the base names we give are ASCII
    set_description(GetCurrentThread(), wide.c_str());
}

// Processor group 0 only: a thread's affinity mask is within one group of up to 64
// processors, and a thread starts in its process's group (SetThreadGroupAffinity would
// reach the others).
int cpu_limit() noexcept {
    const DWORD count = GetActiveProcessorCount(0);
    return count == 0 ? 1 : count > 64 ? 64 : static_cast<int>(count);
}

// (Not written: a FiberLocal value made after the exit clean-up stays: docs/things-to-know.md.)
bool make_thread_end_hook(void (*)(void*)) noexcept { return false; }
bool arm_thread_end_hook(void*) noexcept { return false; }

// (Only a fork()ed child needs it, and Windows has no fork().)
bool reusable_thread_stack(const char*&, const char*&) noexcept { return false; }

// Windows has no per-thread timer slack; a wait's precision is the system timer's.
void set_timer_slack(std::chrono::nanoseconds) noexcept {}

bool pin_thread_to_cpu(int cpu, std::error_code& error) noexcept {
    if (cpu < 0 || cpu >= 64) {
        error = std::make_error_code(std::errc::invalid_argument);
        return false;
    }
    if (SetThreadAffinityMask(GetCurrentThread(), DWORD_PTR{1} << cpu) != 0) return true;
    error = std::error_code(static_cast<int>(GetLastError()), std::system_category());
    return false;
}

void write_stderr(const char* text, std::size_t bytes) noexcept {
    HANDLE err = GetStdHandle(STD_ERROR_HANDLE);
    if (err == nullptr || err == INVALID_HANDLE_VALUE) return;
    while (bytes > 0) {
        DWORD written = 0;
        const DWORD chunk = bytes > 65536 ? 65536u : static_cast<DWORD>(bytes);
        if (!WriteFile(err, text, chunk, &written, nullptr) || written == 0) return;
        text += written;
        bytes -= written;
    }
}

namespace {

LONG WINAPI on_exception(EXCEPTION_POINTERS* info) {
    const EXCEPTION_RECORD* record = info->ExceptionRecord;
    switch (record->ExceptionCode) {
    case STATUS_GUARD_PAGE_VIOLATION:  // a guard page touched outside the TIB's stack
    case EXCEPTION_ACCESS_VIOLATION:  // the floor page below a guarded stack, and others
        // ExceptionInformation[1]: the address touched.
        if (record->NumberParameters >= 2) {
            report_if_stack_overflow(reinterpret_cast<const void*>(record->ExceptionInformation[1]));
        }
        break;
    case EXCEPTION_STACK_OVERFLOW:
        // Raised by the kernel for the stack the TIB describes: a thread's own, a guarded
        // fiber stack (asm-x86_64-win64, which switches the TIB) or an OS fiber's
        // (winfiber). Inside a fiber it is the fiber's.
        report_overflow_of_current_fiber();
        break;
    default: break;
    }
    // Every other exception goes on to the handlers registered before and to the frames'.
    return EXCEPTION_CONTINUE_SEARCH;
}

}  // namespace

void install_fault_handler() {
    // First in the vectored list: it only reads and, unless it aborts, passes on.
    if (!AddVectoredExceptionHandler(1, &on_exception)) {
        throw std::system_error(static_cast<int>(GetLastError()), std::system_category(),
                                "fiber_sched: install_stack_overflow_handler(): AddVectoredExceptionHandler failed");
    }
}

void* install_fault_stack(std::size_t bytes) noexcept {
    // No alternate stacks on Windows (see the top of this file): the kernel keeps the
    // thread's guarantee committed for handlers below a stack that overflows, the thread's
    // own and, through the TIB, each guarded fiber stack, whose guard leaves handler_room
    // for it. Never lowers a guarantee someone else set.
    (void)bytes;
    ULONG guarantee = 0;
    if (SetThreadStackGuarantee(&guarantee) && guarantee < handler_room) {
        guarantee = static_cast<ULONG>(handler_room);
        SetThreadStackGuarantee(&guarantee);
    }
    return nullptr;  // nothing mapped, nothing to free
}

void remove_fault_stack(void*, std::size_t) noexcept {}

}  // namespace os
}  // namespace detail
}  // namespace fsched
