#ifndef FSCHED_STUB_SETJMP_H
#define FSCHED_STUB_SETJMP_H
#include "_stub_types.h"
#if defined(__x86_64__)
typedef int jmp_buf[37];
typedef int sigjmp_buf[38];
#else
typedef int jmp_buf[48];
typedef int sigjmp_buf[49];
#endif
FSCHED_STUB_BEGIN
int setjmp(jmp_buf);
__attribute__((noreturn)) void longjmp(jmp_buf, int);
FSCHED_STUB_END
#endif
