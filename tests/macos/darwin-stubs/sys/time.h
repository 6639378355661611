#ifndef FSCHED_STUB_SYS_TIME_H
#define FSCHED_STUB_SYS_TIME_H
#include "../_stub_types.h"
#include <time.h>
FSCHED_STUB_BEGIN
int gettimeofday(struct timeval*, void*);
FSCHED_STUB_END
#endif
