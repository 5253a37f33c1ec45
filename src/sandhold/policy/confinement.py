"""The confinement steps every plan ends with, the CLI's and the spec's alike.

Rules (F-BE-5):
- A plan whose writable roots leave names that only the creation-time supervisor
  could refuse (``FsPlan.unpinned``) is refused on a kernel without it
  (``UnenforceablePolicy``), never launched with those names open.
- The supervisor's policy refuses the plan's protected names, the names it could
  not pin (``FsPlan.unmade``), every spelling of what sandhold reads back
  (``creation.plan_denies``) and what the caller adds (its own code, this run's
  files); it knows every repository whose work tree a writable root lies in.
- Landlock (where the kernel has it) lets every process write only below the
  writable roots and the scratch directory.
- The syscall rules come from one table (``syscalls.syscall_rules``).
- Pure: host facts come through the ``HostView``.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import UnenforceablePolicy
from sandhold.policy.creation import creation_policy, plan_denies
from sandhold.policy.fsplan import work_trees
from sandhold.policy.syscalls import syscall_rules

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from sandhold.policy.creation import CreationPolicy
    from sandhold.policy.fsplan import FsPlan, FsRequest, HostView
    from sandhold.policy.syscalls import Rule


@record
class Confinement:
    """What the backend loads besides the mounts."""

    creation: CreationPolicy | None  # None: the supervisor is not needed (or not there)
    landlock: tuple[str, ...] | None  # None: no Landlock domain
    syscalls: tuple[Rule, ...]


def check_pinned(fs: FsPlan, supervisor_blocker: str) -> None:
    """Refuse a plan that needs the supervisor on a kernel that has none.

    Raises:
        UnenforceablePolicy: ``fs.unpinned`` is not empty.
    """
    if fs.unpinned:
        raise UnenforceablePolicy(
            ", ".join(fs.unpinned),
            "native",
            "names created during the run can only be refused by the creation-time "
            f"supervisor, and {supervisor_blocker}",
        )


def confine(
    req: FsRequest,
    fs: FsPlan,
    host: HostView,
    *,
    supervise: bool,
    scratch: tuple[str, ...],
    landlock: bool,
    deny_write: Iterable[str] = (),
    extra_deny: Iterable[tuple[str, str]] = (),
    unix_sockets: Iterable[str] | None = None,
    credential_exempt: Iterable[str] = (),
    allow_unix_sockets: bool = False,
    config_copies: Iterable[str] = (),
) -> Confinement:
    """The supervisor's policy, Landlock's roots and the syscall rules of a plan.

    Args:
        req, fs: the plan's filesystem request and its plan (``plan_filesystem``).
        supervise: the creation-time supervisor runs (the kernel has it, and the
            plan needs it); otherwise ``creation`` is None.
        scratch: the session's private directories, writable and never refused in.
        landlock: the kernel has Landlock.
        deny_write: the ``denyWrite`` entries, as the plan read them.
        extra_deny: (path, origin) the caller adds to the plan's own.
        unix_sockets: unix socket paths reachable through the supervisor, or None.
        credential_exempt: ``allowCredentialWrite`` entries.
        allow_unix_sockets: every unix socket is allowed (no per-path rule).
        config_copies: the ``.git/config`` files the run writes as its private copy
            (``git.allowConfig``; the supervisor carries git's rename over them out).
    """
    creation = None
    if supervise:
        creation = creation_policy(
            writable_roots=fs.writable_roots,
            deny_write=deny_write,
            scratch=scratch,
            cwd=req.cwd,
            home=req.home,
            realpath=host.realpath,
            unix_sockets=unix_sockets,
            credential_exempt=credential_exempt,
            extra_deny=(*fs.unmade, *extra_deny, *plan_denies(req, fs, host.realpath)),
            private=(req.private_root,),
            work_trees=(*work_trees(fs.writable_roots, host), *fs.work_trees),
            home_dots=fs.home_dots,
            home_grants=fs.home_grants,
            config_copies=config_copies,
        )
    return Confinement(
        creation=creation,
        landlock=tuple(dict.fromkeys((*fs.writable_roots, *scratch))) if landlock else None,
        syscalls=syscall_rules(
            allow_unix_sockets=allow_unix_sockets,
            supervised_unix_sockets=unix_sockets is not None,
        ),
    )
