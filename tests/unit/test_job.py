"""brctl.job's rules that need no torch process: the socket layout, the directory it
accepts, the stale-socket rule, the facts before torch.distributed starts, the usage."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from brctl import job


def test_the_public_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(job.SOCKET_DIR_ENV, raising=False)
    assert job.socket_dir() == f"/tmp/brctl-job-{os.getuid()}"
    assert job.socket_path(7) == f"/tmp/brctl-job-{os.getuid()}/rank-7.sock"
    monkeypatch.setenv(job.SOCKET_DIR_ENV, "/run/x")
    assert job.socket_path(0) == "/run/x/rank-0.sock"


def test_the_directory_is_made_private_and_never_a_link_or_anothers(tmp_path: Path) -> None:
    made = tmp_path / "mine"
    job._own_dir(str(made))
    assert made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o755)
    job._own_dir(str(made))  # our own, too open: closed again
    assert made.stat().st_mode & 0o777 == 0o700
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(OSError, match="not a directory"):
        job._own_dir(str(tmp_path / "link"))
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    if os.getuid() == 0:
        with pytest.raises(OSError, match="belongs to uid 12345"):
            job._own_dir(str(other))


def test_only_our_own_stale_socket_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.sock"
    os.mknod(path, stat.S_IFSOCK | 0o600)  # a socket inode, as a killed rank leaves it
    job._remove_stale(str(path))
    assert not path.exists()
    job._remove_stale(str(path))  # nothing there: fine
    path.write_text("not a socket")
    with pytest.raises(OSError, match="not this user's socket"):
        job._remove_stale(str(path))


def test_facts_before_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "x")
    job.report_step(41)
    try:
        got = job.facts()
    finally:
        job._state["step"] = None
    assert got == {"v": 1, "rank": 3, "pid": os.getpid(), "world_size": None, "step": 41,
                   "groups": {}}


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        job.main(["--"])
    assert exc.value.code == 2 and "usage" in capsys.readouterr().err


@pytest.mark.parametrize("value", [None, "", "\u00b2", "-1", "3x"])
def test_no_rank_no_socket(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                           value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", value)
    assert job.serve() is None
    assert "RANK is not set" in capsys.readouterr().err
    assert job.facts()["rank"] is None


def test_the_examples_parse_and_opt_in() -> None:
    import ast

    root = Path(__file__).resolve().parents[2] / "examples"
    plain = (root / "torchrun_job.py").read_text()
    megatron = (root / "megatron_style_job.py").read_text()
    for text in (plain, megatron):
        ast.parse(text)
    assert "brctl.job.serve()" in plain and "-m brctl.job --" in megatron
