"""Probe: move checkpoint shard bytes between nodes, and land a restore safely.

Node-side, standard library only (Python >= 3.9); the areas, checks and rules are
``brctl.diagnostics.ckptfiles``'s (read its docstring first). Bytes travel node →
controller → node as a plain stream over each node's SSH connection: ``send`` on the
source writes files back to back, ``receive`` on the destination reads them, so
every write on the destination is done here, through directory fds, never by an
SFTP server following whatever path the job left behind.

Streaming ops (request JSON in ``argv[1]``); every file path must lie inside the
request's ``step`` (one path component), checked before anything is opened:

- ``send``: write the ``files`` of an area (``ckpt``, ``backup``, ``legacy``) to
  stdout, exactly ``size`` bytes each; stops (exit 4, reason on stderr) at a file it
  may not read (a symlink, a FIFO, what ``safefs.foreign_file`` refuses, judged on
  the fd it sends from), or (exit 1) at one that changed: another size, or, where
  the scan gave its ``dev``/``ino``, another file under that name.
- ``receive``: read those bytes from stdin into a backup step (``area: backup``, made
  by ``ckptfiles prepare``) or a restore staging dir (``area: staging``): each file
  under a new ``O_EXCL`` temp name, checked against its sha256, fsynced, renamed over
  its name. Answers one JSON document (``written``, ``mismatched``, ``missing``). A
  receive that fails (``ENOSPC``: named so in its ``probe_error``) removes its temp
  file; one killed leaves it to the next ``prepare`` (``ckptspace.sweep_partials``).

Restore ops (request on stdin, like every probe):

- ``stage``: make ``dir`` if it is missing (0755, owned by ``job_user`` when the
  request names one (the inventory's ``job.user``), else like its nearest existing
  ancestor), remove stale staging dirs brctl made in ``dir`` (owned by this uid, so
  never the job's) and make a new one, ``.brctl-restore-<random>``, 0700. The answer
  gives its ``staging_id`` ([dev, ino]); ``receive``, ``finish_restore`` and ``drop``
  must carry it and use the dir only if it is still that inode, this uid's and 0700
  when reopened, so a job that renames or replaces it cannot redirect a write.
- ``finish_restore``: check the staged step is all there (each file's sha256 was
  checked as it landed), give it to ``job_user`` when set, else to the owner and
  group of ``dir`` (files keep the source's permission bits minus
  setuid/setgid/sticky and execute; dirs get ``dir``'s bits), move an existing step
  aside to ``.brctl-replaced-<step>-<ms>``, rename the step into place, remove the
  staging dir; ``owner_uid`` in the answer says whose the shards now are.
- ``drop``: empty this restore's staging dir through the fd that was checked and
  remove it if its name is still that directory (after a failure).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import secrets
import stat
import sys
import time
from typing import IO, Any

from brctl.diagnostics import safefs
from brctl.diagnostics.ckptfiles import (
    CHUNK,
    REFUSALS,
    STAGING_PREFIX,
    TRUSTED,
    Refused,
    check_files,
    check_in_step,
    job_account,
    job_uid,
    open_area,
    open_ckpt,
    open_step,
    resolve,
    why_refused,
)
from brctl.diagnostics.ckptspace import PARTIAL_PREFIX
from brctl.diagnostics.protocol import PROBE_SCHEMA, serve
from brctl.diagnostics.safefs import UnsafeName

REFUSED_EXIT = 4  # send: a file it may not read (the controller reports the copy refused)

# -- restores ---------------------------------------------------------------------------


def _staging_id(req: dict[str, Any]) -> tuple[int, int]:
    """The ``staging_id`` [dev, ino] that ``stage`` answered: required."""
    ident = req.get("staging_id")
    if (not isinstance(ident, list) or len(ident) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ident)):
        raise UnsafeName(f"staging_id {ident!r}: expected the [dev, ino] stage answered")
    return ident[0], ident[1]


def _open_staging(base_fd: int, req: dict[str, Any]) -> int:
    """The staging dir ``req["staging"]`` in ``dir``, only if it is the one ``stage`` made:
    the same inode (``staging_id``), still our uid and 0700."""
    name: str = safefs.check_component(req["staging"])
    ident = _staging_id(req)
    if not name.startswith(STAGING_PREFIX):
        raise UnsafeName(f"unsafe staging name {name!r}")
    fd = safefs.open_dir(name, base_fd)
    st = os.fstat(fd)
    if ((st.st_dev, st.st_ino) != ident or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) != 0o700):
        os.close(fd)
        raise Refused(f"staging dir {name} was replaced (owner uid {st.st_uid}, mode "
                      f"{stat.S_IMODE(st.st_mode):04o}"
                      + (", another inode" if (st.st_dev, st.st_ino) != ident else "")
                      + "); not used")
    return fd


def _make_ckpt_dir(req: dict[str, Any]) -> None:
    """A missing ``dir`` (a fresh standby), made 0755: owned by ``job_user`` when the
    request names one, else by its nearest existing ancestor's owner (the job user
    when it owns the place ``dir`` lives in). Directories made above it stay root's."""
    want = resolve(req["dir"])
    top = want
    while not os.path.lexists(top):
        top = posixpath.dirname(top)
    real = safefs.resolve_path(top, TRUSTED)
    afd = safefs.open_dir(real)
    try:
        st = os.fstat(afd)
        owner = job_account(req) or (st.st_uid, st.st_gid)
        fd = safefs.make_dirs(afd, posixpath.relpath(want, top), 0o755)
        try:
            os.fchown(fd, *owner)
        finally:
            os.close(fd)
    finally:
        os.close(afd)


