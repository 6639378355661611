# Helpers shared by the fiber_sched tests, examples and the cross-compiled test project.
# Not installed: consumers of fiber_sched never see these.
include_guard(GLOBAL)

option(FIBER_SCHED_TEST_PCH "Precompile the headers the test files share (CMake 3.16 and later)" ON)

# fiber_sched_strict_warnings(<target>)
# Warnings are errors for our own code; set on the target, never in CMAKE_CXX_FLAGS.
function(fiber_sched_strict_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4 /WX)
  endif()
  # Plain ISO C++17 (-std=c++17, not gnu++17): the oldest standard the header supports.
  set_target_properties(${target} PROPERTIES
    CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
endfunction()

# fiber_sched_add_test_executable(<target>
#     TESTS_DIR <dir holding main.cpp, impl.cpp and test_*.cpp>
#     VARIANT <name>                      # becomes FIBER_SCHED_TEST_VARIANT="<name>"
#     [LIBRARIES <doctest target> ...]
#     [COMPILE_OPTIONS ...] [LINK_OPTIONS ...] [DEFINITIONS ...])
# One test executable: the doctest main, the one implementation TU and every test_*.cpp.
function(fiber_sched_add_test_executable target)
  cmake_parse_arguments(PARSE_ARGV 1 arg ""
    "TESTS_DIR;VARIANT" "LIBRARIES;COMPILE_OPTIONS;LINK_OPTIONS;DEFINITIONS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "fiber_sched_add_test_executable: unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  file(GLOB test_sources CONFIGURE_DEPENDS "${arg_TESTS_DIR}/test_*.cpp")
  list(SORT test_sources)
  # FIBER_SCHED_TEST_FILES (a ;-list of names such as test_sync): only those files, for a
  # contributor's short loop (tests/one). Empty, the default: every file.
  if(FIBER_SCHED_TEST_FILES)
    set(chosen "")
    string(REPLACE "," ";" names "${FIBER_SCHED_TEST_FILES}")  # a nested build's commas
    foreach(name IN LISTS names)
      string(REGEX REPLACE "\\.cpp$" "" name "${name}")
      get_filename_component(name "${name}" NAME)
      if(NOT EXISTS "${arg_TESTS_DIR}/${name}.cpp")
        message(FATAL_ERROR "FIBER_SCHED_TEST_FILES: no ${arg_TESTS_DIR}/${name}.cpp")
      endif()
      list(APPEND chosen "${arg_TESTS_DIR}/${name}.cpp")
    endforeach()
    set(test_sources ${chosen})
  endif()
  if(WIN32)
    # fsched::io is Linux-only: its test files are not built for Windows.
    list(FILTER test_sources EXCLUDE REGEX "/test_io[^/]*\\.cpp$")
  endif()
  if(NOT test_sources)
    message(WARNING "fiber_sched: no ${arg_TESTS_DIR}/test_*.cpp found")
  endif()
  # global_scheduler.cpp comes before impl.cpp: its global Scheduler is constructed before
  # the implementation's translation unit is initialised.
  add_executable(${target} "${arg_TESTS_DIR}/main.cpp" "${arg_TESTS_DIR}/global_scheduler.cpp"
                 "${arg_TESTS_DIR}/impl.cpp" ${test_sources})
  target_link_libraries(${target} PRIVATE fiber_sched::fiber_sched ${arg_LIBRARIES})
  # FIBER_SCHED_FAULT_INJECTION: the test-only hooks that make allocation, stack and fd
  # sites fail on demand (tests/test_faults.cpp).
  # DOCTEST_CONFIG_SUPER_FAST_ASSERTS: each check is a call, not a try block of its own
  # (a tenth of the suite's compile); an exception a check's expression throws then fails
  # the test case rather than the one check.
  target_compile_definitions(${target} PRIVATE
    "FIBER_SCHED_TEST_VARIANT=\"${arg_VARIANT}\"" FIBER_SCHED_FAULT_INJECTION DOCTEST_CONFIG_SUPER_FAST_ASSERTS
    ${arg_DEFINITIONS})
  fiber_sched_strict_warnings(${target})
  if(NOT MSVC)
    # fiber_report()'s backtraces follow frame pointers (tests/test_inspect.cpp checks them);
    # -rdynamic (ENABLE_EXPORTS) lets dladdr name the test program's functions.
    target_compile_options(${target} PRIVATE -fno-omit-frame-pointer)
    if(NOT WIN32)
      set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
    endif()
  endif()
  target_compile_options(${target} PRIVATE ${arg_COMPILE_OPTIONS})
  target_link_options(${target} PRIVATE ${arg_LINK_OPTIONS})
  # The headers every test file starts with, parsed once per executable (CMake 3.16 and
  # later): about a second of each test file's compile, a quarter of the suite's. Each
  # test_*.cpp includes them first, with no macro defined before them, so the compiler sees
  # the same text either way. main.cpp (doctest's implementation) and impl.cpp (the
  # library's) define macros first and are compiled without it, as is global_scheduler.cpp
  # (one small file).
  set(pch_headers "${arg_TESTS_DIR}/helpers.hpp" <doctest/doctest.h>)  # helpers.hpp: fiber_sched.hpp first
  if(MINGW)
    # MinGW-w64's emutls frees a thread's thread_locals before their destructors run; the
    # test files' INFO and CAPTURE must keep doctest's thread_local off other threads
    # (tests/doctest_mingw.hpp says why). Not main.cpp: it builds doctest's implementation.
    list(APPEND pch_headers "${arg_TESTS_DIR}/doctest_mingw.hpp")
  endif()
  if(FIBER_SCHED_TEST_PCH AND test_sources AND COMMAND target_precompile_headers)
    target_precompile_headers(${target} PRIVATE ${pch_headers})
    set_source_files_properties("${arg_TESTS_DIR}/main.cpp" "${arg_TESTS_DIR}/global_scheduler.cpp"
      "${arg_TESTS_DIR}/impl.cpp" PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  elseif(MINGW AND test_sources)
    set_source_files_properties(${test_sources} PROPERTIES
      COMPILE_OPTIONS "-include;${arg_TESTS_DIR}/doctest_mingw.hpp")
  endif()
endfunction()
