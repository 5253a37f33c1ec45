/*
 * The compiled supervisor's fast path: the common creating calls, performed in C.
 *
 * The Python supervisor (sandhold.backends.linux.supervisor.emulate) is the reference and the only
 * one that refuses. This file performs a trapped call itself only when all of it is
 * ordinary, and otherwise passes the still-waiting call (its struct seccomp_notif) to
 * the Python supervisor, a child started at the first such call, and waits for its
 * one-byte answer before the next call (sandhold.backends.linux.supervisor.runner, --serve-fd):
 *   - calls: open/openat/creat with O_CREAT, mkdir/mkdirat, rename/renameat/renameat2
 *     (flags 0 or RENAME_NOREPLACE, a source that is neither a directory nor a symlink),
 *     and umask (noted, then CONTINUE: its argument is a register). All others defer,
 *     symlinks included: where one points is the reference's to judge.
 *   - names: the new name's absolute path passes fast_allowed(), a test that may
 *     only be stricter than sandhold.policy.creation (the Python side sends its
 *     rules: fastpath_rules(); tests/test_fastpath.py compares the two on tables
 *     and on generated paths). Anything it does not clear defers, and is decided
 *     (allowed or refused and reported) by the Python supervisor.
 *   - nothing unusual: /proc, ".", "..", a symlink as the last component of an open,
 *     O_PATH, O_TMPFILE, an unreadable parent path: all defer.
 * Each call follows emulate.py's rules: target memory is read once, into this
 * process; the starting directory is a copy of the target's (/proc/TID/cwd or
 * /proc/TID/fd/N) proven current by NOTIF_ID_VALID; the parent is resolved with
 * openat2(RESOLVE_NO_MAGICLINKS) and its path read back from the fd; the call runs
 * relative to that fd with the last component only, with the target's umask; an
 * open's fd is returned with NOTIF_ADDFD | ADDFD_FLAG_SEND. Calls are answered one
 * at a time, so no other creation can move the parent while one is in progress.
 */
#define _GNU_SOURCE
#include "fastpath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP 1
#endif
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif
#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE 1
#endif
/* glibc's __O_TMPFILE includes O_DIRECTORY: the bit alone */
#define TMPFILE_BIT (__O_TMPFILE & ~O_DIRECTORY)
#if defined(__x86_64__)
#define NATIVE_ARCH 0xC000003EU /* AUDIT_ARCH_X86_64 */
#elif defined(__aarch64__)
#define NATIVE_ARCH 0xC00000B7U /* AUDIT_ARCH_AARCH64 */
#else
#error "sandhold-exec: unsupported architecture"
#endif

/* a handler's outcome; new_name's ANSWERED: it already answered the call (an error) */
enum { DONE = 0, DEFER = 1, ANSWERED = 2 };

/* -- the policy ------------------------------------------------------------------ */

/* Records, each one kind letter and a value, NUL-terminated:
 *   S scratch dir: everything at or below is allowed;
 *   D deny prefix: everything at or below defers (a literal denyWrite path, or the
 *     directory part of a glob before its first wildcard);
 *   E (after a D) narrows it: only a path with a component below the prefix that
 *     matches this '*'-only glob defers;
 *   R writable root (outermost): below it the names are checked, outside allowed;
 *   N a name that defers as any component below the root;
 *   F a name that defers as the last component;
 *   G a '*'-only glob that defers when it matches the last component. */
struct fast_policy {
    char *data;
    const char **rec;
    size_t n;
};

struct fast_policy *fast_policy_read(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t got;
    if (!buf) return NULL;
    while ((got = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)got;
        if (len == cap) {
            char *more = cap < (1 << 24) ? realloc(buf, cap * 2 + 1) : NULL;
            if (!more) goto bad;
            buf = more;
            cap *= 2;
        }
    }
    if (got < 0) goto bad;
    if (len && buf[len - 1] != '\0') goto invalid;
    buf[len] = '\0';
    struct fast_policy *p = calloc(1, sizeof *p);
    size_t count = 0;
    for (size_t k = 0; k < len; k++) count += buf[k] == '\0';
    if (!p || !(p->rec = calloc(count + 1, sizeof *p->rec))) {
        free(p);
        goto bad;
    }
    p->data = buf;
    for (size_t k = 0; k < len; k += strlen(buf + k) + 1) {
        const char *r = buf + k;
        int bad = !strchr("SDERNFG", r[0]) || r[0] == '\0' || r[1] == '\0' ||
                  (strchr("SDR", r[0]) && r[1] != '/') ||
                  (r[0] == 'E' && (!p->n || p->rec[p->n - 1][0] != 'D'));
        if (bad) {
            free(p->rec);
            free(p);
            goto invalid;
        }
        p->rec[p->n++] = r;
    }
    return p;
invalid:
    errno = EINVAL;
bad:
    free(buf);
    return NULL;
}

/* path is prefix or lies below it (both absolute and normal). */
static int at_or_below(const char *path, const char *prefix) {
    size_t n = strlen(prefix);
    if (n == 1) return 1; /* "/" */
    return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* A glob whose only wildcard is '*' (any run of characters) against a name. */
static int star_match(const char *pat, const char *s) {
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*pat == '*') {
            star = pat++;
            resume = s;
        } else if (*pat == *s) {
            pat++;
            s++;
        } else if (star) {
            pat = star + 1;
            s = ++resume;
        } else {
            return 0;
        }
    }
    while (*pat == '*') pat++;
    return *pat == '\0';
}

