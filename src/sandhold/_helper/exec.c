/*
 * sandhold-exec: the first process of a supervised CLI sandbox (bubblewrap runs it).
 *
 *   sandhold-exec PROG_FD RULES_FD LOCK_FD SUPERVISOR_ARGC SUPERVISOR_ARGV...
 *                 LANDLOCK_COUNT PATHS... -- CMD ARGS...
 *   sandhold-exec --confine COUNT PATHS... -- CMD ARGS...   (a launch with no supervisor)
 *   sandhold-exec --offline-net SOCK_FD -- PROG ARGS...   (before bubblewrap: network off)
 *   sandhold-exec --check RULES_FD    (tests: "allow" or "defer" for each path on stdin)
 *   sandhold-exec --serve RULES_FD CTRL_FD SUPERVISOR_FD LOCK_FD   (the agent's: fast_serve_many)
 *   sandhold-exec --reap REPORT FAIL STDIN STDOUT STDERR PROG SOCK SPEC
 *                 (an exec's reaper in the agent: reap.c)
 * LOCK_FD: the user's creation lock, held around each call that makes a name (-1: none).
 *
 * It does in C what sandhold.backends.linux.supervisor.runner does in Python, so that a command that
 * makes no name never waits for an interpreter:
 *   1. becomes non-dumpable (the command shares its uid and must not ptrace it);
 *   2. enters a Landlock domain that allows writes only below PATHS (when the kernel
 *      has Landlock): the command and the supervisor then share one domain;
 *   3. forks; the child enters a nested Landlock domain that may make no name itself
 *      (the supervisor makes them all) nor signal this process, loads the notifying seccomp filter (program on PROG_FD), sends the
 *      listener here over a socket pair and execs CMD;
 *   4. answers the command's trapped calls until it exits, then exits with its status
 *      (128+N for signal N). It performs the ordinary ones itself (fastpath.c, with
 *      the rules on RULES_FD) and passes every other one to the Python supervisor,
 *      started at the first such call as a child (SUPERVISOR_ARGV with
 *      "--listener-fd L --serve-fd S" appended) that answers what it is sent over S.
 *      RULES_FD -1, or a fast path that cannot go on: this process execs the
 *      supervisor instead (with "--listener-fd L --child-pid P"), which then
 *      answers every call and reaps the command.
 * The supervisor's interpreter is an execute-only copy, so it is non-dumpable from
 * its first instruction. Anything that fails before CMD runs ends the child with
 * 126 (127: CMD not found); CMD never runs unconfined.
 *
 * --confine: restores the signals sandhold forwards to their defaults, enters one
 * Landlock domain that allows writes only below PATHS and, from ABI 6, signals only
 * within itself, and execs CMD in place: no fork, no filter, nothing left running
 * beside the command.
 *
 * --offline-net (runs on the host, as sandhold's child, before bubblewrap): unshares a
 * network namespace (and, but for root, a user namespace that maps its own uid and
 * gid and owns it), brings the loopback up,
 * binds a datagram socket at 127.0.0.1:53 there, sends it over SOCK_FD ("ok" and the
 * fd; else "error ERRNO WHAT" and exit 126) and execs PROG in place, which keeps the
 * namespace (bwrap --share-net). What backends/linux/netns.py's Python helper does,
 * without an interpreter's fork and ctypes (~10 ms): sandhold answers the sandbox's
 * lookups on that socket (backends/linux/offline.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fastpath.h"
#include "reap.h"

#ifndef SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
#define SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (1UL << 5)
#endif

/* Ignored here, default for the command: the signals sandhold forwards to every
 * process of the sandbox. */
static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM};
/* Ignored here too (the command keeps what it inherited): the terminal's stops, so a
 * command that took the foreground cannot stop this process (TOSTOP) mid-call. */
static const int stops[] = {SIGTSTP, SIGTTIN, SIGTTOU};

static void ignore_signals(void) {
    for (size_t k = 0; k < sizeof forwarded / sizeof *forwarded; k++) signal(forwarded[k], SIG_IGN);
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) signal(stops[k], SIG_IGN);
}

static void die(const char *what) {
    dprintf(2, "sandhold: %s: %s\n", what, strerror(errno));
    _exit(126);
}

static int status_of(int wstatus) {
    return WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus) : WEXITSTATUS(wstatus);
}

/* Write-like rights by Landlock ABI (include/uapi/linux/landlock.h). */
static uint64_t write_rights(int abi) {
    uint64_t r = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                 LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                 LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                 LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                 LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
    if (abi >= 2) r |= 1ULL << 13; /* REFER */
    if (abi >= 3) r |= 1ULL << 14; /* TRUNCATE */
    if (abi >= 5) r |= 1ULL << 15; /* IOCTL_DEV */
    return r;
}