def stage(req: dict[str, Any]) -> dict[str, Any]:
    """Remove stale staging dirs brctl made, then make a fresh one under a random name.

    The answer names it and its identity (``staging_id``: [dev, ino]), which every
    later request on it must carry.
    """
    job_account(req)  # an unknown job.user is refused before anything is made
    try:
        base, path = open_ckpt(req)
    except FileNotFoundError:
        _make_ckpt_dir(req)
        base, path = open_ckpt(req)
    try:
        for name in os.listdir(base):
            if not name.startswith(STAGING_PREFIX):
                continue
            st = os.lstat(name, dir_fd=base)
            if (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
                    and stat.S_IMODE(st.st_mode) == 0o700):
                safefs.remove_tree(base, name)  # a crashed restore's; never the job's
        name = STAGING_PREFIX + secrets.token_hex(8)
        fd = safefs.make_dir(base, name, 0o700)
        st = os.fstat(fd)
        os.close(fd)
    finally:
        os.close(base)
    return {"staging": name, "staging_id": [st.st_dev, st.st_ino], "dir": path}


def _give(fd: int, uid: int, gid: int, mode: int) -> None:
    os.fchown(fd, uid, gid)
    os.fchmod(fd, mode)


def _hand_over(staging_fd: int, step: str, files: list[dict[str, Any]], owner: tuple[int, int],
               dir_mode: int) -> None:
    """Files and dirs of the staged step: to ``owner`` (uid, gid), safe permission bits."""
    dirs = set()
    for f in files:
        rel = safefs.check_relpath(f["path"])
        fd = safefs.open_path(staging_fd, rel)
        try:
            _give(fd, *owner, int(f.get("mode", 0o644)) & 0o666)
        finally:
            os.close(fd)
        parent = posixpath.dirname(rel)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    for rel in sorted(dirs):
        fd = safefs.open_dir(rel, staging_fd)
        try:
            _give(fd, *owner, dir_mode)
        finally:
            os.close(fd)
    if step not in dirs and not any(f["path"] == step for f in files):
        raise Refused(f"staged files are not under step {step!r}")