/* Some component of rest ("" or "/a/b...") matches the '*'-only glob. */
static int component_matches(const char *rest, const char *glob) {
    char name[PATH_MAX];
    while (*rest == '/') {
        const char *end = strchrnul(rest + 1, '/');
        size_t len = (size_t)(end - rest - 1);
        if (len >= sizeof name) return 1; /* no such name: defer all the same */
        memcpy(name, rest + 1, len);
        name[len] = '\0';
        if (star_match(glob, name)) return 1;
        rest = end;
    }
    return 0;
}

static int has_record(const struct fast_policy *p, char kind, const char *v, size_t len) {
    for (size_t k = 0; k < p->n; k++)
        if (p->rec[k][0] == kind && strncmp(p->rec[k] + 1, v, len) == 0 &&
            p->rec[k][1 + len] == '\0')
            return 1;
    return 0;
}

int fast_allowed(const struct fast_policy *p, const char *path) {
    if (path[0] != '/') return 0;
    for (size_t k = 0; k < p->n; k++)
        if (p->rec[k][0] == 'S' && at_or_below(path, p->rec[k] + 1)) return 1;
    for (size_t k = 0; k < p->n; k++) {
        if (p->rec[k][0] != 'D' || !at_or_below(path, p->rec[k] + 1)) continue;
        if (k + 1 == p->n || p->rec[k + 1][0] != 'E') return 0;
        size_t n = strlen(p->rec[k] + 1);
        if (component_matches(path + (n == 1 ? 0 : n), p->rec[k + 1] + 1)) return 0;
    }
    const char *rel = NULL;
    for (size_t k = 0; k < p->n && !rel; k++) {
        const char *root = p->rec[k] + 1;
        size_t n = strlen(root);
        if (p->rec[k][0] != 'R') continue;
        if (n == 1) {
            if (path[1]) rel = path + 1;
        } else if (strncmp(path, root, n) == 0 && path[n] == '/') {
            rel = path + n + 1;
        }
    }
    if (!rel) return 1; /* outside the writable roots: the mounts answer there */
    const char *name = rel;
    for (const char *c = rel;; c++) {
        if (*c != '/' && *c != '\0') continue;
        if (has_record(p, 'N', name, (size_t)(c - name))) return 0;
        if (*c == '\0') break;
        name = c + 1;
    }
    if (has_record(p, 'F', name, strlen(name))) return 0;
    for (size_t k = 0; k < p->n; k++)
        if (p->rec[k][0] == 'G' && star_match(p->rec[k] + 1, name)) return 0;
    return 1;
}

/* -- the target's view ---------------------------------------------------------- */

#define WORKERS 64

struct ctx {
    const struct fast_policy *p;
    const struct supervisor *sup;
    pid_t sup_pid;  /* the Python supervisor, once started */
    int sup_sock;   /* -1: not started */
    int sup_failed; /* it could not start, or died: deferred calls fail closed */
    int tagged;     /* serving many listeners: each passed call says which (fast_serve_many) */
    uint64_t tag;   /* the current listener's */
    int listener;
    int lock;  /* the user's creation lock (session.creation_lock), or -1 */
    int root;
    int umask; /* this process's, as last set */
    pid_t workers[WORKERS]; /* opening a FIFO for a caller (open_fifo_later) */
    struct seccomp_notif *n;
    char buf[2][PATH_MAX];
};

static int reply(struct ctx *c, long long val, int err) {
    struct seccomp_notif_resp r = {.id = c->n->id, .val = val, .error = err ? -err : 0};
    if (ioctl(c->listener, SECCOMP_IOCTL_NOTIF_SEND, &r) < 0 && errno != ENOENT) return -1;
    return DONE;
}

/* Let the kernel run the call as it is: only for calls whose outcome no memory of the
 * target decides (their arguments are registers). */
static int let_run(struct ctx *c) {
    struct seccomp_notif_resp r = {.id = c->n->id, .flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE};
    if (ioctl(c->listener, SECCOMP_IOCTL_NOTIF_SEND, &r) < 0 && errno != ENOENT) return -1;
    return DONE;
}

static int id_valid(struct ctx *c) {
    return ioctl(c->listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &c->n->id) == 0;
}

/* The NUL-terminated string at addr in the target: 0, or an errno. */
static int read_string(pid_t pid, uint64_t addr, char *out) {
    if (!addr) return EFAULT;
    size_t page = 4096, first = page - (addr & (page - 1)), done = 0;
    while (done < PATH_MAX) {
        size_t want = done ? PATH_MAX - done : (first < PATH_MAX ? first : PATH_MAX);
        struct iovec local = {out + done, want}, remote = {(void *)(uintptr_t)(addr + done), want};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got < 0) return errno;
        if (memchr(out + done, '\0', (size_t)got)) return 0;
        done += (size_t)got;
        if ((size_t)got < want) return EFAULT; /* the mapping ends before a NUL */
    }
    return ENAMETOOLONG;
}

