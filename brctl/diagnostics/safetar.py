"""Which tar members a release may hold, and extracting them without trusting the archive.

Node-side, standard library only (Python >= 3.9); the controller imports ``plan``
too, so ``brctl update push`` refuses an archive before any machine sees it. No
reliance on ``tarfile.data_filter`` (absent from 3.9.0-3.9.16, 3.10.0-3.10.11,
3.11.0-3.11.3) nor on ``extractall``:

- names are relative, without ``..`` or NUL (``./`` and empty parts are dropped);
- members are directories, regular files, hard links to an earlier regular file
  of the release (extracted as a copy) or symlinks; nothing else (devices, FIFOs);
- a symlink points at a regular file of the release, resolved part by part
  against the archive's own directories: never through a symlink or a file,
  never above the release, never at a directory or another symlink; nothing is
  extracted under a symlink;
- modes lose setuid, setgid, sticky and group/other write; ownership is never
  taken from the archive (files belong to whoever extracts);
- extraction works below one directory fd, opening every directory with
  ``O_NOFOLLOW`` and creating every file with ``O_EXCL``, so a symlink planted
  while extracting is never followed either.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass

from brctl.diagnostics import safefs

DIR, FILE, COPY, SYMLINK = "dir", "file", "copy", "symlink"
_KEEP_MODE = 0o755  # no setuid/setgid/sticky, no group/other write
_COPY_CHUNK = 1 << 20


class UnsafeMember(Exception):
    """An archive member a release may not hold; the message names it."""


@dataclass(frozen=True)
class Entry:
    """One member to extract: what it is, where (path parts below the release), how."""

    kind: str  # DIR, FILE, COPY (a hard link, written as a copy of ``source``) or SYMLINK
    parts: tuple[str, ...]
    mode: int
    source: tarfile.TarInfo  # the member whose data a FILE or COPY gets
    link: str = ""  # SYMLINK: the target as written in the archive


def _parts(name: str) -> tuple[str, ...]:
    """``name`` as path parts below the release; refused when it could leave it."""
    if name.startswith("/"):
        raise UnsafeMember(f"entry {name!r}: absolute name")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    try:
        if parts:  # none: the release directory itself ("./")
            safefs.check_relpath("/".join(parts))
    except safefs.UnsafeName:
        raise UnsafeMember(f"entry {name!r}: '..' or NUL in the name would leave the release"
                           ) from None
    return parts


def _mode(member: tarfile.TarInfo) -> int:
    owner = stat.S_IRWXU if member.isdir() else stat.S_IRUSR | stat.S_IWUSR
    return (member.mode & _KEEP_MODE) | owner


def _show(parts: tuple[str, ...]) -> str:
    return "/".join(parts)


def _resolve(parts: tuple[str, ...], link: str, kinds: dict[tuple[str, ...], str]) -> None:
    """Refuse a symlink at ``parts`` unless ``link`` names a regular file of the release.

    Resolved as the kernel would, one part at a time from the link's directory; every
    directory passed (``..`` included) must be a real directory of the archive, so a
    lexical check cannot be fooled by a symlinked or fake parent.
    """
    where = f"entry {_show(parts)!r}: symlink to {link!r}"
    if not link or "\0" in link or link.startswith("/"):
        raise UnsafeMember(f"{where} points outside the release")
    path = list(parts[:-1])
    for part in link.split("/"):
        if part in ("", "."):
            continue
        if path and kinds.get(tuple(path)) != DIR:
            raise UnsafeMember(f"{where} passes through {_show(tuple(path))!r}, "
                               "which is not a directory of the release")
        if part == "..":
            if not path:
                raise UnsafeMember(f"{where} points outside the release")
            path.pop()
        else:
            path.append(part)
    if kinds.get(tuple(path)) != FILE:
        raise UnsafeMember(f"{where} does not point at a regular file of the release "
                           "(symlinks may only point at files inside it)")


def _check_parents(parts: tuple[str, ...], kinds: dict[tuple[str, ...], str], shown: str) -> None:
    for i in range(1, len(parts)):
        above = kinds.setdefault(parts[:i], DIR)  # a parent the archive leaves implicit
        if above != DIR:
            raise UnsafeMember(f"entry {shown!r} lies under {_show(parts[:i])!r}, "
                               f"which is a {above}, not a directory")


def _hard_link_target(member: tarfile.TarInfo, kinds: dict[tuple[str, ...], str],
                      shown: str) -> tuple[str, ...]:
    try:
        target = _parts(member.linkname)
    except UnsafeMember:
        target = ()
    if not target or kinds.get(target) != FILE:
        raise UnsafeMember(f"entry {shown!r}: hard link to {member.linkname!r}, "
                           "which is not an earlier regular file of the release")
    return target


def plan(members: Iterable[tarfile.TarInfo]) -> list[Entry]:
    """The entries to extract, in order (symlinks last), after checking every member.

    Raises:
        UnsafeMember: the first member a release may not hold, named.
    """
    kinds: dict[tuple[str, ...], str] = {(): DIR}
    files: dict[tuple[str, ...], tarfile.TarInfo] = {}
    entries: list[Entry] = []
    links: list[Entry] = []
    for member in members:
        parts = _parts(member.name)
        shown = _show(parts) or member.name
        _check_parents(parts, kinds, shown)
        if member.isdir():
            if kinds.setdefault(parts, DIR) != DIR:
                raise UnsafeMember(f"entry {shown!r} appears twice")
            if parts:  # the release directory itself keeps the mode brctl gave it
                entries.append(Entry(DIR, parts, _mode(member), member))
            continue
        if not parts:
            raise UnsafeMember(f"entry {member.name!r} names the release directory itself")
        if parts in kinds:
            raise UnsafeMember(f"entry {shown!r} appears twice")
        if member.isreg():
            kinds[parts] = FILE
            files[parts] = member
            entries.append(Entry(FILE, parts, _mode(member), member))
        elif member.islnk():
            source = files[parts] = files[_hard_link_target(member, kinds, shown)]
            kinds[parts] = FILE
            entries.append(Entry(COPY, parts, _mode(source), source))
        elif member.issym():
            kinds[parts] = SYMLINK
            links.append(Entry(SYMLINK, parts, 0o777, member, member.linkname))
        else:
            raise UnsafeMember(f"entry {shown!r} is a device, FIFO or other special file; "
                               "a release holds files, directories and symlinks only")
    for entry in links:
        _resolve(entry.parts, entry.link, kinds)
    return entries + links


class _Parents:
    """The directory fd of the last entry's parent, kept open: archives list a directory's
    entries together, so most entries open nothing."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.parts: tuple[str, ...] = ()
        self.fd = root_fd

    def open(self, parts: tuple[str, ...]) -> int:
        if parts != self.parts:
            self.close()
            self.fd = safefs.make_dirs(self.root_fd, "/".join(parts), 0o755) if parts else self.root_fd
            self.parts = parts
        return self.fd

    def close(self) -> None:
        if self.fd != self.root_fd:
            os.close(self.fd)
        self.parts, self.fd = (), self.root_fd


