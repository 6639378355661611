# Cross-compiling for 64-bit Windows with MinGW-w64 (Debian: g++-mingw-w64-x86-64-posix),
# running what it builds under wine (Debian: wine64).
#   cmake -S . -B build-mingw -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake
# The -posix flavour of the compiler: the -win32 one has no std::thread in gcc < 13.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(_mingw_prefix x86_64-w64-mingw32)
find_program(FIBER_SCHED_MINGW_CXX NAMES ${_mingw_prefix}-g++-posix ${_mingw_prefix}-g++)
if(NOT FIBER_SCHED_MINGW_CXX)
  message(FATAL_ERROR "${_mingw_prefix}-g++ not found (Debian: apt-get install g++-mingw-w64-x86-64-posix)")
endif()
find_program(FIBER_SCHED_MINGW_CC NAMES ${_mingw_prefix}-gcc-posix ${_mingw_prefix}-gcc)
find_program(FIBER_SCHED_MINGW_RC NAMES ${_mingw_prefix}-windres)
set(CMAKE_CXX_COMPILER "${FIBER_SCHED_MINGW_CXX}")
if(FIBER_SCHED_MINGW_CC)
  set(CMAKE_C_COMPILER "${FIBER_SCHED_MINGW_CC}")
endif()
if(FIBER_SCHED_MINGW_RC)
  set(CMAKE_RC_COMPILER "${FIBER_SCHED_MINGW_RC}")
endif()

# Headers and libraries from the MinGW sysroot only; programs (python3, go) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${_mingw_prefix})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Linked statically (libstdc++, libgcc, winpthreads), so wine needs no DLL search path.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

# wine64 is not on PATH in Debian's package: look where it installs it too.
find_program(FIBER_SCHED_WINE NAMES wine64 wine PATHS /usr/lib/wine /usr/lib64/wine NO_CMAKE_FIND_ROOT_PATH)
if(FIBER_SCHED_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${FIBER_SCHED_WINE}")
endif()