/* An fd the path starts from: the root, or a copy of the target's cwd or dirfd. */
static int base_of(struct ctx *c, uint64_t dirfd, const char *path, int *err) {
    char proc[64];
    if (path[0] == '/') return c->root;
    int d = (int)(uint32_t)dirfd;
    if (d == AT_FDCWD) {
        snprintf(proc, sizeof proc, "/proc/%u/cwd", c->n->pid);
        int fd = open(proc, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) *err = errno;
        return fd;
    }
    if (d < 0) {
        *err = EBADF;
        return -1;
    }
    snprintf(proc, sizeof proc, "/proc/%u/fd/%d", c->n->pid, d);
    int fd = open(proc, O_PATH | O_CLOEXEC);
    if (fd < 0) *err = errno == ENOENT ? EBADF : errno;
    return fd;
}

static void close_base(struct ctx *c, int fd) {
    if (fd >= 0 && fd != c->root) close(fd);
}

/* A resolved parent: fd (owned unless it is the base or root), the last name, and the
 * absolute path of the new name. */
struct parent {
    int fd;
    int owned;
    int trailing;
    const char *name;
    int base;        /* resolved from */
    const char *dir; /* the text resolved ("" when the base is the parent) */
    size_t dirlen;
    char path[PATH_MAX * 2];
};

static void parent_close(struct parent *pa) {
    if (pa->owned) close(pa->fd);
    pa->owned = 0;
}

/* Resolve all but the last component of path (edited in place) from base, or take
 * the directory of same (resolved from the same base, with the same text: a rename
 * within one directory resolves it once, as one consistent snapshot).
 * DONE with *err = 0: resolved; DONE with *err: the call fails with it; DEFER. */
static int parent_of(struct ctx *c, int base, char *path, struct parent *pa, int *err,
                     const struct parent *same) {
    pa->fd = -1;
    pa->owned = 0;
    *err = 0;
    size_t end = strlen(path);
    if (end == 0) {
        *err = ENOENT;
        return DONE;
    }
    while (end > 1 && path[end - 1] == '/') end--;
    pa->trailing = path[end] != '\0';
    path[end] = '\0';
    char *cut = strrchr(path, '/');
    pa->name = cut ? cut + 1 : path;
    if (!pa->name[0] || strcmp(pa->name, ".") == 0 || strcmp(pa->name, "..") == 0)
        return DEFER; /* no new name: the reference answers as the kernel would */
    pa->base = base;
    pa->dir = cut ? path : "";
    pa->dirlen = cut ? (size_t)(cut - path) + 1 : 0; /* with the slash: "/" differs from "" */
    if (same && same->base == base && same->dirlen == pa->dirlen &&
        memcmp(same->dir, pa->dir, pa->dirlen) == 0) {
        size_t n = strlen(same->path) - strlen(same->name) - 1;
        pa->fd = same->fd;
        memcpy(pa->path, same->path, n);
        snprintf(pa->path + n, sizeof pa->path - n, "/%s", pa->name);
        return DONE;
    }
    if (!cut) {
        pa->fd = base;
    } else if (cut == path) {
        pa->fd = c->root;
    } else {
        *cut = '\0';
        struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                               .resolve = RESOLVE_NO_MAGICLINKS};
        pa->fd = (int)syscall(SYS_openat2, base, path, &how, sizeof how);
        *cut = '/';
        if (pa->fd < 0) {
            *err = errno;
            return DONE;
        }
        pa->owned = 1;
    }
    ssize_t n;
    if (pa->fd == c->root) {
        n = 0;
        pa->path[0] = '\0';
    } else {
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", pa->fd);
        n = readlink(self, pa->path, PATH_MAX);
        if (n <= 0 || n >= PATH_MAX || pa->path[0] != '/') return DEFER;
        pa->path[n] = '\0';
        if (strcmp(pa->path, "/proc") == 0 || strncmp(pa->path, "/proc/", 6) == 0) return DEFER;
        if (n > 10 && strcmp(pa->path + n - 10, " (deleted)") == 0) return DEFER;
        if (n == 1) n = 0; /* "/" */
    }
    snprintf(pa->path + n, sizeof pa->path - (size_t)n, "/%s", pa->name);
    return DONE;
}

/* The name to operate on in pa->fd: the last component, with its trailing slash. */
static const char *op_name(struct parent *pa, char *out, size_t size) {
    snprintf(out, size, "%s%s", pa->name, pa->trailing ? "/" : "");
    return out;
}

/* -- the target's umask, cached per thread as emulate.Emulator._umask does --------- */

#define UMASKS 256
static struct {
    pid_t tid, tgid;
    int pidfd, umask;
} umasks[UMASKS];

