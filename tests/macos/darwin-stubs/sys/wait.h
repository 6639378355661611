#ifndef FSCHED_STUB_SYS_WAIT_H
#define FSCHED_STUB_SYS_WAIT_H
#include "../_stub_types.h"
#include <signal.h>
#define WNOHANG 0x00000001
#define WUNTRACED 0x00000002
#define WIFEXITED(s) (((s) & 0177) == 0)
#define WEXITSTATUS(s) (((s) >> 8) & 0xff)
#define WIFSIGNALED(s) (((s) & 0177) != 0177 && ((s) & 0177) != 0)
#define WTERMSIG(s) ((s) & 0177)
FSCHED_STUB_BEGIN
pid_t wait(int*);
pid_t waitpid(pid_t, int*, int);
FSCHED_STUB_END
#endif
