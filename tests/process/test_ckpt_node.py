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
import subprocess
from collections.abc import Iterator
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


def _stage(ckpt: Path, **req: object) -> dict[str, object]:
    """A fresh staging dir: the fields later requests on it carry (name and identity)."""
    doc = ckptmove.handle({"op": "stage", "dir": str(ckpt), **req})
    return {"staging": doc["staging"], "staging_id": doc["staging_id"]}


def _receive(req: dict[str, object], data: bytes) -> dict[str, object]:
    out = io.BytesIO()
    ckptmove.main([json.dumps(req)], io.BytesIO(data), out)
    return dict(json.loads(out.getvalue()))


def test_receive_refuses_an_escaping_name_before_writing_anything(ckpt: Path) -> None:
    staged = _stage(ckpt)
    before = sorted(p.name for p in ckpt.parent.rglob("*"))
    doc = _receive({"op": "receive", "area": "staging", "dir": str(ckpt), **staged, "step": "step_1",
                    "files": [_entry("step_1/ok.pt", b"a"), _entry("step_1/../../x", b"b")]}, b"ab")
    assert "'step_1/../../x'" in str(doc["refused"])
    assert sorted(p.name for p in ckpt.parent.rglob("*")) == before


def test_receive_lands_only_files_whose_bytes_match(ckpt: Path) -> None:
    staged = _stage(ckpt)
    staging = staged["staging"]
    req = {"op": "receive", "area": "staging", "dir": str(ckpt), **staged, "step": "step_1",
           "files": [_entry("step_1/a.pt", b"good"), _entry("step_1/b.pt", b"want"),
                     _entry("step_1/c.pt", b"never sent")]}
    doc = _receive(req, b"good" + b"evil")  # b.pt's bytes are wrong, c.pt's never come
    assert (doc["written"], doc["mismatched"], doc["missing"]) == (1, ["step_1/b.pt"], ["step_1/c.pt"])
    assert sorted(p.name for p in (ckpt / staging / "step_1").iterdir()) == ["a.pt"]  # no temp left


def test_a_staging_dir_that_is_not_brctls_is_not_used(ckpt: Path) -> None:
    staged = _stage(ckpt)
    staging = str(staged["staging"])
    (ckpt / staging).rename(ckpt / "moved")
    (ckpt / staging).mkdir(mode=0o700)
    os.chown(ckpt / staging, NOBODY, NOBODY)  # the job's own dir under brctl's name
    doc = _receive({"op": "receive", "area": "staging", "dir": str(ckpt), **staged, "step": "step_1",
                    "files": [_entry("step_1/a.pt", b"x")]}, b"x")
    assert "was replaced (owner uid 65534" in str(doc["refused"])
    assert not list((ckpt / staging).iterdir())
    # The next stage removes brctl's own stale dirs (ours, 0700), never the job's,
    # nor a root-owned dir of other modes that the job renamed there.
    (ckpt / ".brctl-restore-stale").mkdir(mode=0o700)
    (ckpt / ".brctl-restore-renamed").mkdir(mode=0o755)
    fresh = str(_stage(ckpt)["staging"])
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
    staged = _stage(ckpt)
    staging = str(staged["staging"])
    entry = {**_entry("step_1/a.pt", b"new"), "mode": 0o4755}
    req = {"dir": str(ckpt), **staged, "step": "step_1", "files": [entry]}
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
    os.chown(ckpt / "step_4", NOBODY, NOBODY)  # the job made it
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


# -- the audit's follow-ups (issue 12): R1-R9 ---------------------------------------------


@pytest.fixture
def secret(trusted_tmp: Path) -> Path:
    """A root-only file on the checkpoints' filesystem (a hard link needs one filesystem)."""
    path = trusted_tmp / "secret"
    path.write_bytes(b"root only")
    path.chmod(0o600)
    return path


def _hashed(doc: dict[str, object]) -> list[str]:
    return [f["path"] for s in doc["steps"] for f in s.get("files", [])]  # type: ignore[attr-defined]