static int status_of_task(pid_t tid, pid_t *tgid, int *umask, int *threads) {
    char proc[64], buf[4096];
    snprintf(proc, sizeof proc, "/proc/%d/status", tid);
    int fd = open(proc, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *at;
    *tgid = (at = strstr(buf, "\nTgid:\t")) ? (pid_t)strtol(at + 7, NULL, 10) : tid;
    *umask = (at = strstr(buf, "\nUmask:\t")) ? (int)strtol(at + 8, NULL, 8) : 022;
    *threads = (at = strstr(buf, "\nThreads:\t")) ? (int)strtol(at + 10, NULL, 10) : 2;
    return 0;
}

static int alive(int pidfd) {
    return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
}

static int target_umask(pid_t tid) {
    int slot = (int)((unsigned)tid % UMASKS);
    if (umasks[slot].pidfd > 0 && umasks[slot].tid == tid) {
        if (alive(umasks[slot].pidfd)) return umasks[slot].umask;
        close(umasks[slot].pidfd);
        umasks[slot].pidfd = 0;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, tid, PIDFD_THREAD); /* first: see umask_call */
    pid_t tgid;
    int umask, threads;
    if (status_of_task(tid, &tgid, &umask, &threads) < 0) {
        if (pidfd >= 0) close(pidfd);
        errno = ENOENT; /* the task is gone */
        return -1;
    }
    if (pidfd > 0 && threads == 1) {
        if (umasks[slot].pidfd > 0) close(umasks[slot].pidfd);
        umasks[slot].tid = tid;
        umasks[slot].tgid = tgid;
        umasks[slot].pidfd = pidfd;
        umasks[slot].umask = umask;
    } else if (pidfd >= 0) {
        close(pidfd);
    }
    return umask;
}

static int umask_call(struct ctx *c) {
    pid_t tid = (pid_t)c->n->pid, tgid = -1;
    int slot = (int)((unsigned)tid % UMASKS), um, threads;
    if (umasks[slot].pidfd > 0 && umasks[slot].tid == tid)
        tgid = umasks[slot].tgid;
    else if (status_of_task(tid, &tgid, &um, &threads) < 0)
        tgid = -1; /* gone: nothing cached can be its */
    for (int k = 0; k < UMASKS; k++)
        if (umasks[k].pidfd > 0 && umasks[k].tgid == tgid)
            umasks[k].umask = (int)(c->n->data.args[0] & 0777);
    if (c->sup_sock >= 0) return DEFER; /* its cache too; it lets the call go on */
    return let_run(c);
}

static int set_umask(struct ctx *c) {
    int um = target_umask((pid_t)c->n->pid);
    if (um < 0) return -1;
    if (um != c->umask) umask((mode_t)um); /* a system call saved on most calls */
    c->umask = um;
    return 0;
}

/* -- the calls -------------------------------------------------------------------- */

/* Read one path and resolve its parent: DONE (*pa resolved from *base), ANSWERED,
 * DEFER, or -1. The caller closes *base and *pa whatever the outcome. */
static int new_name(struct ctx *c, int which, uint64_t dirfd, uint64_t addr, int *base,
                    struct parent *pa) {
    int err = read_string((pid_t)c->n->pid, addr, c->buf[which]);
    *base = -1;
    pa->fd = -1;
    pa->owned = 0;
    if (err) return reply(c, -1, err) < 0 ? -1 : ANSWERED;
    *base = base_of(c, dirfd, c->buf[which], &err);
    if (*base < 0) return reply(c, -1, err) < 0 ? -1 : ANSWERED;
    if (!id_valid(c)) return reply(c, -1, ENOENT) < 0 ? -1 : ANSWERED;
    int r = parent_of(c, *base, c->buf[which], pa, &err, NULL);
    if (r == DEFER) return DEFER;
    if (err) return reply(c, -1, err) < 0 ? -1 : ANSWERED;
    return DONE;
}

/* A call that failed for want of write access (a read-only mount, Landlock): nothing
 * was made, so the reference can redo it and report the write it refused. */
static int refused_write(int err) { return err == EROFS || err == EACCES; }

static int finish(struct ctx *c, int base, struct parent *pa, int result) {
    parent_close(pa);
    close_base(c, base);
    return result;
}

/* Answer the open with our fd (closed here): installed in the caller and returned as
 * its result in one step (NOTIF_ADDFD | ADDFD_FLAG_SEND), close-on-exec as it asked. */
static int install(struct ctx *c, int fd, int flags) {
    struct seccomp_notif_addfd add = {
        .id = c->n->id,
        .flags = SECCOMP_ADDFD_FLAG_SEND,
        .srcfd = (uint32_t)fd,
        .newfd_flags = flags & O_CLOEXEC ? O_CLOEXEC : 0,
    };
    int sent = ioctl(c->listener, SECCOMP_IOCTL_NOTIF_ADDFD, &add);
    int err = errno;
    close(fd);
    return sent < 0 && err != ENOENT ? reply(c, -1, err) : DONE;
}

/* Close every fd but stdio, a and b. */
static void keep_only(int a, int b) {
    int lo = a < b ? a : b, hi = a < b ? b : a;
    if (lo > 3) syscall(SYS_close_range, 3, lo - 1, 0);
    if (hi > lo + 1) syscall(SYS_close_range, lo + 1, hi - 1, 0);
    syscall(SYS_close_range, hi + 1, ~0U, 0);
}

/* An existing FIFO the open would wait on (for the other end): a worker process
 * opens it and answers the call, so that the sandbox's other calls are not held up
 * meanwhile (the other end may need one first). The FIFO is pinned here first (O_PATH):
 * the worker opens that inode, never a name. ANSWERED: the worker has it; 0: the name
 * is no such FIFO any more; DEFER: every worker is waiting already (the Python
 * supervisor takes it, with a thread); -1: errno. */
static int open_fifo_later(struct ctx *c, struct parent *pa, int flags) {
    int pin = openat(pa->fd, pa->name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (pin < 0) return errno == ENOENT ? 0 : -1;
    if (fstat(pin, &st) < 0 || !S_ISFIFO(st.st_mode)) {
        close(pin);
        return 0;
    }
    int slot = -1;
    for (int k = 0; k < WORKERS; k++) {
        if (c->workers[k] > 0 && waitpid(c->workers[k], NULL, WNOHANG) == c->workers[k])
            c->workers[k] = 0;
        if (c->workers[k] <= 0 && slot < 0) slot = k;
    }
    if (slot < 0) {
        close(pin);
        return DEFER;
    }
    pid_t front = getpid(); /* before the fork: a front gone by the child's first look */
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(pin);
        errno = err;
        return -1;
    }
    if (pid == 0) {
        /* Only the pin and the listener: no copy of the lock's open file (it would keep
         * the lock held should the front die meanwhile), of the agent's control socket
         * (a gone front would seem alive) or of the supervisor's socket; and nothing
         * past the front's life. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != front) _exit(1);
        keep_only(pin, c->listener);
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", pin);
        /* the pin is the FIFO itself: O_NOFOLLOW would refuse the magic link */
        int fd = open(self, (flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW)) | O_CLOEXEC);
        _exit((fd < 0 ? reply(c, -1, errno) : install(c, fd, flags)) < 0);
    }
    close(pin);
    c->workers[slot] = pid;
    return ANSWERED;
}

