"""The node side of ``brctl ckpt`` (ckptfiles, ckptmove) on real files, called directly.

What a hostile request or a job user's tree can and cannot make it do: names are
refused before any write, a stream that lies about its bytes never lands, staging
dirs that are not brctl's are neither used nor removed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from brctl.diagnostics import ckptfiles, ckptmove

NOBODY = 65534


def _entry(path: str, data: bytes) -> dict[str, object]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "mode": 0o640}


@pytest.fixture
def ckpt(trusted_tmp: Path) -> Path:
    d = trusted_tmp / "ckpt"
    d.mkdir()
    return d


def _stage(ckpt: Path) -> str:
    return str(ckptmove.handle({"op": "stage", "dir": str(ckpt)})["staging"])


def _receive(req: dict[str, object], data: bytes) -> dict[str, object]:
    out = io.BytesIO()
    ckptmove.main([json.dumps(req)], io.BytesIO(data), out)
    return dict(json.loads(out.getvalue()))


def test_receive_refuses_an_escaping_name_before_writing_anything(ckpt: Path) -> None:
    staging = _stage(ckpt)
    before = sorted(p.name for p in ckpt.parent.rglob("*"))
    doc = _receive({"op": "receive", "area": "staging", "dir": str(ckpt), "staging": staging,
                    "files": [_entry("step_1/ok.pt", b"a"), _entry("step_1/../../x", b"b")]}, b"ab")
    assert "'step_1/../../x'" in str(doc["refused"])
    assert sorted(p.name for p in ckpt.parent.rglob("*")) == before


def test_receive_lands_only_files_whose_bytes_match(ckpt: Path) -> None:
    staging = _stage(ckpt)
    req = {"op": "receive", "area": "staging", "dir": str(ckpt), "staging": staging,
           "files": [_entry("step_1/a.pt", b"good"), _entry("step_1/b.pt", b"want"),
                     _entry("step_1/c.pt", b"never sent")]}
    doc = _receive(req, b"good" + b"evil")  # b.pt's bytes are wrong, c.pt's never come
    assert (doc["written"], doc["mismatched"], doc["missing"]) == (1, ["step_1/b.pt"], ["step_1/c.pt"])
    assert sorted(p.name for p in (ckpt / staging / "step_1").iterdir()) == ["a.pt"]  # no temp left


def test_a_staging_dir_that_is_not_brctls_is_not_used(ckpt: Path) -> None:
    staging = _stage(ckpt)
    (ckpt / staging).rename(ckpt / "moved")
    (ckpt / staging).mkdir(mode=0o700)
    os.chown(ckpt / staging, NOBODY, NOBODY)  # the job's own dir under brctl's name
    doc = _receive({"op": "receive", "area": "staging", "dir": str(ckpt), "staging": staging,
                    "files": [_entry("step_1/a.pt", b"x")]}, b"x")
    assert "was replaced (owner uid 65534" in str(doc["refused"])
    assert not list((ckpt / staging).iterdir())
    # The next stage removes brctl's own stale dirs (ours, 0700), never the job's,
    # nor a root-owned dir of other modes that the job renamed there.
    (ckpt / ".brctl-restore-stale").mkdir(mode=0o700)
    (ckpt / ".brctl-restore-renamed").mkdir(mode=0o755)
    fresh = _stage(ckpt)
    assert fresh != staging and (ckpt / staging).is_dir() and not (ckpt / ".brctl-restore-stale").exists()
    assert (ckpt / ".brctl-restore-renamed").is_dir()
    assert (ckpt / fresh).stat().st_mode & 0o777 == 0o700


def test_send_stops_at_a_symlink_swapped_in_after_the_scan(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "step_1").mkdir()
    (ckpt / "step_1" / "a.pt").write_bytes(b"shard")
    (tmp_path / "secret").write_bytes(b"root only")
    scan = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*"})
    files = scan["steps"][0]["files"]
    (ckpt / "step_1" / "a.pt").unlink()
    (ckpt / "step_1" / "a.pt").symlink_to(tmp_path / "secret")
    out = io.BytesIO()
    code = ckptmove.main([json.dumps({"op": "send", "area": "ckpt", "dir": str(ckpt),
                                      "files": files})], io.BytesIO(), out)
    assert code == ckptmove.REFUSED_EXIT and out.getvalue() == b""


def test_finish_restore_hands_the_step_to_the_dirs_owner_and_keeps_the_old_one(ckpt: Path) -> None:
    os.chown(ckpt, NOBODY, NOBODY)
    (ckpt / "step_1").mkdir()
    (ckpt / "step_1" / "old.pt").write_bytes(b"older")
    staging = _stage(ckpt)
    entry = {**_entry("step_1/a.pt", b"new"), "mode": 0o4755}
    req = {"dir": str(ckpt), "staging": staging, "files": [entry]}
    assert _receive({**req, "op": "receive", "area": "staging"}, b"new")["written"] == 1
    doc = ckptmove.handle({**req, "op": "finish_restore", "step": "step_1"})
    assert doc["ok"] and str(doc["moved_aside"]).startswith(str(ckpt / ".brctl-replaced-step_1-"))
    st = (ckpt / "step_1" / "a.pt").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (NOBODY, NOBODY, 0o644)
    assert not (ckpt / staging).exists()
    assert (Path(str(doc["moved_aside"])) / "old.pt").read_bytes() == b"older"


def test_scan_reports_what_it_skipped(ckpt: Path, tmp_path: Path) -> None:
    (ckpt / "step_2").mkdir()
    (ckpt / "step_2" / "a.pt").write_bytes(b"x")
    os.mkfifo(ckpt / "step_2" / "pipe")
    (ckpt / "step_9").symlink_to(tmp_path)
    doc = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*"})
    assert doc["skipped"] == [["step_9", "symlink; not followed"]]
    (step,) = doc["steps"]
    assert [f["path"] for f in step["files"]] == ["step_2/a.pt"]
    assert step["skipped"] == [["step_2/pipe", "FIFO"]]


def test_scan_never_hashes_a_hard_link_to_a_root_file_as_a_one_file_step(
        ckpt: Path, trusted_tmp: Path) -> None:
    """A step may be one file. A hard link the job made to a root-only file (possible where
    fs.protected_hardlinks is 0) must be skipped like one inside a step directory: hashed,
    it would be backed up and restored to the job's owner on another machine."""
    os.chown(ckpt, NOBODY, NOBODY)
    secret = trusted_tmp / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    os.link(secret, ckpt / "step_5")
    (ckpt / "step_4").mkdir()
    os.link(secret, ckpt / "step_4" / "a.pt")
    doc = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*", "hash_steps": 2})
    hashed = [f["path"] for s in doc["steps"] for f in s.get("files", [])]
    assert hashed == []
    skipped = [p for p, _ in doc["skipped"]] + [p for s in doc["steps"] for p, _ in s.get("skipped", [])]
    assert sorted(skipped) == ["step_4/a.pt", "step_5"]


