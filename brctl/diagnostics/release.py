"""Probe: versioned code releases on a machine, switched atomically (``brctl update``).

Node side, standard library only. Layout under the update root::

    <root>/releases/<version>/            a complete release (immutable once there)
    <root>/releases/<version>/.brctl-release.json   its marker: version, sha256, size
    <root>/releases/.staging-<version>-<pid>/       being extracted (never switched to)
    <root>/current -> releases/<version>  relative symlink, replaced with rename(2)
    <root>/.incoming/<sha256>.partial     an artifact being received (resumable)
    <root>/.incoming/<sha256>.lock        flock: one receiver per artifact

Actions (the request's ``action``):

- ``inspect``: what is here (current, complete releases, partial artifacts).
- ``receive``: read the artifact from stdin after the one-line request header
  (from byte ``offset``: a cut transfer resumes where it stopped), check its
  sha256, extract into a staging directory, write the marker inside it and
  rename the directory into place. Staging is idempotent; a version already
  staged with a different checksum is refused (releases are immutable).
- ``prune``: delete complete releases not in ``keep`` (never ``current``'s).
- ``switch``: point ``current`` at a complete release: a new symlink under a
  temporary name, then ``rename(2)`` over ``current``, so a reader always sees
  either the old or the new target, never a missing link.

The update root may sit in a tree the job user can write, so nothing here
follows a symlink the job could have made: the way to the root follows only
links owned by root or the login user (``safefs.resolve_path``), and everything
below it is reached through directory fds, one name at a time, following none. A release,
marker or artifact that is a symlink is never read, switched to or extracted.

Requests are one JSON object: in ``sys.argv[1]`` (``receive``, whose stdin is the
artifact) or on stdin.
The answer is one JSON document on stdout (``probe_error`` on failure, exit 1); a
planted link or special file is a refusal instead (``Refused``: the node state
``refused``, exit 4 for the command, as for the same plant in ``ckpt.dir``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import stat
import sys
import tarfile
import time
from typing import IO, Any, Callable, Optional

from brctl.diagnostics import safefs, safetar
from brctl.diagnostics.isolate import REFUSED_EXIT, REFUSED_MARK

MARKER = ".brctl-release.json"
CHUNK = 1 << 20  # 1 MiB reads keep memory flat for multi-GB artifacts
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
PROBE_SCHEMA = "brctl.probe/1"
_MARKER_MAX = 1 << 16  # a marker is a few hundred bytes; never read a planted giant


class ReleaseError(Exception):
    """A request this machine cannot honour; the message names what and where."""


class Refused(ReleaseError):
    """A safety rule stopped the request here: something planted in the update root (a
    symlink, a special file, a hard link) where brctl would write or read. Answered as
    the node state ``refused`` (``isolate.refuse``'s mark, exit ``REFUSED_EXIT``), as the
    same plant in ``ckpt.dir`` is, so the command exits 4."""


def _root(request: dict[str, Any]) -> str:
    root = request.get("root")
    if not isinstance(root, str) or not root:
        raise ReleaseError("request has no update root")
    return os.path.abspath(os.path.expanduser(root))


def _open_root(root: str, create: bool) -> Optional[int]:
    """An fd of the update root (None: absent). Links on the way are followed only
    when owned by root or the login user (``safefs.resolve_path``: an operator's
    ``/opt -> /data/opt``), never one the job planted. ``create``: ``mkdir -p``."""
    top = root
    while create and not os.path.lexists(top):
        top = posixpath.dirname(top)
    try:
        fd = safefs.open_dir(safefs.resolve_path(top, safefs.TRUSTED))
    except FileNotFoundError:
        return None
    except safefs.SymlinkRefused as exc:
        raise Refused(f"update root {root}: {exc.strerror}") from None
    if top == root:
        return fd
    try:
        return safefs.make_dirs(fd, posixpath.relpath(root, top), 0o755)
    finally:
        os.close(fd)


def _subdir(parent_fd: int, name: str) -> Optional[int]:
    """An fd of directory ``name`` in ``parent_fd``; None when absent, a link or not a dir."""
    try:
        return safefs.open_dir(name, parent_fd)
    except (FileNotFoundError, safefs.SymlinkRefused):
        return None


def _version(request: dict[str, Any]) -> str:
    version = request.get("version")
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise ReleaseError(f"bad release version {version!r}")
    return version


def _read_marker(releases_fd: int, name: str) -> Optional[dict[str, Any]]:
    """The marker of release ``name``; None when it (or the release) is absent or a link."""
    try:
        fd = safefs.open_path(releases_fd, f"{safefs.check_component(name)}/{MARKER}")
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(_MARKER_MAX).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _lstat(dir_fd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _current(root_fd: int) -> Optional[str]:
    """The version ``current`` points at (None when absent or not one of our releases)."""
    try:
        target = os.readlink("current", dir_fd=root_fd)
    except OSError:
        return None
    parts = target.rstrip("/").split("/")
    if len(parts) == 2 and parts[0] == "releases":
        return parts[1]
    return None


def _releases(releases_fd: Optional[int]) -> tuple[dict[str, str], list[str]]:
    """Complete releases (version -> sha256) and the other names under ``releases/``
    (none when ``releases_fd`` is None: no such directory, or a link)."""
    releases: dict[str, str] = {}
    incomplete: list[str] = []
    if releases_fd is None:
        return releases, incomplete
    for name in sorted(os.listdir(releases_fd)):
        marker = _read_marker(releases_fd, name)
        if name.startswith(".staging-") or marker is None:
            incomplete.append(name)
        elif marker.get("version") == name:
            releases[name] = str(marker.get("sha256"))
    return releases, incomplete


def _partials(root_fd: int) -> dict[str, int]:
    partial: dict[str, int] = {}
    incoming = _subdir(root_fd, ".incoming")
    if incoming is None:
        return partial
    try:
        for name in os.listdir(incoming):
            if name.endswith(".partial"):
                st = os.stat(name, dir_fd=incoming, follow_symlinks=False)
                partial[name[: -len(".partial")]] = st.st_size
    finally:
        os.close(incoming)
    return partial


def inspect(request: dict[str, Any]) -> dict[str, Any]:
    """What this machine holds under the root."""
    root = _root(request)
    root_fd = _open_root(root, create=False)
    if root_fd is None:
        return {"root": root, "current": None, "current_complete": False,
                "current_is_link": False, "releases": {}, "incomplete": [], "partial": {}}
    try:
        releases_fd = _subdir(root_fd, "releases")
        try:
            releases, incomplete = _releases(releases_fd)
        finally:
            if releases_fd is not None:
                os.close(releases_fd)
        current = _current(root_fd)
        link = _lstat(root_fd, "current")
        return {
            "root": root,
            "current": current,
            "current_complete": current in releases,
            "current_is_link": link is not None and stat.S_ISLNK(link.st_mode),
            "releases": releases,
            "incomplete": incomplete,
            "partial": _partials(root_fd),
        }
    finally:
        os.close(root_fd)


def _extract(artifact_fd: int, dest_fd: int) -> int:
    """Unpack the artifact below the empty directory ``dest_fd`` by brctl's own member rules
    (``safetar``: no reliance on ``tarfile.data_filter``); returns the file count."""
    with os.fdopen(os.dup(artifact_fd), "rb") as fh:
        fh.seek(0)  # the dup shares the offset the receive left at the end
        with tarfile.open(fileobj=fh, mode="r:*") as tar:
            try:
                return safetar.extract(tar, safetar.plan(tar.getmembers()), dest_fd)
            except safetar.UnsafeMember as exc:
                raise ReleaseError(f"artifact {exc}") from None


def _existing(releases_fd: int, where: str, version: str, sha256: str) -> bool:
    """True when ``version`` is already complete with this checksum; refuse a different one."""
    st = _lstat(releases_fd, version)
    if st is None:
        return False
    path = f"{where}/{version}"
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{path} is a symlink; not followed: remove it (brctl makes releases)")
    marker = _read_marker(releases_fd, version)
    if marker is None:
        raise ReleaseError(f"{path} exists but is not a brctl release (no {MARKER}); move it away")
    if marker.get("sha256") != sha256:
        raise ReleaseError(
            f"release {version} is already staged at {path} with sha256 "
            f"{str(marker.get('sha256'))[:12]}; releases are immutable: push under a new version")
    return True


def _remove(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        safefs.remove_tree(dir_fd, name)


def _stage(artifact_fd: int, releases_fd: int, version: str, sha256: str, size: int) -> int:
    """Extract into a staging directory, mark it complete, rename it into place."""
    for name in os.listdir(releases_fd):  # leftovers of a cut extraction of this version
        if name.startswith(f".staging-{version}-"):
            _remove(releases_fd, name)
    staging = f".staging-{version}-{os.getpid()}"
    fd = safefs.make_dir(releases_fd, staging, 0o755)
    try:
        try:
            files = _extract(artifact_fd, fd)  # every file fsynced: the marker promises it
            marker = {"version": version, "sha256": sha256, "size": size, "files": files,
                      "staged_at": time.time()}
            mfd = safefs.open_file(fd, MARKER, os.O_WRONLY | os.O_CREAT, 0o644)
            with os.fdopen(mfd, "w", encoding="utf-8") as fh:
                json.dump(marker, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(staging, version, src_dir_fd=releases_fd, dst_dir_fd=releases_fd)
    except BaseException:
        _remove(releases_fd, staging)
        raise
    os.fsync(releases_fd)
    return files


def _make_dir(root_fd: int, name: str, mode: int, root: str) -> int:
    try:
        return safefs.make_dir(root_fd, name, mode, exist_ok=True)
    except safefs.SymlinkRefused as exc:
        what = str(exc.strerror).split(" ", 1)[1]  # "'releases' is a symlink; ..." less the name
        raise Refused(f"{root}/{name} {what}; remove it (brctl makes it)") from None


def _open_plain(dir_fd: int, name: str, shown: str) -> int:
    """Open (or create, 0600) a file of brctl's own in ``dir_fd``: a link, a FIFO or a hard
    link planted under that name is refused, never truncated or written through."""
    refused = Refused(f"{shown} is not a plain file brctl made (a link or special file); "
                      "not used: remove it")
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refused from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise refused
    return fd


def _drain(stream: IO[bytes]) -> int:
    total = 0
    while True:
        block = stream.read(CHUNK)
        if not block:
            return total
        total += len(block)


def _receive_into(fd: int, stream: IO[bytes], offset: int, size: int) -> hashlib._Hash:
    """Keep the first ``offset`` bytes of the partial file, append the stream; return the hash."""
    digest = hashlib.sha256()
    have = os.fstat(fd).st_size
    if offset > have:
        raise ReleaseError(f"resume offset {offset} is beyond the {have} bytes received so far")
    os.ftruncate(fd, offset)
    os.lseek(fd, 0, os.SEEK_SET)
    left = offset
    while left:
        block = os.read(fd, min(CHUNK, left))
        if not block:
            raise ReleaseError("partial artifact shrank while resuming")
        digest.update(block)
        left -= len(block)
    os.lseek(fd, offset, os.SEEK_SET)
    while True:
        block = stream.read(CHUNK)
        if not block:
            break
        digest.update(block)
        os.write(fd, block)  # unbuffered: what reached the disk is resumable after a cut
    return digest


def receive(request: dict[str, Any], stream: IO[bytes]) -> dict[str, Any]:
    """Receive (or resume) the artifact from ``stream``, verify it and stage the release."""
    root = _root(request)
    version = _version(request)
    sha256 = str(request.get("sha256", ""))
    size = int(request.get("size", -1))
    offset = int(request.get("offset", 0))
    if not re.match(r"^[0-9a-f]{64}$", sha256) or size < 0 or not 0 <= offset <= size:
        raise ReleaseError("receive needs sha256 (64 hex digits), size and 0 <= offset <= size")
    root_fd = _open_root(root, create=True)
    assert root_fd is not None  # created
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, root_fd)
        releases_fd = _make_dir(root_fd, "releases", 0o755, root)
        stack.callback(os.close, releases_fd)
        incoming_fd = _make_dir(root_fd, ".incoming", 0o700, root)
        stack.callback(os.close, incoming_fd)
        incoming = f"{root}/.incoming"
        lock = _open_plain(incoming_fd, f"{sha256}.lock", f"{incoming}/{sha256}.lock")
        stack.callback(os.close, lock)
        # Blocks while another receiver (a cut push still exiting, or a sibling machine
        # sharing this root over NFS) works on the same artifact; the controller's
        # timeout bounds the wait.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _existing(releases_fd, f"{root}/releases", version, sha256):
            return {"version": version, "sha256": sha256, "staged": True, "already": True,
                    "received": _drain(stream)}
        partial = f"{sha256}.partial"
        fd = _open_plain(incoming_fd, partial, f"{incoming}/{partial}")
        stack.callback(os.close, fd)
        # No fsync here: after a crash the sha256 check catches a torn partial.
        digest = _receive_into(fd, stream, offset, size)
        have = os.fstat(fd).st_size
        if have < size:
            raise ReleaseError(f"transfer cut short: {have} of {size} bytes received "
                               "(kept; the next push resumes from there)")
        if have > size or digest.hexdigest() != sha256:
            os.unlink(partial, dir_fd=incoming_fd)
            raise ReleaseError(f"sha256 mismatch: artifact arrived as {digest.hexdigest()[:12]}, "
                               f"expected {sha256[:12]} (corrupted in transfer; discarded)")
        files = _stage(fd, releases_fd, version, sha256, size)
        os.unlink(partial, dir_fd=incoming_fd)
        # Safe to drop: a later receiver of this artifact finds the release complete.
        os.unlink(f"{sha256}.lock", dir_fd=incoming_fd)
    return {"version": version, "sha256": sha256, "staged": True, "already": False,
            "received": size - offset, "files": files}


def _existing_root(request: dict[str, Any]) -> tuple[str, int]:
    root = _root(request)
    root_fd = _open_root(root, create=False)
    if root_fd is None:
        raise ReleaseError(f"update root {root} does not exist")
    return root, root_fd


def switch(request: dict[str, Any]) -> dict[str, Any]:
    """Point ``current`` at a complete release with one rename(2)."""
    root, root_fd = _existing_root(request)
    try:
        return _switch(request, root, root_fd)
    finally:
        os.close(root_fd)


def _switch(request: dict[str, Any], root: str, root_fd: int) -> dict[str, Any]:
    link = _lstat(root_fd, "current")
    if link is not None and not stat.S_ISLNK(link.st_mode):
        raise ReleaseError(f"{root}/current exists and is not a symlink; brctl will not replace it")
    previous = _current(root_fd)
    if request.get("version") is None:  # undo a first-ever switch: back to no release
        if link is not None:
            os.unlink("current", dir_fd=root_fd)
        return {"previous": previous, "current": None}
    version = _version(request)
    expect = request.get("sha256")
    target = f"{root}/releases/{version}"
    releases_fd = _subdir(root_fd, "releases")
    marker = None
    if releases_fd is not None:
        try:
            marker = _read_marker(releases_fd, version)
        finally:
            os.close(releases_fd)
    if marker is None or marker.get("version") != version:
        raise ReleaseError(f"release {version} is not staged completely at {target}")
    if expect is not None and marker.get("sha256") != expect:
        raise ReleaseError(f"release {version} at {target} has sha256 "
                           f"{str(marker.get('sha256'))[:12]}, expected {str(expect)[:12]}")
    tmp = f".current-{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    os.symlink(f"releases/{version}", tmp, dir_fd=root_fd)  # relative: valid however mounted
    os.replace(tmp, "current", src_dir_fd=root_fd, dst_dir_fd=root_fd)
    os.fsync(root_fd)
    return {"previous": previous, "current": version}


def prune(request: dict[str, Any]) -> dict[str, Any]:
    """Remove complete releases not in ``keep`` (never the one ``current`` points at).

    A release is renamed out of ``releases/`` before it is deleted, so a reader never
    finds a half-deleted one under its version's name.
    """
    keep = set(request.get("keep") or [])
    _root_path, root_fd = _existing_root(request)
    removed = []
    try:
        current = _current(root_fd)
        releases_fd = _subdir(root_fd, "releases")
        if releases_fd is None:
            return {"removed": []}
        try:
            for version in sorted(_releases(releases_fd)[0]):
                if version in keep or version == current:
                    continue
                trash = f".trash-{version}-{os.getpid()}"
                os.rename(version, trash, src_dir_fd=releases_fd, dst_dir_fd=releases_fd)
                _remove(releases_fd, trash)
                removed.append(version)
        finally:
            os.close(releases_fd)
    finally:
        os.close(root_fd)
    return {"removed": removed}


ACTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "inspect": inspect,
    "switch": switch,
    "prune": prune,
}


def handle(request: dict[str, Any], stream: IO[bytes]) -> dict[str, Any]:
    """Dispatch one request; ``receive`` reads the artifact from ``stream``."""
    action = request.get("action")
    if action == "receive":
        return receive(request, stream)
    if action not in ACTIONS:
        raise ReleaseError(f"unknown action {action!r}")
    return ACTIONS[str(action)](request)


def main(argv: list[str], stdin: IO[bytes], stdout: IO[str]) -> int:
    """The request (``argv[0]``, else one JSON line on stdin) → one JSON document.

    ``receive`` takes its request from argv so stdin carries nothing but the artifact.
    """
    try:
        header = argv[0].encode() if argv else stdin.readline()
        request = json.loads(header.decode("utf-8")) if header.strip() else {}
        if not isinstance(request, dict):
            raise ReleaseError("request must be a JSON object")
        document = handle(request, stdin)
        code = 0
    except Refused as exc:
        with contextlib.suppress(OSError, ValueError):
            _drain(stdin)
        stdout.write(f"{REFUSED_MARK} {json.dumps(str(exc))}\n")
        stdout.flush()
        return REFUSED_EXIT
    except (ReleaseError, OSError, ValueError, tarfile.TarError) as exc:
        message = str(exc) if isinstance(exc, ReleaseError) else f"{type(exc).__name__}: {exc}"
        document = {"probe_error": message}
        code = 1
        with contextlib.suppress(OSError, ValueError):
            _drain(stdin)  # let the sender finish cleanly instead of writing into a closed pipe
    document.setdefault("schema", PROBE_SCHEMA)
    stdout.write(json.dumps(document, separators=(",", ":")) + "\n")
    stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout))