static int emulate_open(struct ctx *c, uint64_t dirfd, uint64_t addr, int flags, int mode) {
    if (flags & O_PATH) {
        /* open/openat/creat only: the kernel drops O_CREAT with O_PATH, so no name is made
         * whatever the path says, and the flags are a register; an O_PATH fd cannot go
         * back through NOTIF_ADDFD anyway. (openat2 reads flags from memory: never here.) */
        return let_run(c);
    }
    if (!(flags & O_CREAT) || flags & TMPFILE_BIT) return DEFER;
    if (mode & (S_ISUID | S_ISGID)) return DEFER; /* the reference refuses it if new */
    if (flags & O_DIRECTORY) return reply(c, -1, EINVAL); /* since Linux 6.4, as the reference */
    int base, fd = -1, err = 0;
    struct parent pa;
    int r = new_name(c, 0, dirfd, addr, &base, &pa);
    if (r != DONE) return finish(c, base, &pa, r == ANSWERED ? DONE : r);
    if (pa.trailing) return finish(c, base, &pa, reply(c, -1, EISDIR));
    if (!fast_allowed(c->p, pa.path)) return finish(c, base, &pa, DEFER);
    if (set_umask(c) < 0) return finish(c, base, &pa, reply(c, -1, errno));
    mode &= 07777;
    if (flags & O_EXCL) {
        fd = openat(pa.fd, pa.name, flags | O_CLOEXEC, mode);
        if (fd < 0) err = errno;
    } else {
        /* What is there decides; while this call is answered nothing in the sandbox
         * can make a name, so it can only vanish meanwhile (then: look again). */
        for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
            struct stat st;
            if (fstatat(pa.fd, pa.name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if ((err = errno) != ENOENT) break;
                fd = openat(pa.fd, pa.name, flags | O_EXCL | O_CLOEXEC, mode);
                if (fd >= 0 || (err = errno) == EEXIST) continue; /* appeared: open it */
                break;
            }
            if (S_ISLNK(st.st_mode) && !(flags & O_NOFOLLOW))
                return finish(c, base, &pa, DEFER); /* followed by the reference */
            if (S_ISDIR(st.st_mode)) { /* O_CREAT on a directory, whatever the access */
                err = EISDIR;
                break;
            }
            if (S_ISFIFO(st.st_mode) && !(flags & O_NONBLOCK) && (flags & O_ACCMODE) != O_RDWR) {
                r = open_fifo_later(c, &pa, flags);
                if (r == ANSWERED) return finish(c, base, &pa, DONE);
                if (r == DEFER) return finish(c, base, &pa, DEFER);
                if (r < 0) return finish(c, base, &pa, reply(c, -1, errno));
                continue; /* no longer that FIFO */
            }
            fd = openat(pa.fd, pa.name, (flags & ~O_CREAT) | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0 && (err = errno) != ENOENT) break;
        }
        if (fd < 0 && (err == EEXIST || err == ENOENT)) err = EAGAIN; /* kept changing */
    }
    finish(c, base, &pa, DONE);
    if (fd < 0 && refused_write(err)) return DEFER;
    return fd < 0 ? reply(c, -1, err) : install(c, fd, flags);
}

static int do_mkdir(struct ctx *c, struct parent *pa, const char *name, int mode) {
    if (set_umask(c) < 0) return -1;
    return mkdirat(pa->fd, name, (mode_t)(mode & 07777));
}

