// The one doctest main shared by every test file.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#if defined(_WIN32)
// The Windows half of test::run_in_child() (helpers.hpp): a listener that knows which test
// case runs, starting a child, and being one.
#include "helpers.hpp"

#include <windows.h>
#include <fcntl.h>
#include <io.h>

#include <csignal>
#include <cstdlib>
#include <exception>

namespace {

struct CurrentTestCase : doctest::IReporter {
    explicit CurrentTestCase(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& data) override {
        test::child::test_case = data.m_name;
        test::child::calls = 0;
    }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("fsched_current_test_case", 1, CurrentTestCase);

constexpr const char* child_variable = "FSCHED_TEST_CHILD";

// "<call>:<test case>" in a child, empty in the parent.
const std::string& child_role() {
    static const std::string role = [] {
        const char* value = std::getenv(child_variable);
        return std::string(value ? value : "");
    }();
    return role;
}

LONG WINAPI die_with_exception_code(EXCEPTION_POINTERS* info) {
    TerminateProcess(GetCurrentProcess(), info->ExceptionRecord->ExceptionCode);
    return EXCEPTION_EXECUTE_HANDLER;
}

std::wstring widen(const std::string& text) {
    std::wstring wide;
    for (char c : text) wide += static_cast<wchar_t>(static_cast<unsigned char>(c));
    return wide;
}

}  // namespace

namespace test {
namespace child {

bool is_target(int call) {
    return !child_role().empty() && child_role() == std::to_string(call) + ":" + test_case;
}

void run_body_here(int, void (*run)(void*), void* body) {
    // doctest's crash handlers are set; the child must die of its own faults: no filter,
    // no debugger (wine would start one), abort() exits with code 3.
    std::signal(SIGABRT, SIG_DFL);
    std::signal(SIGSEGV, SIG_DFL);
    std::set_terminate(nullptr);
    SetErrorMode(SEM_FAILCRITICALERRORS | SEM_NOGPFAULTERRORBOX);
    SetUnhandledExceptionFilter(&die_with_exception_code);
    // "\n" stays "\n", as the parent's checks of what the child wrote expect.
    _setmode(_fileno(stderr), _O_BINARY);
    run(body);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
}

ChildResult start(int call, unsigned seconds) {
    ChildResult result;
    if (!child_role().empty()) return result;  // a child's other calls run nothing
    // doctest's filters take * and ? as wildcards and , as a separator: ? stands for any of
    // those in the name (and for the quote, which the command line would need escaped).
    std::string pattern = test_case;
    for (char& c : pattern) {
        if (c == ',' || c == '\\' || c == '*' || c == '?' || c == '"') c = '?';
    }
    wchar_t exe[32768];
    const DWORD exe_length = GetModuleFileNameW(nullptr, exe, 32768);
    if (exe_length == 0 || exe_length >= 32768) return result;
    std::wstring command = L"\"" + std::wstring(exe, exe_length) + L"\" \"-tc=" + widen(pattern) + L"\"";

    SECURITY_ATTRIBUTES inherit{sizeof(SECURITY_ATTRIBUTES), nullptr, TRUE};
    HANDLE read_end = nullptr, write_end = nullptr;
    if (!CreatePipe(&read_end, &write_end, &inherit, 0)) return result;
    SetHandleInformation(read_end, HANDLE_FLAG_INHERIT, 0);
    HANDLE null_device = CreateFileW(L"NUL", GENERIC_READ | GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_WRITE,
                                     &inherit, OPEN_EXISTING, 0, nullptr);
    STARTUPINFOW startup{};
    startup.cb = sizeof startup;
    startup.dwFlags = STARTF_USESTDHANDLES;
    startup.hStdInput = null_device;
    startup.hStdOutput = null_device;  // the child's doctest report is not ours to read
    startup.hStdError = write_end;
    PROCESS_INFORMATION process{};
    const std::string role = std::to_string(call) + ":" + test_case;
    SetEnvironmentVariableA(child_variable, role.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    // Wine's CreateProcess fails now and then on a loaded machine (error 1359, an internal
    // error, seen once in CI): tried again a few times before the child counts as not started.
    BOOL started = FALSE;
    DWORD create_error = 0;
    for (int attempt = 0; attempt < 5 && !started; ++attempt) {
        if (attempt > 0) Sleep(200);
        started = CreateProcessW(nullptr, &command[0], nullptr, nullptr, TRUE, 0, nullptr, nullptr, &startup, &process);
        if (!started) create_error = GetLastError();
    }
    SetEnvironmentVariableA(child_variable, nullptr);
    CloseHandle(write_end);
    if (null_device != INVALID_HANDLE_VALUE) CloseHandle(null_device);
    if (!started) {
        CloseHandle(read_end);
        result.err = "CreateProcess failed: " + std::to_string(create_error);
        return result;
    }
    std::thread reader([&] {
        char buffer[4096];
        DWORD n = 0;
        while (ReadFile(read_end, buffer, sizeof buffer, &n, nullptr) && n > 0) result.err.append(buffer, n);
    });
    if (WaitForSingleObject(process.hProcess, seconds * 1000u) != WAIT_OBJECT_0) {
        TerminateProcess(process.hProcess, 0xC000013Au);  // as if it were killed: a timeout
        WaitForSingleObject(process.hProcess, INFINITE);
    }
    reader.join();
    CloseHandle(read_end);
    DWORD code = 0;
    GetExitCodeProcess(process.hProcess, &code);
    CloseHandle(process.hThread);
    CloseHandle(process.hProcess);
    if (code == 3) {  // abort()
        result.signaled = true;
        result.signal = SIGABRT;
    } else if (code == 0xC0000005u || code == 0x80000001u || code == 0xC00000FDu) {
        result.signaled = true;
        result.signal = SIGSEGV;
    } else if (code >= 0xC0000000u) {  // another exception or the timeout
        result.signaled = true;
        result.signal = -1;
    } else {
        result.exited = true;
        result.exit_code = static_cast<int>(code);
    }
    return result;
}

}  // namespace child
}  // namespace test
#endif
