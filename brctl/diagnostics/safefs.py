"""File safety for node-side code that runs as root in trees a job user can write.

Node-side, standard library only (Python >= 3.9); the controller imports it too
(the name validators), so it imports nothing of brctl.

Threat. brctl usually runs as root on the machines; the training job's user is
untrusted and owns directories brctl reads and writes (``ckpt.dir``, logs,
``update.root``); a name that arrives from another machine is untrusted too.
Given a path, the job user can swap any component it may write for a symlink (to
``/etc``, ``/root/.ssh``), a FIFO (an open that never returns) or a hard link to
a root-only file, at any moment, including between a check and a use.

Rules this module enforces, so callers need not re-derive them:

- Names. ``check_component`` accepts one directory entry name: non-empty, no
  ``/``, no NUL, not ``.`` or ``..``. ``check_relpath`` accepts a relative path
  already in normal form (``posixpath.normpath(p) == p``): not absolute, no
  ``..`` component, no NUL, not ``.``. Both raise ``UnsafeName`` (a
  ``ValueError``) whose message quotes the bad name, and return their argument.
- Never follow a symlink. ``open_dir`` opens a path one component at a time with
  ``O_DIRECTORY|O_NOFOLLOW`` relative to the previous component's fd, so no
  component, including the first, may be a symlink; the fd it returns is the
  directory that was checked, whatever happens to its path afterwards. Every
  later operation is relative to such an fd (``dir_fd=``), one component at a
  time. A symlink where a directory or file was expected raises
  ``SymlinkRefused`` (an ``OSError``, errno ``ELOOP``) naming the path.
- Files. ``open_file`` opens one name relative to a dir fd with ``O_NOFOLLOW``;
  for reading, the open is non-blocking (a planted FIFO cannot hang it) and
  anything but a regular file is refused (``NotRegular``, errno ``EINVAL``).
  Creating a file always means ``O_CREAT|O_EXCL`` with an explicit mode: an
  existing name, link or not, is never reused.
- Foreign files. A job user who may write a directory can put there a hard link
  to a file it cannot read (where ``fs.protected_hardlinks`` is 0), or keep such
  a link after the original name is gone (then the file has one link left).
  ``foreign_file`` is the one rule for every file brctl reads as root: in a
  directory only root can write (root-owned, not group/other writable) anything
  goes; a file of the directory's owner (not root) is its own; otherwise a file
  with more than one link is refused, and so is a file others may not read unless
  it is the job user's (``job_uid``) in a root directory others can write.
  ``open_read``, ``walk_files`` and ``open_job_file`` apply it to the file
  actually opened or listed and the directory it was found in.
- Job files. ``open_job_file`` opens a file brctl only reads (a log) by absolute
  path: its directory reached as ``resolve_path`` does (only ``TRUSTED`` links),
  the file never a link, only if it belongs to root, to its directory's owner
  or to the job user named by the caller, and only if ``foreign_file`` allows it.
- Directories. ``make_dir`` is ``mkdir(name, mode, dir_fd=)`` followed by an
  ``O_NOFOLLOW`` open of what was made (``exist_ok``: an existing directory is
  opened the same way, an existing symlink is refused).
- Walking. ``walk_files`` lists the regular files of a tree by fd, breadth
  first, sorted; symlinks, FIFOs, sockets, devices and files ``foreign_file``
  refuses are not listed but returned in ``skipped`` with a reason, so callers
  can report them. Nothing is ever read through them.
- Removing. ``remove_tree`` empties and removes one directory entry by fd
  (``empty_dir`` empties a directory fd already checked): symlinks inside are
  unlinked, never followed; a subdirectory swapped for a symlink mid-walk is
  unlinked as the link it now is.
- Roots. ``resolve_path`` gives the real path of a configured root (``ckpt.dir``)
  following only symlinks owned by an allowed uid (an operator's ``/local ->
  /mnt/nvme0``), never one the job user planted; ``open_dir`` it afterwards.
- Ownership. ``unsafe_owner_chain`` is OpenSSH's StrictModes rule (misc.c
  ``safe_path``) for a whole path: every directory from ``/`` down to the path
  (and the path itself) must be owned by an allowed uid and not group/other
  writable. By default, as in OpenSSH, there is no exception for sticky
  directories: ``/tmp`` (1777) fails (``sticky_ok`` admits them for paths brctl
  only reads, never for ones it writes into). Symlinks along the way are followed only if owned by an allowed
  uid and not hard linked elsewhere (their directory was already checked), the target's chain is then checked.
  It returns the first reason (path, owner, mode) or ``None``.
"""

