# cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DFIBER_SCHED_SOURCE_DIR=... -DGENERATOR=...
#       [-DGENERATOR_PLATFORM=...] [-DGENERATOR_TOOLSET=...] [-DMAKE_PROGRAM=...]
#       [-DCXX_COMPILER=...] [-DCONFIG=...]
#       [-DFIBER_SCHED_GENERATE_HEADER=ON|OFF] [-DPYTHON3_EXECUTABLE=...] -P run.cmake
#
# Passes only when a program that never defines FIBER_SCHED_IMPLEMENTATION compiles, then
# fails to link with the symbol that tells the user what to do.
cmake_minimum_required(VERSION 3.14)

set(expected_symbol "define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file")

foreach(var SOURCE_DIR BINARY_DIR FIBER_SCHED_SOURCE_DIR GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

set(configure_args -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
    "-DFIBER_SCHED_SOURCE_DIR=${FIBER_SCHED_SOURCE_DIR}")
if(GENERATOR_PLATFORM)
  list(APPEND configure_args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND configure_args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(NOT "${FIBER_SCHED_GENERATE_HEADER}" STREQUAL "")
  # ON: fiber_sched regenerates its header from src/ in BINARY_DIR, as the outer build does.
  list(APPEND configure_args "-DFIBER_SCHED_GENERATE_HEADER=${FIBER_SCHED_GENERATE_HEADER}")
endif()
if(PYTHON3_EXECUTABLE)
  list(APPEND configure_args "-DPython3_EXECUTABLE=${PYTHON3_EXECUTABLE}")
endif()
set(build_config_args "")
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
  set(build_config_args --config "${CONFIG}")
endif()

# A fresh tree every run: a stale object or executable must not decide the outcome.
file(REMOVE_RECURSE "${BINARY_DIR}")

execute_process(COMMAND "${CMAKE_COMMAND}" ${configure_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the link-check project failed:\n${out}")
endif()

execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --target link_check_objects
                        ${build_config_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fiber_sched.hpp must compile without FIBER_SCHED_IMPLEMENTATION, "
                      "but compiling main.cpp failed:\n${out}")
endif()

execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --target link_check
                        ${build_config_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "a program without FIBER_SCHED_IMPLEMENTATION linked; it must fail "
                      "to link with the symbol ${expected_symbol}:\n${out}")
endif()
string(FIND "${out}" "${expected_symbol}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the link failed as it should, but its output does not name "
                      "${expected_symbol}:\n${out}")
endif()
message(STATUS "ok: linking without FIBER_SCHED_IMPLEMENTATION fails and names ${expected_symbol}")
