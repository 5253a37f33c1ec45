"""A dict-backed ``HostView`` for table tests of the filesystem plan."""

from __future__ import annotations

import posixpath
from collections.abc import Container, Iterator

from sandhold.errors import UnenforceablePolicy
from sandhold.policy.fsplan import DIR, FILE, SYMLINK, LinkScan, Stat


class FakeHost:
    """Paths map to "dir", "file", or "-> target" (a symlink). Parents are implied.

    ``links`` groups paths that are hard links of one inode; ``data`` holds what
    files contain (empty unless given).
    """

    def __init__(
        self,
        entries: dict[str, str],
        links: tuple[tuple[str, ...], ...] = (),
        data: dict[str, bytes] | None = None,
    ) -> None:
        self.data = dict(data or {})
        self.read: list[str] = []  # every file read_bytes read, in order
        self.scanned: list[str] = []  # every root scan_links walked, in order
        self.entries: dict[str, str] = {"/": "dir"}
        for path, kind in entries.items():
            for anc in _ancestors(path):
                self.entries.setdefault(anc, "dir")
            self.entries[path] = kind
        self.inodes: dict[str, int] = {p: i + 1 for i, p in enumerate(sorted(self.entries))}
        self.nlinks: dict[str, int] = {}
        self.locked: set[str] = set()  # listed as "dir" but not listable (tests set it)
        for group in links:
            ino = self.inodes[group[0]]
            for p in group:
                self.inodes[p] = ino
                self.nlinks[p] = len(group)

    def realpath(self, path: str) -> str:
        parts = [p for p in path.split("/") if p]
        resolved = "/"
        for hops, part in enumerate(parts):
            if hops > 40:
                break
            cand = posixpath.join(resolved, part)
            kind = self.entries.get(cand)
            if kind is not None and kind.startswith("->"):
                target = kind[2:].strip()
                cand = self.realpath(posixpath.join(resolved, target))
            resolved = cand
        return posixpath.normpath(resolved)

    def lstat(self, path: str) -> Stat | None:
        kind = self.entries.get(path)
        if kind is None:
            return None
        k = SYMLINK if kind.startswith("->") else (DIR if kind == "dir" else FILE)
        return Stat(k, 1, self.inodes[path], self.nlinks.get(path, 1))

    def readlink(self, path: str) -> str | None:
        kind = self.entries.get(path, "")
        return kind[2:].strip() if kind.startswith("->") else None

    def read_bytes(self, path: str, limit: int) -> bytes | None:
        real = self.realpath(path)
        kind = self.entries.get(real)
        if kind is None:
            return None
        if kind != "file":
            raise UnenforceablePolicy(real, "native", "not a regular file")
        self.read.append(real)
        return self.data.get(real, b"")[:limit]

    def walk(
        self, root: str, unreadable: list[str] | None = None
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        if root in self.locked:  # a directory its owner cannot list (mode 000)
            if unreadable is not None:
                unreadable.append(root)
            return
        if self.entries.get(root) != "dir":
            return
        children = sorted(
            p
            for p in self.entries
            if (p != root and posixpath.dirname(p) == root.rstrip("/"))
            or (root == "/" and p != "/" and posixpath.dirname(p) == "/")
        )
        dirs = [posixpath.basename(p) for p in children if self.entries[p] == "dir"]
        files = [posixpath.basename(p) for p in children if self.entries[p] != "dir"]
        yield root, dirs, files
        for name in dirs:
            yield from self.walk(posixpath.join(root, name), unreadable)

    def scan_links(self, root: str, skip: Container[str], limit: int) -> LinkScan:
        self.scanned.append(root)
        found: list[tuple[str, int, int, int]] = []
        seen = 0
        pruned: set[str] = set()
        for dirpath, dirnames, filenames in self.walk(root):
            if dirpath in skip or posixpath.dirname(dirpath) in pruned:
                pruned.add(dirpath)
                continue
            for name in (*dirnames, *filenames):
                if seen >= limit:
                    return LinkScan(tuple(found), seen, False)
                seen += 1
                path = posixpath.join(dirpath, name)
                st = self.lstat(path)
                if path not in skip and st and st.kind == FILE and st.nlink > 1:
                    found.append((path, st.dev, st.ino, st.nlink))
        return LinkScan(tuple(found), seen, True)


def _ancestors(path: str) -> list[str]:
    out = []
    while path != "/":
        path = posixpath.dirname(path)
        out.append(path)
    return out
