#ifndef FSCHED_STUB_SYS_SYSCTL_H
#define FSCHED_STUB_SYS_SYSCTL_H
#include "../_stub_types.h"
#include <sys/types.h>
#define CTL_KERN 1
#define KERN_PROC 14
#define KERN_PROC_PID 1
#define P_TRACED 0x00000800
/* Only the fields doctest's debugger check reads. */
struct extern_proc {
    char __opaque[32];
    int p_flag;
    char __opaque2[260];
};
struct kinfo_proc {
    struct extern_proc kp_proc;
    char kp_eproc[352];
};
FSCHED_STUB_BEGIN
int sysctl(int*, unsigned, void*, size_t*, void*, size_t);
int sysctlbyname(const char*, void*, size_t*, void*, size_t);
FSCHED_STUB_END
#endif
