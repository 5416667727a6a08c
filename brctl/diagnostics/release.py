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

Requests are one JSON object: in ``sys.argv[1]`` (``receive``, whose stdin is the
artifact) or on stdin.
The answer is one JSON document on stdout (``probe_error`` on failure, exit 1).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import time
from typing import IO, Any, Callable, Optional

from brctl.diagnostics import safetar

MARKER = ".brctl-release.json"
CHUNK = 1 << 20  # 1 MiB reads keep memory flat for multi-GB artifacts
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
PROBE_SCHEMA = "brctl.probe/1"


class ReleaseError(Exception):
    """A request this machine cannot honour; the message names what and where."""


def _root(request: dict[str, Any]) -> str:
    root = request.get("root")
    if not isinstance(root, str) or not root:
        raise ReleaseError("request has no update root")
    return os.path.abspath(os.path.expanduser(root))


def _version(request: dict[str, Any]) -> str:
    version = request.get("version")
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise ReleaseError(f"bad release version {version!r}")
    return version


def _read_marker(path: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _current(root: str) -> Optional[str]:
    """The version ``current`` points at (None when absent or not one of our releases)."""
    try:
        target = os.readlink(os.path.join(root, "current"))
    except OSError:
        return None
    parts = target.rstrip("/").split("/")
    if len(parts) == 2 and parts[0] == "releases":
        return parts[1]
    return None


def inspect(request: dict[str, Any]) -> dict[str, Any]:
    """What this machine holds under the root."""
    root = _root(request)
    releases_dir = os.path.join(root, "releases")
    releases: dict[str, str] = {}
    incomplete = []
    try:
        names = sorted(os.listdir(releases_dir))
    except OSError:
        names = []
    for name in names:
        marker = _read_marker(os.path.join(releases_dir, name))
        if name.startswith(".staging-") or marker is None:
            incomplete.append(name)
        elif marker.get("version") == name:
            releases[name] = str(marker.get("sha256"))
    partial: dict[str, int] = {}
    incoming = os.path.join(root, ".incoming")
    try:
        for name in os.listdir(incoming):
            if name.endswith(".partial"):
                partial[name[: -len(".partial")]] = os.path.getsize(os.path.join(incoming, name))
    except OSError:
        pass
    current = _current(root)
    return {
        "root": root,
        "current": current,
        "current_complete": current in releases,
        "current_is_link": os.path.islink(os.path.join(root, "current")),
        "releases": releases,
        "incomplete": incomplete,
        "partial": partial,
    }


def _extract(artifact: str, dest_fd: int) -> int:
    """Unpack ``artifact`` below the empty directory ``dest_fd`` by brctl's own member rules
    (``safetar``: no reliance on ``tarfile.data_filter``); returns the file count."""
    with tarfile.open(artifact, "r:*") as tar:
        try:
            return safetar.extract(tar, safetar.plan(tar.getmembers()), dest_fd)
        except safetar.UnsafeMember as exc:
            raise ReleaseError(f"artifact {exc}") from None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _existing(releases_dir: str, version: str, sha256: str) -> bool:
    """True when ``version`` is already complete with this checksum; refuse a different one."""
    path = os.path.join(releases_dir, version)
    if not os.path.lexists(path):
        return False
    marker = _read_marker(path)
    if marker is None:
        raise ReleaseError(f"{path} exists but is not a brctl release (no {MARKER}); move it away")
    if marker.get("sha256") != sha256:
        raise ReleaseError(
            f"release {version} is already staged at {path} with sha256 "
            f"{str(marker.get('sha256'))[:12]}; releases are immutable: push under a new version")
    return True


def _stage(artifact: str, releases_dir: str, version: str, sha256: str, size: int) -> int:
    """Extract into a staging directory, mark it complete, rename it into place."""
    for name in os.listdir(releases_dir):  # leftovers of a cut extraction of this version
        if name.startswith(f".staging-{version}-"):
            shutil.rmtree(os.path.join(releases_dir, name), ignore_errors=True)
    staging = os.path.join(releases_dir, f".staging-{version}-{os.getpid()}")
    os.mkdir(staging, 0o755)
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            files = _extract(artifact, fd)  # every file fsynced: the marker promises it
            marker = {"version": version, "sha256": sha256, "size": size, "files": files,
                      "staged_at": time.time()}
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(MARKER, flags, 0o644, dir_fd=fd), "w",
                           encoding="utf-8") as fh:
                json.dump(marker, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(staging, os.path.join(releases_dir, version))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(releases_dir)
    return files


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
    releases_dir = os.path.join(root, "releases")
    incoming = os.path.join(root, ".incoming")
    for path in (releases_dir, incoming):
        os.makedirs(path, exist_ok=True)
    with open(os.path.join(incoming, f"{sha256}.lock"), "a") as lock:
        # Blocks while another receiver (a cut push still exiting, or a sibling machine
        # sharing this root over NFS) works on the same artifact; the controller's
        # timeout bounds the wait.
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if _existing(releases_dir, version, sha256):
            return {"version": version, "sha256": sha256, "staged": True, "already": True,
                    "received": _drain(stream)}
        partial = os.path.join(incoming, f"{sha256}.partial")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # No fsync here: after a crash the sha256 check catches a torn partial.
            digest = _receive_into(fd, stream, offset, size)
            have = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if have < size:
            raise ReleaseError(f"transfer cut short: {have} of {size} bytes received "
                               "(kept; the next push resumes from there)")
        if have > size or digest.hexdigest() != sha256:
            os.unlink(partial)
            raise ReleaseError(f"sha256 mismatch: artifact arrived as {digest.hexdigest()[:12]}, "
                               f"expected {sha256[:12]} (corrupted in transfer; discarded)")
        files = _stage(partial, releases_dir, version, sha256, size)
        os.unlink(partial)
        # Safe to drop: a later receiver of this artifact finds the release complete.
        os.unlink(lock.name)
    return {"version": version, "sha256": sha256, "staged": True, "already": False,
            "received": size - offset, "files": files}


def switch(request: dict[str, Any]) -> dict[str, Any]:
    """Point ``current`` at a complete release with one rename(2)."""
    root = _root(request)
    link = os.path.join(root, "current")
    if request.get("version") is None:  # undo a first-ever switch: back to no release
        previous = _current(root)
        if os.path.islink(link):
            os.unlink(link)
        return {"previous": previous, "current": None}
    version = _version(request)
    expect = request.get("sha256")
    target = os.path.join(root, "releases", version)
    marker = _read_marker(target)
    if marker is None or marker.get("version") != version:
        raise ReleaseError(f"release {version} is not staged completely at {target}")
    if expect is not None and marker.get("sha256") != expect:
        raise ReleaseError(f"release {version} at {target} has sha256 "
                           f"{str(marker.get('sha256'))[:12]}, expected {str(expect)[:12]}")
    if os.path.lexists(link) and not os.path.islink(link):
        raise ReleaseError(f"{link} exists and is not a symlink; brctl will not replace it")
    previous = _current(root)
    tmp = os.path.join(root, f".current-{os.getpid()}")
    try:
        os.unlink(tmp)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    os.symlink(os.path.join("releases", version), tmp)  # relative: valid however root is mounted
    os.replace(tmp, link)
    _fsync_dir(root)
    return {"previous": previous, "current": version}


def prune(request: dict[str, Any]) -> dict[str, Any]:
    """Remove complete releases not in ``keep`` (never the one ``current`` points at).

    A release is renamed out of ``releases/`` before it is deleted, so a reader never
    finds a half-deleted one under its version's name.
    """
    root = _root(request)
    keep = set(request.get("keep") or [])
    current = _current(root)
    releases_dir = os.path.join(root, "releases")
    removed = []
    for version, _sha in sorted(inspect({"root": root})["releases"].items()):
        if version in keep or version == current:
            continue
        trash = os.path.join(releases_dir, f".trash-{version}-{os.getpid()}")
        os.rename(os.path.join(releases_dir, version), trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(version)
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
