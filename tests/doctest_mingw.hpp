// Included before everything else in each test file built with MinGW-w64 g++ (a forced
// include: cmake/FiberSchedTestHelpers.cmake).
//
// MinGW-w64 g++ keeps thread_local variables in emutls, which frees a thread's variables
// before their destructors run (src/impl/common.ipp): a destructor then works on freed
// memory. doctest's INFO, CAPTURE and *_MESSAGE checks keep their context in a thread_local
// std::vector. On a thread other than the main one, that vector's destructor ran on a block
// the heap had already reused for its free list, and freed a pointer from it. The heap broke,
// and a later free() crashed ("wine: Unhandled page fault" in heap_free_block, in CI's
// mingw-asm variant, once in a few runs). Here INFO and CAPTURE keep their context on the
// main thread only; on any other thread they record nothing, so a check that fails there
// prints no context under MinGW. doctest's other thread_local, its string stream, does the
// same harm: MESSAGE, FAIL and WARN make it, and so does a check that fails; so no test
// calls MESSAGE off the main thread, and a check failing there may end a MinGW run in a
// crash at that thread's exit, before doctest reports the failure (wine's "Unhandled page
// fault" in heap_free_block is then the sign).
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <ostream>
#include <thread>

namespace test {

// Initialised before main(), on the main thread.
inline const std::thread::id main_thread_id = std::this_thread::get_id();

// doctest's context scope, made only on the main thread.
template <typename L>
class MainThreadContext {
public:
    explicit MainThreadContext(const L& lambda) {
        if (std::this_thread::get_id() == main_thread_id) scope_.emplace(lambda);
    }

private:
    std::optional<doctest::detail::ContextScope<L>> scope_;
};

}  // namespace test

// INFO, CAPTURE and the *_MESSAGE checks all expand to this.
#undef DOCTEST_INFO_IMPL
#define DOCTEST_INFO_IMPL(mb_name, s_name, ...)                                                    \
    auto DOCTEST_ANONYMOUS(DOCTEST_CAPTURE_) = ::test::MainThreadContext([&](std::ostream* s_name) { \
        doctest::detail::MessageBuilder mb_name(__FILE__, __LINE__, doctest::assertType::is_warn);  \
        mb_name.m_stream = s_name;                                                                  \
        mb_name * __VA_ARGS__;                                                                      \
    })