/* mkdir: make the one new name the caller names, with op; answers the call. */
static int make_name(struct ctx *c, uint64_t dirfd, uint64_t addr,
                     int (*op)(struct ctx *, struct parent *, const char *, int), int arg) {
    int base;
    struct parent pa;
    char name[PATH_MAX + 2];
    int r = new_name(c, 0, dirfd, addr, &base, &pa);
    if (r != DONE) return finish(c, base, &pa, r == ANSWERED ? DONE : r);
    if (!fast_allowed(c->p, pa.path)) return finish(c, base, &pa, DEFER);
    int ok = op(c, &pa, op_name(&pa, name, sizeof name), arg);
    int err = errno;
    if (ok < 0 && refused_write(err)) return finish(c, base, &pa, DEFER);
    return finish(c, base, &pa, reply(c, ok < 0 ? -1 : 0, ok < 0 ? err : 0));
}

static int emulate_rename(struct ctx *c, uint64_t odir, uint64_t oaddr, uint64_t ndir,
                          uint64_t naddr, uint64_t flags) {
    if (flags & ~(uint64_t)RENAME_NOREPLACE) return DEFER;
    int ob = -1, nb = -1, err = 0, result = DEFER;
    struct parent po = {.fd = -1}, pn = {.fd = -1};
    char oname[PATH_MAX + 2], nname[PATH_MAX + 2];
    err = read_string((pid_t)c->n->pid, oaddr, c->buf[0]);
    if (!err) err = read_string((pid_t)c->n->pid, naddr, c->buf[1]);
    if (err) return reply(c, -1, err);
    ob = base_of(c, odir, c->buf[0], &err);
    int relative = c->buf[0][0] != '/' && c->buf[1][0] != '/';
    if (ob >= 0) /* one copy of one starting point: both names start from the same one */
        nb = relative && (uint32_t)odir == (uint32_t)ndir ? ob : base_of(c, ndir, c->buf[1], &err);
    if (ob < 0 || nb < 0) {
        result = reply(c, -1, err);
        goto out;
    }
    if (!id_valid(c)) {
        result = reply(c, -1, ENOENT);
        goto out;
    }
    if (parent_of(c, ob, c->buf[0], &po, &err, NULL) == DEFER) goto out;
    if (!err && parent_of(c, nb, c->buf[1], &pn, &err, &po) == DEFER) goto out;
    if (err) {
        result = reply(c, -1, err);
        goto out;
    }
    /* moving a protected name away, or making one */
    if (!fast_allowed(c->p, po.path) || !fast_allowed(c->p, pn.path)) goto out;
    struct stat st;
    if (fstatat(po.fd, po.name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)))
        goto out; /* the reference checks every name a directory moves, a symlink's target */
    int ok = (int)syscall(SYS_renameat2, po.fd, op_name(&po, oname, sizeof oname), pn.fd,
                          op_name(&pn, nname, sizeof nname), (unsigned)flags);
    err = errno;
    result = ok < 0 && refused_write(err) ? DEFER : reply(c, ok < 0 ? -1 : 0, ok < 0 ? err : 0);
out:
    parent_close(&po);
    parent_close(&pn);
    close_base(c, ob);
    if (nb != ob) close_base(c, nb);
    return result;
}

/* One notification: DONE (answered), DEFER (still waiting), -1 (the listener failed). */
static int handle(struct ctx *c) {
    const __u64 *a = c->n->data.args;
#ifdef SANDHOLD_BENCH_NULL_SUPERVISOR
    /* Only in the copy bench/supervisor.py builds to measure the floor of a round
     * trip: it lets every call go on unchecked. scripts/setup never defines it. */
    return let_run(c);
#endif
    if (c->n->data.arch != NATIVE_ARCH) return DEFER;
    switch (c->n->data.nr) {
#ifdef SYS_open
    case SYS_open:
        return emulate_open(c, (uint64_t)AT_FDCWD, a[0], (int)a[1], (int)a[2]);
    case SYS_creat:
        return emulate_open(c, (uint64_t)AT_FDCWD, a[0], O_CREAT | O_WRONLY | O_TRUNC, (int)a[1]);
    case SYS_mkdir:
        return make_name(c, (uint64_t)AT_FDCWD, a[0], do_mkdir, (int)a[1]);
    case SYS_rename:
        return emulate_rename(c, (uint64_t)AT_FDCWD, a[0], (uint64_t)AT_FDCWD, a[1], 0);
#endif
    case SYS_openat:
        return emulate_open(c, a[0], a[1], (int)a[2], (int)a[3]);
    case SYS_mkdirat:
        return make_name(c, a[0], a[1], do_mkdir, (int)a[2]);
#ifdef SYS_renameat
    case SYS_renameat:
        return emulate_rename(c, a[0], a[1], a[2], a[3], 0);
#endif
    case SYS_renameat2:
        return emulate_rename(c, a[0], a[1], a[2], a[3], a[4] & 0xFFFFFFFFU);
    case SYS_umask:
        return umask_call(c);
    default:
        return DEFER;
    }
}

/* -- the Python supervisor, for what this file does not perform ------------------ */

