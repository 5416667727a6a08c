"""Probe: checkpoint shard files on this node — list, checksum, send, receive, commit, restore.

Node-side, standard library only (Python >= 3.9). The job's user owns ``dir`` and is
untrusted, as is every name in a request (it may come from another machine's answer):
all file work goes through ``brctl.diagnostics.safefs`` (directory fds, no symlink
ever followed, ``O_EXCL`` creates with explicit modes) and every name is checked
before any mkdir/open/rename/remove. A refusal is answered as ``{"refused": why}``.

Areas (``area`` in a request) — where a request's relative names live:

- ``ckpt``: ``dir`` (``~``/``$VARS`` expanded on the node; root-owned symlinks on the
  way are followed, any other symlink is refused).
- ``backup``: the backup root, ``backup_dir`` or by default ``<dir>.brctl-backup``
  beside ``dir``; every component from ``/`` must be owned by root (or the SSH user)
  and not group/other writable, else refused. The default must be on ``dir``'s
  filesystem: a ``dir`` that is a mount point is refused (set ``backup_dir``).
  ``prepare`` creates it 0700. Copies live in ``<root>/<source>/<step>/<path>``.
- ``legacy``: ``<dir>/.brctl-backup`` (the old default, inside the job's directory):
  read-only, for restores, by the same no-symlink rules.

Ops (``op``):

- ``scan``: the steps under ``dir`` matching ``glob`` (newest first, natural order);
  the first ``hash_steps`` eligible ones (with ``marker`` when given) are hashed,
  each file with its identity here (``dev``, ``ino``) for ``send`` to check again.
  Symlinked steps/files, FIFOs, devices and files ``safefs.foreign_file`` refuses
  (a hard link to someone else's file) are listed under ``skipped`` with a
  reason, never hashed or sent.
- ``scan_backup``: the backed-up steps of ``source``: committed (a manifest, written
  last) or partial, and the sha256 of files present (``deep``: committed ones too);
  ``root`` is where the area is (or, not made yet, would be); ``skipped`` lists
  what was not followed or read, with why (the legacy area is the job's to plant in).
- ``prepare``: create ``<root>/<source>/<step>/`` and drop its stale manifest.
- ``send`` (request in ``argv[1]``, ``ckptmove``): write the ``files`` of an area to
  stdout, back to back, exactly ``size`` bytes each; stops (exit 4) at a file it may
  not read, (exit 1) at one that changed since the scan.
- ``receive`` (request in ``argv[1]``): read those bytes from stdin into the backup
  step or a restore staging dir: each file under a new ``O_EXCL`` temp name, checked
  against its sha256, fsynced, then renamed over its name.
- ``commit``: check every path lies inside ``step`` and the step is all there (every
  sha256 was checked as the file landed or was listed, in this run, in a root only
  brctl writes); then write the manifest atomically and prune older steps beyond
  ``keep``.
- ``verify``: re-hash a committed backup step against its manifest.
- ``stage`` (``ckptmove``): remove stale staging dirs brctl made in ``dir`` (owned by
  this uid) and make a new one, ``.brctl-restore-<random>``, 0700; its [dev, ino]
  (``staging_id``) must come with every later request on it.
- ``finish_restore`` (``ckptmove``): re-check the staged step, give it to ``job_user``
  (else the owner and group of ``dir``; files keep the source's permission bits,
  minus setuid/setgid/sticky and execute), move an existing step aside, rename it
  into place and remove the staging dir.
- ``drop``: remove a staging dir (a failed restore).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import pwd
import re
import secrets
import stat
import time
from typing import Any

from brctl.diagnostics import ckptspace, safefs
from brctl.diagnostics.protocol import serve
from brctl.diagnostics.safefs import SymlinkRefused, UnsafeName

MANIFEST = ".brctl-manifest.json"
STAGING_PREFIX = ".brctl-restore-"
LEGACY_BACKUP = ".brctl-backup"  # the old default backup root, inside dir
BACKUP_SUFFIX = ".brctl-backup"  # the default backup root: <dir>.brctl-backup
CHUNK = 1 << 20  # 1 MiB reads: bounded memory for any shard size
_MANIFEST_MAX = 64 << 20
TRUSTED = tuple(sorted({0, os.geteuid()}))  # root, and the SSH user when it is not root
SUGGESTION = ("set ckpt.backup_dir to a directory whose every component is owned by root "
              "and not group/other writable, e.g. /var/lib/brctl/ckpt-backup")


class Refused(Exception):
    """A safety rule stopped the request on this node (answered as ``refused``)."""


REFUSALS = (Refused, UnsafeName, SymlinkRefused, safefs.NotRegular, safefs.ForeignFile)


def why_refused(exc: BaseException) -> str:
    """The reason of one of ``REFUSALS``, naming the path or name."""
    return str(exc.strerror) if isinstance(exc, OSError) else str(exc)


def resolve(path: str) -> str:
    """``~`` and ``$VARS`` expanded on the node, made absolute and normal."""
    return os.path.abspath(os.path.expanduser(os.path.expandvars(path)))


def _natural(name: str) -> list[Any]:
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t]


def sha256_file(path: str) -> str:
    """The file's sha256, read in chunks (a controller-side spool file)."""
    with open(path, "rb") as fh:
        return _digest(fh.fileno())