#define FILE_RIGHTS (LANDLOCK_ACCESS_FS_WRITE_FILE | (1ULL << 14) | (1ULL << 15))

/* The running kernel's Landlock ABI; 0 or less: none. */
static int landlock_abi(void) {
    int abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    /* Only a kernel without Landlock says so; any other refusal (a container's seccomp
     * profile answering EPERM, say) is no answer: fail closed, as the Python fronts do. */
    if (abi < 0 && errno != ENOSYS && errno != EOPNOTSUPP) die("landlock_create_ruleset (ABI)");
    return abi;
}

/* A domain that allows writes only below PATHS (and to stdio that is a terminal); with
 * SCOPE (and ABI 6) it may signal
 * only processes within itself. No Landlock: a second layer only, so the run goes on,
 * and with NOTE that is said on stderr. An older kernel takes the ABI 6 struct while
 * the fields it lacks are 0. */
static void landlock(char **paths, int count, int scope, int note) {
    int abi = landlock_abi();
    if (abi <= 0) {
        if (note)
            dprintf(2, "sandhold: note: no Landlock on this kernel: writes are confined by "
                       "the mount plan alone, without the second layer\n");
        return;
    }
    uint64_t handled = write_rights(abi);
    uint64_t attr[3] = {handled, 0, scope && abi >= 6 ? 1ULL << 1 : 0}; /* SCOPE_SIGNAL */
    int ruleset = syscall(SYS_landlock_create_ruleset, attr, sizeof attr, 0);
    if (ruleset < 0) die("landlock_create_ruleset");
    for (int i = 0; i < count; i++) {
        int fd = open(paths[i], O_PATH | O_CLOEXEC);
        if (fd < 0) continue; /* a missing path: nothing to allow there */
        struct stat st;
        if (fstat(fd, &st) < 0) die("fstat");
        struct landlock_path_beneath_attr rule = {
            .allowed_access = S_ISDIR(st.st_mode) ? handled : handled & FILE_RIGHTS,
            .parent_fd = fd,
        };
        if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) < 0)
            die("landlock_add_rule");
        close(fd);
    }
    /* stdio that is a terminal: reopened by name (/dev/stderr) it writes where the
     * inherited fd writes already. A regular file stays refused: that is the point. */
    for (int fd = 0; fd <= 2; fd++) {
        if (!isatty(fd)) continue;
        struct landlock_path_beneath_attr rule = {
            .allowed_access = handled & FILE_RIGHTS,
            .parent_fd = fd,
        };
        /* a rule the kernel refuses only allows less */
        (void)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) die("landlock_restrict_self");
    close(ruleset);
}

/* The command's own nested domain. It may make no name: every creating call is trapped
 * and made by the supervisor outside this domain, so one the filter missed is refused by
 * the kernel. It may not signal processes outside it either (ABI 6): this process and the
 * supervisor hold the listener, and a command that killed them could load a listener of
 * its own. An older kernel takes the ABI 6 struct while the fields it lacks are 0. */
static void confine_command(void) {
    int abi = landlock_abi();
    if (abi < 1) return;
    uint64_t attr[3] = {
#ifndef SANDHOLD_BENCH_NULL_SUPERVISOR /* whose CONTINUE lets the command make each name */
        LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
            LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
            LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM,
#else
        0,
#endif
        0,
        abi >= 6 ? 1ULL << 1 : 0, /* scoped = LANDLOCK_SCOPE_SIGNAL */
    };
    if (!attr[0] && !attr[2]) return;
    int ruleset = syscall(SYS_landlock_create_ruleset, attr, sizeof attr, 0);
    if (ruleset < 0) die("landlock_create_ruleset (command)");
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) die("landlock_restrict_self (command)");
    close(ruleset);
}

static struct sock_fprog read_program(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    if (!buf) die("malloc");
    while ((n = read(fd, buf + len, cap - len)) > 0) len += (size_t)n;
    if (n < 0) die("read the filter");
    close(fd);
    if (len == 0 || len % sizeof(struct sock_filter) || len / sizeof(struct sock_filter) > 4096) {
        errno = EINVAL;
        die("the filter");
    }
    struct sock_fprog prog = {
        .len = (unsigned short)(len / sizeof(struct sock_filter)),
        .filter = (struct sock_filter *)buf,
    };
    return prog;
}

/* One byte and one fd (SCM_RIGHTS): how the listener travels from child to parent. */
struct fd_message {
    char byte;
    struct iovec iov;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg;
};

static void fd_message_init(struct fd_message *m) {
    memset(m, 0, sizeof *m);
    m->byte = 'L';
    m->iov.iov_base = &m->byte;
    m->iov.iov_len = 1;
    m->msg.msg_iov = &m->iov;
    m->msg.msg_iovlen = 1;
    m->msg.msg_control = m->ctl.buf;
    m->msg.msg_controllen = sizeof m->ctl.buf;
}

