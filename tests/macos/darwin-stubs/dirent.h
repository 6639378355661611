#ifndef FSCHED_STUB_DIRENT_H
#define FSCHED_STUB_DIRENT_H
#include "_stub_types.h"
typedef struct __dirstream DIR;
struct dirent {
    uint64_t d_ino;
    uint64_t d_seekoff;
    uint16_t d_reclen;
    uint16_t d_namlen;
    uint8_t d_type;
    char d_name[1024];
};
FSCHED_STUB_BEGIN
DIR* opendir(const char*);
struct dirent* readdir(DIR*);
int closedir(DIR*);
int dirfd(DIR*);
FSCHED_STUB_END
#endif
