#ifndef FSCHED_STUB_ARPA_INET_H
#define FSCHED_STUB_ARPA_INET_H
#include <netinet/in.h>
FSCHED_STUB_BEGIN
int inet_pton(int, const char*, void*);
const char* inet_ntop(int, const void*, char*, socklen_t);
FSCHED_STUB_END
#endif
