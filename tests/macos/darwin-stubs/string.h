#ifndef FSCHED_STUB_STRING_H
#define FSCHED_STUB_STRING_H
#include "_stub_types.h"
FSCHED_STUB_BEGIN
void* memcpy(void*, const void*, size_t);
void* memmove(void*, const void*, size_t);
void* memset(void*, int, size_t);
int memcmp(const void*, const void*, size_t);
void* memchr(const void*, int, size_t);
char* strcpy(char*, const char*);
char* strncpy(char*, const char*, size_t);
char* strcat(char*, const char*);
char* strncat(char*, const char*, size_t);
int strcmp(const char*, const char*);
int strncmp(const char*, const char*, size_t);
int strcoll(const char*, const char*);
size_t strxfrm(char*, const char*, size_t);
char* strchr(const char*, int);
char* strrchr(const char*, int);
size_t strcspn(const char*, const char*);
size_t strspn(const char*, const char*);
char* strpbrk(const char*, const char*);
char* strstr(const char*, const char*);
char* strtok(char*, const char*);
char* strerror(int);
int strerror_r(int, char*, size_t);
size_t strlen(const char*);
size_t strnlen(const char*, size_t);
char* strdup(const char*);
char* strsignal(int);
FSCHED_STUB_END
#endif
