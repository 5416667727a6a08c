"""Pack a release once: a directory, a tarball, or a git revision → one checksummed artifact.

The artifact is a gzip'd tar kept in the state directory under its sha256
(``<state>/update/artifacts/<sha256>.tar.gz``), so machines that missed a push
are caught up later from the same bytes even if the source has changed since.
Packing a directory is deterministic (sorted entries, fixed owner, mode and
mtime, gzip header without a timestamp): the same tree gives the same sha256.
The controller packs as root a tree the job user may own (issue 35): ``SRC`` is
reached following only links of root or the operator (``safefs.resolve_path``,
the nodes' rule), the tree is walked by directory fd and each member opened
``O_NOFOLLOW`` relative to its directory and packed as ``fstat`` of that fd says
(a member swapped for a link or a FIFO after the listing is refused, never read
through), and a member others cannot read is refused rather than widened to the
0644/0755 every machine installs (else root would ship a root-only key
world-readable). A tarball is read through the same checked fds. A git
revision is packed with ``git archive`` (deterministic for a commit); a
tarball is used as it is; brctl never overrides git's refusal of a repository
another user owns (``safe.directory``). Every artifact is first checked with the nodes' own
member rules (``brctl.diagnostics.safetar``), so a hostile one is refused here
(exit 2, naming the member) before any machine receives it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pwd
import stat
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from brctl.core.errors import InputError
from brctl.diagnostics import safefs, safetar

EXCLUDE = frozenset({".git", "__pycache__"})  # VCS metadata and bytecode are not code
_GZIP_LEVEL = 1  # code compresses ~4x even at level 1; higher levels cost CPU, gain little
MAX_BYTES = 1 << 30  # update.max_bytes: a tree's files together, read whole into memory
_SPARSE_MIN = 1 << 20  # a file this big holding under 1/8 of its size in blocks is sparse


@dataclass
class _Bounds:
    """What one directory walk may read: the root's filesystem only, ``left`` bytes."""

    dev: int
    left: int
    limit: int

    def check(self, rel: str, st: os.stat_result, shown: str) -> None:
        """Refuse (naming ``rel``) another filesystem, a sparse file, or one past the cap."""
        if st.st_dev != self.dev:  # tar --one-file-system: a FUSE mount serves anything
            raise InputError(f"{shown}: entry {rel!r} is on another filesystem (a mount "
                             "point in the tree); brctl packs one filesystem only",
                             hint="copy what it holds into the release, or unmount it")
        if not stat.S_ISREG(st.st_mode):
            return
        if st.st_size >= _SPARSE_MIN and st.st_blocks * 512 < st.st_size // 8:
            raise InputError(f"{shown}: entry {rel!r} is sparse ({st.st_size} bytes, "
                             f"{st.st_blocks * 512} on disk); not packed",
                             hint="a release holds real files: remove it or write it out")
        self.left -= st.st_size
        if self.left < 0:
            raise InputError(f"{shown}: entry {rel!r} ({st.st_size} bytes) takes the release "
                             f"past update.max_bytes ({self.limit} bytes); not packed",
                             hint="move large data out of the release, or raise "
                                  "update.max_bytes in the inventory")


@dataclass(frozen=True)
class Artifact:
    """A packed release on the controller."""

    path: Path
    sha256: str
    size: int
    source: str  # what was packed, for the history: dir:/x, tar:/x.tgz, git:/repo@<commit>


def _info(rel: str, st: os.stat_result, shown: str) -> tarfile.TarInfo:
    """A member's header from the ``fstat`` of what was opened: fixed owner and mtime,
    0755 for directories and executables, else 0644; never wider than it is."""
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & need != need:
        raise InputError(f"{shown}: entry {rel!r}: others cannot read it "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); every machine installs a "
                         "release readable by all, and brctl does not widen a member",
                         hint="make it readable by others (chmod o+r) if it is meant to "
                              "ship, or move it out of the release")
    info = tarfile.TarInfo(rel)
    info.mode = 0o755 if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR else 0o644
    info.type = (tarfile.DIRTYPE if stat.S_ISDIR(st.st_mode) else
                 tarfile.SYMTYPE if stat.S_ISLNK(st.st_mode) else tarfile.REGTYPE)
    info.size = st.st_size if info.type == tarfile.REGTYPE else 0
    return info