from __future__ import annotations

import errno
import os
import posixpath
import pwd
import stat
from dataclasses import dataclass, field

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SYMLINKS = 40  # as the kernel's MAXSYMLINKS
# Whose symlinks on the way to a configured path are the operator's: root, and the
# login user when it is not root (the job user cannot make a link owned by either).
TRUSTED = tuple(sorted({0, os.geteuid()}))


class UnsafeName(ValueError):
    """A name or relative path that must not be used as a path (message quotes it)."""


class SymlinkRefused(OSError):
    """A symlink (or non-directory) found where brctl will not follow one."""

    def __init__(self, path: str, what: str = "is a symlink; not followed") -> None:
        super().__init__(errno.ELOOP, f"{path!r} {what}")
        self.path = path


class NotRegular(OSError):
    """Not a regular file (FIFO, socket, device, directory) where a file was expected."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"{path!r} is a {kind}, not a regular file")
        self.path = path


class ForeignFile(OSError):
    """A file ``foreign_file`` refuses to read as root where it was found."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, f"{path!r} is {why}; not read")
        self.path, self.why = path, why


def foreign_file(st: os.stat_result, dir_st: os.stat_result,
                 job_uid: int | None = None) -> str | None:
    """Why root must not read file ``st`` found in directory ``dir_st``, or ``None``.

    Whoever can write a directory can put a hard link there to a file it cannot read
    (where ``fs.protected_hardlinks`` is 0), and keep it once the original name is
    gone (log rotation, ``/etc/shadow-`` replaced): root reading it would hand a
    root-only file to the job. So, the one rule for files brctl reads as root:

    - a directory only root can write (root-owned, not group/other writable): any file;
    - the directory owner's own file (owner not root): fine, however many links;
    - otherwise (a job user's directory, a root directory others can write: a 0775
      ``ckpt.dir``, a 1777 log dir) a file with more than one link is refused, and
      so is a file others may not read (such a link left with one name): root's, or
      a colleague's (root would copy it to the job: the directory's owner or
      ``job_uid``, the inventory's ``job.user``). The one exception is the job user's
      own in a root directory others can write: its checkpoints in a shared 0775
      ``ckpt.dir``, its logs in a 1777 one.
    """
    if dir_st.st_uid == 0 and not dir_st.st_mode & 0o022:
        return None
    if st.st_uid == dir_st.st_uid != 0:
        return None
    whose = "a root file" if st.st_uid == 0 else f"a file of {_owner(st.st_uid)}"
    where = (f"a directory of {_owner(dir_st.st_uid)}" if dir_st.st_uid != 0 else
             f"a root directory others can write (mode {stat.S_IMODE(dir_st.st_mode):04o})")
    if st.st_nlink > 1:
        return f"{whose} with {st.st_nlink} links in {where}"
    if st.st_mode & stat.S_IROTH or (dir_st.st_uid == 0 and st.st_uid == job_uid != 0):
        return None
    mode = stat.S_IMODE(st.st_mode)
    return (f"{whose} others cannot read (mode {mode:04o}) in {where}"
            + (", not the job user's" if dir_st.st_uid == 0 and st.st_uid != 0 else ""))


