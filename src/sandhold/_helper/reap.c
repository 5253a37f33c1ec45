/*
 * sandhold-exec --reap: an exec's reaper for the in-sandbox agent (agent/main.py), in C.
 *
 *   sandhold-exec --reap REPORT FAIL STDIN STDOUT STDERR PROG SOCK SPEC
 *
 * What the agent's Python reaper (``_reaper`` and ``_child``) does, without copying the
 * agent's interpreter twice per exec (two forks of a Python process, their copy-on-write
 * faults and their teardown were most of an exec's cost: ~5 of ~7 ms of CPU for `true`).
 * The agent spawns it (posix_spawn: no copy of its memory) from an execute-only sealed
 * memfd, so it is non-dumpable from its first instruction; every catchable signal arrives
 * blocked. The fds are the agent's, inherited at their own numbers. SPEC is a memfd
 * holding "CWD\0ARGC\0ARG...\0ENV...\0": not arguments, which any process of the
 * host may read in /proc/PID/cmdline (the environment may hold a secret; the
 * command's own /proc/PID/environ is guarded by the kernel's ptrace checks).
 *
 *   1. becomes a child subreaper, forks the command;
 *   2. reports the command's pid and its own pid as /proc numbers it (two 32-bit little-
 *      endian words) on REPORT, closes every fd but REPORT, reaps until no child is
 *      left, and writes the command's wait status (32 bits, little-endian) when it ends;
 *   3. the command: a process group of its own, STDIN/STDOUT/STDERR on 0/1/2, every
 *      signal at its default and unblocked, CWD (empty: none), then, with PROG >= 0, the
 *      notifying seccomp filter read from PROG, whose listener goes over SOCK; then exec
 *      of ARGV with exactly ENV, searching ENV's PATH for a bare name. Any failure
 *      before exec is written on FAIL as "STAGE\0ERRNO\0MESSAGE" (the Python child's
 *      format) and the command never runs; FAIL is close-on-exec, so its end without a
 *      byte means exec succeeded.
 *
 * Nothing is parsed from the command's world: every argument comes from the agent. An
 * argument line or a SPEC it cannot parse ends the reaper before any report (the agent
 * says "the exec's reaper failed").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reap.h"

#ifndef SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
#define SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (1UL << 5)
#endif
#define MAX_INSNS 4096

static int parse_fd(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -1 || v > INT32_MAX) return -1;
    *out = (int)v;
    return 0;
}

/* Write all of buf; errors ignored (the agent reads what arrived). */
static void write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        p += n;
        len -= (size_t)n;
    }
}

static void put32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* "STAGE\0ERRNO\0MESSAGE" on FAIL, then the end of the command's process. */
static void fail(int fd, const char *stage, int err, const char *message) {
    char num[16];
    int n = 0;
    unsigned v = (unsigned)err;
    char tmp[16];
    do tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) && n < 15);
    for (int i = 0; i < n; i++) num[i] = tmp[n - 1 - i];
    num[n] = '\0';
    struct iovec iov[5] = {
        {(void *)stage, strlen(stage)}, {"\0", 1}, {num, (size_t)n}, {"\0", 1},
        {(void *)message, strlen(message)},
    };
    (void)writev(fd, iov, 5);
    _exit(127);
}

static void load_filter(int prog_fd, int sock, int fail_fd) {
    struct sock_filter insns[MAX_INSNS + 1]; /* one more: a longer filter is refused */
    ssize_t len = pread(prog_fd, insns, sizeof insns, 0); /* shared offset: pread */
    if (len <= 0 || len % (ssize_t)sizeof(struct sock_filter) ||
        len > (ssize_t)(MAX_INSNS * sizeof(struct sock_filter))) {
        fail(fail_fd, "pre-exec hook", len < 0 ? errno : EINVAL,
             len < 0 ? strerror(errno) : "the supervisor's filter is malformed");
    }
    struct sock_fprog prog = {.len = (unsigned short)(len / (ssize_t)sizeof *insns),
                              .filter = insns};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail(fail_fd, "pre-exec hook", errno, strerror(errno));
    int listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                                SECCOMP_FILTER_FLAG_NEW_LISTENER |
                                    SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
                                &prog);
    if (listener < 0) fail(fail_fd, "pre-exec hook", errno, strerror(errno));
    char byte = 'L';
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t sent;
    do sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != 1) fail(fail_fd, "pre-exec hook", errno, strerror(errno));
    close(listener);
    close(sock);
}

/* execvpe over ENV's own PATH: ENOENT only if no candidate exists (as _execvpe). */
static void exec_command(char **argv, char **env, int fail_fd) {
    const char *name = argv[0];
    if (strchr(name, '/')) {
        execve(name, argv, env);
        fail(fail_fd, "exec", errno, strerror(errno));
    }
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5; /* the last one, as a dict keeps */
    size_t nlen = strlen(name);
    int saved = 0;
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[4096];
        const char *dir = dlen ? p : ".";
        if (!dlen) dlen = 1;
        if (dlen + 1 + nlen < sizeof full) {
            memcpy(full, dir, dlen);
            full[dlen] = '/';
            memcpy(full + dlen + 1, name, nlen + 1);
            execve(full, argv, env);
            if (errno != ENOENT && errno != ENOTDIR && !saved) saved = errno;
        } else if (!saved) {
            saved = ENAMETOOLONG;
        }
        if (!colon) break;
        p = colon + 1;
    }
    if (saved) fail(fail_fd, "exec", saved, strerror(saved));
    fail(fail_fd, "exec", ENOENT, "command not found");
}