def _digest(fd: int) -> str:
    digest = hashlib.sha256()
    while True:
        block = os.read(fd, CHUNK)
        if not block:
            return digest.hexdigest()
        digest.update(block)


# -- areas ------------------------------------------------------------------------------


def ckpt_dir(req: dict[str, Any]) -> str:
    """The real path of ``dir``, following only root-owned symlinks."""
    return safefs.resolve_path(resolve(req["dir"]), TRUSTED)


def backup_root(req: dict[str, Any]) -> str:
    """``backup_dir`` (resolved) or the default beside ``dir``."""
    if req.get("backup_dir"):
        return resolve(req["backup_dir"])
    try:
        return ckpt_dir(req) + BACKUP_SUFFIX
    except FileNotFoundError:  # a machine without checkpoints of its own (yet)
        return resolve(req["dir"]) + BACKUP_SUFFIX


def open_ckpt(req: dict[str, Any]) -> tuple[int, str]:
    """(fd, real path) of ``dir``."""
    path = ckpt_dir(req)
    return safefs.open_dir(path), path


def open_area(req: dict[str, Any], *, create: bool = False) -> tuple[int, str] | None:
    """(fd, path) of the request's area root; None when a backup root does not exist."""
    area = req.get("area", "ckpt")
    if area == "ckpt":
        return open_ckpt(req)
    if area == "legacy":
        try:
            base, path = open_ckpt(req)
        except FileNotFoundError:  # no ckpt.dir here: no old backups either
            return None
        try:
            return safefs.open_dir(LEGACY_BACKUP, base), posixpath.join(path, LEGACY_BACKUP)
        except FileNotFoundError:
            return None
        finally:
            os.close(base)
    if area != "backup":
        raise UnsafeName(f"unknown area {area!r}")
    root = backup_root(req)
    if create and not req.get("backup_dir"):
        _check_same_filesystem(req, root)
    if not os.path.lexists(root):
        if not create:
            return None
        top = root
        while not os.path.lexists(top):
            top = posixpath.dirname(top)
        real_top = safefs.resolve_path(top, TRUSTED)
        _check_chain(real_top)
        pfd = safefs.open_dir(real_top)
        try:
            os.close(safefs.make_dirs(pfd, posixpath.relpath(root, top), 0o700))
        finally:
            os.close(pfd)
    real = safefs.resolve_path(root, TRUSTED)
    _check_chain(real)
    return safefs.open_dir(real), real