static int start_supervisor(struct ctx *c) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(sp[0]);
        close(sp[1]);
        return -1;
    }
    if (pid == 0) {
        char lfd[16], sfd[16];
        int flags = fcntl(c->listener, F_GETFD);
        if (flags < 0 || fcntl(c->listener, F_SETFD, flags & ~FD_CLOEXEC) < 0) _exit(126);
        flags = fcntl(sp[1], F_GETFD);
        if (flags < 0 || fcntl(sp[1], F_SETFD, flags & ~FD_CLOEXEC) < 0) _exit(126);
        snprintf(lfd, sizeof lfd, "%d", c->listener);
        snprintf(sfd, sizeof sfd, "%d", sp[1]);
        char **argv = calloc((size_t)c->sup->argc + 5, sizeof(char *));
        if (!argv) _exit(126);
        int k = 0;
        for (; k < c->sup->argc; k++) argv[k] = c->sup->argv[k];
        argv[k++] = "--listener-fd";
        argv[k++] = lfd;
        argv[k++] = "--serve-fd";
        argv[k++] = sfd;
        execv(argv[0], argv);
        _exit(126);
    }
    close(sp[1]);
    c->sup_pid = pid;
    c->sup_sock = sp[0];
    return 0;
}

static void stop_supervisor(struct ctx *c) {
    if (c->sup_sock < 0) return;
    close(c->sup_sock); /* end of input: it exits */
    c->sup_sock = -1;
    int ignored;
    while (c->sup_pid > 0 && waitpid(c->sup_pid, &ignored, 0) < 0 && errno == EINTR) {}
}

/* The waiting call to the supervisor: the struct seccomp_notif alone, or (tagged) the
 * listener's tag, the struct and the listener itself (SCM_RIGHTS) in one message. */