def test_scan_survives_a_file_rotated_away_between_listing_and_hashing(
        ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job deletes shards while brctl scans: a step losing a file before it is hashed
    is skipped as incomplete (the next one is hashed instead), not a failed scan."""
    for step in ("step_1", "step_2"):
        (ckpt / step).mkdir()
        (ckpt / step / "a.pt").write_bytes(b"a")
        (ckpt / step / "b.pt").write_bytes(b"b")
    listed = ckptfiles.safefs.walk_files

    def walk_then_rotate(*args: object, **kw: object) -> object:
        out = listed(*args, **kw)  # type: ignore[arg-type]
        if (ckpt / "step_2" / "b.pt").exists():
            (ckpt / "step_2" / "b.pt").unlink()  # the job's rotation, right after the listing
        return out

    monkeypatch.setattr(ckptfiles.safefs, "walk_files", walk_then_rotate)
    doc = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*"})
    assert [p for p, _ in doc["skipped"]] == ["step_2"]
    hashed = [f["path"] for s in doc["steps"] for f in s.get("files", [])]
    assert hashed == ["step_1/a.pt", "step_1/b.pt"]


def test_an_unsafe_backup_root_is_refused_with_a_suggestion(ckpt: Path) -> None:
    os.chown(ckpt, NOBODY, NOBODY)
    doc = ckptfiles.handle({"op": "prepare", "dir": str(ckpt), "source": "n1", "step": "step_1",
                            "backup_dir": str(ckpt / "backups")})
    assert f"{ckpt} is owned by" in doc["refused"] and "ckpt.backup_dir" in doc["refused"]
    assert not (ckpt / "backups").exists()
    ok = ckptfiles.handle({"op": "prepare", "dir": str(ckpt), "source": "n1", "step": "step_1"})
    root = Path(f"{ckpt}.brctl-backup")
    assert ok["ok"] and (root.stat().st_uid, root.stat().st_mode & 0o777) == (0, 0o700)
    bad = ckptfiles.handle({"op": "prepare", "dir": str(ckpt), "source": "..", "step": "step_1"})
    assert "'..'" in bad["refused"]