def _check_same_filesystem(req: dict[str, Any], root: str) -> None:
    """The default backup root sits beside ``dir``: refuse it when ``dir`` is a mount
    point, where it would put checkpoint-sized copies on the parent's filesystem."""
    try:
        base, path = open_ckpt(req)
    except FileNotFoundError:  # no checkpoints here (yet): nothing to compare with
        return
    try:
        parent = posixpath.dirname(root)
        pfd = safefs.open_dir(safefs.resolve_path(parent, TRUSTED))
        try:
            same = os.fstat(base).st_dev == os.fstat(pfd).st_dev
        finally:
            os.close(pfd)
    finally:
        os.close(base)
    if not same:
        raise Refused(f"ckpt.dir {path} is a mount point: the default backup root {root} would "
                      f"be on another filesystem (that of {parent}); set ckpt.backup_dir to a "
                      "directory on the filesystem you want the backups on (every component "
                      "owned by root and not group/other writable)")


def _check_chain(path: str) -> None:
    reason = safefs.unsafe_owner_chain(path, TRUSTED)
    if reason:
        raise Refused(f"backup root {path}: {reason}; {SUGGESTION}")


def open_step(req: dict[str, Any], root_fd: int) -> int:
    return safefs.open_dir(f"{safefs.check_component(req['source'])}/"
                           f"{safefs.check_component(req['step'])}", root_fd)


def job_account(req: dict[str, Any]) -> tuple[int, int] | None:
    """(uid, gid) of the request's ``job_user`` (the inventory's ``job.user``) here, or None."""
    user = req.get("job_user")
    if not user:
        return None
    try:
        account = pwd.getpwnam(str(user))
    except KeyError:
        raise Refused(f"job.user {user!r}: no such user on this machine") from None
    return account.pw_uid, account.pw_gid


def job_uid(req: dict[str, Any]) -> int | None:
    """The uid of the request's ``job_user`` here, or None: whose private files a root
    directory others can write may hold (``safefs.foreign_file``)."""
    account = job_account(req)
    return None if account is None else account[0]


# -- reading --------------------------------------------------------------------------


def _hash_at(base_fd: int, rel: str, job_uid: int | None = None
             ) -> tuple[int, str, int, os.stat_result]:
    """(size, sha256, permission bits, stat) of ``rel`` below ``base_fd``, opened without links.

    ``safefs.open_read``: a file the job user may have hard linked there (someone
    else's) is refused (``ForeignFile``), judged on the file actually opened.
    """
    fd = safefs.open_read(base_fd, rel, job_uid)
    try:
        st = os.fstat(fd)
        return st.st_size, _digest(fd), stat.S_IMODE(st.st_mode), st
    finally:
        os.close(fd)


def _describe(base_fd: int, rels: list[str], skipped: list[list[str]],
              job_uid: int | None) -> list[dict[str, Any]]:
    """Each file's entry: path, size, sha256, permission bits and its identity (dev, ino)
    on this node, which ``ckptmove send`` checks again; refused ones go to ``skipped``."""
    out = []
    for rel in rels:
        try:
            size, sha, mode, st = _hash_at(base_fd, rel, job_uid)
        except safefs.ForeignFile as exc:
            skipped.append([rel, f"{exc.why}; not read"])
            continue
        except (SymlinkRefused, safefs.NotRegular) as exc:  # swapped since it was listed
            skipped.append([rel, str(exc.strerror)])
            continue
        out.append({"path": rel, "size": size, "sha256": sha, "mode": mode,
                    "dev": st.st_dev, "ino": st.st_ino})
    return out


def _step_files(base_fd: int, name: str, job_uid: int | None
                ) -> tuple[list[str], list[list[str]]]:
    """Regular files of one step (a file or a tree), relative to ``base_fd``."""
    st = os.lstat(name, dir_fd=base_fd)
    if stat.S_ISREG(st.st_mode):
        return [name], []
    fd = safefs.open_dir(name, base_fd)
    try:
        walk = safefs.walk_files(fd, exclude=frozenset({MANIFEST}), job_uid=job_uid)
    finally:
        os.close(fd)
    return ([f"{name}/{p}" for p in walk.files],
            [[f"{name}/{p}", why] for p, why in walk.skipped])


