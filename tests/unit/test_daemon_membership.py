"""The job's machines now: the daemon's recorded swaps win over the inventory's job.nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from brctl.analysis.daemon.policy import recorded_membership
from brctl.operations.ledger.state import DaemonState
from brctl.state import DB_NAME, Store

LISTED = ["n1", "n2", "n3", "n4"]
KNOWN = [*LISTED, "s1", "s2"]


def test_recorded_membership_wins_and_names_the_swaps() -> None:
    assert recorded_membership("llm", LISTED, None, KNOWN) == (LISTED, None)
    assert recorded_membership("llm", LISTED, LISTED, KNOWN) == (LISTED, None)
    nodes, note = recorded_membership("llm", LISTED, ["n1", "s1", "n3", "s2"], KNOWN)
    assert nodes == ["n1", "s1", "n3", "s2"]
    assert note == ("job llm: the daemon swapped s1 in for n2, s2 in for n4 (state DB); "
                    "the inventory still lists n2, n4")


def test_a_record_naming_unknown_machines_loses_to_the_inventory() -> None:
    nodes, note = recorded_membership("llm", LISTED, ["n1", "gone", "n3", "n4"], KNOWN)
    assert nodes == LISTED and note is not None and "gone" in note and "inventory" in note


def test_a_record_of_another_size_is_used_and_said() -> None:
    nodes, note = recorded_membership("llm", LISTED, ["n1", "n2"], KNOWN)
    assert nodes == ["n1", "n2"] and note is not None and "lists 2 machines" in note


def write_inv(tmp_path: Path) -> Path:
    doc = {"nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 2}],
           "standby": [{"name": "s[1-2]", "connection": "local", "gpus": 2}],
           "job": {"name": "llm", "nodes": "n[1-4]", "tp": 2, "pp": 2},
           "daemon": {"metrics_port": 0}}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def record(state_dir: Path, members: list[str]) -> None:
    store = Store(state_dir)
    DaemonState(store, "llm").set_members(members)
    store.close()


def test_job_commands_see_the_swap_with_one_warning(brctl: Any, tmp_path: Path,
                                                     state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    record(state_dir, ["n1", "s1", "n3", "n4"])
    res = brctl("-i", inv, "--json", "nodes")
    assert res.exit_code == 0, res.stderr
    assert res.json["job"]["members"] == ["n1", "s1", "n3", "n4"]
    roles = {name: n["role"] for name, n in res.json["nodes"].items()}
    assert roles["s1"] == "job" and roles["n2"] == "other" and roles["s2"] == "standby"
    assert res.stderr.count("warning") == 1
    assert "the daemon swapped s1 in for n2 (state DB); the inventory still lists n2" in (
        " ".join(res.stderr.split()))
    plan = brctl("-i", inv, "--json", "replay", "--plan-only")
    assert plan.exit_code == 0, plan.stderr
    assert "n2" not in plan.stdout and "s1" in plan.stdout
    ckpt = brctl("-i", inv, "--json", "ckpt", "plan")
    assert "n2" not in ckpt.stdout and "s1" in ckpt.stdout and "swapped" in ckpt.stderr


def test_daemon_family_commands_read_the_record_themselves(brctl: Any, tmp_path: Path,
                                                            state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    record(state_dir, ["n1", "s1", "n3", "n4"])
    pool = brctl("-i", inv, "--json", "standby", "list")
    assert pool.exit_code == 0 and "warning" not in pool.stderr
    status = {n: m["status"] for n, m in pool.json["nodes"].items()}
    assert status["s1"] == "in-job" and status["n2"] == "unchecked"  # n2 left the job


def test_no_database_no_warning_and_none_created(brctl: Any, tmp_path: Path,
                                                 state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "--json", "replay", "--plan-only")
    assert res.exit_code == 0 and "warning" not in res.stderr
    assert not (state_dir / DB_NAME).exists()
