#ifndef FSCHED_STUB_UNISTD_H
#define FSCHED_STUB_UNISTD_H
#include "_stub_types.h"
#define STDIN_FILENO 0
#define STDOUT_FILENO 1
#define STDERR_FILENO 2
#define F_OK 0
#define X_OK 1
#define W_OK 2
#define R_OK 4
#define _SC_OPEN_MAX 5
#define _SC_PAGESIZE 29
#define _SC_PAGE_SIZE _SC_PAGESIZE
#define _SC_NPROCESSORS_CONF 57
#define _SC_NPROCESSORS_ONLN 58
FSCHED_STUB_BEGIN
long sysconf(int);
int getpagesize(void);
ssize_t read(int, void*, size_t);
ssize_t write(int, const void*, size_t);
int close(int);
int dup(int);
int dup2(int, int);
int pipe(int[2]);
off_t lseek(int, off_t, int);
int unlink(const char*);
int rmdir(const char*);
int access(const char*, int);
int chdir(const char*);
char* getcwd(char*, size_t);
int isatty(int);
pid_t fork(void);
pid_t getpid(void);
pid_t getppid(void);
uid_t getuid(void);
int execv(const char*, char* const[]);
int execve(const char*, char* const[], char* const[]);
int execvp(const char*, char* const[]);
__attribute__((noreturn)) void _exit(int);
unsigned sleep(unsigned);
unsigned alarm(unsigned);
int usleep(useconds_t);
int ftruncate(int, off_t);
int fsync(int);
long syscall(int, ...);
extern char** environ;
FSCHED_STUB_END
#endif
