"""bubblewrap's command line for a plan: a pure function, golden-tested.

Rules: namespaces are all unshared (user, pid, net, ipc, uts, cgroup), nested
user namespaces are disabled, every capability is dropped, the sandbox dies
with sandhold, and the host is bound read-only before the plan's own mounts are
applied in order. bwrap sets ``no_new_privs`` itself before it execs. A mount
whose source was pinned (``BwrapFds.pinned``) is bound from its open fd
(``--bind-fd``/``--ro-bind-fd``), which bwrap closes once mounted.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandhold.policy.fsplan import FsPlan


@record
class BwrapFds:
    """File descriptors bwrap reads or writes, numbered as the child sees them."""

    seccomp: int
    status: int
    hidden_file: str  # host path of an empty mode-000 file that hides denied files
    hidden_dir: str  # and of an empty mode-000 directory that hides denied directories
    # (path, fd) of bind sources opened and checked (``hostfs.pin_sources``): bound
    # by fd, so bwrap cannot resolve the path again to something else
    pinned: tuple[tuple[str, int], ...] = ()
    # (path, host copy): a masked credential file shown as its copy with the secret
    # replaced, bound over the hiding mount the plan put there (credentials.files)
    masked: tuple[tuple[str, str], ...] = ()
    # (path, host copy): a repository's config the run writes as its private copy
    # (git.allowConfig), bound writable over the read-only one the plan put there
    config_copies: tuple[tuple[str, str], ...] = ()


def bwrap_argv(
    bwrap: str,
    plan: FsPlan,
    fds: BwrapFds,
    cwd: str,
    command: Sequence[str],
    *,
    share_net: bool = False,
    host_root: bool = True,
) -> list[str]:
    """The full bwrap argv that runs ``command`` under ``plan``.

    ``share_net``: stay in the caller's network namespace (one sandhold made, with
    only the proxies' listeners in it) instead of a fresh one. ``host_root``: start
    from the whole host read-only (the CLI's model); otherwise from an empty root
    that only the plan's mounts fill (the spec model: system base plus binds).
    """
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--json-status-fd",
        str(fds.status),
        "--seccomp",
        str(fds.seccomp),
    ]
    if share_net:
        argv.insert(2, "--share-net")
    if host_root:
        argv += ["--ro-bind", "/", "/"]
    # The sandbox's /proc is read-only whole. bwrap covers only some of a new /proc
    # read-only, and judges /proc/sys by its directory, which is never writable: its
    # files stayed writable for host root (the sandbox's root when sandhold runs as
    # root), caps dropped or not. And root owns the global /proc entries: a chmod of
    # /proc/timer_list in any proc mount changes it for the whole host until reboot.
    # Landlock refuses writes there but not chmod; this holds without Landlock too.
    # Opening /proc/self/fd/N (/dev/stdout) still reaches the file behind it.
    argv += ["--dev", "/dev", "--proc", "/proc", "--remount-ro", "/proc"]
    pinned = dict(fds.pinned)
    mounts = list(plan.mounts)
    # the spec model's last mount makes its root skeleton read-only: a masked file
    # outside every bind needs its mount point made in that skeleton first
    last = (
        mounts.pop() if mounts and (mounts[-1].op, mounts[-1].path) == ("remount-ro", "/") else None
    )
    for m in mounts:
        fd = pinned.get(m.path)
        if fd is not None and m.op in ("bind", "ro-bind"):
            argv += [f"--{m.op}-fd", str(fd), m.path]
        elif m.op == "bind":
            argv += ["--bind", m.path, m.path]
        elif m.op == "ro-bind":
            argv += ["--ro-bind", m.path, m.path]
        elif m.op == "hide-file":
            argv += ["--ro-bind", fds.hidden_file, m.path]
        elif m.op == "hide-dir" and (m.perms or "0000") == "0000":
            # one mount, read-only already: a tmpfs needs a second (its remount)
            argv += ["--ro-bind", fds.hidden_dir, m.path]
        elif m.op == "hide-dir":  # others are mounted inside it, then it is made read-only
            argv += ["--perms", m.perms or "0000", "--tmpfs", m.path]
        elif m.op == "tmpfs":  # a writable private tmpfs (the spec model's /tmp)
            argv += ["--perms", m.perms or "0755", "--tmpfs", m.path]
        elif m.op == "remount-ro":
            argv += ["--remount-ro", m.path]
        else:  # pragma: no cover - the plan only produces the ops above
            raise ValueError(f"unknown mount op {m.op!r}")
    for path, copy in fds.masked:
        argv += ["--ro-bind", copy, path]
    for path, copy in fds.config_copies:
        argv += ["--bind", copy, path]
    if last is not None:
        argv += ["--remount-ro", last.path]
    argv += ["--chdir", cwd, "--", *command]
    return argv