def scan(req: dict[str, Any]) -> dict[str, Any]:
    """The node's own steps, newest first; the newest ``hash_steps`` eligible ones hashed
    (``job_user``: whose private files a root directory others can write may hold)."""
    pattern, marker, want = req.get("glob", "*"), req.get("marker"), int(req.get("hash_steps", 1))
    uid = job_uid(req)
    try:
        base, path = open_ckpt(req)
    except FileNotFoundError:
        return {"dir": resolve(req["dir"]), "exists": False, "steps": [], "skipped": []}
    try:
        steps, skipped = [], []
        names = sorted((n for n in os.listdir(base) if fnmatch.fnmatchcase(n, pattern)
                        and not n.startswith(".")), key=_natural, reverse=True)
        for name in names:
            try:
                st = os.lstat(name, dir_fd=base)
            except FileNotFoundError:  # rotated away since it was listed
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                skipped.append([name, "symlink; not followed" if stat.S_ISLNK(st.st_mode)
                                else "not a file or directory"])
                continue
            eligible = not marker or _has(base, name, marker)
            step: dict[str, Any] = {"name": name, "eligible": eligible}
            if eligible and want > 0:
                try:
                    rels, step["skipped"] = _step_files(base, name, uid)
                    # a file rotated away before it is hashed: the step is no longer whole
                    step["files"] = _describe(base, rels, step["skipped"], uid)
                except (SymlinkRefused, FileNotFoundError) as exc:  # swapped since listed
                    skipped.append([name, str(exc.strerror)])
                    continue
                if stat.S_ISREG(st.st_mode) and not step["files"]:  # a one-file step refused
                    skipped.extend(step["skipped"])
                    continue
                want -= 1
            steps.append(step)
        return {"dir": path, "exists": True, "steps": steps, "skipped": skipped}
    finally:
        os.close(base)


def _has(base_fd: int, step: str, marker: str) -> bool:
    try:
        fd = safefs.open_path(base_fd, f"{step}/{safefs.check_component(marker)}")
    except OSError:
        return False
    os.close(fd)
    return True


def _read_manifest(step_fd: int) -> dict[str, Any] | None:
    try:
        fd = safefs.open_file(step_fd, MANIFEST)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            doc = json.loads(fh.read(_MANIFEST_MAX))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def scan_backup(req: dict[str, Any]) -> dict[str, Any]:
    """Backed-up steps of ``source``: committed or partial, with present files' checksums."""
    deep, only = bool(req.get("deep", True)), req.get("step")
    source = safefs.check_component(req["source"])
    opened = open_area(req)
    if opened is None:  # not made yet: where the first backup would make it
        return {"root": backup_root(req) if req.get("area") == "backup" else None, "steps": [],
                "skipped": []}
    root_fd, root = opened
    skipped: list[list[str]] = []
    try:
        try:
            src_fd = safefs.open_dir(source, root_fd)
        except FileNotFoundError:
            return {"root": root, "steps": [], "skipped": []}
        try:
            steps = _backup_steps(src_fd, deep, only, skipped, job_uid(req))
        finally:
            os.close(src_fd)
    finally:
        os.close(root_fd)
    return {"root": root, "steps": steps, "skipped": skipped}


