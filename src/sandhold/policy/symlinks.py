"""Where a new symlink leads, step by step, and whether it leads into a kernel file system.

A symlink is judged by where it leads, never by how its text is spelled: ``/proc``,
``../../../../proc``, ``./..//proc/self/root`` and ``a/self`` (``a`` a symlink to
``/proc``) all lead into ``/proc``.

Rules (creation rule 4, F-BE-5):
- A symlink's text is resolved from the directory that holds the link, as the
  sandbox sees it (the caller gives that directory's absolute path), one component
  at a time: ``.`` and empty components (``./`` padding, double slashes) are
  nothing, ``..`` goes to the parent of where the walk stands (after a symlink:
  of where that symlink led), and each name that is a symlink now is replaced by
  its own text, resolved the same way (at most ``MAX_SYMLINKS`` of them, as the
  kernel). Every place the walk passes counts, not only where it ends: a magic
  link such as ``/proc/self/root`` reads as ``/``, so the end alone would hide
  that the way went through ``/proc``.
- The lexically normalised target (the text joined to the link's directory, with
  ``..`` taken lexically) counts too: it is what a host that sees other symlinks
  on the way would start from.
- A symlink that leads at, into or through ``/proc``, ``/sys`` or ``/dev``
  (``KERNEL_TREES``) is refused, but for one that goes straight to ``/dev/null``
  (``HARMLESS_DEVICES``): on the host it would reach another process's view
  (``/proc/PID/root``), the kernel's settings or the host's devices, which a
  process on the host that follows it would write to with its own rights.
- Whether a name is a symlink is a host fact: it comes in as ``readlink``
  (``os.readlink`` in the supervisor, a dict in tests); a name it cannot read is
  taken for no symlink, and the places the walk reached up to it still count.
"""

from __future__ import annotations

import posixpath

from sandhold.policy import paths
from sandhold.policy.refusal import SYMLINK, Refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

KERNEL_TREES: tuple[str, ...] = ("/proc", "/sys", "/dev")
"""The kernel's file systems, which no symlink made in the sandbox may lead into."""

MAX_SYMLINKS = 40  # the kernel's MAXSYMLINKS

HARMLESS_DEVICES: tuple[str, ...] = ("/dev/null",)
"""Devices a symlink may lead to straight (``ln -s /dev/null ~/.lesshst`` is common):
what a host process writes there is gone, what it reads is nothing."""


def normal_target(directory: str, text: str) -> str:
    """The absolute, lexically normalised target of a symlink in ``directory`` holding
    ``text`` (``..`` taken lexically; ``posixpath.normpath`` keeps a leading ``//``)."""
    joined = posixpath.join(directory, text)
    return "/" + posixpath.normpath(joined).lstrip("/")


def steps(directory: str, text: str, readlink: Callable[[str], str | None]) -> list[str]:
    """Every absolute place the symlink text ``text`` in ``directory`` passes through
    when followed (see the module rules), in order, the lexical target first.

    ``readlink(path)`` is the text of the symlink at ``path``, or None when there is
    none (or it cannot be read). A walk that meets more than ``MAX_SYMLINKS`` symlinks
    stops there (the kernel answers ``ELOOP``): the places passed until then are given.
    """
    passed = [normal_target(directory, text)]
    at = "/" if text.startswith("/") else directory
    pending = text.split("/")[::-1]  # a stack: the next component last
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            at = posixpath.dirname(at)
            passed.append(at)
            continue
        here = (at if at != "/" else "") + "/" + name
        passed.append(here)
        link = readlink(here)
        if link is None:
            at = here
            continue
        links += 1
        if links > MAX_SYMLINKS:
            break
        pending.extend(link.split("/")[::-1])
        if link.startswith("/"):
            at = "/"
    return passed


def kernel_tree_denied(passed: list[str]) -> Refusal | None:
    """Why a symlink that passes ``passed`` (``steps``) may not be made, or None.

    A link that ends at one of ``HARMLESS_DEVICES`` and passes no other place in a
    kernel tree than that device and the directories above it is allowed."""
    inside = [p for p in passed if any(paths.is_within(p, t) for t in KERNEL_TREES)]
    for device in HARMLESS_DEVICES:
        if passed and passed[-1] == device and all(paths.is_within(device, p) for p in inside):
            return None
    for place in passed:
        for tree in KERNEL_TREES:
            if paths.is_within(place, tree):
                return Refusal(
                    SYMLINK,
                    f"a symlink that leads into {tree} (it passes {place}): a kernel file "
                    "system, another process's view or the host's devices on the host "
                    "(no setting allows it; a symlink in $TMPDIR is not checked)",
                )
    return None
