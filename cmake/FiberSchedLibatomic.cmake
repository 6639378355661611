# fiber_sched_needs_libatomic(<result var>): TRUE when this C++ compiler's 1-byte atomics
# (std::atomic<bool> and the library's one-byte states: exchange, compare-exchange) link only
# with libatomic, as with gcc 12 on RISC-V, which has no inline sub-word atomics; FALSE when
# they link without it (or cannot be linked with it either). Used by the build
# (CMakeLists.txt) and by the installed package (fiber_schedConfig.cmake), so that each
# consumer's compiler decides.
include_guard(GLOBAL)
include(CheckCXXSourceCompiles)

function(fiber_sched_needs_libatomic result)
  set(${result} FALSE PARENT_SCOPE)
  if(NOT CMAKE_CXX_COMPILER_LOADED)
    return()  # a project without C++ links no fiber_sched code
  endif()
  set(source [[
    #include <atomic>
    std::atomic<bool> flag{false};
    std::atomic<unsigned char> byte{0};
    int main() {
      unsigned char expected = 0;
      bool swapped = byte.compare_exchange_strong(expected, 1);
      return flag.exchange(swapped) ? 1 : 0;
    }
  ]])
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_source_compiles("${source}" FIBER_SCHED_ATOMICS_LINK_ALONE)
  if(FIBER_SCHED_ATOMICS_LINK_ALONE)
    return()
  endif()
  set(CMAKE_REQUIRED_LIBRARIES atomic)
  check_cxx_source_compiles("${source}" FIBER_SCHED_ATOMICS_LINK_WITH_LIBATOMIC)
  set(${result} ${FIBER_SCHED_ATOMICS_LINK_WITH_LIBATOMIC} PARENT_SCOPE)
endfunction()