def _backup_steps(src_fd: int, deep: bool, only: str | None, skipped: list[list[str]],
                  job_uid: int | None) -> list[dict[str, Any]]:
    """The steps of one source; what is not followed or read goes to ``skipped``
    (``[step or step/path, why]``): in the legacy area, inside the job's directory,
    that is what the job planted there."""
    steps = []
    for name in sorted(os.listdir(src_fd), key=_natural, reverse=True):
        if name.startswith(".") or (only and name != only):
            continue
        try:
            fd = safefs.open_dir(name, src_fd)
        except SymlinkRefused as exc:
            skipped.append([name, str(exc.strerror)])
            continue
        except FileNotFoundError:  # removed since it was listed
            continue
        try:
            manifest = _read_manifest(fd)
            entry: dict[str, Any] = {"name": name, "committed": manifest is not None}
            if manifest is not None:
                entry["manifest"] = manifest["files"]
                entry["committed_at"] = manifest.get("committed_at")
            if manifest is None or deep:
                mine: list[list[str]] = []
                walk = safefs.walk_files(fd, exclude=frozenset({MANIFEST}), job_uid=job_uid)
                mine.extend([p, why] for p, why in walk.skipped)
                entry["present"] = {d["path"]: d["sha256"]
                                    for d in _describe(fd, walk.files, mine, job_uid)}
                skipped.extend([f"{name}/{p}", why] for p, why in mine)
            steps.append(entry)
        finally:
            os.close(fd)
    return steps


def check_in_step(step: Any, files: list[dict[str, Any]]) -> str:
    """``step`` (one path component) if every file path is normalised and inside it."""
    name: str = safefs.check_component(step)
    for f in files:
        rel = safefs.check_relpath(f["path"])
        if rel != name and not rel.startswith(name + "/"):
            raise UnsafeName(f"path {rel!r} is not inside step {name!r}")
    return name


def check_files(base_fd: int, files: list[dict[str, Any]], *, rehash: bool = True
                ) -> tuple[list[str], list[str]]:
    """(missing, mismatched) paths of ``files`` below ``base_fd``.

    ``rehash=False`` checks presence and sizes only: for files whose sha256 was
    checked as they landed (``ckptmove receive``) or listed (``scan_backup``) in
    this run, in a directory only brctl can write. A symlink or special file where
    a file should be is no mere mismatch but planted: ``SymlinkRefused`` /
    ``NotRegular`` propagate (the request is refused).
    """
    missing, bad = [], []
    for f in files:
        rel = safefs.check_relpath(f["path"])
        try:
            if rehash:
                size, sha, _, _ = _hash_at(base_fd, rel)
            else:
                fd = safefs.open_read(base_fd, rel)
                size, sha = os.fstat(fd).st_size, f["sha256"]
                os.close(fd)
        except FileNotFoundError:
            missing.append(f["path"])
            continue
        if size != f["size"] or sha != f["sha256"]:
            bad.append(f["path"])
    return missing, bad


# -- backups ----------------------------------------------------------------------------


def prepare(req: dict[str, Any]) -> dict[str, Any]:
    """Create ``<root>/<source>/<step>/`` (0700), drop its stale manifest, the source's
    incomplete older steps and partials, and check the room (``ckptspace``)."""
    opened = open_area({**req, "area": "backup"}, create=True)
    assert opened is not None
    root_fd, root = opened
    try:
        src_fd = safefs.make_dir(root_fd, safefs.check_component(req["source"]), exist_ok=True)
        try:
            step_fd = safefs.make_dir(src_fd, safefs.check_component(req["step"]), exist_ok=True)
            try:
                os.unlink(MANIFEST, dir_fd=step_fd)
            except FileNotFoundError:
                pass
            finally:
                os.close(step_fd)
            _prune(src_fd, req["step"], 1 << 62)  # only the incomplete older steps: a killed
            answer = ckptspace.ready(src_fd, req)  # receive's debris must not block this one
        finally:
            os.close(src_fd)
    finally:
        os.close(root_fd)
    return {**answer, "root": root}


def _write_manifest(step_fd: int, doc: dict[str, Any]) -> None:
    tmp = f".partial-{secrets.token_hex(6)}"
    fd = safefs.open_file(step_fd, tmp, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, MANIFEST, src_dir_fd=step_fd, dst_dir_fd=step_fd)
    os.fsync(step_fd)  # the rename itself must survive a crash, not just the bytes


