#ifndef FSCHED_STUB_STRINGS_H
#define FSCHED_STUB_STRINGS_H
#include "_stub_types.h"
FSCHED_STUB_BEGIN
int strcasecmp(const char*, const char*);
int strncasecmp(const char*, const char*, size_t);
FSCHED_STUB_END
#endif
