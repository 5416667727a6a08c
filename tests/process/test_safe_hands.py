"""Safe hands for manual evict/unevict, through the real CLI and a real SQLite state database.

A dry run writes nothing (the database's bytes and the directory listing are the
same before and after, the scheduler hook never runs, no one is notified); unevict
tells the scheduler through job.unevict_command; both take node sets; --force goes
past a cap only with the operator and the reason recorded and announced; every
manual action is in the audit trail (events and event log) and notifies through
the daemon's notify_command.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from brctl.operations.ledger.state import DaemonState
from brctl.state import Store

RECORD = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"
# the daemon's notify_command: the JSON message arrives on stdin
PAGE = "import sys; open(sys.argv[1],'a').write(sys.stdin.read()+'\\n')"


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
        "daemon": {"max_evictions_per_hour": 1, "metrics_port": 0,
                   "notify_command": [sys.executable, "-c", PAGE, str(tmp_path / "pages.jsonl")]},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def pages(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "pages.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


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
    forced = brctl("-i", inv, "--json", "evict", "n[2-3]", "--reason", "flaky", "--dry-run",
                   "--force")
    assert forced.exit_code == 0 and "max_evictions_per_hour" in forced.json["forced"]
    assert forced.json["nodes"]["n2"]["command"][-2:] == ["n2", "flaky"]  # what would run
    dry = brctl("-i", inv, "--json", "unevict", "n1", "--dry-run").json
    assert dry["members"] == ["n1"] and dry["nodes"]["n1"]["command"][-1] == "State=RESUME"
    human = brctl("-i", inv, "unevict", "n1", "--dry-run")
    assert "would run unevict_command" in human.stdout and "NodeName=n1" in human.stdout
    assert snapshot(state_dir) == before
    assert not (tmp_path / "unevict.jsonl").exists()
    assert len((tmp_path / "evict.jsonl").read_text().splitlines()) == 1
    assert [p["kind"] for p in pages(tmp_path)] == ["evict"]  # the real one only


def test_unevict_tells_the_scheduler_and_records_the_operator(brctl: Any, tmp_path: Path,
                                                              state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    sudo = {"SUDO_USER": "alice", "USER": "root"}
    assert brctl("-i", inv, "evict", "n3", "--reason", "ecc", env=sudo).exit_code == 0
    res = brctl("-i", inv, "--json", "unevict", "n3", "--by", "bob")
    assert res.exit_code == 0 and res.json["nodes"]["n3"]["hook"]["exit_code"] == 0, res.stderr
    calls = [json.loads(x) for x in (tmp_path / "unevict.jsonl").read_text().splitlines()]
    assert calls == [["scontrol", "update", "NodeName=n3", "State=RESUME"]]
    assert [e["operator"].split("@")[0] for e in events(state_dir, "evict")] == ["alice"]
    assert [e["operator"] for e in events(state_dir, "unevict")] == ["bob"]
    # the daemon's notifier heard both, with who did it
    assert [(p["kind"], p["node"], p["detail"]["operator"].split("@")[0])
            for p in pages(tmp_path)] == [("evict", "n3", "alice"), ("unevict", "n3", "bob")]
    # and the daemon's event log (the audit trail a SIEM tails) has both
    log = [json.loads(x) for x in (state_dir / "daemon-events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["nodes"], e["detail"]["by"]) for e in log] == [
        ("evict", ["n3"], "hand"), ("unevict", ["n3"], "hand")]


def test_a_failing_unevict_command_is_a_finding(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["unevict_command"] = [sys.executable, "-c", "raise SystemExit(3)"]
    inv.write_text(yaml.safe_dump(doc))
    assert brctl("-i", inv, "evict", "n2", "--reason", "ecc").exit_code == 0
    assert brctl("-i", inv, "unevict", "n2").exit_code == 1


def test_node_sets_are_validated_and_evicted_together(brctl: Any, tmp_path: Path,
                                                      state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["daemon"].update(max_evictions_per_hour=3, max_evict_fraction=0.75)
    inv.write_text(yaml.safe_dump(doc))
    for bad in ("n[1-2],gpu9", "@rack:r9"):
        res = brctl("-i", inv, "evict", bad, "--reason", "x")
        assert res.exit_code == 2 and "not in the inventory" in res.stderr, (bad, res.stderr)
        assert "Traceback" not in res.stderr
    assert brctl("-i", inv, "unevict", "n9").exit_code == 2
    assert not state_dir.exists() or not events(state_dir, "evict")
    # the caps see the whole set at once: three would be within the cap of 3, four not
    four = brctl("-i", inv, "evict", "@job", "--reason", "rack power")
    assert four.exit_code == 4 and "4 would exceed" in four.stderr
    res = brctl("-i", inv, "--json", "evict", "n[1-3]", "--reason", "rack power")
    assert res.exit_code == 0, res.stderr
    assert res.json["members"] == ["n1", "n2", "n3"]
    calls = [json.loads(x) for x in (tmp_path / "evict.jsonl").read_text().splitlines()]
    assert calls == [[n, "rack power"] for n in ("n1", "n2", "n3")]
    res = brctl("-i", inv, "--json", "unevict", "n[2-4]")  # n4 was never quarantined
    assert res.json["members"] == ["n2", "n3"] and res.json["nodes"]["n4"]["changed"] is False
    store = Store(state_dir)
    try:
        assert list(DaemonState(store, "llm").quarantined()) == ["n1"]
    finally:
        store.close()


def test_force_past_a_cap_is_recorded_with_who_and_why_and_announced(
        brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    assert brctl("-i", inv, "evict", "n1", "--reason", "xid 79").exit_code == 0
    refused = brctl("-i", inv, "evict", "n2", "--reason", "flaky")
    assert refused.exit_code == 4 and "--force" in refused.stderr
    # the refusal is recorded and announced (a real run, not a dry one)
    assert [d["operator"] for d in events(state_dir, "refused")]
    assert [p["state"] for p in pages(tmp_path)] == ["done", "refused"]
    res = brctl("-i", inv, "--json", "evict", "n2", "--reason", "ECC storm, on-call said go",
                "--force", "--by", "carol")
    assert res.exit_code == 0, res.stderr
    assert res.json["operator"] == "carol" and "max_evictions_per_hour" in res.json["forced"]
    (record,) = [d for d in events(state_dir, "evict") if d["operator"] == "carol"]
    assert record["forced"] and record["reason"] == "ECC storm, on-call said go"
    page = pages(tmp_path)[-1]
    assert page["kind"] == "evict" and page["node"] == "n2" and page["detail"]["operator"] == "carol"
    assert "forced past eviction cap" in page["reason"] and "ECC storm" in page["reason"]
    store = Store(state_dir)
    try:
        quarantined = DaemonState(store, "llm").quarantined()
    finally:
        store.close()
    assert quarantined["n2"].operator == "carol" and quarantined["n2"].source == "hand"
    human = brctl("-i", inv, "evict", "n3", "--reason", "also", "--force", "--dry-run")
    assert human.exit_code == 0 and "would go past a cap" in human.stdout


def test_a_failed_notification_is_recorded_not_fatal(brctl: Any, tmp_path: Path,
                                                      state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["daemon"]["notify_command"] = [sys.executable, "-c", "raise SystemExit(5)"]
    inv.write_text(yaml.safe_dump(doc))
    res = brctl("-i", inv, "--json", "evict", "n1", "--reason", "ecc")
    assert res.exit_code == 0 and res.json["notify_errors"], res.stderr
    assert events(state_dir, "notify_failed")