def commit(req: dict[str, Any]) -> dict[str, Any]:
    """Check a backed-up step is all there and, only then, write its manifest."""
    check_in_step(req["step"], req["files"])
    opened = open_area({**req, "area": "backup"})
    if opened is None:
        return {"ok": False, "missing": [f["path"] for f in req["files"]], "mismatched": [],
                "pruned": []}
    root_fd, _ = opened
    try:
        step_fd = open_step(req, root_fd)
        try:
            missing, bad = check_files(step_fd, req["files"], rehash=False)
            if missing or bad:
                return {"ok": False, "missing": missing, "mismatched": bad, "pruned": []}
            _write_manifest(step_fd, {"source": req["source"], "step": req["step"],
                                      "files": req["files"], "committed_at": time.time()})
        finally:
            os.close(step_fd)
        src_fd = safefs.open_dir(req["source"], root_fd)
        try:
            pruned = _prune(src_fd, req["step"], int(req.get("keep", 2)))
        finally:
            os.close(src_fd)
    finally:
        os.close(root_fd)
    return {"ok": True, "missing": [], "mismatched": [], "pruned": pruned}


def _committed(src_fd: int, name: str) -> bool:
    try:
        fd = safefs.open_dir(name, src_fd)
    except OSError:
        return False
    try:
        return _read_manifest(fd) is not None
    finally:
        os.close(fd)


def _prune(src_fd: int, current: str, keep: int) -> list[str]:
    """Drop committed steps beyond the newest ``keep`` and partial ones older than ``current``."""
    names = sorted((n for n in os.listdir(src_fd) if not n.startswith(".")
                    and stat.S_ISDIR(os.lstat(n, dir_fd=src_fd).st_mode)),
                   key=_natural, reverse=True)
    committed = [n for n in names if _committed(src_fd, n)]
    doomed = set(committed[keep:])
    doomed.update(n for n in names if n not in committed and _natural(n) < _natural(current))
    for name in sorted(doomed):
        safefs.remove_tree(src_fd, name)
    return sorted(doomed)


def verify(req: dict[str, Any]) -> dict[str, Any]:
    """Re-hash a committed backup step against its manifest."""
    opened = open_area(req)
    if opened is None:
        return {"ok": False, "committed": False, "missing": [], "mismatched": []}
    root_fd, _ = opened
    try:
        step_fd = open_step(req, root_fd)
        try:
            manifest = _read_manifest(step_fd)
            if manifest is None:
                return {"ok": False, "committed": False, "missing": [], "mismatched": []}
            missing, bad = check_files(step_fd, manifest["files"])
        finally:
            os.close(step_fd)
    finally:
        os.close(root_fd)
    return {"ok": not missing and not bad, "committed": True, "missing": missing,
            "mismatched": bad, "files": manifest["files"]}


# -- dispatch ---------------------------------------------------------------------------


def batch(req: dict[str, Any]) -> dict[str, Any]:
    """Several requests in one run: ``items`` [{key, op, ...}] → ``results`` {key: document}.

    One item's failure is reported as its ``probe_error`` (or ``refused``) and does
    not stop the others.
    """
    results: dict[str, Any] = {}
    for item in req.get("items", []):
        results[str(item.get("key"))] = handle(item)
    return {"results": results}


OPS = {"scan": scan, "scan_backup": scan_backup, "prepare": prepare, "commit": commit,
       "verify": verify}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Dispatch on ``op``; a safety refusal is ``{"refused": why}``, other failures raise."""
    op = request.get("op")
    if op == "batch":
        return batch(request)
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (expected one of {', '.join(sorted(OPS))})")
    try:
        return OPS[op](request)
    except REFUSALS as exc:
        return {"refused": why_refused(exc)}
    except Exception as exc:
        if request.get("key") is None:
            raise
        return {"probe_error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    serve(handle)