def _skipped(doc: dict[str, object]) -> dict[str, str]:
    out = dict(doc["skipped"])  # type: ignore[call-overload]
    for s in doc.get("steps", []):  # type: ignore[attr-defined]
        out.update(dict(s.get("skipped", [])))
    return out


def test_scan_never_hashes_a_hard_link_in_a_root_ckpt_dir_the_jobs_group_can_write(
        ckpt: Path, secret: Path) -> None:
    """R1: a root-owned 0775 ckpt.dir (the job's group writes it). The file is root's and
    so is the directory, but the job may have made that link: neither the one-file step
    nor the file inside a step is hashed (it would be restored to the job elsewhere)."""
    ckpt.chmod(0o775)
    os.link(secret, ckpt / "step_5")
    (ckpt / "step_4").mkdir()
    (ckpt / "step_4").chmod(0o775)
    os.link(secret, ckpt / "step_4" / "a.pt")
    (ckpt / "step_4" / "b.pt").write_bytes(b"the job's")
    os.chown(ckpt / "step_4" / "b.pt", NOBODY, NOBODY)
    doc = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*", "hash_steps": 2})
    assert _hashed(doc) == ["step_4/b.pt"]
    skipped = _skipped(doc)
    assert sorted(skipped) == ["step_4/a.pt", "step_5"]
    assert all("with 3 links in a root directory others can write (mode 0775)" in why
               for why in skipped.values()), skipped


def test_a_root_ckpt_dir_the_jobs_group_can_write_gives_up_only_the_job_users_private_files(
        ckpt: Path) -> None:
    """A shared 0775 root ckpt.dir: a colleague's private shard (theirs, or a link the job
    kept once the original went) would be restored to the job elsewhere: never hashed or
    sent. The job user's own private shard is its; without job.user, no one's is."""
    ckpt.chmod(0o775)
    (ckpt / "step_4").mkdir()
    (ckpt / "step_4").chmod(0o775)
    for name, uid, mode in (("mine.pt", NOBODY, 0o600), ("theirs.pt", 1234, 0o600),
                            ("open.pt", 1234, 0o644)):
        (ckpt / "step_4" / name).write_bytes(name.encode())
        os.chown(ckpt / "step_4" / name, uid, uid)
        (ckpt / "step_4" / name).chmod(mode)
    req = {"op": "scan", "dir": str(ckpt), "glob": "step_*"}
    doc = ckptfiles.handle({**req, "job_user": "nobody"})
    assert _hashed(doc) == ["step_4/mine.pt", "step_4/open.pt"]
    assert _skipped(doc) == {"step_4/theirs.pt": (
        "a file of uid 1234 others cannot read (mode 0600) in a root directory others can "
        "write (mode 0775), not the job user's; not read")}
    alone = ckptfiles.handle(req)
    assert _hashed(alone) == ["step_4/open.pt"]
    assert "a file of nobody (uid 65534) others cannot read" in _skipped(alone)["step_4/mine.pt"]
    theirs = [_entry("step_4/theirs.pt", b"theirs.pt")]
    assert _send(ckpt, theirs, job_user="nobody") == (ckptmove.REFUSED_EXIT, b"")
    mine = [_entry("step_4/mine.pt", b"mine.pt")]
    assert _send(ckpt, mine, job_user="nobody") == (0, b"mine.pt")
    assert ckptfiles.handle({**req, "job_user": "no-such-user-here"}) == {
        "refused": "job.user 'no-such-user-here': no such user on this machine"}


def test_scan_never_hashes_a_root_only_file_left_in_the_jobs_dir(ckpt: Path, secret: Path) -> None:
    """A hard link kept after the original name went (log rotation, /etc/shadow- replaced)
    has one link: a root file in the job's directory that others cannot read is not read."""
    os.chown(ckpt, NOBODY, NOBODY)
    (ckpt / "step_1").mkdir()
    os.chown(ckpt / "step_1", NOBODY, NOBODY)
    os.link(secret, ckpt / "step_1" / "a.pt")
    secret.unlink()
    doc = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*"})
    assert _hashed(doc) == []
    assert "a root file others cannot read (mode 0600)" in _skipped(doc)["step_1/a.pt"]