static void child(int sock, struct sock_fprog *prog, char **argv) {
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) signal(forwarded[i], SIG_DFL);
    /* The command gets stdio and nothing else: not the supervisor's setup or report. */
    if (sock != 3) {
        if (dup2(sock, 3) < 0) die("dup2");
        close(sock);
        sock = 3;
    }
    if (syscall(SYS_close_range, 4, ~0U, 0) < 0) die("close_range");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs");
    confine_command();
    int listener = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                           SECCOMP_FILTER_FLAG_NEW_LISTENER |
                               SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
                           prog);
    if (listener < 0) die("load the supervisor's filter");
    struct fd_message m;
    fd_message_init(&m);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    if (sendmsg(sock, &m.msg, 0) != 1) die("hand the listener over");
    close(listener);
    close(sock);
    execvp(argv[0], argv);
    int code = errno == ENOENT ? 127 : 126;
    dprintf(2, "sandhold: %s: %s\n", argv[0], strerror(errno));
    _exit(code);
}

static int receive_listener(int sock) {
    struct fd_message m;
    fd_message_init(&m);
    ssize_t n;
    do n = recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    struct cmsghdr *c = n == 1 ? CMSG_FIRSTHDR(&m.msg) : NULL;
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

/* --check: the fast path's verdict on each path read from stdin, one per line. */
static int check(const char *rules_fd) {
    struct fast_policy *p = fast_policy_read(atoi(rules_fd));
    if (!p) die("the fast path's rules");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (line[n - 1] == '\n') line[n - 1] = '\0';
        puts(fast_allowed(p, line) ? "allow" : "defer");
    }
    return 0;
}

/* --serve: the agent's compiled front (SandboxPort), beside its supervisor thread. */
static int serve(const char *rules_fd, const char *ctrl, const char *supervisor,
                 const char *lock) {
    struct fast_policy *p = fast_policy_read(atoi(rules_fd));
    if (!p) die("the fast path's rules");
    close(atoi(rules_fd));
    ignore_signals();
    return fast_serve_many(p, atoi(ctrl), atoi(supervisor), atoi(lock)) < 0 ? 126 : 0;
}

/* --confine COUNT PATHS... -- CMD...: see the top of this file. */
static int confine(int argc, char **argv) {
    int count = argc > 2 ? atoi(argv[2]) : -1;
    if (count < 0 || count >= argc || 3 + count + 1 >= argc || strcmp(argv[3 + count], "--")) {
        dprintf(2, "usage: sandhold-exec --confine COUNT PATHS... -- CMD...\n");
        return 126;
    }
    for (size_t k = 0; k < sizeof forwarded / sizeof *forwarded; k++) signal(forwarded[k], SIG_DFL);
    landlock(argv + 3, count, 1, 0); /* silent without Landlock: see docs/linux-sandbox.md */
    char **cmd = argv + 3 + count + 1;
    execvp(cmd[0], cmd);
    int code = errno == ENOENT ? 127 : 126;
    dprintf(2, "sandhold: %s: %s\n", cmd[0], strerror(errno));
    return code;
}

static int offline_fail(int sock, const char *what) {
    dprintf(sock, "error %d %s: %s", errno, what, strerror(errno));
    return 126;
}