struct reap_args {
    int report, fail, stdio[3], prog, sock;
    const char *cwd;
    char **argv, **env;
};

static void command(struct reap_args *a) {
    if (setpgid(0, 0) < 0) fail(a->fail, "setup", errno, strerror(errno));
    for (int target = 0; target < 3; target++)
        if (dup2(a->stdio[target], target) < 0) fail(a->fail, "setup", errno, strerror(errno));
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) (void)sigaction(s, &dfl, NULL); /* KILL, STOP: EINVAL */
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0) fail(a->fail, "setup", errno, strerror(errno));
    if (*a->cwd && chdir(a->cwd) < 0) fail(a->fail, "chdir", errno, strerror(errno));
    if (a->prog >= 0) load_filter(a->prog, a->sock, a->fail);
    /* the command outlives its reaper; until here it dies with it (reap_main) */
    if (prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0) < 0) fail(a->fail, "setup", errno, strerror(errno));
    exec_command(a->argv, a->env, a->fail);
}

/* SPEC's fields, split in place: cwd, argv (NULL-terminated), env (likewise); -1 if
 * it is not whole (the last byte must end a field) or names no command. */
static int read_spec(int fd, struct reap_args *a) {
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size < 4 || st.st_size > (1 << 26)) return -1;
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size);
    if (!buf) return -1;
    for (size_t got = 0; got < size;) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    if (buf[size - 1] != '\0') return -1;
    size_t fields = 0;
    for (size_t i = 0; i < size; i++) fields += buf[i] == '\0';
    if (fields < 3) return -1; /* cwd, argc, a command */
    char **ptrs = calloc(fields + 2, sizeof *ptrs); /* + argv's and env's NULLs */
    if (!ptrs) return -1;
    char *p = buf;
    a->cwd = p;
    p += strlen(p) + 1;
    int n;
    if (parse_fd(p, &n) < 0 || n < 1 || (size_t)n > fields - 2) return -1;
    p += strlen(p) + 1;
    size_t k = 0;
    for (int i = 0; i < n; i++, p += strlen(p) + 1) ptrs[k++] = p;
    a->argv = ptrs;
    ptrs[k++] = NULL;
    a->env = ptrs + k;
    for (; p < buf + size; p += strlen(p) + 1) ptrs[k++] = p;
    ptrs[k] = NULL;
    return 0;
}

int reap_main(int argc, char **argv) {
    /* argv[0] sandhold-exec, argv[1] --reap, then the fields of the top of this file */
    if (argc != 10) return 0;
    /* run from /proc/self/fd/N, its name would be "N" */
    (void)prctl(PR_SET_NAME, "sandhold-reap", 0, 0, 0);
    struct reap_args a;
    int fds[8];
    for (int i = 0; i < 8; i++)
        if (parse_fd(argv[2 + i], &fds[i]) < 0) return 0;
    a.report = fds[0];
    a.fail = fds[1];
    a.stdio[0] = fds[2];
    a.stdio[1] = fds[3];
    a.stdio[2] = fds[4];
    a.prog = fds[5];
    a.sock = fds[6];
    if (a.report < 0 || a.fail < 0 || a.stdio[0] < 0 || a.stdio[1] < 0 || a.stdio[2] < 0 ||
        (a.prog >= 0) != (a.sock >= 0) || fds[7] < 0 || read_spec(fds[7], &a) < 0)
        return 0;
    /* what the agent handed over is the command's or ours, never the command's by
     * accident: close-on-exec on all of it (stdio is dup2'd, FAIL ends at exec) */
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
        for (int i = 0; i < 8; i++)
            if (fds[i] >= 3) (void)fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) return 0;
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        /* a reaper the agent kills for giving no report (it may be stopped) leaves no
         * command behind: this child dies with it until its exec */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != me) _exit(127);
        command(&a);
        _exit(127);
    }
    (void)setpgid(pid, pid); /* as the command does: its group exists once reported */
    char self[32];
    ssize_t len = readlink("/proc/self", self, sizeof self - 1);
    long proc_pid = 0;
    if (len > 0) {
        self[len] = '\0';
        proc_pid = strtol(self, NULL, 10);
    }
    if (proc_pid <= 0) proc_pid = getpid();
    unsigned char head[8];
    put32(head, (uint32_t)pid);
    put32(head + 4, (uint32_t)proc_pid);
    write_all(a.report, head, sizeof head);
    /* the channel's fds, the command's pipes (their end is the exec's), the rest */
    if (a.report != 0) (void)syscall(SYS_close_range, 0, (unsigned)a.report - 1, 0);
    (void)syscall(SYS_close_range, (unsigned)a.report + 1, ~0U, 0);
    int report = a.report;
    for (;;) {
        int status;
        pid_t got = waitpid(-1, &status, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: no child left */
        }
        if (got == pid && report >= 0) {
            unsigned char b[4];
            put32(b, (uint32_t)status);
            write_all(report, b, sizeof b);
            close(report);
            report = -1;
        }
    }
    return 0;
}
