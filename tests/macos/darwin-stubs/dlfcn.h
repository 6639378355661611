#ifndef FSCHED_STUB_DLFCN_H
#define FSCHED_STUB_DLFCN_H
#include "_stub_types.h"
FSCHED_STUB_BEGIN
/* Darwin's Dl_info and dladdr(), as <dlfcn.h> declares them. */
typedef struct dl_info {
    const char* dli_fname;
    void* dli_fbase;
    const char* dli_sname;
    void* dli_saddr;
} Dl_info;
int dladdr(const void*, Dl_info*);
FSCHED_STUB_END
#endif