def _listing(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """The entries of one directory fd with their ``lstat`` (the walk opens each again)."""
    with os.scandir(dir_fd) as it:
        return sorted(((e.name, e.stat(follow_symlinks=False)) for e in it
                       if e.name not in EXCLUDE), key=lambda pair: pair[0])


def _refused(shown: str, rel: str, exc: OSError) -> InputError:
    return InputError(f"{shown}: entry {rel!r}: {exc.strerror or exc}; not packed (it changed "
                      "while the release was packed, or is not a file, directory or symlink)")


def _file(dir_fd: int, name: str, rel: str, shown: str,
          bounds: _Bounds) -> tuple[tarfile.TarInfo, bytes]:
    try:
        fd = safefs.open_file(dir_fd, name)  # O_NOFOLLOW, non-blocking, regular files only
    except OSError as exc:
        raise _refused(shown, rel, exc) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        info = _info(rel, st, shown)
        bounds.check(rel, st, shown)
        data = fh.read(info.size)
    if len(data) != info.size:
        raise InputError(f"{shown}: entry {rel!r} shrank while it was packed; push again")
    return info, data


def _walk(root_fd: int, shown: str,
          max_bytes: int = MAX_BYTES) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []
    bounds = _Bounds(os.fstat(root_fd).st_dev, max_bytes, max_bytes)
    pending: list[tuple[int, str]] = [(os.dup(root_fd), "")]
    try:
        while pending:
            dir_fd, base = pending.pop()
            try:
                for name, st in _listing(dir_fd):
                    rel = f"{base}{name}"
                    if stat.S_ISDIR(st.st_mode):
                        try:
                            sub = safefs.open_dir(name, dir_fd)
                        except OSError as exc:
                            raise _refused(shown, rel, exc) from None
                        pending.append((sub, f"{rel}/"))
                        out.append((_info(rel, os.fstat(sub), shown), None))
                        bounds.check(rel, os.fstat(sub), shown)
                    elif stat.S_ISREG(st.st_mode):
                        out.append(_file(dir_fd, name, rel, shown, bounds))
                    elif stat.S_ISLNK(st.st_mode):
                        try:
                            target = os.readlink(name, dir_fd=dir_fd)
                        except OSError as exc:
                            raise _refused(shown, rel, exc) from None
                        info = _info(rel, st, shown)
                        info.linkname = target
                        out.append((info, None))
                    else:
                        raise InputError(f"{shown}: entry {rel!r}: not a file, directory or "
                                         "symlink; cannot be released")
            finally:
                os.close(dir_fd)
    finally:
        for fd, _ in pending:
            os.close(fd)
    return sorted(out, key=lambda member: member[0].name)


def _resolve(src: str) -> str:
    """``src`` made absolute and resolved following only links of root or the operator.

    Raises:
        InputError: a link on the way another user owns (naming it), or a missing part.
    """
    path = os.path.join(os.getcwd(), os.path.expanduser(src))
    try:
        return safefs.resolve_path(path, safefs.TRUSTED)
    except safefs.SymlinkRefused as exc:
        raise InputError(f"{src}: {exc.strerror}",
                         hint="only links owned by root or you are followed to a release "
                              "(the nodes' rule): name the directory it points at") from None
    except FileNotFoundError:
        raise InputError(f"{src}: no such file or directory",
                         hint="SRC is a directory, a tarball, or a git repository with "
                              "--rev REV") from None
    except OSError as exc:
        raise InputError(f"{src}: {exc.strerror or exc}") from None


def _open_dir(real: str, src: str) -> int:
    try:
        return safefs.open_dir(real)
    except OSError as exc:  # a link swapped in since it was resolved
        raise InputError(f"{src}: {exc.strerror or exc}") from None


def pack_directory(src: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """A deterministic ``.tar.gz`` of ``src`` (entries relative to it), read by fd: one
    filesystem, no sparse file, ``max_bytes`` of files at most (``_Bounds``)."""
    shown = str(src)
    fd = _open_dir(_resolve(shown), shown)
    try:
        members = _walk(fd, shown, max_bytes)
    finally:
        os.close(fd)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return _gzip(raw.getvalue())


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0,
                       filename="") as gz:
        gz.write(data)
    return out.getvalue()


def pack_git(repo: Path, rev: str) -> tuple[bytes, str]:
    """``git archive`` of ``rev`` in ``repo``; returns (tar.gz bytes, the commit's sha).

    Git refuses a repository another user owns unless ``safe.directory`` says
    otherwise (its config and hooks are that user's code); brctl never passes one,
    so a job-owned repository is refused naming its owner.
    """
    def git(*args: str) -> bytes:
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  check=False, timeout=600)
        except FileNotFoundError:
            raise InputError("git is not installed; cannot pack a git revision") from None
        if proc.returncode != 0:
            text = proc.stderr.decode(errors="replace")
            if "dubious ownership" in text:
                raise InputError(
                    f"{repo}: git refuses this repository: it is owned by "
                    f"{_owner(repo)}, not by you (git's safe.directory check, which brctl "
                    "does not override)",
                    hint="have its owner make a tarball of the revision (git archive -o "
                         "rel.tgz REV) and push that") from None
            msg = text.strip().splitlines()
            raise InputError(f"{repo}: git {args[0]} {rev}: {msg[-1] if msg else 'failed'}")
        return proc.stdout

    commit = git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}").decode().strip()
    return _gzip(git("archive", "--format=tar", commit)), commit


