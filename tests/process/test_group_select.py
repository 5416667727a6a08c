"""``-w @group`` where a command picks machines from a list of its own (the pool, the
job's backups): the inventory's groups resolve there as everywhere (issue 18)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.process.test_ckpt_local import NODES, make_step, write_inventory
from tests.process.test_daemon_cli import write_inv


def test_standby_check_takes_the_standby_group(brctl: Any, tmp_path: Path,
                                                state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "--json", "standby", "check", "--dry-run", "-w", "@standby")
    assert res.exit_code == 0, res.stderr
    assert res.json["would_check"] == ["s1"]
    job = brctl("-i", inv, "standby", "check", "--dry-run", "-w", "@job")
    assert job.exit_code == 2 and "not pool machines: n[1-4]" in job.stderr


def test_ckpt_backup_takes_the_job_and_label_groups(brctl: Any, tmp_path: Path,
                                                    state_dir: Path) -> None:
    inv = write_inventory(tmp_path)
    for n in NODES:
        make_step(tmp_path, n, "step_1")
    res = brctl("-i", inv, "--json", "ckpt", "backup", "--dry-run", "-w", "@job")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert sorted(c["owner"] for c in res.json["copies"]) == NODES
    rack = brctl("-i", inv, "--json", "ckpt", "backup", "--dry-run", "-w", "@rack:r1")
    assert rack.exit_code == 0, rack.stdout + rack.stderr
    assert sorted(c["owner"] for c in rack.json["copies"]) == ["n2", "n4"]
