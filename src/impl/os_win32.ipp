// ---------------------------------------------------------------------------
// Implementation: the OS interface (impl/os.ipp) on Windows: VirtualAlloc for stacks, a
// vectored exception handler for overflows, SetThreadDescription for names.
//
// Stack memory is reserved and committed in one VirtualAlloc call. Committing charges the
// system's commit limit (RAM + page file) for the whole stack, but takes no physical page:
// each page is a demand-zero page until a fiber first touches it, so memory in use is what
// the fibers touched, as with mmap on POSIX. (Committing page by page as the stack grows,
// as Windows does for thread stacks, would need the kernel's stack-growth guard to follow
// the fiber, or a fault handler in every program; the one call keeps both out.)
//
// The guard below each stack is 16 KiB: from the top, one PAGE_GUARD page, two ordinary
// pages, and a PAGE_NOACCESS floor. Windows has no alternate signal stack: an exception is
// dispatched on the stack of the code that faulted, and a fiber that ran into its guard has
// its stack pointer there. A touch of a PAGE_GUARD page raises STATUS_GUARD_PAGE_VIOLATION
// and turns the page into ordinary memory, so the dispatcher and the vectored handler below
// run in the 12 KiB under the fault (one page is not enough for wine's dispatcher); a
// PAGE_NOACCESS guard would leave them no room, and the process would vanish without a
// word. The floor stops whatever runs past that room. The PAGE_GUARD page is one-shot, but
// an overflow is fatal either way: reported and ended with the handler, an unhandled
// exception without it. SetThreadStackGuarantee() keeps such room on a thread's own stack
// (whose guard the kernel moves as it grows); install_fault_stack() asks for it, so an
// overflow of a thread's own stack reaches the handlers too.
// ---------------------------------------------------------------------------

namespace fsched {
namespace detail {

// The overflow report for a fiber whose stack the OS manages (winfiber backend), in
// stack_overflow.ipp: names the current fiber, aborts. Returns when no fiber is running.
void report_overflow_of_current_fiber() noexcept;

namespace os {

// What abort() does on Windows, in what little stack an overflow leaves: abort() itself
// goes through raise() and the C runtime's reporting, which need more.
[[noreturn]] void abort_after_report() noexcept {
    TerminateProcess(GetCurrentProcess(), 3);
    std::abort();  // not reached
}

std::size_t page_size() noexcept {
    SYSTEM_INFO info;
    GetSystemInfo(&info);
    return static_cast<std::size_t>(info.dwPageSize);
}

std::size_t guard_size() noexcept { return 4 * page_size(); }

std::size_t guarded_stack_budget() noexcept {
    // A guard costs a split of the allocation's descriptor, and Windows has no cap on those
    // like vm.max_map_count: the address space is the limit (a million guarded stacks of
    // the default size are 256 GiB of it). Under wine each protection run is a Linux
    // mapping (four per guarded stack here) and Linux's default vm.max_map_count of 65,530
    // applies: half of it for stacks, as os_posix.ipp allows.
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    if (ntdll && GetProcAddress(ntdll, "wine_get_version")) return 65530 / 2 / 4;
    return std::size_t{1} << 20;
}

void* map_stack_memory(std::size_t bytes) noexcept {
    return VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

bool guard_pages(void* lo, std::size_t bytes) noexcept {
    const std::size_t page = page_size();
    char* const floor = static_cast<char*>(lo);
    char* const top = floor + bytes - page;
    DWORD previous = 0;
    if (!VirtualProtect(floor, page, PAGE_NOACCESS, &previous)) return false;
    if (!VirtualProtect(top, page, PAGE_READWRITE | PAGE_GUARD, &previous)) {
        VirtualProtect(floor, page, PAGE_READWRITE, &previous);
        return false;
    }
    return true;
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
    case STATUS_GUARD_PAGE_VIOLATION:
    case EXCEPTION_ACCESS_VIOLATION:
        // ExceptionInformation[1]: the address touched.
        if (record->NumberParameters >= 2) {
            report_if_stack_overflow(reinterpret_cast<const void*>(record->ExceptionInformation[1]));
        }
        break;
    case EXCEPTION_STACK_OVERFLOW:
        // Raised by the kernel for a stack it manages: a thread's own, or an OS fiber's
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
    // No alternate stacks on Windows (see the top of this file); for the thread's own stack
    // the kernel keeps `bytes` free below its guard once the stack overflows, so handlers
    // can run there. Never lowers a guarantee someone else set.
    ULONG guarantee = 0;
    if (SetThreadStackGuarantee(&guarantee) && guarantee < bytes / 2) {
        guarantee = static_cast<ULONG>(bytes / 2);
        SetThreadStackGuarantee(&guarantee);
    }
    return nullptr;  // nothing mapped, nothing to free
}

void remove_fault_stack(void*, std::size_t) noexcept {}

}  // namespace os
}  // namespace detail
}  // namespace fsched