def finish_restore(req: dict[str, Any]) -> dict[str, Any]:
    """Check the staged files, hand them to the job user (``job_user``, else ``dir``'s
    owner), rename the step into place; ``owner_uid`` says whose they now are."""
    files = req["files"]
    step = check_in_step(req["step"], files)
    job = job_account(req)
    base, path = open_ckpt(req)
    try:
        sfd = _open_staging(base, req)
        try:
            missing, bad = check_files(sfd, files, rehash=False)
            if missing or bad:
                return {"ok": False, "missing": missing, "mismatched": bad}
            dst = os.fstat(base)
            owner = job or (dst.st_uid, dst.st_gid)
            _hand_over(sfd, step, files, owner, stat.S_IMODE(dst.st_mode) & 0o777)
            moved_aside = None
            if _exists(base, step):
                moved_aside = f".brctl-replaced-{step}-{int(time.time() * 1e3)}"
                os.rename(step, moved_aside, src_dir_fd=base, dst_dir_fd=base)
            os.rename(step, step, src_dir_fd=sfd, dst_dir_fd=base)
            _rmdir_if_same(base, req["staging"], os.fstat(sfd))
        finally:
            os.close(sfd)
    finally:
        os.close(base)
    return {"ok": True, "missing": [], "mismatched": [], "path": posixpath.join(path, step),
            "moved_aside": moved_aside and posixpath.join(path, moved_aside),
            "owner_uid": owner[0]}


def _exists(base_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=base_fd)
    except FileNotFoundError:
        return False
    return True


def _rmdir_if_same(base_fd: int, name: str, want: os.stat_result) -> None:
    st = os.lstat(name, dir_fd=base_fd)
    if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
        os.rmdir(name, dir_fd=base_fd)


def drop(req: dict[str, Any]) -> dict[str, Any]:
    """Remove a staging dir this restore made (after a failure): emptied through the fd
    that was checked, removed only if its name still is that directory."""
    base, _ = open_ckpt(req)
    try:
        sfd = _open_staging(base, req)
        try:
            safefs.empty_dir(sfd)
            _rmdir_if_same(base, req["staging"], os.fstat(sfd))
        finally:
            os.close(sfd)
    finally:
        os.close(base)
    return {"ok": True}


# -- streams ----------------------------------------------------------------------------


def _stream_base(req: dict[str, Any], *, receiving: bool) -> int:
    """The directory a send/receive request's paths are relative to."""
    area = req.get("area", "ckpt")
    if receiving and area == "staging":
        base, _ = open_ckpt(req)
        try:
            return _open_staging(base, req)
        finally:
            os.close(base)
    if receiving and area != "backup":
        raise UnsafeName(f"cannot receive into area {area!r}")
    opened = open_area(req)
    if opened is None:
        raise Refused("no backup root here")
    root_fd, _ = opened
    if area == "ckpt":
        return root_fd
    try:
        return open_step(req, root_fd)
    finally:
        os.close(root_fd)


def send(req: dict[str, Any], out: IO[bytes]) -> None:
    """Write each file's bytes to ``out``; raise at the first one that may not be sent.

    Each file is judged again on the fd opened for sending (``safefs.open_read``: no
    link, nothing ``foreign_file`` refuses); with the ``dev``/``ino`` the scan reported,
    it must still be that very file, and it must still have the size that was hashed.
    """
    if req.get("step") is not None:
        check_in_step(req["step"], req["files"])
    uid = job_uid(req)
    base = _stream_base(req, receiving=False)
    try:
        for f in req["files"]:
            fd = safefs.open_read(base, safefs.check_relpath(f["path"]), uid)
            try:
                st = os.fstat(fd)
                if "ino" in f and (st.st_dev, st.st_ino) != (f.get("dev"), f["ino"]):
                    raise ValueError(f"{f['path']}: not the file whose sha256 was taken "
                                     "(replaced at the source since the scan)")
                if st.st_size != int(f["size"]):
                    raise ValueError(f"{f['path']}: {st.st_size} bytes now, {f['size']} when its "
                                     "sha256 was taken (changed at the source)")
                _copy_out(fd, out, int(f["size"]))
            finally:
                os.close(fd)
    finally:
        os.close(base)


