#ifndef FSCHED_STUB_POLL_H
#define FSCHED_STUB_POLL_H
#include "_stub_types.h"
struct pollfd {
    int fd;
    short events;
    short revents;
};
typedef unsigned int nfds_t;
#define POLLIN 0x0001
#define POLLPRI 0x0002
#define POLLOUT 0x0004
#define POLLRDNORM 0x0040
#define POLLWRNORM POLLOUT
#define POLLERR 0x0008
#define POLLHUP 0x0010
#define POLLNVAL 0x0020
FSCHED_STUB_BEGIN
int poll(struct pollfd*, nfds_t, int);
FSCHED_STUB_END
#endif