def _send(ckpt: Path, files: object, **req: object) -> tuple[int, bytes]:
    out = io.BytesIO()
    code = ckptmove.main([json.dumps({"op": "send", "area": "ckpt", "dir": str(ckpt),
                                      "files": files, **req})], io.BytesIO(), out)
    return code, out.getvalue()


def test_send_stops_at_a_hard_link_or_another_file_swapped_in_after_the_scan(
        ckpt: Path, secret: Path) -> None:
    """R4: send judges the fd it sends from again. A hard link to a root file of the same
    size swapped in after the scan is refused (exit 4); a file replaced since (another
    inode, same size) is not the one hashed: stopped (exit 1). Nothing is written out."""
    os.chown(ckpt, NOBODY, NOBODY)
    (ckpt / "step_1").mkdir()
    os.chown(ckpt / "step_1", NOBODY, NOBODY)
    shard = ckpt / "step_1" / "a.pt"
    shard.write_bytes(b"same size")  # as long as the secret
    os.chown(shard, NOBODY, NOBODY)
    files = ckptfiles.handle({"op": "scan", "dir": str(ckpt), "glob": "step_*"})["steps"][0]["files"]
    assert files[0]["ino"] == shard.stat().st_ino
    assert _send(ckpt, files, step="step_1") == (0, b"same size")
    (ckpt / "step_1" / "new").write_bytes(b"SAME SIZE")  # made while a.pt lives: another inode
    os.chown(ckpt / "step_1" / "new", NOBODY, NOBODY)
    shard.unlink()
    os.link(secret, shard)
    assert _send(ckpt, files, step="step_1") == (ckptmove.REFUSED_EXIT, b"")
    (ckpt / "step_1" / "new").rename(shard)
    assert _send(ckpt, files, step="step_1") == (1, b"")
    # and a path outside the request's step is refused before anything is opened
    assert _send(ckpt, files, step="step_2") == (ckptmove.REFUSED_EXIT, b"")


def _legacy_step(base: Path, step: str, files: dict[str, bytes]) -> list[dict[str, object]]:
    """A committed step under the old default backup root, as older brctl wrote it."""
    entries = []
    for rel, data in files.items():
        path = base / step / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries.append({**_entry(rel, data), "mode": 0o644})
    (base / step / ckptfiles.MANIFEST).write_text(json.dumps(
        {"source": "n1", "step": step, "files": entries, "committed_at": 1.0}))
    return entries


