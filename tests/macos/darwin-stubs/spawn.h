#ifndef FSCHED_STUB_SPAWN_H
#define FSCHED_STUB_SPAWN_H
#include "_stub_types.h"
#include <signal.h>
typedef void* posix_spawnattr_t;
typedef void* posix_spawn_file_actions_t;
FSCHED_STUB_BEGIN
int posix_spawn(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                char* const[], char* const[]);
int posix_spawnp(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                 char* const[], char* const[]);
int posix_spawn_file_actions_init(posix_spawn_file_actions_t*);
int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t*);
int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t*, int, int);
int posix_spawn_file_actions_addclose(posix_spawn_file_actions_t*, int);
FSCHED_STUB_END
#endif
