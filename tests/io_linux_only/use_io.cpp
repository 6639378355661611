// Must not compile: without epoll (here forced with FIBER_SCHED_NO_EPOLL) fsched::io says
// at compile time that it is Linux-only.
#define FIBER_SCHED_NO_EPOLL
#include "fiber_sched.hpp"

int main() { return fsched::io::wait(0, fsched::io::Ready::Read) ? 0 : 1; }