def test_scan_backup_of_the_legacy_area_reports_what_the_job_planted(
        ckpt: Path, secret: Path, trusted_tmp: Path) -> None:
    """R3: the old default backup root lives in the job's directory: the job may have
    replaced it. Its links and foreign files are skipped and said, never hashed."""
    os.chown(ckpt, NOBODY, NOBODY)
    legacy = ckpt / ckptfiles.LEGACY_BACKUP / "n1"
    _legacy_step(legacy, "step_2", {"step_2/a.pt": b"shard"})
    os.link(secret, legacy / "step_2" / "step_2" / "b.pt")
    (legacy / "step_2" / "step_2" / "c.pt").symlink_to(secret)
    elsewhere = trusted_tmp / "elsewhere"
    _legacy_step(elsewhere, "step_3", {"step_3/x.pt": b"x"})
    (legacy / "step_3").symlink_to(elsewhere / "step_3")
    for d in (ckpt / ckptfiles.LEGACY_BACKUP, legacy, legacy / "step_2", legacy / "step_2" / "step_2"):
        os.chown(d, NOBODY, NOBODY)  # the job's tree now
    doc = ckptfiles.handle({"op": "scan_backup", "area": "legacy", "dir": str(ckpt), "source": "n1"})
    assert [s["name"] for s in doc["steps"]] == ["step_2"]
    assert doc["steps"][0]["present"] == {"step_2/a.pt": hashlib.sha256(b"shard").hexdigest()}
    skipped = dict(doc["skipped"])
    assert sorted(skipped) == ["step_2/step_2/b.pt", "step_2/step_2/c.pt", "step_3"]
    assert "a root file with 2 links in a directory of nobody" in skipped["step_2/step_2/b.pt"]
    assert skipped["step_2/step_2/c.pt"] == "symlink; not followed"
    assert "is a symlink; not followed" in skipped["step_3"]
    # verify re-hashes through the same rule: the planted link fails the whole step
    (legacy / "step_2" / "step_2" / "c.pt").unlink()
    manifest = json.loads((legacy / "step_2" / ckptfiles.MANIFEST).read_text())
    manifest["files"].append({**_entry("step_2/b.pt", b"root only"), "mode": 0o644})
    (legacy / "step_2" / ckptfiles.MANIFEST).write_text(json.dumps(manifest))
    bad = ckptfiles.handle({"op": "verify", "area": "legacy", "dir": str(ckpt), "source": "n1",
                            "step": "step_2"})
    assert "'step_2/b.pt' is a root file with 2 links" in bad["refused"]


def test_stage_makes_a_missing_ckpt_dir_for_job_user_and_finish_hands_it_the_shards(
        trusted_tmp: Path) -> None:
    """R2: a fresh standby has no ckpt.dir. With job.user (job_user in the request) it
    is made for that user, and the restored step is the job's; the directories made
    above it stay root's (the backup root beside it must pass StrictModes)."""
    ckpt = trusted_tmp / "local" / "ckpt"
    staged = _stage(ckpt, job_user="nobody")
    assert (ckpt.stat().st_uid, ckpt.stat().st_mode & 0o777) == (NOBODY, 0o755)
    assert ckpt.parent.stat().st_uid == 0
    req = {"dir": str(ckpt), **staged, "step": "step_1", "files": [_entry("step_1/a.pt", b"x")],
           "job_user": "nobody"}
    assert _receive({**req, "op": "receive", "area": "staging"}, b"x")["written"] == 1
    doc = ckptmove.handle({**req, "op": "finish_restore"})
    assert doc["ok"] and doc["owner_uid"] == NOBODY
    for p in (ckpt / "step_1", ckpt / "step_1" / "a.pt"):
        assert p.stat().st_uid == NOBODY
    unknown = ckptmove.handle({"op": "stage", "dir": str(trusted_tmp / "other"),
                               "job_user": "no-such-user-here"})
    assert "no such user" in unknown["refused"] and not (trusted_tmp / "other").exists()


def test_without_job_user_a_fresh_ckpt_dir_is_its_parents_and_finish_says_whose(
        trusted_tmp: Path) -> None:
    ckpt = trusted_tmp / "local" / "ckpt"
    staged = _stage(ckpt)
    assert ckpt.stat().st_uid == 0
    req = {"dir": str(ckpt), **staged, "step": "step_1", "files": [_entry("step_1/a.pt", b"x")]}
    _receive({**req, "op": "receive", "area": "staging"}, b"x")
    doc = ckptmove.handle({**req, "op": "finish_restore"})
    assert doc["ok"] and doc["owner_uid"] == 0  # the controller warns: set job.user


