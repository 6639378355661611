# cmake -DCXX=<compiler> -DINCLUDE_DIR=<directory holding fiber_sched.hpp> -DBINARY_DIR=<dir>
#       -P run.cmake
# x86-64: a file built with another FIBER_SCHED_SWITCH_FP_CONTROL, or another backend, than
# the implementation's calls a switch routine of another name (context.hpp), so the program
# fails to link rather than switch with the wrong arguments. Passes when user.cpp built like
# impl.cpp links and runs, and built with FIBER_SCHED_SWITCH_FP_CONTROL=0 or with
# FIBER_SCHED_USE_UCONTEXT fails to link on an undefined fsched_switch_context.
file(REMOVE_RECURSE "${BINARY_DIR}")
file(MAKE_DIRECTORY "${BINARY_DIR}")
set(flags -std=c++17 -O1 -pthread -I "${INCLUDE_DIR}")
execute_process(COMMAND "${CXX}" ${flags} -c "${CMAKE_CURRENT_LIST_DIR}/impl.cpp" -o "${BINARY_DIR}/impl.o"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "impl.cpp failed to compile:\n${out}")
endif()
execute_process(COMMAND "${CXX}" ${flags} "${CMAKE_CURRENT_LIST_DIR}/user.cpp" "${BINARY_DIR}/impl.o"
                        -o "${BINARY_DIR}/same"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "user.cpp, configured as impl.cpp, failed to build:\n${out}")
endif()
execute_process(COMMAND "${BINARY_DIR}/same" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "user.cpp, configured as impl.cpp, ran and failed (${rc})")
endif()
foreach(define FIBER_SCHED_SWITCH_FP_CONTROL=0 FIBER_SCHED_USE_UCONTEXT)
  execute_process(COMMAND "${CXX}" ${flags} "-D${define}" "${CMAKE_CURRENT_LIST_DIR}/user.cpp"
                          "${BINARY_DIR}/impl.o" -o "${BINARY_DIR}/mismatch"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "user.cpp with -D${define} linked against an implementation built without it; "
                        "it must fail to link")
  endif()
  if(NOT out MATCHES "undefined reference to .fsched_switch_context")
    message(FATAL_ERROR "user.cpp with -D${define} failed, but not on the switch routine's name:\n${out}")
  endif()
endforeach()
message(STATUS "a configuration that differs from the implementation's fails to link, as it should")