static int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* --offline-net SOCK_FD -- PROG...: see the top of this file. */
static int offline_net(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--")) {
        dprintf(2, "usage: sandhold-exec --offline-net SOCK_FD -- PROG...\n");
        return 126;
    }
    int sock = atoi(argv[2]);
    char map[64];
    unsigned uid = geteuid(), gid = getegid();
    if (uid == 0) {
        /* root may make a network namespace as it is: one user namespace fewer, and
         * bubblewrap's, made next, owns nothing of it (as in the user's case) */
        if (unshare(CLONE_NEWNET) < 0) return offline_fail(sock, "unshare");
    } else {
        if (unshare(CLONE_NEWUSER | CLONE_NEWNET) < 0) return offline_fail(sock, "unshare");
        if (write_text("/proc/self/setgroups", "deny") < 0) return offline_fail(sock, "setgroups");
        snprintf(map, sizeof map, "%u %u 1\n", uid, uid);
        if (write_text("/proc/self/uid_map", map) < 0) return offline_fail(sock, "uid_map");
        snprintf(map, sizeof map, "%u %u 1\n", gid, gid);
        if (write_text("/proc/self/gid_map", map) < 0) return offline_fail(sock, "gid_map");
    }
    int dns = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (dns < 0) return offline_fail(sock, "socket");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(dns, SIOCGIFFLAGS, &ifr) < 0) return offline_fail(sock, "loopback");
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(dns, SIOCSIFFLAGS, &ifr) < 0) return offline_fail(sock, "loopback up");
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(53)};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(dns, (struct sockaddr *)&at, sizeof at) < 0) return offline_fail(sock, "bind");
    struct fd_message m;
    fd_message_init(&m);
    m.iov.iov_base = "ok";
    m.iov.iov_len = 2;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &dns, sizeof(int));
    if (sendmsg(sock, &m.msg, 0) != 2) return offline_fail(sock, "send the socket");
    close(dns);
    close(sock);
    char **prog = argv + 4;
    execv(prog[0], prog);
    dprintf(2, "sandhold: %s: %s\n", prog[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--check") == 0) return check(argv[2]);
    if (argc > 1 && strcmp(argv[1], "--confine") == 0) return confine(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--offline-net") == 0) return offline_net(argc, argv);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("non-dumpable");
    if (argc > 1 && strcmp(argv[1], "--reap") == 0) return reap_main(argc, argv);
    if (argc == 6 && strcmp(argv[1], "--serve") == 0)
        return serve(argv[2], argv[3], argv[4], argv[5]);
    /* argv: PROG_FD RULES_FD LOCK_FD SUP_ARGC SUP_ARGV... LL_COUNT PATHS... -- CMD... */
    int i = 1;
    if (argc < 8) goto usage;
    int prog_fd = atoi(argv[i++]);
    int rules_fd = atoi(argv[i++]);
    int lock_fd = atoi(argv[i++]);
    int sup_argc = atoi(argv[i++]);
    if (sup_argc < 1 || i + sup_argc >= argc) goto usage;
    char **sup_argv = argv + i;
    i += sup_argc;
    int ll_count = atoi(argv[i++]);
    if (ll_count < 0 || i + ll_count >= argc) goto usage;
    char **ll_paths = argv + i;
    i += ll_count;
    if (strcmp(argv[i++], "--") != 0 || i >= argc) goto usage;
    char **cmd = argv + i;

    struct sock_fprog prog = read_program(prog_fd);
    struct fast_policy *rules = NULL;
    if (rules_fd >= 0) {
        rules = fast_policy_read(rules_fd);
        if (!rules) die("the fast path's rules");
        close(rules_fd);
    }
    landlock(ll_paths, ll_count, 0, 1);
    /* The kernel writes a core file itself, past the supervisor: its name (core_pattern)
     * is refused nowhere. Hard limit too: raising it needs a capability the sandbox lacks. */
    struct rlimit no_core = {0, 0};
    if (setrlimit(RLIMIT_CORE, &no_core) < 0) die("setrlimit(RLIMIT_CORE)");
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) die("socketpair");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(sp[0]);
        child(sp[1], &prog, cmd);
    }
    close(sp[1]);
    ignore_signals();
    int listener = receive_listener(sp[0]);
    close(sp[0]);
    int wstatus;
    if (listener < 0) { /* the child failed before its exec, and said why */
        while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {}
        return status_of(wstatus);
    }
    int pidfd = syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) die("pidfd_open");
    if (rules) {
        struct supervisor sup = {.argc = sup_argc, .argv = sup_argv};
        if (fast_serve(rules, &sup, listener, pidfd, pid, lock_fd, &wstatus) == 0)
            return status_of(wstatus);
        /* the fast path cannot go on: the supervisor takes over */
    } else {
        struct pollfd fds[2] = {{.fd = pidfd, .events = POLLIN},
                                {.fd = listener, .events = POLLIN}};
        for (;;) {
            if (poll(fds, 2, -1) < 0) {
                if (errno == EINTR) continue;
                die("poll");
            }
            if (fds[0].revents) {
                while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {}
                return status_of(wstatus);
            }
            if (fds[1].revents & POLLIN) break;
            if (fds[1].revents) fds[1].fd = -1; /* listener hung up: only the exit is left */
        }
    }
    /* The supervisor takes this process over. */
    close(pidfd);
    int flags = fcntl(listener, F_GETFD);
    if (flags < 0 || fcntl(listener, F_SETFD, flags & ~FD_CLOEXEC) < 0) die("keep the listener");
    char lfd[16], cpid[16];
    snprintf(lfd, sizeof lfd, "%d", listener);
    snprintf(cpid, sizeof cpid, "%d", (int)pid);
    char **sv = calloc((size_t)sup_argc + 5, sizeof(char *));
    if (!sv) die("calloc");
    for (int k = 0; k < sup_argc; k++) sv[k] = sup_argv[k];
    sv[sup_argc] = "--listener-fd";
    sv[sup_argc + 1] = lfd;
    sv[sup_argc + 2] = "--child-pid";
    sv[sup_argc + 3] = cpid;
    execv(sv[0], sv);
    die("start the supervisor"); /* the command's trapped calls now fail (ENOSYS) */
usage:
    dprintf(2, "usage: sandhold-exec PROG_FD RULES_FD LOCK_FD N SUPERVISOR... N PATHS... -- CMD...\n");
    return 126;
}
