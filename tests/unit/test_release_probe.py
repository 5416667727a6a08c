"""The node-side release probe on real files: staging, immutability, resume, checksum, switch."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from brctl.diagnostics import release
from brctl.operations.update.pack import pack_directory


def call(request: dict, data: bytes = b"", via_argv: bool = True) -> tuple[int, dict]:
    """(exit code, answer); a refusal (``isolate.refuse``'s mark) as ``{"refused": why}``."""
    out = io.StringIO()
    if via_argv:
        code = release.main([json.dumps(request)], io.BytesIO(data), out)
    else:
        code = release.main([], io.BytesIO(json.dumps(request).encode()), out)
    text = out.getvalue()
    if text.startswith(release.REFUSED_MARK + " "):
        return code, {"refused": json.loads(text[len(release.REFUSED_MARK) + 1:])}
    return code, json.loads(text)


@pytest.fixture
def artifact(tmp_path: Path) -> bytes:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_text("print('hello')\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    os.symlink("pkg/train.py", src / "link.py")
    return pack_directory(src)


def receive(root: Path, data: bytes, version="v1", offset=0, sha=None, size=None):
    req = {"action": "receive", "root": str(root), "version": version,
           "sha256": sha or hashlib.sha256(data).hexdigest(),
           "size": len(data) if size is None else size, "offset": offset}
    return call(req, data[offset:])


def test_stage_inspect_switch(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    code, doc = receive(root, artifact)
    assert code == 0 and doc["staged"] and not doc["already"] and doc["received"] == len(artifact)
    rel = root / "releases" / "v1"
    assert (rel / "pkg" / "train.py").read_text() == "print('hello')\n"
    assert os.access(rel / "run.sh", os.X_OK) and os.readlink(rel / "link.py") == "pkg/train.py"
    assert not list((root / "releases").glob(".staging-*"))
    assert not list((root / ".incoming").iterdir())  # partial and lock gone
    code, doc = call({"action": "inspect", "root": str(root)}, via_argv=False)
    assert doc["releases"] == {"v1": hashlib.sha256(artifact).hexdigest()}
    assert doc["current"] is None
    code, doc = call({"action": "switch", "root": str(root), "version": "v1"}, via_argv=False)
    assert code == 0 and doc == {"previous": None, "current": "v1", "schema": "brctl.probe/1"}
    assert os.readlink(root / "current") == "releases/v1"
    assert (root / "current" / "pkg" / "train.py").exists()


def test_staging_is_idempotent_and_releases_immutable(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    receive(root, artifact)
    code, doc = receive(root, artifact)
    assert code == 0 and doc["already"] and doc["received"] == len(artifact)  # drained
    other = artifact + b"\0" * 512
    code, doc = receive(root, other)
    assert code == 1 and "immutable" in doc["probe_error"]
    assert "push under a new version" in doc["probe_error"]


def test_corrupted_transfer_is_discarded_and_never_staged(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    bad = bytearray(artifact)
    bad[len(bad) // 2] ^= 0x01
    code, doc = receive(root, bytes(bad), sha=hashlib.sha256(artifact).hexdigest())
    assert code == 1 and "sha256 mismatch" in doc["probe_error"]
    assert not (root / "releases" / "v1").exists()
    assert not list((root / ".incoming").glob("*.partial"))


def test_cut_transfer_is_kept_and_resumed(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    sha = hashlib.sha256(artifact).hexdigest()
    half = len(artifact) // 2
    code, doc = call({"action": "receive", "root": str(root), "version": "v1", "sha256": sha,
                      "size": len(artifact), "offset": 0}, artifact[:half])
    assert code == 1 and "cut short" in doc["probe_error"]
    assert not (root / "releases" / "v1").exists()
    _, doc = call({"action": "inspect", "root": str(root)}, via_argv=False)
    assert doc["partial"] == {sha: half}
    code, doc = receive(root, artifact, offset=half)
    assert code == 0 and doc["received"] == len(artifact) - half
    assert (root / "releases" / "v1" / "pkg" / "train.py").exists()


def test_half_extracted_release_is_never_switched_to(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    (root / "releases" / ".staging-v1-123").mkdir(parents=True)
    (root / "releases" / "v0").mkdir()  # no marker: not a release
    _, doc = call({"action": "inspect", "root": str(root)}, via_argv=False)
    assert doc["releases"] == {} and sorted(doc["incomplete"]) == [".staging-v1-123", "v0"]
    code, doc = call({"action": "switch", "root": str(root), "version": "v0"}, via_argv=False)
    assert code == 1 and "not staged completely" in doc["probe_error"]
    code, doc = receive(root, artifact, version="v0")
    assert code == 1 and "not a brctl release" in doc["probe_error"]
    receive(root, artifact)  # leftovers of a cut extraction of v1 are cleaned
    assert not (root / "releases" / ".staging-v1-123").exists()


@pytest.mark.parametrize("name, kind, link", [
    ("../evil", tarfile.REGTYPE, ""),
    ("/abs", tarfile.REGTYPE, ""),
    ("ok/link", tarfile.SYMTYPE, "../../outside"),
    ("dev", tarfile.CHRTYPE, ""),
])
def test_hostile_archives_are_refused(tmp_path: Path, name: str, kind: bytes, link: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = link
        tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    code, doc = receive(tmp_path / "root", buf.getvalue())
    assert code == 1 and "artifact" in doc["probe_error"]
    assert not (tmp_path / "root" / "releases" / "v1").exists()
    assert not (tmp_path / "outside").exists() and not (tmp_path / "evil").exists()


def test_switch_refuses_a_real_directory_and_checks_sha(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    receive(root, artifact)
    code, doc = call({"action": "switch", "root": str(root), "version": "v1",
                      "sha256": "0" * 64}, via_argv=False)
    assert code == 1 and "expected 000000000000" in doc["probe_error"]
    (root / "current").mkdir()
    code, doc = call({"action": "switch", "root": str(root), "version": "v1"}, via_argv=False)
    assert code == 1 and "not a symlink" in doc["probe_error"]


def test_bad_requests(tmp_path: Path) -> None:
    for request, match in [({"action": "nope", "root": "/x"}, "unknown action"),
                           ({"action": "switch", "root": str(tmp_path), "version": "../x"},
                            "bad release version"),
                           ({"action": "inspect"}, "no update root"),
                           ({"action": "receive", "root": str(tmp_path), "version": "v1",
                             "sha256": "xyz", "size": 1}, "64 hex")]:
        code, doc = call(request, via_argv=False)
        assert code == 1 and match in doc["probe_error"], doc
    out = io.StringIO()
    assert release.main([], io.BytesIO(b"[1]"), out) == 1
    assert "JSON object" in json.loads(out.getvalue())["probe_error"]


def test_prune_keeps_the_list_and_current(tmp_path: Path, artifact: bytes) -> None:
    root = tmp_path / "root"
    for v, extra in (("v1", b""), ("v2", b"\0" * 512), ("v3", b"\0" * 1024)):
        receive(root, artifact + extra, version=v)
    call({"action": "switch", "root": str(root), "version": "v1"}, via_argv=False)
    code, doc = call({"action": "prune", "root": str(root), "keep": ["v3"]}, via_argv=False)
    assert code == 0 and doc["removed"] == ["v2"]  # v1 is current: never removed
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["v1", "v3"]


# The update root may sit in a tree the job user can write: nothing below it is followed.

@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A root-only directory the job user would love brctl to write into or read."""
    path = tmp_path / "canary"
    path.mkdir(mode=0o700)
    (path / "passwd").write_text("root:x:0:0\n")
    return path


def _snapshot(path: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(path)): (os.readlink(p) if p.is_symlink() else
                                       p.read_bytes() if p.is_file() else "dir")
            for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("plant, why", [
    ("releases", "not followed"),  # releases/ -> canary: the release would be staged there
    (".incoming", "not followed"),  # .incoming/ -> canary: the artifact would be written there
    ("partial", "not a plain file"),  # .incoming/<sha>.partial -> canary/passwd: truncated
    ("hardlink", "not a plain file"),  # .incoming/<sha>.partial hard-linked to canary/passwd
    ("lock", "not a plain file"),  # .incoming/<sha>.lock -> canary/passwd
])
def test_links_planted_in_the_update_root_are_never_followed(
        tmp_path: Path, artifact: bytes, canary: Path, plant: str, why: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    sha = hashlib.sha256(artifact).hexdigest()
    if plant in ("releases", ".incoming"):
        (root / plant).symlink_to(canary)
    else:
        (root / ".incoming").mkdir()
        name = f"{sha}.lock" if plant == "lock" else f"{sha}.partial"
        if plant == "hardlink":
            os.link(canary / "passwd", root / ".incoming" / name)
        else:
            (root / ".incoming" / name).symlink_to(canary / "passwd")
    before = _snapshot(canary)
    code, doc = receive(root, artifact)
    # refused, as the same plant in ckpt.dir is: the command exits 4, not 1
    assert code == release.REFUSED_EXIT and why in doc["refused"], doc
    assert _snapshot(canary) == before
    assert not (root / "releases" / "v1").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a link owned by the job user needs root")
def test_a_job_users_link_on_the_way_to_the_update_root_is_refused(
        tmp_path: Path, artifact: bytes, canary: Path) -> None:
    (tmp_path / "apps").symlink_to(canary)
    os.lchown(tmp_path / "apps", 65534, 65534)
    before = _snapshot(canary)
    code, doc = receive(tmp_path / "apps" / "train", artifact)
    assert code == release.REFUSED_EXIT and "apps is a symlink owned by" in doc["refused"], doc
    assert "uid 65534" in doc["refused"] and _snapshot(canary) == before


def test_an_operators_link_on_the_way_to_the_update_root_is_followed(
        tmp_path: Path, artifact: bytes) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "opt").symlink_to(tmp_path / "data")  # owned by root (or by us): /opt -> /data
    code, doc = receive(tmp_path / "opt" / "train", artifact)
    assert code == 0, doc
    assert (tmp_path / "data" / "train" / "releases" / "v1" / "pkg" / "train.py").is_file()


def test_a_symlinked_release_is_never_listed_switched_to_or_pruned_through(
        tmp_path: Path, artifact: bytes, canary: Path) -> None:
    root = tmp_path / "root"
    receive(root, artifact)
    forged = canary / "v2"
    forged.mkdir()
    (forged / release.MARKER).write_text(json.dumps({"version": "v2", "sha256": "f" * 64}))
    (root / "releases" / "v2").symlink_to(forged)  # the job's "release" of root's files
    (root / "releases" / "v1" / "pkg" / "escape").symlink_to(canary)  # pruning must not follow
    _, doc = call({"action": "inspect", "root": str(root)}, via_argv=False)
    assert doc["releases"] == {"v1": hashlib.sha256(artifact).hexdigest()}
    assert doc["incomplete"] == ["v2"]
    code, doc = call({"action": "switch", "root": str(root), "version": "v2"}, via_argv=False)
    assert code == 1 and "not staged completely" in doc["probe_error"]
    before = _snapshot(canary)
    receive(root, artifact + b"\0" * 512, version="v3")
    call({"action": "switch", "root": str(root), "version": "v3"}, via_argv=False)
    code, doc = call({"action": "prune", "root": str(root), "keep": []}, via_argv=False)
    assert code == 0 and doc["removed"] == ["v1"] and _snapshot(canary) == before


def test_a_symlink_under_the_version_being_received_is_refused(
        tmp_path: Path, artifact: bytes, canary: Path) -> None:
    """R10: <root>/releases/<version> planted as a link (to a forged release of root's
    files) is a refusal, as any plant in the update root is, and nothing is read there."""
    root = tmp_path / "root"
    (root / "releases").mkdir(parents=True)
    (root / "releases" / "v1").symlink_to(canary)
    before = _snapshot(canary)
    code, doc = receive(root, artifact)
    assert code == release.REFUSED_EXIT and "releases/v1 is a symlink; not followed" in doc["refused"]
    assert _snapshot(canary) == before
