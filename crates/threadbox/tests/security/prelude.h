/* Shared by every C case of the security suite: raw system calls, and a verdict per
 * attempt. "ESCAPE ..." on stdout is what the host judges; "END" proves the program ran to
 * its end (a crash is never mistaken for "held"). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <dirent.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/msg.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <linux/perf_event.h>
#include <linux/if_ether.h>
#include <arpa/inet.h>
#include <netinet/in.h>

static int escapes;

static void esc(const char *what, long r) {
    printf("ESCAPE %s (returned %ld)\n", what, r);
    fflush(stdout);
    escapes++;
}

/* The call must fail (any errno). */
#define MUST_FAIL(what, expr)                                                    \
    do {                                                                         \
        errno = 0;                                                               \
        long r_ = (long)(expr);                                                  \
        if (r_ >= 0)                                                             \
            esc(what, r_);                                                       \
        else                                                                     \
            printf("held %s: %s\n", what, strerror(errno));                      \
    } while (0)

/* The call must fail with EPERM: the seccomp policy's refusal, not the kernel's. */
#define MUST_EPERM(what, expr)                                                   \
    do {                                                                         \
        errno = 0;                                                               \
        long r_ = (long)(expr);                                                  \
        if (r_ >= 0)                                                             \
            esc(what, r_);                                                       \
        else if (errno != EPERM) {                                               \
            printf("ESCAPE %s reached the kernel: %s\n", what, strerror(errno)); \
            escapes++;                                                           \
        } else                                                                   \
            printf("held %s\n", what);                                           \
    } while (0)

/* Runs f in a child; returns its wait status. */
static int in_child(void (*f)(void)) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return st;
}

static void done(void) {
    printf("END\n");
    fflush(stdout);
}
