"""Job-owned files brctl reads as root (log tails, evidence): no link followed, no root file
read through the job's directory. The job user is uid 65534 (nobody) owning the log dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brctl.diagnostics import evidence, logtail, safefs

JOB = 65534
SECRET = "root-only secret line\n"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the job user needs root")


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """A job log dir owned by the job user, one good log, and a root-only canary."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "shadow.log").write_text(SECRET * 3)
    (secret / "shadow.log").chmod(0o600)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text("step 1\nstep 2\n")
    if os.geteuid() == 0:
        os.chown(logs, JOB, JOB)
        os.chown(logs / "train.log", JOB, JOB)
    return logs


def _plant(logs: Path, kind: str) -> None:
    secret = logs.parent / "root-only"
    if kind == "symlinked log":
        (logs / "x.log").symlink_to(secret / "shadow.log")
    elif kind == "symlinked dir":
        (logs / "sub").symlink_to(secret)
        os.lchown(logs / "sub", JOB, JOB)  # the job's link (one of root's would be followed)
    elif kind == "hard link":
        os.link(secret / "shadow.log", logs / "x.log")
    elif kind == "fifo":
        os.mkfifo(logs / "x.log")


@pytest.mark.parametrize("kind, pattern, why", [
    ("symlinked log", "*.log", "is a symlink; not followed"),
    pytest.param("symlinked dir", "sub/*.log", "sub is a symlink owned by", marks=needs_root),
    pytest.param("hard link", "*.log", "is a root file with 2 links", marks=needs_root),
    ("fifo", "*.log", "is a FIFO"),
])
def test_logtail_reports_a_planted_file_and_never_ships_it(logs: Path, kind: str, pattern: str,
                                                           why: str) -> None:
    _plant(logs, kind)
    doc = logtail.collect({"paths": [str(logs / pattern)], "bytes": 4096, "files": 5})
    assert SECRET not in repr(doc)
    planted = [f for f in doc["files"] if not f["path"].endswith("train.log")]
    assert planted and all(why in f["error"] and "tail" not in f for f in planted), doc
    if pattern == "*.log":  # the job's real log is still read
        good = [f for f in doc["files"] if f["path"].endswith("train.log")]
        assert good[0]["tail"] == "step 1\nstep 2\n"


@pytest.mark.parametrize("kind", ["symlinked log", pytest.param("symlinked dir", marks=needs_root),
                                  pytest.param("hard link", marks=needs_root), "fifo"])
def test_evidence_reports_a_planted_file_and_never_ships_it(logs: Path, kind: str) -> None:
    _plant(logs, kind)
    found, errors = evidence._logs([str(logs / "*.log"), str(logs / "sub" / "*.log")], 50)
    assert SECRET not in repr(found) and list(found) == [str(logs / "train.log")]
    assert found[str(logs / "train.log")] == ["step 1", "step 2"]
    why = {"symlinked log": "is a symlink; not followed", "symlinked dir": "sub is a symlink owned by",
           "hard link": "is a root file with 2 links", "fifo": "is a FIFO"}[kind]
    assert len(errors) == 1 and why in errors[0], errors


@needs_root
def test_a_file_of_another_user_in_the_jobs_dir_is_not_read(logs: Path) -> None:
    other = logs / "other.log"
    other.write_text(SECRET)
    os.chown(other, 1234, 1234)
    with pytest.raises(OSError, match="owned by uid 1234, not by root or its directory's owner"):
        safefs.open_job_file(str(other))


@needs_root
def test_a_job_users_link_above_the_log_is_not_followed(tmp_path: Path, logs: Path) -> None:
    (tmp_path / "link").symlink_to(logs)
    os.lchown(tmp_path / "link", JOB, JOB)
    with pytest.raises(safefs.SymlinkRefused, match=r"link is a symlink owned by .*uid 65534"):
        safefs.open_job_file(str(tmp_path / "link" / "train.log"))


def test_an_operators_link_above_the_log_is_followed(tmp_path: Path, logs: Path) -> None:
    (tmp_path / "varlog").symlink_to(logs)  # root's (or ours): /var/log -> /data/log
    doc = logtail.collect({"paths": [str(tmp_path / "varlog" / "*.log")], "bytes": 100})
    assert [f["tail"] for f in doc["files"]] == ["step 1\nstep 2\n"]


@pytest.fixture
def sticky(tmp_path: Path) -> Path:
    """A root-owned 1777 log dir (``/tmp/train-logs``) beside the root-only canary."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700, exist_ok=True)
    (secret / "shadow.log").write_text(SECRET * 3)
    (secret / "shadow.log").chmod(0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


@needs_root
def test_a_hard_link_to_a_root_file_in_a_sticky_log_dir_is_not_shipped(sticky: Path) -> None:
    """Audit R1: where fs.protected_hardlinks is 0 the job can link root's file into a
    1777 directory of root's. Root owning both the file and the directory must not make
    it the directory owner's own file."""
    os.link(sticky.parent / "root-only" / "shadow.log", sticky / "rank0.log")
    doc = logtail.collect({"paths": [str(sticky / "*.log")], "bytes": 4096})
    assert SECRET not in repr(doc)
    (entry,) = doc["files"]
    assert "tail" not in entry
    assert "a root file with 2 links in a root directory others can write (mode 1777)" in entry["error"]
    found, errors = evidence._logs([str(sticky / "*.log")], 50)
    assert found == {} and len(errors) == 1 and "with 2 links" in errors[0]


@needs_root
def test_job_users_logs_in_a_root_sticky_dir_are_read_when_job_user_is_set(sticky: Path) -> None:
    """Audit R8: the job's own logs in a root-owned 1777 dir belong to neither root nor the
    directory's owner; with job.user (``job_user`` in the request) they are the job's."""
    log = sticky / "rank0.log"
    log.write_text("step 7 loss 0.5\n")
    os.chown(log, JOB, JOB)
    other = sticky / "other.log"
    other.write_text(SECRET)
    os.chown(other, 1234, 1234)  # neither root's, the directory owner's nor the job's
    plain = logtail.collect({"paths": [str(log)], "bytes": 100})
    assert "owned by nobody (uid 65534), not by root or its directory's owner" in plain["files"][0]["error"]
    doc = logtail.collect({"paths": [str(sticky / "*.log")], "bytes": 100, "files": 5,
                           "job_user": "nobody"})
    by_name = {Path(f["path"]).name: f for f in doc["files"]}
    assert by_name["rank0.log"]["tail"] == "step 7 loss 0.5\n"
    assert "owned by uid 1234, not by root or its directory's owner or the job user" in \
        by_name["other.log"]["error"]
    got = evidence.collect({"log_paths": [str(log)], "tail_lines": 5, "job_user": "nobody"})
    assert got["logs"] == {str(log): ["step 7 loss 0.5"]}
    # a hard link of the job's own in that directory is still refused (others could make it)
    os.link(log, sticky / "again.log")
    with pytest.raises(OSError, match=r"a file of nobody \(uid 65534\) with 2 links"):
        safefs.open_job_file(str(sticky / "again.log"), JOB)
