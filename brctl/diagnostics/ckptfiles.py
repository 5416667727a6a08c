"""Probe: checkpoint shard files on this node — list, checksum, commit, restore.

Node-side, standard library only (Python >= 3.9). One request ``op`` per run:

- ``scan``: the steps under ``dir`` matching ``glob`` (newest first, natural order);
  the first ``hash_steps`` eligible ones (with ``marker`` when given) are hashed.
- ``scan_backup``: the backed-up steps of one source under ``root``: whether each
  is committed (a manifest, written last, says so) and, for resuming, the sha256 of
  every file already there (``deep``: re-hash committed steps too, to catch rot).
- ``prepare``: create directories (sftp does not create parents), after removing
  ``clean`` ones (a restore's stale staging area).
- ``commit``: re-hash a backed-up step's files; when every checksum matches, write
  the manifest atomically (temp, fsync, rename) and prune older steps beyond ``keep``.
- ``verify``: re-hash a committed backup step against its manifest.
- ``finish_restore``: check a staged restore, then rename it into place.

Paths in requests are absolute; file paths inside a step are relative and are
refused if they escape it (``..``, absolute).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from typing import Any

from brctl.diagnostics.protocol import serve

MANIFEST = ".brctl-manifest.json"
STAGING = ".brctl-restore"
_CHUNK = 1 << 20  # hash in 1 MiB reads: bounded memory for any shard size


def resolve(path: str) -> str:
    """``~`` and ``$VARS`` expanded on the node (e.g. ``dir: $LOCAL_SSD/ckpt``), made absolute."""
    return os.path.abspath(os.path.expanduser(os.path.expandvars(path)))


def _natural(name: str) -> list[Any]:
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t]


def sha256_file(path: str) -> str:
    """The file's sha256, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(_CHUNK)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _safe_rel(rel: str) -> str:
    norm = os.path.normpath(rel)
    if os.path.isabs(rel) or norm == ".." or norm.startswith("../") or norm == ".":
        raise ValueError(f"path {rel!r} escapes its step")
    return norm


def _files_of(base: str, entry: str) -> list[str]:
    """Regular files of one step (a file or a directory tree), relative to ``base``."""
    top = os.path.join(base, entry)
    if os.path.isfile(top) and not os.path.islink(top):
        return [entry]
    out = []
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if name == MANIFEST or os.path.islink(path) or not os.path.isfile(path):
                continue
            out.append(os.path.relpath(path, base))
    return out


def _describe(base: str, rels: list[str]) -> list[dict[str, Any]]:
    return [{"path": rel, "size": os.path.getsize(os.path.join(base, rel)),
             "sha256": sha256_file(os.path.join(base, rel))} for rel in rels]


def scan(req: dict[str, Any]) -> dict[str, Any]:
    """The node's own steps, newest first; the newest ``hash_steps`` eligible ones hashed."""
    base, pattern, marker = resolve(req["dir"]), req.get("glob", "*"), req.get("marker")
    want = int(req.get("hash_steps", 1))
    if not os.path.isdir(base):
        return {"dir": base, "exists": False, "steps": []}
    names = sorted((n for n in os.listdir(base) if fnmatch.fnmatchcase(n, pattern)
                    and not n.startswith(".")), key=_natural, reverse=True)
    steps = []
    for name in names:
        eligible = not marker or os.path.isfile(os.path.join(base, name, marker))
        step: dict[str, Any] = {"name": name, "eligible": eligible}
        if eligible and want > 0:
            step["files"] = _describe(base, _files_of(base, name))
            want -= 1
        steps.append(step)
    return {"dir": base, "exists": True, "steps": steps}


def _read_manifest(step_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(step_dir, MANIFEST)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def scan_backup(req: dict[str, Any]) -> dict[str, Any]:
    """Backed-up steps of one source: committed or partial, with present files' checksums."""
    root, deep = resolve(req["root"]), bool(req.get("deep", True))
    only = req.get("step")
    if not os.path.isdir(root):
        return {"root": root, "steps": []}
    steps = []
    for name in sorted(os.listdir(root), key=_natural, reverse=True):
        step_dir = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(step_dir) or (only and name != only):
            continue
        manifest = _read_manifest(step_dir)
        entry: dict[str, Any] = {"name": name, "committed": manifest is not None}
        if manifest is not None:
            entry["manifest"] = manifest["files"]
            entry["committed_at"] = manifest.get("committed_at")
        if manifest is None or deep:
            entry["present"] = {d["path"]: d["sha256"]
                                for d in _describe(step_dir, _files_of(step_dir, ""))}
        steps.append(entry)
    return {"root": root, "steps": steps}


def prepare(req: dict[str, Any]) -> dict[str, Any]:
    """Create directories (and drop a stale manifest so a step being rewritten is partial)."""
    for path in req.get("clean", []):
        shutil.rmtree(resolve(path), ignore_errors=True)  # leftovers of an earlier attempt
    resolved = {}
    for path in req.get("dirs", []):
        resolved[path] = resolve(path)
        os.makedirs(resolved[path], exist_ok=True)
    for step_dir in req.get("uncommit", []):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(resolve(step_dir), MANIFEST))
    return {"ok": True, "resolved": resolved}


