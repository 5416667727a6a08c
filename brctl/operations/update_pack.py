"""Pack a release once: a directory, a tarball, or a git revision → one checksummed artifact.

The artifact is a gzip'd tar kept in the state directory under its sha256
(``<state>/update/artifacts/<sha256>.tar.gz``), so machines that missed a push
are caught up later from the same bytes even if the source has changed since.
Packing a directory is deterministic (sorted entries, fixed owner, mode and
mtime, gzip header without a timestamp): the same tree gives the same sha256.
A git revision is packed with ``git archive`` (deterministic for a commit); a
tarball is used as it is. Every artifact is first checked with the nodes' own
member rules (``brctl.diagnostics.safetar``), so a hostile one is refused here
(exit 2, naming the member) before any machine receives it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from brctl.core.errors import InputError
from brctl.diagnostics import safetar

EXCLUDE = frozenset({".git", "__pycache__"})  # VCS metadata and bytecode are not code
_GZIP_LEVEL = 1  # code compresses ~4x even at level 1; higher levels cost CPU, gain little


@dataclass(frozen=True)
class Artifact:
    """A packed release on the controller."""

    path: Path
    sha256: str
    size: int
    source: str  # what was packed, for the history: dir:/x, tar:/x.tgz, git:/repo@<commit>


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if info.isdir() or info.mode & stat.S_IXUSR:
        info.mode = 0o755
    else:
        info.mode = 0o644
    return info


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDE)
        base = Path(dirpath)
        out.extend(base / d for d in dirnames)
        out.extend(base / f for f in sorted(filenames) if f not in EXCLUDE)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def pack_directory(src: Path) -> bytes:
    """A deterministic ``.tar.gz`` of ``src`` (entries relative to it)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk(src):
            rel = path.relative_to(src).as_posix()
            st = path.lstat()
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                    or stat.S_ISLNK(st.st_mode)):
                raise InputError(f"{path}: not a file, directory or symlink; cannot be released")
            info = _normalise(tar.gettarinfo(str(path), arcname=rel))
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return _gzip(raw.getvalue())


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0,
                       filename="") as gz:
        gz.write(data)
    return out.getvalue()


def pack_git(repo: Path, rev: str) -> tuple[bytes, str]:
    """``git archive`` of ``rev`` in ``repo``; returns (tar.gz bytes, the commit's sha)."""
    def git(*args: str) -> bytes:
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  check=False, timeout=600)
        except FileNotFoundError:
            raise InputError("git is not installed; cannot pack a git revision") from None
        if proc.returncode != 0:
            msg = proc.stderr.decode(errors="replace").strip().splitlines()
            raise InputError(f"{repo}: git {args[0]} {rev}: {msg[-1] if msg else 'failed'}")
        return proc.stdout

    commit = git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}").decode().strip()
    return _gzip(git("archive", "--format=tar", commit)), commit


def read_tarball(src: Path) -> bytes:
    """A tarball's bytes, after checking it is one (so nodes never get garbage)."""
    try:
        data = src.read_bytes()
        check_release(data, str(src))
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


def pack(src: str, rev: str | None, store_dir: Path) -> Artifact:
    """Pack ``src`` (or ``rev`` of the git repository ``src``) into ``store_dir``.

    Raises:
        InputError: the source does not exist, is not a tar archive, or git fails.
    """
    path = Path(src).expanduser()
    if rev is not None:
        if not path.is_dir():
            raise InputError(f"{src}: not a directory (with --rev, SRC is a git repository)")
        data, commit = pack_git(path, rev)
        source = f"git:{path.resolve()}@{commit}"
        check_release(data, f"{src}@{rev}")
    elif path.is_dir():
        data, source = pack_directory(path), f"dir:{path.resolve()}"
        check_release(data, str(path))
    elif path.is_file():
        data, source = read_tarball(path), f"tar:{path.resolve()}"
    else:
        raise InputError(f"{src}: no such file or directory",
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
