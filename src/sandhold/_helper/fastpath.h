/* The compiled supervisor's fast path: see fastpath.c. */
#ifndef SANDHOLD_FASTPATH_H
#define SANDHOLD_FASTPATH_H

#include <linux/seccomp.h>
#include <sys/types.h>

struct fast_policy;

/* The policy from fd (NUL-separated records, see fastpath.c); NULL and errno on error. */
struct fast_policy *fast_policy_read(int fd);

/* 1: creating the absolute, normal path is allowed for sure; 0: the full supervisor decides. */
int fast_allowed(const struct fast_policy *p, const char *path);

/* How to start the Python supervisor: argv, to which "--listener-fd L --serve-fd S"
 * are appended. */
struct supervisor {
    int argc;
    char **argv;
};

/* Answer the command's trapped calls until it exits: returns 0 with *wstatus set,
 * after the Python supervisor (if started) has written its report; or -1 when the
 * listener fails (no call is left half done; the caller lets the supervisor take
 * over). Each call that makes a name is answered holding flock(lock) (-1: none). */
int fast_serve(const struct fast_policy *p, const struct supervisor *sup, int listener,
               int pidfd, pid_t child, int lock, int *wstatus);

/* Serve the listeners the agent sends over ctrl (SCM_RIGHTS, with an 8-byte tag each)
 * until ctrl ends; every call the fast path does not clear goes to the agent's Python
 * supervisor over the seqpacket socket supervisor (tag, struct seccomp_notif, the
 * listener), which answers it and acknowledges with one byte. Returns 0, or -1. */
int fast_serve_many(const struct fast_policy *p, int ctrl, int supervisor, int lock);

#endif
