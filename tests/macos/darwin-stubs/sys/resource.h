#ifndef FSCHED_STUB_SYS_RESOURCE_H
#define FSCHED_STUB_SYS_RESOURCE_H
#include "../_stub_types.h"
typedef uint64_t rlim_t;
struct rlimit {
    rlim_t rlim_cur;
    rlim_t rlim_max;
};
struct rusage {
    struct timeval ru_utime;
    struct timeval ru_stime;
    long ru_maxrss, ru_ixrss, ru_idrss, ru_isrss, ru_minflt, ru_majflt, ru_nswap, ru_inblock,
        ru_oublock, ru_msgsnd, ru_msgrcv, ru_nsignals, ru_nvcsw, ru_nivcsw;
};
#define RLIM_INFINITY (((uint64_t)1 << 63) - 1)
#define RLIMIT_CPU 0
#define RLIMIT_FSIZE 1
#define RLIMIT_DATA 2
#define RLIMIT_STACK 3
#define RLIMIT_CORE 4
#define RLIMIT_AS 5
#define RLIMIT_RSS RLIMIT_AS
#define RLIMIT_MEMLOCK 6
#define RLIMIT_NPROC 7
#define RLIMIT_NOFILE 8
#define RUSAGE_SELF 0
FSCHED_STUB_BEGIN
int getrlimit(int, struct rlimit*);
int setrlimit(int, const struct rlimit*);
int getrusage(int, struct rusage*);
FSCHED_STUB_END
#endif