def test_every_request_on_a_staging_dir_needs_the_identity_stage_gave(ckpt: Path) -> None:
    """R7: the same name is not enough: a root-owned 0700 dir put under brctl's name
    (renamed in by someone who can write ckpt.dir) is neither written to nor removed."""
    staged = _stage(ckpt)
    name = str(staged["staging"])
    assert staged["staging_id"] == [(ckpt / name).stat().st_dev, (ckpt / name).stat().st_ino]
    base = {"dir": str(ckpt), "step": "step_1", "files": [_entry("step_1/a.pt", b"x")]}
    for ident in (None, "x", [1], [-1, 2], [True, 1]):
        req = {**base, "op": "receive", "area": "staging", "staging": name, "staging_id": ident}
        assert "staging_id" in str(_receive(req, b"x")["refused"])
    (ckpt / name).rename(ckpt / "moved")
    (ckpt / name).mkdir(mode=0o700)  # same name, owner and mode; another directory
    (ckpt / name / "keep").write_text("not brctl's")
    for op in ("receive", "finish_restore", "drop"):
        req = {**base, **staged, "op": op, "area": "staging"}
        doc = _receive(req, b"x") if op == "receive" else ckptmove.handle(req)
        assert "another inode" in str(doc["refused"]), (op, doc)
    assert (ckpt / name / "keep").read_text() == "not brctl's"
    (ckpt / name / "keep").unlink()
    (ckpt / name).rmdir()
    (ckpt / "moved").rename(ckpt / name)
    assert ckptmove.handle({"dir": str(ckpt), **staged, "op": "drop"}) == {"ok": True}
    assert not (ckpt / name).exists()


@pytest.mark.parametrize("op", ["receive", "finish_restore"])
def test_staged_paths_must_lie_inside_their_step(ckpt: Path, op: str) -> None:
    staged = _stage(ckpt)
    req = {"dir": str(ckpt), **staged, "op": op, "area": "staging", "step": "step_1",
           "files": [_entry("step_1/a.pt", b"x"), _entry("step_2/b.pt", b"y")]}
    doc = _receive(req, b"xy") if op == "receive" else ckptmove.handle(req)
    assert "'step_2/b.pt' is not inside step 'step_1'" in str(doc["refused"])
    assert not list((ckpt / str(staged["staging"])).iterdir())


@pytest.mark.parametrize("op", ["prepare", "commit", "verify"])
def test_backup_ops_refuse_a_step_that_is_not_one_component(ckpt: Path, trusted_tmp: Path,
                                                           op: str) -> None:
    """R9: the node refuses a step name from the request before any mkdir/open/write."""
    backup = trusted_tmp / "backup"
    assert ckptfiles.handle({"op": "prepare", "dir": str(ckpt), "backup_dir": str(backup),
                             "source": "n1", "step": "step_1"})["ok"]
    before = sorted(str(p) for p in trusted_tmp.rglob("*"))
    doc = ckptfiles.handle({"op": op, "dir": str(ckpt), "backup_dir": str(backup), "area": "backup",
                            "source": "n1", "step": "../x", "files": [_entry("../x/a.pt", b"a")]})
    assert "'../x'" in doc["refused"], doc
    assert sorted(str(p) for p in trusted_tmp.rglob("*")) == before


@pytest.fixture
def mounted_ckpt(ckpt: Path) -> Iterator[Path]:
    """``ckpt`` as a mount point of its own (a tmpfs), as a local NVMe often is."""
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ckpt)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield ckpt
    finally:
        subprocess.run(["umount", str(ckpt)], check=False)


def test_the_default_backup_root_is_refused_beside_a_mounted_ckpt_dir(
        mounted_ckpt: Path, trusted_tmp: Path) -> None:
    """R6: <ckpt.dir>.brctl-backup is meant to be on ckpt.dir's filesystem; beside a mount
    point it would put checkpoint-sized copies on the parent's (often the root) disk."""
    req = {"op": "prepare", "dir": str(mounted_ckpt), "source": "n1", "step": "step_1"}
    doc = ckptfiles.handle(req)
    assert f"ckpt.dir {mounted_ckpt} is a mount point" in doc["refused"]
    assert "ckpt.backup_dir" in doc["refused"]
    assert not Path(f"{mounted_ckpt}.brctl-backup").exists()
    chosen = ckptfiles.handle({**req, "backup_dir": str(trusted_tmp / "elsewhere")})
    assert chosen["ok"], chosen