static int pass_on(struct ctx *c) {
    if (!c->tagged) {
        const char *at = (const char *)c->n;
        size_t left = sizeof *c->n;
        ssize_t n = 0;
        while (left && ((n = send(c->sup_sock, at, left, MSG_NOSIGNAL)) > 0 || errno == EINTR))
            if (n > 0) at += n, left -= (size_t)n;
        return left ? -1 : 0;
    }
    struct iovec iov[2] = {{&c->tag, sizeof c->tag}, {c->n, sizeof *c->n}};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &c->listener, sizeof(int));
    ssize_t n;
    while ((n = sendmsg(c->sup_sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
    return n == (ssize_t)(sizeof c->tag + sizeof *c->n) ? 0 : -1;
}

/* Pass the waiting call to the Python supervisor and wait until it has answered it. */
static int defer(struct ctx *c) {
    if (!c->sup_failed && c->sup_sock < 0 && start_supervisor(c) < 0) {
        dprintf(2, "sandhold: the creation-time supervisor could not start: %s\n", strerror(errno));
        c->sup_failed = 1;
    }
    if (!c->sup_failed) {
        /* MSG_NOSIGNAL: a supervisor that died must not take this process with it */
        char ack;
        ssize_t n = -1;
        if (pass_on(c) == 0)
            while ((n = read(c->sup_sock, &ack, 1)) < 0 && errno == EINTR) {}
        if (n == 1) return DONE;
        dprintf(2, "sandhold: the creation-time supervisor stopped\n");
        c->sup_failed = 1;
        if (c->sup_pid > 0) kill(c->sup_pid, SIGKILL); /* whatever it still does, it is done */
        stop_supervisor(c);
    }
    return reply(c, -1, EPERM); /* fail closed: the call never runs unchecked */
}

/* Ready c to answer calls: where absolute paths start, and this process's umask. */
static int ctx_open(struct ctx *c, const struct fast_policy *p, struct seccomp_notif *n) {
    c->p = p;
    c->n = n;
    c->root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    c->umask = (int)umask(022);
    umask((mode_t)c->umask);
    return c->root < 0 ? -1 : 0;
}

static void ctx_close(struct ctx *c) {
    for (int k = 0; k < WORKERS; k++) { /* still waiting for a FIFO's other end */
        if (c->workers[k] <= 0) continue;
        kill(c->workers[k], SIGKILL);
        while (waitpid(c->workers[k], NULL, 0) < 0 && errno == EINTR) {}
    }
    close(c->root);
}

/* The user's creation lock, waited for at most LOCK_WAIT_MS: another sandbox holding
 * it longer (stopped, or checking a huge tree) makes this call fail with EAGAIN rather
 * than hang. 0, or the errno to answer with. */
#define LOCK_WAIT_MS 10000
static int take_lock(int lock) {
    long waited_us = 0, step_us = 50;
    static int said;
    for (;;) {
        if (flock(lock, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return EPERM;
        if (waited_us >= LOCK_WAIT_MS * 1000L) break;
        struct timespec ts = {0, step_us * 1000};
        nanosleep(&ts, NULL);
        waited_us += step_us;
        if (step_us < 5000) step_us *= 2;
    }
    if (!said++)
        dprintf(2, "sandhold: another sandbox of this user has held the creation lock for "
                   "%d s: calls that make a name fail with EAGAIN until it lets go\n",
                LOCK_WAIT_MS / 1000);
    return EAGAIN;
}

/* Its own open file for the lock: an flock belongs to the open file, and the agent
 * that started this process shares the inherited one; if this process dies holding the
 * lock, only its own open file lets go at once. -1 stays -1; should the reopen fail,
 * the inherited one still serialises (it is released before every deferral). */
static int own_lock(int inherited) {
    if (inherited < 0) return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", inherited);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? inherited : fd;
}

/* Receive the next call on c->listener and answer it, here or through the supervisor:
 * 0, or -1 when the listener fails. */
static int answer_next(struct ctx *c) {
    memset(c->n, 0, sizeof *c->n);
    if (ioctl(c->listener, SECCOMP_IOCTL_NOTIF_RECV, c->n) < 0)
        return errno == ENOENT || errno == EINTR ? 0 : -1; /* ENOENT: the caller died */
    /* Check and call (here or in Python) under the lock every sandbox of this user
     * shares: no rename elsewhere moves a directory between the two. Not for calls
     * that make no name (a connect may wait for a full backlog). */
    int nr = c->n->data.nr;
    int locked = c->lock >= 0 && nr != SYS_umask && nr != SYS_connect;
    if (locked) {
        int err = take_lock(c->lock);
        if (err) return reply(c, -1, err) < 0 ? -1 : 0; /* unchecked never */
    }
    int r = handle(c);
    /* The Python supervisor takes the lock itself, on its own open file: it must not
     * be held here while this process waits for it (it may be stopped or die). */
    if (locked) flock(c->lock, LOCK_UN);
    if (r == DEFER) r = defer(c);
    return r < 0 ? -1 : 0;
}

static void sync_wakeup(int listener) { /* 6.6+: an optimisation only */
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP);
}

int fast_serve(const struct fast_policy *p, const struct supervisor *sup, int listener,
               int pidfd, pid_t child, int lock, int *wstatus) {
    static struct ctx c;
    static struct seccomp_notif n;
    if (ctx_open(&c, p, &n) < 0) return -1;
    c.lock = own_lock(lock);
    c.sup = sup;
    c.sup_sock = -1;
    c.listener = listener;
    sync_wakeup(listener);
    struct pollfd fds[2] = {{.fd = pidfd, .events = POLLIN}, {.fd = listener, .events = POLLIN}};
    int result = -1;
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[0].revents) {
            while (waitpid(child, wstatus, 0) < 0 && errno == EINTR) {}
            result = 0;
            break;
        }
        if (fds[1].revents & POLLIN) {
            if (answer_next(&c) < 0) break;
        } else if (fds[1].revents) {
            fds[1].fd = -1; /* listener hung up: only the exit is left */
        }
    }
    ctx_close(&c);
    stop_supervisor(&c);
    return result;
}

/* One fd and 8 bytes of tag from the agent (SCM_RIGHTS): the fd; 0 at the end of input
 * (or a failing socket); -1 for a message without both. */
static int receive_listener(int ctrl, uint64_t *tag) {
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {tag, sizeof *tag};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    ssize_t n;
    while ((n = recvmsg(ctrl, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
    struct cmsghdr *cm = n == (ssize_t)sizeof *tag ? CMSG_FIRSTHDR(&msg) : NULL;
    if (n <= 0) return 0;
    if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    return fd;
}

int fast_serve_many(const struct fast_policy *p, int ctrl, int supervisor, int lock) {
    static struct ctx c;
    static struct seccomp_notif n;
    if (ctx_open(&c, p, &n) < 0) return -1;
    c.lock = own_lock(lock);
    if (c.lock != lock) close(lock); /* the agent's: it locks that one for its thread */
    c.sup_sock = supervisor;
    c.tagged = 1;
    size_t count = 1, cap = 64;
    struct pollfd *fds = calloc(cap, sizeof *fds);
    uint64_t *tags = calloc(cap, sizeof *tags);
    if (!fds || !tags) return -1;
    fds[0] = (struct pollfd){.fd = ctrl, .events = POLLIN};
    for (;;) {
        if (poll(fds, count, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[0].revents) {
            uint64_t tag = 0;
            int fd = receive_listener(ctrl, &tag);
            if (fd == 0) break; /* the agent is gone */
            if (fd > 0) {
                if (count == cap) {
                    struct pollfd *more = realloc(fds, 2 * cap * sizeof *fds);
                    uint64_t *more_tags = more ? realloc(tags, 2 * cap * sizeof *tags) : NULL;
                    if (more) fds = more;
                    if (!more_tags) {
                        close(fd); /* its calls then fail (ENOSYS): nothing runs unchecked */
                        continue;
                    }
                    tags = more_tags;
                    cap *= 2;
                }
                sync_wakeup(fd);
                fds[count] = (struct pollfd){.fd = fd, .events = POLLIN};
                tags[count++] = tag;
            }
        }
        for (size_t k = 1; k < count; k++) {
            int gone = 0;
            if (fds[k].revents & POLLIN) {
                c.listener = fds[k].fd;
                c.tag = tags[k];
                gone = answer_next(&c) < 0;
            } else if (fds[k].revents) {
                gone = 1; /* every process of that exec is gone */
            }
            if (gone) {
                close(fds[k].fd);
                fds[k] = fds[--count];
                tags[k] = tags[count];
                k--;
            }
        }
    }
    ctx_close(&c);
    return 0;
}
