# cmake -DCXX=<compiler> -DINCLUDE_DIR=<directory holding fiber_sched.hpp> [-DEXPECT=<text>]
#       -P run.cmake
# Passes when use_io.cpp fails to compile with the "Linux-only" message (and EXPECT, if given:
# the Windows wording, with a compiler for Windows).
execute_process(
  COMMAND "${CXX}" -std=c++17 -fsyntax-only -I "${INCLUDE_DIR}" "${CMAKE_CURRENT_LIST_DIR}/use_io.cpp"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "use_io.cpp compiled without epoll; fsched::io must refuse it")
endif()
if(NOT "${out}${err}" MATCHES "fsched::io is Linux-only")
  message(FATAL_ERROR "use_io.cpp failed without the Linux-only message:\n${out}${err}")
endif()
if(DEFINED EXPECT AND NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "use_io.cpp failed without \"${EXPECT}\":\n${out}${err}")
endif()
message(STATUS "fsched::io without epoll: refused at compile time, as it should be")
