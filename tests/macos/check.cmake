# Compile-only checks of fiber_sched for macOS (x86-64 and Apple silicon), with clang on a
# machine that has no Apple SDK. Nothing here runs on a Mac: it proves that the code
# assembles and compiles for Mach-O, links with ld64.lld, and that the switch routine is the
# one reviewed.
#
# cmake -DMODE=backend|suite|io -DARCH=x86_64|arm64 -DCLANGXX=<clang++> -DBINARY_DIR=<dir>
#       -DSOURCE_DIR=<repository> [-DLD64=<ld64.lld> -DNM=<llvm-nm> -DOBJDUMP=<llvm-objdump>]
#       [-DHEADER_DIR=<dir of fiber_sched.hpp> -DLIBCXX_DIR=<libc++'s include/c++/v1>
#        -DDOCTEST_HEADER=<doctest/doctest.h>] -P check.cmake
#
# backend  tests/macos/backend.cpp: config.hpp, context.hpp and the backend's .ipp files
#          only, against clang's own <stddef.h>/<stdint.h> (no SDK, no stubs); linked with
#          main() into an executable (ld64.lld, tests/macos/libSystem.tbd, no undefined
#          symbol allowed); the symbols read with llvm-nm and the switch routine's
#          instructions with llvm-objdump, compared with the listing below.
# suite    the generated header and the test suite's translation units (main.cpp,
#          global_scheduler.cpp, impl.cpp, every test_*.cpp but the Linux-only test_io*),
#          -Wall -Wextra -Wpedantic -Werror, against libc++'s headers (LIBCXX_DIR) over
#          tests/macos/darwin-stubs (declarations of Darwin's C interface, no SDK); impl.cpp
#          at -O2, the others at -O0 (faster; only compilation is checked); all linked with
#          -undefined dynamic_lookup (only the C and C++ runtimes may be left undefined);
#          the cascade must have picked the assembly backend.
# io       fsched::io used on macOS fails to compile, saying it is Linux-only.

