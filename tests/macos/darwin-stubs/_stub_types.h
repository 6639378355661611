/* Stand-in for Darwin's C headers, for compile-only checks of fiber_sched for macOS targets
   on a machine without Apple's SDK (tests/macos/check.cmake). Declarations only: the C and
   POSIX interface as Darwin spells it, with Darwin's values for the constants the library
   uses. Not a replacement for the SDK: nothing compiled against it is meant to run. */
#ifndef FSCHED_STUB_TYPES_H
#define FSCHED_STUB_TYPES_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
#define FSCHED_STUB_BEGIN extern "C" {
#define FSCHED_STUB_END }
#define FSCHED_STUB_NOEXCEPT noexcept
#else
#define FSCHED_STUB_BEGIN
#define FSCHED_STUB_END
#define FSCHED_STUB_NOEXCEPT
#endif
typedef int8_t __int8_t;
typedef uint8_t __uint8_t;
typedef int16_t __int16_t;
typedef uint16_t __uint16_t;
typedef int32_t __int32_t;
typedef uint32_t __uint32_t;
typedef int64_t __int64_t;
typedef uint64_t __uint64_t;
typedef long ssize_t;
typedef int64_t off_t;
typedef int32_t pid_t;
typedef uint32_t uid_t;
typedef uint32_t gid_t;
typedef uint32_t id_t;
typedef uint16_t mode_t;
typedef int32_t dev_t;
typedef uint64_t ino_t;
typedef uint16_t nlink_t;
typedef int32_t blksize_t;
typedef int64_t blkcnt_t;
typedef long time_t;
typedef unsigned long clock_t;
typedef uint32_t useconds_t;
typedef int32_t suseconds_t;
typedef uint32_t sigset_t;
typedef uint32_t socklen_t;
typedef uint8_t sa_family_t;
typedef int __darwin_ct_rune_t;
typedef int wint_t;
typedef uint32_t wctype_t;
typedef int wctrans_t;
typedef struct _xlocale* locale_t;
typedef union {
    char __mbstate8[128];
    long long _mbstateL;
} __mbstate_t;
typedef __mbstate_t mbstate_t;
typedef int clockid_t;
struct timespec {
    time_t tv_sec;
    long tv_nsec;
};
struct timeval {
    time_t tv_sec;
    suseconds_t tv_usec;
};
#endif