def _owner(path: Path) -> str:
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "another user"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def read_tarball(src: Path) -> bytes:
    """A tarball's bytes, read through a checked fd, after checking it is one.

    Its directory is reached following only links of root or the operator; the
    file itself is never a link, and ``safefs.foreign_file`` refuses a hard link
    the job user made to a root-only tarball.
    """
    shown = str(src)
    parent, name = os.path.split(_resolve(shown))
    pfd = _open_dir(parent, shown)
    try:
        try:
            fd = safefs.open_file(pfd, name)
        except OSError as exc:
            raise InputError(f"{shown}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            why = safefs.foreign_file(os.fstat(fd), os.fstat(pfd))
            if why:
                raise InputError(f"{shown}: {why}; not read",
                                 hint="a tarball root may not read for the job user is "
                                      "not packed; copy it somewhere only root can write")
            data = fh.read()
    finally:
        os.close(pfd)
    try:
        check_release(data, shown)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"{src}: not a readable tar archive: {exc}") from None
    return data


def check_release(data: bytes, source: str) -> None:
    """Refuse an archive the nodes would refuse (``safetar``'s rules), naming the member.

    Raises:
        InputError: a member a release may not hold (absolute, ``..``, a device, a
            symlink that does not point at a file inside the release...).
        tarfile.TarError: ``data`` is not a tar archive.
    """
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        try:
            safetar.plan(tar.getmembers())
        except safetar.UnsafeMember as exc:
            raise InputError(f"{source}: {exc}",
                             hint="a release holds files, directories and symlinks to its "
                                  "own files; copy what a link points at into the release"
                             ) from None


def pack(src: str, rev: str | None, store_dir: Path, max_bytes: int = MAX_BYTES) -> Artifact:
    """Pack ``src`` (or ``rev`` of the git repository ``src``) into ``store_dir``.

    Raises:
        InputError: the source does not exist, is not a tar archive, or git fails.
    """
    real = _resolve(src)
    try:
        st = os.lstat(real)
    except OSError as exc:
        raise InputError(f"{src}: {exc.strerror or exc}") from None
    if rev is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{src}: not a directory (with --rev, SRC is a git repository)")
        data, commit = pack_git(Path(real), rev)
        source = f"git:{real}@{commit}"
        check_release(data, f"{src}@{rev}")
    elif stat.S_ISDIR(st.st_mode):
        data, source = pack_directory(Path(real), max_bytes), f"dir:{real}"
        check_release(data, src)
    elif stat.S_ISREG(st.st_mode):
        data, source = read_tarball(Path(real)), f"tar:{real}"
    else:
        raise InputError(f"{src}: not a directory or a tarball",
                         hint="SRC is a directory, a tarball, or a git repository with --rev REV")
    return store(data, source, store_dir)


def store(data: bytes, source: str, store_dir: Path) -> Artifact:
    """Keep ``data`` under its sha256 in ``store_dir`` (atomic: temp name, then rename)."""
    digest = hashlib.sha256(data).hexdigest()
    final = store_dir / f"{digest}.tar.gz"
    try:
        store_dir.mkdir(parents=True, exist_ok=True)
        if not final.is_file() or final.stat().st_size != len(data):
            fd, tmp = tempfile.mkstemp(dir=store_dir, prefix=".partial-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, final)
    except OSError as exc:
        raise InputError(f"cannot keep the artifact in {store_dir}: {exc}") from None
    return Artifact(final, digest, len(data), source)


def load(store_dir: Path, sha256: str, source: str) -> Artifact:
    """A stored artifact, checked against its name.

    Raises:
        InputError: it is gone or its bytes changed.
    """
    path = store_dir / f"{sha256}.tar.gz"
    try:
        data = path.read_bytes()
    except OSError:
        raise InputError(f"release {source}: its artifact {sha256[:12]} is no longer in "
                         f"{store_dir} (releases beyond update.keep are pruned)",
                         hint="push that release again, under a new version") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"{path}: content does not match its sha256 (corrupted on the controller)",
                         hint="push that release again")
    return Artifact(path, sha256, len(data), source)
