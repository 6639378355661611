#ifndef FSCHED_STUB_SYS_TYPES_H
#define FSCHED_STUB_SYS_TYPES_H
#include "../_stub_types.h"
#endif
