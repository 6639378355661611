# cmake -DPYTHON=<python3> -DCHECK=<check.py> -DLIST=<scratch file> -DCONFIGS=<configs> -P run.cmake
# Runs check.py once per configuration, each after the first checking only the parts the
# ones before it did not compile (a cross compiler's backend, the other idle wait). CONFIGS
# is a list of "<compiler>|<flag>,<flag>..." entries.
file(REMOVE "${LIST}")
set(failed "")
foreach(config IN LISTS CONFIGS)
  string(REPLACE "|" ";" fields "${config}")
  list(GET fields 0 cxx)
  set(flags "")
  list(LENGTH fields n)
  if(n GREATER 1)
    list(GET fields 1 flag_text)
    string(REPLACE "," ";" flag_list "${flag_text}")
    foreach(flag IN LISTS flag_list)
      list(APPEND flags "--flag=${flag}")
    endforeach()
  endif()
  execute_process(COMMAND "${PYTHON}" "${CHECK}" --cxx "${cxx}" ${flags} --only-new "${LIST}" --record "${LIST}"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(APPEND failed "${config}")
  endif()
endforeach()
# Parts no configuration here compiles (a cross compiler missing): said, not failed.
file(STRINGS "${LIST}" checked)
file(GLOB_RECURSE all RELATIVE "${CMAKE_CURRENT_LIST_DIR}/../../src" "${CMAKE_CURRENT_LIST_DIR}/../../src/*.hpp"
     "${CMAKE_CURRENT_LIST_DIR}/../../src/*.ipp")
list(REMOVE_ITEM all fiber_sched.hpp)
list(REMOVE_ITEM all ${checked})
if(all AND "$ENV{CI}" STREQUAL "true")
  # CI installs every cross compiler: a part none of them builds has no configuration in
  # _parts_configs (tests/CMakeLists.txt) yet.
  list(APPEND failed "no configuration builds ${all}")
elseif(all)
  message(STATUS "parts no compiler here builds, so unchecked: ${all}")
else()
  message(STATUS "every part of src/ was checked by one of the configurations")
endif()
if(failed)
  message(FATAL_ERROR "parts that do not compile with only what they include, in: ${failed}")
endif()
