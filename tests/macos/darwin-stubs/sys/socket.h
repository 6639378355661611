#ifndef FSCHED_STUB_SYS_SOCKET_H
#define FSCHED_STUB_SYS_SOCKET_H
#include "../_stub_types.h"
struct sockaddr {
    uint8_t sa_len;
    sa_family_t sa_family;
    char sa_data[14];
};
struct sockaddr_storage {
    uint8_t ss_len;
    sa_family_t ss_family;
    char __ss_pad1[6];
    int64_t __ss_align;
    char __ss_pad2[112];
};
struct iovec {
    void* iov_base;
    size_t iov_len;
};
struct msghdr {
    void* msg_name;
    socklen_t msg_namelen;
    struct iovec* msg_iov;
    int msg_iovlen;
    void* msg_control;
    socklen_t msg_controllen;
    int msg_flags;
};
#define AF_UNSPEC 0
#define AF_UNIX 1
#define AF_LOCAL AF_UNIX
#define AF_INET 2
#define AF_INET6 30
#define PF_UNIX AF_UNIX
#define PF_INET AF_INET
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOL_SOCKET 0xffff
#define SO_REUSEADDR 0x0004
#define SO_KEEPALIVE 0x0008
#define SO_ERROR 0x1007
#define SO_SNDBUF 0x1001
#define SO_RCVBUF 0x1002
#define SO_NOSIGPIPE 0x1022
#define SOMAXCONN 128
#define MSG_PEEK 0x2
#define MSG_DONTWAIT 0x80
#define SHUT_RD 0
#define SHUT_WR 1
#define SHUT_RDWR 2
FSCHED_STUB_BEGIN
int socket(int, int, int);
int socketpair(int, int, int, int[2]);
int bind(int, const struct sockaddr*, socklen_t);
int listen(int, int);
int accept(int, struct sockaddr*, socklen_t*);
int connect(int, const struct sockaddr*, socklen_t);
ssize_t send(int, const void*, size_t, int);
ssize_t recv(int, void*, size_t, int);
ssize_t sendto(int, const void*, size_t, int, const struct sockaddr*, socklen_t);
ssize_t recvfrom(int, void*, size_t, int, struct sockaddr*, socklen_t*);
ssize_t sendmsg(int, const struct msghdr*, int);
ssize_t recvmsg(int, struct msghdr*, int);
int shutdown(int, int);
int getsockopt(int, int, int, void*, socklen_t*);
int setsockopt(int, int, int, const void*, socklen_t);
int getsockname(int, struct sockaddr*, socklen_t*);
int getpeername(int, struct sockaddr*, socklen_t*);
FSCHED_STUB_END
#endif
