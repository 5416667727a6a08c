"""Safe hands for manual evict/unevict, through the real CLI and a real SQLite state database.

A dry run writes nothing (the database's bytes and the directory listing are the
same before and after, the scheduler hook never runs); unevict tells the
scheduler through job.unevict_command; every manual action records its operator.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from brctl.operations.daemon_state import DaemonState
from brctl.state import Store

RECORD = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"


def write_inv(tmp_path: Path) -> Path:
    hook = [sys.executable, "-c", RECORD]
    doc = {
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 1}],
        "standby": [{"name": "s1", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-4]",
                "evict_command": [*hook, str(tmp_path / "evict.jsonl"), "{node}", "{reason}"],
                "unevict_command": [*hook, str(tmp_path / "unevict.jsonl"), "scontrol", "update",
                                    "NodeName={node}", "State=RESUME"]},
        "health": {"checks": ["disk"]},
        "daemon": {"max_evictions_per_hour": 1, "metrics_port": 0},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def snapshot(state_dir: Path) -> dict[str, str]:
    """Every file of the state directory and a hash of its bytes."""
    return {str(p.relative_to(state_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(state_dir.rglob("*")) if p.is_file()}


def events(state_dir: Path, kind: str) -> list[dict[str, Any]]:
    store = Store(state_dir)
    try:
        found = DaemonState(store, "llm").events()
    finally:
        store.close()
    return [e["detail"] for e in found if e["kind"] == kind]


def test_dry_runs_write_nothing_not_even_a_refusal(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    assert brctl("-i", inv, "evict", "n1", "--reason", "xid 79").exit_code == 0
    before = snapshot(state_dir)
    assert before, "the real eviction wrote the state database"
    capped = brctl("-i", inv, "evict", "n2", "--reason", "flaky", "--dry-run")
    assert capped.exit_code == 4 and "max_evictions_per_hour" in capped.stderr
    assert brctl("-i", inv, "--json", "unevict", "n1", "--dry-run").json["changed"] is True
    assert snapshot(state_dir) == before
    assert not (tmp_path / "unevict.jsonl").exists()
    assert len((tmp_path / "evict.jsonl").read_text().splitlines()) == 1


def test_unevict_tells_the_scheduler_and_records_the_operator(brctl: Any, tmp_path: Path,
                                                              state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    sudo = {"SUDO_USER": "alice", "USER": "root"}
    assert brctl("-i", inv, "evict", "n3", "--reason", "ecc", env=sudo).exit_code == 0
    res = brctl("-i", inv, "--json", "unevict", "n3", "--by", "bob")
    assert res.exit_code == 0 and res.json["hook"]["exit_code"] == 0, res.stderr
    calls = [json.loads(x) for x in (tmp_path / "unevict.jsonl").read_text().splitlines()]
    assert calls == [["scontrol", "update", "NodeName=n3", "State=RESUME"]]
    assert [e["operator"].split("@")[0] for e in events(state_dir, "evict")] == ["alice"]
    assert [e["operator"] for e in events(state_dir, "unevict")] == ["bob"]


def test_a_failing_unevict_command_is_a_finding(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["unevict_command"] = [sys.executable, "-c", "raise SystemExit(3)"]
    inv.write_text(yaml.safe_dump(doc))
    assert brctl("-i", inv, "evict", "n2", "--reason", "ecc").exit_code == 0
    assert brctl("-i", inv, "unevict", "n2").exit_code == 1