def check_component(name: str) -> str:
    """``name`` if it is one plain directory entry name, else ``UnsafeName``."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafeName(f"unsafe name {name!r}: expected one path component "
                         "(not empty, '.', '..'; no '/' or NUL)")
    return name


def check_relpath(path: str) -> str:
    """``path`` if it is a normalised relative path staying below its base, else ``UnsafeName``."""
    if (not isinstance(path, str) or not path or "\0" in path or path.startswith("/")
            or posixpath.normpath(path) != path or path == "."
            or ".." in path.split("/")):
        raise UnsafeName(f"unsafe relative path {path!r}: expected a normalised path below "
                         "its base (not absolute, no '..', no NUL)")
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"


def _open_component(name: str, dir_fd: int, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                kind = _kind(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                kind = "not a directory"
            raise SymlinkRefused(shown, "is a symlink; not followed" if kind == "symlink"
                                 else f"is a {kind}, not a directory") from None
        raise


def open_dir(path: str, dir_fd: int | None = None) -> int:
    """An fd of directory ``path`` (absolute, or relative to ``dir_fd``); no symlink followed.

    A relative ``path`` must pass ``check_relpath``; an absolute one must be in normal
    form. The caller closes the fd.
    """
    if dir_fd is None:
        if not path.startswith("/") or path.startswith("//") or posixpath.normpath(path) != path:
            raise UnsafeName(f"expected an absolute normalised directory path, got {path!r}")
        parts = [p for p in path.split("/") if p]
        fd = os.open("/", _DIR_FLAGS)
        shown = ""
    else:
        parts = check_relpath(path).split("/") if path != "." else []
        fd = os.dup(dir_fd)
        shown = "."
    try:
        for part in parts:
            shown = f"{shown}/{part}" if shown else f"/{part}"
            nxt = _open_component(part, fd, shown)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(dir_fd: int, name: str, flags: int = os.O_RDONLY, mode: int | None = None) -> int:
    """Open file ``name`` (one component) in ``dir_fd`` with ``O_NOFOLLOW``.

    With ``O_CREAT`` in ``flags`` the file must be new (``O_EXCL`` is added) and
    gets exactly ``mode`` (required; the umask does not apply). Otherwise only a
    regular file opens; a read open does not block on a FIFO. The caller closes the fd.
    """
    check_component(name)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if flags & os.O_CREAT:
        if mode is None:
            raise ValueError("creating a file needs an explicit mode")
        fd = os.open(name, flags | os.O_EXCL, mode, dir_fd=dir_fd)
        os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
        return fd
    try:
        fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkRefused(name) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(name, _kind(st.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_path(dir_fd: int, relpath: str, flags: int = os.O_RDONLY, mode: int | None = None) -> int:
    """``open_file`` of ``relpath`` (``check_relpath``) below ``dir_fd``, every directory by fd."""
    parent, name = posixpath.split(check_relpath(relpath))
    pfd = open_dir(parent or ".", dir_fd)
    try:
        return open_file(pfd, name, flags, mode)
    finally:
        os.close(pfd)


def open_read(dir_fd: int, relpath: str, job_uid: int | None = None) -> int:
    """``open_path`` for reading, and only a file ``foreign_file`` allows in its directory
    (``job_uid``: the job user's, see there).

    The rule is judged on the file actually opened and the directory fd it was
    opened from, so a name swapped after a listing cannot dodge it: ``ForeignFile``.
    """
    parent, name = posixpath.split(check_relpath(relpath))
    pfd = open_dir(parent or ".", dir_fd)
    try:
        fd = open_file(pfd, name)
        dir_st = os.fstat(pfd)
    finally:
        os.close(pfd)
    why = foreign_file(os.fstat(fd), dir_st, job_uid)
    if why:
        os.close(fd)
        raise ForeignFile(relpath, why)
    return fd


def open_job_file(path: str, job_uid: int | None = None) -> int:
    """A read-only fd of the job's file at ``path`` (absolute), e.g. a log.

    Its directory is reached as ``resolve_path`` does (only links of ``TRUSTED``
    owners: an operator's ``/var/log -> /data/log``, never one the job planted) and
    opened with ``open_dir``; the file itself is never a link (``open_file``). It
    must belong to root, to the owner of its directory or to ``job_uid`` (the
    inventory's ``job.user``: its logs in a root-owned 1777 directory), and pass
    ``foreign_file`` (no hard link to a root-only file). Refusals are ``OSError``
    naming the path.
    """
    path = posixpath.normpath(path)  # glob output: '//' and trailing '/'
    parent, name = posixpath.split(path)
    pfd = open_dir(resolve_path(parent, TRUSTED))
    try:
        fd = open_file(pfd, name)
        dir_st = os.fstat(pfd)
    finally:
        os.close(pfd)
    st = os.fstat(fd)
    why = None
    owners = {0, dir_st.st_uid} | ({job_uid} if job_uid is not None else set())
    if st.st_uid not in owners:
        why = (f"owned by {_owner(st.st_uid)}, not by root or its directory's owner"
               + (" or the job user" if job_uid is not None else ""))
    else:
        why = foreign_file(st, dir_st, job_uid)
    if why:
        os.close(fd)
        raise ForeignFile(path, why)
    return fd


def job_uid(user: object) -> int | None:
    """The uid of ``job.user`` (a request's ``job_user``) on this machine; None when unset.

    Raises:
        OSError: there is no such user here (``ENOENT``, naming it).
    """
    if not user:
        return None
    try:
        return pwd.getpwnam(str(user)).pw_uid
    except KeyError:
        raise OSError(errno.ENOENT, f"job.user {user!r}: no such user on this machine") from None


def make_dir(dir_fd: int, name: str, mode: int = 0o700, *, exist_ok: bool = False) -> int:
    """``mkdir`` ``name`` in ``dir_fd`` and return an fd of it, opened without following links."""
    check_component(name)
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        if not exist_ok:
            raise
    return _open_component(name, dir_fd, name)


def make_dirs(dir_fd: int, relpath: str, mode: int = 0o700) -> int:
    """``make_dir(exist_ok=True)`` for each component of ``relpath``; an fd of the last."""
    fd = os.dup(dir_fd)
    try:
        for part in check_relpath(relpath).split("/"):
            nxt = make_dir(fd, part, mode, exist_ok=True)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class Walk:
    """A tree's regular files (relative paths, sorted) and what was skipped, with why."""

    files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def walk_files(dir_fd: int, *, exclude: frozenset[str] = frozenset(),
               job_uid: int | None = None) -> Walk:
    """The regular files below ``dir_fd``, found by fd; nothing is followed.

    A file ``foreign_file`` refuses in the directory it is in (a hard link the job
    user made to someone else's file; ``job_uid``: see there) is skipped. Names in
    ``exclude`` are ignored at every level (brctl's own manifests).
    """
    out = Walk()
    pending = ["."]
    while pending:
        rel = pending.pop(0)
        try:
            fd = open_dir(rel, dir_fd)
        except SymlinkRefused as exc:  # swapped for a link after it was listed
            out.skipped.append((rel, str(exc.strerror)))
            continue
        try:
            dir_st = os.fstat(fd)
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                if entry.name in exclude:
                    continue
                path = entry.name if rel == "." else f"{rel}/{entry.name}"
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(path)
                elif not stat.S_ISREG(st.st_mode):
                    why = "symlink; not followed" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
                    out.skipped.append((path, why))
                elif (foreign := foreign_file(st, dir_st, job_uid)) is not None:
                    out.skipped.append((path, f"{foreign}; not read"))
                else:
                    out.files.append(path)
        finally:
            os.close(fd)
    out.files.sort()
    return out


def remove_tree(dir_fd: int, name: str) -> None:
    """Remove directory ``name`` in ``dir_fd`` and everything below it, following no link."""
    fd = _open_component(check_component(name), dir_fd, name)
    try:
        _empty(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def empty_dir(fd: int) -> None:
    """Remove everything below the directory ``fd`` (itself stays), following no link."""
    _empty(fd)


def _empty(fd: int) -> None:
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                os.unlink(entry.name, dir_fd=fd)  # swapped for a link: remove the link
                continue
            try:
                _empty(sub)
            finally:
                os.close(sub)
            os.rmdir(entry.name, dir_fd=fd)
        else:
            os.unlink(entry.name, dir_fd=fd)


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _unsafe(path: str, allowed_uids: tuple[int, ...], sticky_ok: bool) -> str | None:
    st = os.lstat(path)
    if st.st_uid not in allowed_uids:
        return f"{path} is owned by {_owner(st.st_uid)}"
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & 0o022 and not (sticky_ok and sticky_dir):
        return f"{path} is group/other writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _walk(path: str, allowed_uids: tuple[int, ...], check: bool, sticky_ok: bool = False
          ) -> tuple[str, str | None]:
    """(the real path, the first policy failure or None); ``OSError`` for a missing part."""
    if not path.startswith("/"):
        return path, f"{path}: not an absolute path"
    todo = [p for p in path.split("/") if p]
    done, links, checked = "", 0, set()
    while True:
        here = done or "/"
        if check and here not in checked:
            reason = _unsafe(here, allowed_uids, sticky_ok)
            if reason:
                return here, reason
            checked.add(here)
        if not todo:
            return here, None
        part = todo.pop(0)
        if part in (".", ".."):
            done = posixpath.dirname(done) if part == ".." and done else done
            continue
        nxt = f"{done}/{part}"
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if st.st_uid not in allowed_uids:
                return nxt, f"{nxt} is a symlink owned by {_owner(st.st_uid)}"
            if st.st_nlink > 1:  # the job hard linked a root symlink (protected_hardlinks=0)
                return nxt, f"{nxt} is a symlink with {st.st_nlink} hard links; not followed"
            if links > _MAX_SYMLINKS:
                return nxt, f"{path}: too many levels of symbolic links"
            target = os.readlink(nxt)
            todo = [p for p in target.split("/") if p] + todo
            done = "" if target.startswith("/") else done
            continue
        done = nxt


def resolve_path(path: str, allowed_uids: tuple[int, ...] = (0,)) -> str:
    """The real path of ``path``, following only symlinks owned by ``allowed_uids``.

    For a configured root (``ckpt.dir``) that an operator may reach through a
    root-owned link (``/local -> /mnt/nvme0``): a link the job user planted raises
    ``SymlinkRefused``; a missing part raises the ``OSError``. Open the result with
    ``open_dir``, which then refuses any link swapped in since.
    """
    real, reason = _walk(path, allowed_uids, check=False)
    if reason:
        raise SymlinkRefused(path, f"cannot be resolved safely: {reason}")
    return real


def unsafe_owner_chain(path: str, allowed_uids: tuple[int, ...] = (0,), *,
                       sticky_ok: bool = False) -> str | None:
    """Why ``path`` fails OpenSSH's StrictModes rule, or ``None`` when it passes.

    Every directory from ``/`` to ``path`` and ``path`` itself: owned by a uid in
    ``allowed_uids`` and not group/other writable (sticky bit or not). A symlink on
    the way must be owned by an allowed uid; its target is checked the same way.
    A missing component is a reason too.

    ``sticky_ok``: a sticky directory (``/tmp``, 1777) owned by an allowed uid may
    be group/other writable: others may add names there but cannot rename or
    remove an entry they do not own, and every entry on the path is checked to be
    owned by an allowed uid. For code brctl only reads (an inventory, an
    interpreter, an import path), not for directories it writes into.
    """
    try:
        return _walk(path, allowed_uids, check=True, sticky_ok=sticky_ok)[1]
    except OSError as exc:
        return f"{exc.filename or path}: {exc.strerror}"