foreach(var MODE ARCH CLANGXX BINARY_DIR SOURCE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is required")
  endif()
endforeach()

set(triple "${ARCH}-apple-macos11")
set(out_dir "${BINARY_DIR}/${ARCH}")
file(MAKE_DIRECTORY "${out_dir}")
set(common_flags -target "${triple}" -std=c++17 -Wall -Wextra -Wpedantic -Werror
                 -nostdlibinc -nostdinc++)
set(stubs "${SOURCE_DIR}/tests/macos/darwin-stubs")

# run(<what> <command>...): runs a command, fails the check with its output if it fails.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " shown "${ARGN}")
    message(FATAL_ERROR "${triple}: ${what} failed (${rc}):\n${shown}\n${out}${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# instructions(<var> <objdump output>): the instructions, one "mnemonic operands" per list
# element, without addresses (a branch keeps its target's <symbol+offset>), comments and the
# nop padding after the routine.
function(instructions var text)
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(result "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^ *[0-9a-f]+:[ \t]+(.*)$")
      string(REGEX REPLACE "[ \t]+" " " insn "${CMAKE_MATCH_1}")
      # A branch names its target by address and symbol: keep the symbol; drop comments.
      string(REGEX REPLACE "0x[0-9a-f]+ (<[^>]*>)" "\\1" insn "${insn}")
      string(REGEX REPLACE " *##.*$" "" insn "${insn}")
      string(STRIP "${insn}" insn)
      string(TOLOWER "${insn}" insn)  # llvm-objdump versions differ in case (FPCR, fpcr)
      if(NOT insn MATCHES "^nop")
        list(APPEND result "${insn}")
      endif()
    endif()
  endforeach()
  set(${var} "${result}" PARENT_SCOPE)
endfunction()

# expect_routine(<binary> <symbol> <expected instruction>...): its disassembly is exactly this.
function(expect_routine binary symbol)
  run("llvm-objdump of ${symbol}" "${OBJDUMP}" -d --no-show-raw-insn
      "--disassemble-symbols=${symbol}" "${binary}")
  instructions(got "${run_output}")
  string(TOLOWER "${ARGN}" want)
  if(NOT "${got}" STREQUAL "${want}")
    string(REPLACE ";" "\n  " got_text "${got}")
    string(REPLACE ";" "\n  " want_text "${want}")
    message(FATAL_ERROR "${triple}: ${symbol} changed shape. Expected:\n  ${want_text}\n"
                        "got:\n  ${got_text}\n(update tests/macos/check.cmake with a reviewed change)")
  endif()
endfunction()

# expect_symbols(<object> <symbol>...): each is defined in __TEXT,__text, private extern.
function(expect_symbols object)
  run("llvm-nm" "${NM}" -m "${object}")
  foreach(symbol IN LISTS ARGN)
    if(NOT run_output MATCHES "\\(__TEXT,__text\\) private external ${symbol}\n")
      message(FATAL_ERROR "${triple}: ${object} has no private extern ${symbol} in __TEXT,__text:\n${run_output}")
    endif()
  endforeach()
endfunction()

# no_x18(<binary>): Apple's arm64 ABI reserves x18 (the platform register): nothing may use it.
function(no_x18 binary)
  run("llvm-objdump" "${OBJDUMP}" -d --no-show-raw-insn "${binary}")
  instructions(all "${run_output}")
  foreach(insn IN LISTS all)
    if(insn MATCHES "[ ,\\[][xw]18([^0-9]|$)")
      message(FATAL_ERROR "${triple}: ${binary} uses x18, the platform register: ${insn}")
    endif()
  endforeach()
endfunction()

if(ARCH STREQUAL "x86_64")
  set(backend_name "asm-x86_64-sysv")
  set(switch_routine "_fsched_switch_context_fp")  # with FIBER_SCHED_SWITCH_FP_CONTROL 1
  set(trampoline "_fsched_trampoline_x86_64_sysv")
  # context_x86_64_sysv.ipp with FIBER_SCHED_SWITCH_FP_CONTROL 1 (the default): the FP words
  # come in rdx and are loaded out of line, only where a control bit differs.
  set(switch_listing
    "pushq %rbp" "pushq %rbx" "pushq %r12" "pushq %r13" "pushq %r14" "pushq %r15"
    "subq $8, %rsp" "movq %rdx, (%rsp)"
    "movq %rsp, (%rdi)" "movq %rsi, %rsp"
    "movq (%rsp), %rax" "xorq %rdx, %rax" "movabsq $281474976710592, %r11" "testq %r11, %rax"
    "jne <_fsched_switch_context_fp+0x3f>"
    "addq $8, %rsp"
    "popq %r15" "popq %r14" "popq %r13" "popq %r12" "popq %rbx" "popq %rbp"
    "popq %rcx" "jmpq *%rcx"
    "andq $-64, %rax" "xorq %rdx, %rax" "movq %rax, (%rsp)" "ldmxcsr (%rsp)" "fldcw 4(%rsp)"
    "jmp <_fsched_switch_context_fp+0x2e>")
  set(trampoline_listing "movq %r13, %rdi" "callq *%r12" "ud2")
elseif(ARCH STREQUAL "arm64")
  set(backend_name "asm-aarch64")
  set(switch_routine "_fsched_switch_context")
  set(trampoline "_fsched_trampoline_aarch64_aapcs")
  # context_aarch64_aapcs.ipp: x19-x30, d8-d15 and FPCR saved, x9 the only scratch register.
  set(switch_listing
    "sub sp, sp, #176"
    "stp x19, x20, [sp]" "stp x21, x22, [sp, #16]" "stp x23, x24, [sp, #32]"
    "stp x25, x26, [sp, #48]" "stp x27, x28, [sp, #64]" "stp x29, x30, [sp, #80]"
    "stp d8, d9, [sp, #96]" "stp d10, d11, [sp, #112]" "stp d12, d13, [sp, #128]"
    "stp d14, d15, [sp, #144]" "mrs x9, FPCR" "str x9, [sp, #160]"
    "mov x9, sp" "str x9, [x0]" "mov sp, x1"
    "ldp x19, x20, [sp]" "ldp x21, x22, [sp, #16]" "ldp x23, x24, [sp, #32]"
    "ldp x25, x26, [sp, #48]" "ldp x27, x28, [sp, #64]" "ldp x29, x30, [sp, #80]"
    "ldp d8, d9, [sp, #96]" "ldp d10, d11, [sp, #112]" "ldp d12, d13, [sp, #128]"
    "ldp d14, d15, [sp, #144]" "ldr x9, [sp, #160]" "msr FPCR, x9"
    "add sp, sp, #176" "ret")
  set(trampoline_listing "mov x0, x20" "blr x19" "brk #0")
else()
  message(FATAL_ERROR "check.cmake: ARCH is x86_64 or arm64, not '${ARCH}'")
endif()

if(MODE STREQUAL "backend")
  set(object "${out_dir}/backend.o")
  set(program "${out_dir}/backend")
  run("compiling tests/macos/backend.cpp" "${CLANGXX}" ${common_flags} -O2 -fno-exceptions -fno-rtti
      -I "${SOURCE_DIR}/src" -c "${SOURCE_DIR}/tests/macos/backend.cpp" -o "${object}")
  expect_symbols("${object}" "${switch_routine}" "${trampoline}")
  run("linking with ld64.lld" "${LD64}" -arch "${ARCH}" -platform_version macos 11.0 11.0
      -o "${program}" "${object}" "${SOURCE_DIR}/tests/macos/libSystem.tbd")
  if(ARCH STREQUAL "arm64")
    no_x18("${program}")
  endif()
  expect_routine("${program}" "${switch_routine}" ${switch_listing})
  expect_routine("${program}" "${trampoline}" ${trampoline_listing})
  message(STATUS "${triple}: backend assembled for Mach-O, linked, switch routine as reviewed")

elseif(MODE STREQUAL "suite")
  foreach(var HEADER_DIR LIBCXX_DIR DOCTEST_HEADER)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "check.cmake: MODE suite needs -D${var}=...")
    endif()
  endforeach()
  # doctest alone, away from the build machine's own C headers beside it.
  configure_file("${DOCTEST_HEADER}" "${BINARY_DIR}/doctest-only/doctest/doctest.h" COPYONLY)
  set(suite_flags ${common_flags} -isystem "${LIBCXX_DIR}" -isystem "${stubs}"
                  -isystem "${BINARY_DIR}/doctest-only" -I "${HEADER_DIR}"
                  -DFIBER_SCHED_FAULT_INJECTION "-DFIBER_SCHED_TEST_VARIANT=\"macos-${ARCH}\""
                  -DDOCTEST_CONFIG_SUPER_FAST_ASSERTS)
  file(GLOB tests "${SOURCE_DIR}/tests/test_*.cpp")
  list(FILTER tests EXCLUDE REGEX "/test_io[^/]*\\.cpp$")  # fsched::io is Linux-only
  list(SORT tests)
  # The headers the test files share, parsed once (as the test build's precompiled header,
  # cmake/FiberSchedTestHelpers.cmake): most of a test file's compile at -O0.
  file(WRITE "${out_dir}/shared.hpp"
       "#include \"${SOURCE_DIR}/tests/helpers.hpp\"\n#include <doctest/doctest.h>\n")
  run("precompiling the test files' headers" "${CLANGXX}" ${suite_flags} -O0 -x c++-header
      "${out_dir}/shared.hpp" -o "${out_dir}/shared.pch")
  set(objects "")
  foreach(source "${SOURCE_DIR}/tests/impl.cpp" "${SOURCE_DIR}/tests/main.cpp"
                 "${SOURCE_DIR}/tests/global_scheduler.cpp" ${tests})
    get_filename_component(name "${source}" NAME_WE)
    set(opt -O0 -include-pch "${out_dir}/shared.pch")
    if(name STREQUAL "impl")
      set(opt -O2)
    elseif(name MATCHES "^(main|global_scheduler)$")  # as in the test build (main: macros first)
      set(opt -O0)
    endif()
    run("compiling ${name}.cpp" "${CLANGXX}" ${suite_flags} ${opt} -c "${source}"
        -o "${out_dir}/${name}.o")
    list(APPEND objects "${out_dir}/${name}.o")
  endforeach()
  # The implementation unit, from the whole header: the cascade chose the assembly backend.
  expect_symbols("${out_dir}/impl.o" "${switch_routine}" "${trampoline}")
  file(STRINGS "${out_dir}/impl.o" names REGEX "asm-")
  if(NOT names MATCHES "${backend_name}")
    message(FATAL_ERROR "${triple}: impl.o does not name the ${backend_name} backend")
  endif()
  if(ARCH STREQUAL "arm64")
    no_x18("${out_dir}/impl.o")
  endif()
  run("linking the test objects with ld64.lld" "${LD64}" -arch "${ARCH}"
      -platform_version macos 11.0 11.0 -undefined dynamic_lookup -o "${out_dir}/fiber_sched_tests"
      ${objects} "${SOURCE_DIR}/tests/macos/libSystem.tbd")
  run("llvm-nm -u" "${NM}" -u "${out_dir}/fiber_sched_tests")
  string(REGEX MATCHALL "[^\n]*fsched[^\n]*" ours "${run_output}")
  if(ours)
    string(REPLACE ";" "\n  " ours "${ours}")
    message(FATAL_ERROR "${triple}: the linked tests leave fiber_sched's own symbols undefined:\n  ${ours}")
  endif()
  list(LENGTH objects count)
  message(STATUS "${triple}: ${count} translation units compiled and linked")

elseif(MODE STREQUAL "io")
  foreach(var HEADER_DIR LIBCXX_DIR)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "check.cmake: MODE io needs -D${var}=...")
    endif()
  endforeach()
  execute_process(
    COMMAND "${CLANGXX}" ${common_flags} -isystem "${LIBCXX_DIR}" -isystem "${stubs}"
            -I "${HEADER_DIR}" -fsyntax-only "${SOURCE_DIR}/tests/io_linux_only/use_io.cpp"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${triple}: use_io.cpp compiled; fsched::io must refuse macOS")
  endif()
  if(NOT "${out}${err}" MATCHES "fsched::io is Linux-only: it needs epoll; macOS has no fsched::io yet")
    message(FATAL_ERROR "${triple}: use_io.cpp failed without the macOS refusal:\n${out}${err}")
  endif()
  message(STATUS "${triple}: fsched::io refused at compile time, as it should be")

else()
  message(FATAL_ERROR "check.cmake: MODE is backend, suite or io, not '${MODE}'")
endif()