def _copy_out(fd: int, out: IO[bytes], size: int) -> None:
    out.flush()
    left, offset = size, 0
    while left > 0:
        try:
            n = os.sendfile(out.fileno(), fd, offset, min(left, 1 << 30))
        except OSError:  # not every output takes sendfile: plain reads
            os.lseek(fd, offset, os.SEEK_SET)
            n = len(block := os.read(fd, min(left, CHUNK)))
            out.write(block)
            out.flush()
        if n == 0:
            raise ValueError(f"file shrank while it was sent ({left} bytes short)")
        left, offset = left - n, offset + n


def receive(req: dict[str, Any], data: IO[bytes]) -> dict[str, Any]:
    """Files from ``data`` into the area, each checked against its sha256 before its rename."""
    files = req["files"]
    check_in_step(req.get("step"), files)
    base = _stream_base(req, receiving=True)
    written, bad, missing = 0, [], []  # type: ignore[var-annotated]
    try:
        for i, f in enumerate(files):
            got = _receive_one(base, f, data)
            if got is None:
                missing.extend(g["path"] for g in files[i:])
                break
            if got:
                written += 1
            else:
                bad.append(f["path"])
    finally:
        os.close(base)
    return {"ok": not bad and not missing, "written": written, "mismatched": bad,
            "missing": missing}


def _receive_one(base: int, f: dict[str, Any], data: IO[bytes]) -> bool | None:
    """True: written; False: wrong checksum (dropped); None: the stream ended early."""
    parent, name = posixpath.split(f["path"])
    pfd = safefs.make_dirs(base, parent) if parent else os.dup(base)
    tmp = f"{PARTIAL_PREFIX}{secrets.token_hex(6)}"
    try:
        fd = safefs.open_file(pfd, tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        digest, left = hashlib.sha256(), int(f["size"])
        try:
            while left > 0:
                block = data.read(min(left, CHUNK))
                if not block:
                    break
                digest.update(block)
                _write_all(fd, block)
                left -= len(block)
            os.fsync(fd)
        except BaseException:  # ENOSPC, a lost stream: leave the filesystem as found
            os.close(fd)
            os.unlink(tmp, dir_fd=pfd)
            raise
        else:
            os.close(fd)
        if left > 0 or digest.hexdigest() != f["sha256"]:
            os.unlink(tmp, dir_fd=pfd)
            return None if left > 0 else False
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        return True
    finally:
        os.close(pfd)


def _write_all(fd: int, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[os.write(fd, view):]




OPS = {"stage": stage, "finish_restore": finish_restore, "drop": drop}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Dispatch a restore op; a safety refusal is ``{"refused": why}``."""
    op = request.get("op")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (expected one of {', '.join(sorted(OPS))})")
    try:
        return OPS[op](request)
    except REFUSALS as exc:
        return {"refused": why_refused(exc)}


def main(argv: list[str], stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """``send``/``receive`` (request in ``argv[0]``, bulk data on stdin/stdout)."""
    req = json.loads(argv[0])
    try:
        if req.get("op") == "send":
            send(req, stdout)
            stdout.flush()
            return 0
        if req.get("op") != "receive":
            raise ValueError(f"unknown streaming op {req.get('op')!r}")
        doc = receive(req, stdin)
    except REFUSALS as exc:
        doc = {"refused": why_refused(exc)}
    except Exception as exc:  # one JSON answer, never a traceback
        # the receiver's own cause, by name (ENOSPC): the sender's EPIPE is only its echo
        code = errno.errorcode.get(exc.errno or 0) if isinstance(exc, OSError) else None
        doc = {"probe_error": f"{code or type(exc).__name__}: {exc}"}
    if req.get("op") == "send":  # no document: stdout is the data
        sys.stderr.write(f"brctl: send stopped: {doc.get('refused') or doc.get('probe_error')}\n")
        return REFUSED_EXIT if "refused" in doc else 1
    doc["schema"] = PROBE_SCHEMA
    stdout.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
    stdout.flush()
    return 0 if "probe_error" not in doc else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer))
    serve(handle)
