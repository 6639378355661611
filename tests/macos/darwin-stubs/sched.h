#ifndef FSCHED_STUB_SCHED_H
#define FSCHED_STUB_SCHED_H
#include "_stub_types.h"
struct sched_param {
    int sched_priority;
    char __opaque[4];
};
FSCHED_STUB_BEGIN
int sched_yield(void);
FSCHED_STUB_END
#endif