def _write(tar: tarfile.TarFile, entry: Entry, parent_fd: int) -> None:
    data = tar.extractfile(entry.source)
    if data is None:
        raise UnsafeMember(f"entry {_show(entry.parts)!r} has no data")
    fd = safefs.open_file(parent_fd, entry.parts[-1], os.O_WRONLY | os.O_CREAT, entry.mode)
    try:
        while True:
            block = data.read(_COPY_CHUNK)
            if not block:
                break
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
        os.utime(fd, (entry.source.mtime, entry.source.mtime))
        os.fsync(fd)  # the release's marker promises the files are on disk
    finally:
        os.close(fd)


def _fsync_dirs(root_fd: int, entries: list[Entry]) -> None:
    dirs = {e.parts[:i] for e in entries for i in range(1, len(e.parts))}
    dirs.update(e.parts for e in entries if e.kind == DIR)
    for parts in sorted(dirs, key=len, reverse=True):  # children before their parents
        fd = safefs.open_dir("/".join(parts), root_fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.fsync(root_fd)


def extract(tar: tarfile.TarFile, entries: list[Entry], dest_fd: int) -> int:
    """Create ``entries`` (from ``plan``) below the empty directory ``dest_fd``.

    Every directory is opened without following links (``safefs``) and every file
    created with ``O_EXCL``, so a symlink planted meanwhile is refused, not followed.
    Returns the number of regular files written; everything is fsynced.
    """
    parents = _Parents(dest_fd)
    files = 0
    try:
        for entry in entries:
            parent_fd = parents.open(entry.parts[:-1])
            name = entry.parts[-1]
            if entry.kind == DIR:
                fd = safefs.make_dir(parent_fd, name, entry.mode, exist_ok=True)
                try:
                    os.fchmod(fd, entry.mode)  # exactly, whatever the umask or an earlier mkdir
                finally:
                    os.close(fd)
            elif entry.kind == SYMLINK:
                os.symlink(entry.link, name, dir_fd=parent_fd)
            else:
                _write(tar, entry, parent_fd)
                files += 1
    finally:
        parents.close()
    _fsync_dirs(dest_fd, entries)
    return files