def _check(base: str, files: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    missing, bad = [], []
    for f in files:
        path = os.path.join(base, _safe_rel(f["path"]))
        if not os.path.isfile(path):
            missing.append(f["path"])
        elif os.path.getsize(path) != f["size"] or sha256_file(path) != f["sha256"]:
            bad.append(f["path"])
    return missing, bad


def _write_json_atomic(path: str, doc: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".partial-")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a crash, not just the bytes
    finally:
        os.close(dfd)


def commit(req: dict[str, Any]) -> dict[str, Any]:
    """Verify a backed-up step and, only if every file matches, write its manifest."""
    root, step, files = resolve(req["root"]), req["step"], req["files"]
    step_dir = os.path.join(root, step)
    missing, bad = _check(step_dir, files)
    if missing or bad:
        return {"ok": False, "missing": missing, "mismatched": bad, "pruned": []}
    _write_json_atomic(os.path.join(step_dir, MANIFEST), {
        "source": req.get("source"), "step": step, "files": files,
        "committed_at": time.time(),
    })
    return {"ok": True, "missing": [], "mismatched": [], "pruned": _prune(root, step,
                                                                           int(req.get("keep", 2)))}


def _prune(root: str, current: str, keep: int) -> list[str]:
    """Drop committed steps beyond the newest ``keep`` and partial ones older than ``current``."""
    names = sorted((n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))
                    and not n.startswith(".")), key=_natural, reverse=True)
    committed = [n for n in names if _read_manifest(os.path.join(root, n)) is not None]
    doomed = set(committed[keep:])
    doomed.update(n for n in names if n not in committed and _natural(n) < _natural(current))
    for name in sorted(doomed):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return sorted(doomed)


def verify(req: dict[str, Any]) -> dict[str, Any]:
    """Re-hash a committed backup step against its manifest."""
    step_dir = os.path.join(resolve(req["root"]), req["step"])
    manifest = _read_manifest(step_dir)
    if manifest is None:
        return {"ok": False, "committed": False, "missing": [], "mismatched": []}
    missing, bad = _check(step_dir, manifest["files"])
    return {"ok": not missing and not bad, "committed": True, "missing": missing,
            "mismatched": bad, "files": manifest["files"]}


def finish_restore(req: dict[str, Any]) -> dict[str, Any]:
    """Check the staged files, then rename the step into ``dir`` (an old copy is kept aside)."""
    base, step, files = resolve(req["dir"]), req["step"], req["files"]
    staging = os.path.join(base, STAGING, step)
    missing, bad = _check(staging, files)
    if missing or bad:
        return {"ok": False, "missing": missing, "mismatched": bad}
    final = os.path.join(base, step)
    moved_aside = None
    if os.path.lexists(final):
        moved_aside = os.path.join(base, STAGING, f"replaced-{step}-{int(time.time() * 1e3)}")
        os.rename(final, moved_aside)
    os.rename(os.path.join(staging, step), final)
    shutil.rmtree(staging, ignore_errors=True)
    return {"ok": True, "missing": [], "mismatched": [], "path": final, "moved_aside": moved_aside}


def batch(req: dict[str, Any]) -> dict[str, Any]:
    """Several requests in one run: ``items`` [{key, op, ...}] → ``results`` {key: document}.

    One item's failure is reported as its ``probe_error`` and does not stop the others.
    """
    results: dict[str, Any] = {}
    for item in req.get("items", []):
        try:
            results[str(item["key"])] = OPS[item["op"]](item)
        except Exception as exc:  # per item, like serve() does per probe
            results[str(item.get("key"))] = {"probe_error": f"{type(exc).__name__}: {exc}"}
    return {"results": results}


OPS = {"scan": scan, "scan_backup": scan_backup, "prepare": prepare, "commit": commit,
       "verify": verify, "finish_restore": finish_restore}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Dispatch on ``op``."""
    op = request.get("op")
    if op == "batch":
        return batch(request)
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (expected one of {', '.join(sorted(OPS))})")
    return OPS[op](request)


if __name__ == "__main__":
    serve(handle)
