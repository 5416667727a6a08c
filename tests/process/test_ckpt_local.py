"""``brctl ckpt`` end to end on ``connection: local`` machines (no sockets).

Each local machine gets its own checkpoint directory through its ``env``
(``ckpt.dir: $CKPT_ROOT/ckpt``, expanded on the node), so shards, backups and
restores really move between distinct directories through the node-side probe.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.load.inventory import load_inventory
from brctl.operations.ckpt import ops
from brctl.remote.local import LocalTransport

NODES = ["n1", "n2", "n3", "n4"]


def write_inventory(tmp_path: Path, **ckpt: Any) -> Path:
    roots = {n: tmp_path / n for n in [*NODES, "spare"]}
    doc = {
        "nodes": [{"name": n, "connection": "local", "gpus": 2, "labels": {"rack": f"r{i % 2}"},
                   "python": sys.executable, "env": {"CKPT_ROOT": str(roots[n])}}
                  for i, n in enumerate(NODES)],
        "standby": [{"name": "spare", "connection": "local", "gpus": 2, "python": sys.executable,
                     "env": {"CKPT_ROOT": str(roots["spare"])}}],
        "job": {"nodes": "n[1-4]", "tp": 2, "pp": 2},
        "ckpt": {"dir": "$CKPT_ROOT/ckpt", **ckpt},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def make_step(tmp_path: Path, node: str, step: str, size: int = 3000) -> dict[str, str]:
    """Shard files of one step; returns {relative path: sha256}."""
    base = tmp_path / node / "ckpt" / step
    (base / "optim").mkdir(parents=True, exist_ok=True)
    out = {}
    for rel, seed in ((f"{step}/model_rank0.pt", 1), (f"{step}/optim/rank0.bin", 2)):
        data = hashlib.sha256(f"{node}{step}{seed}".encode()).digest() * (size // 32)
        (tmp_path / node / "ckpt" / rel).write_bytes(data)
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def tmp_path(trusted_tmp: Path) -> Path:
    """Node roots outside /tmp: the default backup root (beside ckpt.dir) must pass StrictModes."""
    return trusted_tmp


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    inv_path = write_inventory(tmp_path)
    inv = load_inventory(inv_path)
    return inv_path, inv


def test_plan_and_verify_cli(brctl: Any, cluster: Any) -> None:
    inv_path, _inv = cluster
    res = brctl("-i", inv_path, "--json", "ckpt", "plan")
    assert res.exit_code == 0, res.stderr
    doc = res.json
    assert doc["schema"] == "brctl.ckpt.plan/1"
    assert {p["node"]: p["backup_node"] for p in doc["placements"]} == {
        "n1": "n4", "n4": "n1", "n2": "n3", "n3": "n2"}
    res = brctl("-i", inv_path, "--json", "ckpt", "verify")
    assert res.exit_code == 0 and res.json["ok"] is True and res.json["violations"] == []
    assert res.json["loss_probability"]["2"] == pytest.approx(2 / 6)
    yml = brctl("-i", inv_path, "ckpt", "plan", "--format", "yaml")
    assert yaml.safe_load(yml.stdout)["placements"][0] == {
        "node": "n1", "backup_node": "n4", "meets_rule": True, "how": "pair", "shared_kinds": [],
        "same_domain": False}
    human = brctl("-i", inv_path, "ckpt", "plan")
    assert "n1" in human.stdout and "n4" in human.stdout


def test_verify_plan_file_from_elsewhere(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    inv_path, _inv = cluster
    bad = tmp_path / "nvrx.json"  # n1↔n2 share the DP group (same pipeline stage)
    bad.write_text(json.dumps({"placements": [
        {"node": "n1", "backup_node": "n2"}, {"node": "n2", "backup_node": "n1"},
        {"node": "n3", "backup_node": "n4"}, {"node": "n4", "backup_node": "n3"}]}))
    res = brctl("-i", inv_path, "--json", "ckpt", "verify", "--plan", bad)
    assert res.exit_code == 1
    assert res.json["ok"] is False
    assert {v["kind"] for v in res.json["violations"]} == {"dp"}
    human = brctl("-i", inv_path, "ckpt", "verify", "--plan", bad)
    assert human.exit_code == 1 and "dp" in human.stdout


@pytest.mark.parametrize(("content", "message"), [
    ("placements: [{node: n1, backup: n4}]", "placements[0].backup: unknown key"),
    ("placements: [{node: n9, backup_node: n4}]", "placements[0].node: 'n9' is not a job machine"),
    ("placements: [{node: n1, backup_node: x}]", "placements[0].backup_node: 'x' is not in"),
    ("placements: [{node: n1, backup_node: n4}, {node: n1, backup_node: n3}]", "placed twice"),
    ("{placements: [", "malformed"),
    ("nodes: 3", "placements: expected a list"),
    ("placements:\n  - node: n1\n    node: n2\n    backup_node: n4\n",
     ":3:5: malformed YAML: duplicate key 'node'"),
    ("placements: [{node: n1, backup_node: n\udcff}]", ":1:39: not UTF-8 text (byte 0xff)"),
])
def test_bad_plan_files_are_named(brctl: Any, cluster: Any, tmp_path: Path, content: str,
                                  message: str) -> None:
    inv_path, _inv = cluster
    path = tmp_path / "plan.yaml"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    res = brctl("-i", inv_path, "ckpt", "verify", "--plan", path)
    assert res.exit_code == 2
    assert message in res.stderr and str(path) in res.stderr
    assert "Traceback" not in res.stderr


def test_backup_then_restore_onto_standby(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    inv_path, _inv = cluster
    shards = {n: make_step(tmp_path, n, "step_100") for n in NODES}
    newer = {n: make_step(tmp_path, n, "step_200") for n in NODES}
    res = brctl("-i", inv_path, "--json", "ckpt", "backup")
    assert res.exit_code == 0, res.stdout + res.stderr
    copies = {c["owner"]: c for c in res.json["copies"]}
    assert {c["step"] for c in copies.values()} == {"step_200"}  # the newest step wins
    assert copies["n1"]["dest"] == "n4" and copies["n1"]["copied"] == 2
    # The copy is on the peer, byte for byte, with a manifest written last.
    backup = tmp_path / "n4" / "ckpt.brctl-backup" / "n1" / "step_200"
    assert {k: v for k, v in tree(backup).items() if not k.endswith("manifest.json")} == newer["n1"]
    manifest = json.loads((backup / ".brctl-manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == newer["n1"]
    # Resumable: a second run copies nothing.
    again = brctl("-i", inv_path, "--json", "ckpt", "backup")
    assert again.exit_code == 0 and all(c["copied"] == 0 for c in again.json["copies"])
    # n1 is evicted: its shards come back on the standby from n4.
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n1")
    assert res.exit_code == 0, res.stdout + res.stderr
    (copy,) = res.json["copies"]
    assert (copy["source"], copy["dest"], copy["step"], copy["state"]) == ("n4", "spare", "step_200", "ok")
    assert tree(tmp_path / "spare" / "ckpt") == newer["n1"]
    del shards


def test_partial_and_corrupted_copies(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    inv_path, _inv = cluster
    make_step(tmp_path, "n1", "step_100")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n1").exit_code == 0
    step2 = make_step(tmp_path, "n1", "step_200")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n1").exit_code == 0
    peer = tmp_path / "n4" / "ckpt.brctl-backup" / "n1"
    # Truncate one file of the newest copy: restore detects it and takes step_100.
    victim = peer / "step_200" / "step_200" / "optim" / "rank0.bin"
    victim.write_bytes(victim.read_bytes()[:100])
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n1")
    assert res.exit_code == 0
    (copy,) = res.json["copies"]
    assert copy["step"] == "step_100"
    assert any("corrupted or truncated" in n for n in copy["notes"])
    # The next backup notices the damage, recopies only the bad file and recommits.
    res = brctl("-i", inv_path, "--json", "ckpt", "backup", "-w", "n1")
    (copy,) = res.json["copies"]
    assert copy["state"] == "ok" and copy["copied"] == 1 and copy["skipped"] == 1
    assert tree(peer / "step_200")["step_200/optim/rank0.bin"] == step2["step_200/optim/rank0.bin"]
    # A partial copy (no manifest) is never restored.
    (peer / "step_200" / ".brctl-manifest.json").unlink()
    (peer / "step_100" / ".brctl-manifest.json").unlink()
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n1")
    assert res.exit_code == 1
    assert "no complete backup" in res.json["copies"][0]["error"]


def test_marker_gates_incomplete_steps(tmp_path: Path) -> None:
    inv = load_inventory(write_inventory(tmp_path, complete_marker="DONE"))
    make_step(tmp_path, "n2", "step_100")
    (tmp_path / "n2" / "ckpt" / "step_100" / "DONE").write_text("")
    make_step(tmp_path, "n2", "step_200")  # still being written: no DONE yet
    from tests.process.test_progress import StageRecorder

    track = StageRecorder()
    report = ops.backup(LocalTransport(), inv, ops.plan(inv).backups(), nodes=["n2"],
                        track=track)
    (copy,) = report.copies
    assert copy.state == "ok" and copy.step == "step_100" and copy.files == 3, (copy.error, copy.notes)
    # progress: the scan, then the copy, each hearing n2 finish (the copy when its last lane did)
    assert track.names() == ["scan and hash", "copy"] and track.complete()
    assert track.stages[1][1:] == (["n2"], ["n2"])


def test_nothing_to_back_up_is_a_finding(brctl: Any, cluster: Any) -> None:
    inv_path, _inv = cluster
    res = brctl("-i", inv_path, "--json", "ckpt", "backup", "-w", "n3")
    assert res.exit_code == 1
    assert res.json["copies"][0]["state"] == "nothing"


def test_restore_usage_errors(brctl: Any, cluster: Any) -> None:
    inv_path, _inv = cluster
    res = brctl("-i", inv_path, "ckpt", "restore", "--to", "nope", "--for", "n1")
    assert res.exit_code == 2 and "--to nope: not in the inventory" in res.stderr
    res = brctl("-i", inv_path, "ckpt", "restore", "--to", "n4", "--for", "n1")
    assert res.exit_code == 2 and "holding the copy" in res.stderr


def test_restore_ignores_stale_staging(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    """Leftovers of an interrupted restore never end up in the restored step."""
    inv_path, _inv = cluster
    want = make_step(tmp_path, "n2", "step_7")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n2").exit_code == 0
    (tmp_path / "spare" / "ckpt").mkdir(parents=True)
    (tmp_path / "spare" / "ckpt" / ".brctl-restore-5eed").mkdir(mode=0o700)  # as brctl makes it
    stale = tmp_path / "spare" / "ckpt" / ".brctl-restore-5eed" / "step_7"
    stale.mkdir()
    (stale / "junk.pt").write_bytes(b"from an earlier attempt")
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n2")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert tree(tmp_path / "spare" / "ckpt") == want


def test_restore_progress_names_each_stage(cluster: Any, tmp_path: Path) -> None:
    from tests.process.test_progress import StageRecorder

    _, inv = cluster
    want = make_step(tmp_path, "n2", "step_7")
    backups = ops.plan(inv).backups()
    backed = ops.backup(LocalTransport(), inv, backups, nodes=["n2"]).copies[0]
    assert backed.state == "ok", (backed.error, backed.notes)
    track = StageRecorder()
    report = ops.restore(LocalTransport(), inv, backups, target="spare", evicted="n2",
                         track=track)
    assert report.copies[0].state == "ok" and tree(tmp_path / "spare" / "ckpt") == want
    peer = backups["n2"]
    assert track.names() == [f"verify the backup on {peer}", f"copy step_7 {peer} -> spare"]
    assert track.complete()


def test_restore_onto_a_live_job_member_is_refused_unless_forced(
    brctl: Any, cluster: Any, tmp_path: Path
) -> None:
    inv_path, _inv = cluster
    make_step(tmp_path, "n1", "step_1")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n1").exit_code == 0
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "n2", "--for", "n1")
    assert res.exit_code == 4, res.stdout + res.stderr
    assert "n2 is a live member of job" in res.stderr and "--force" in res.stderr
    assert not (tmp_path / "n2" / "ckpt" / "step_1").exists()
    forced = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "n2", "--for", "n1", "--force")
    assert forced.exit_code == 0, forced.stdout + forced.stderr
    assert (tmp_path / "n2" / "ckpt" / "step_1" / "model_rank0.pt").is_file()


def test_a_symlinked_step_is_skipped_with_a_warning(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    inv_path, _inv = cluster
    want = make_step(tmp_path, "n1", "step_1")
    (tmp_path / "n1" / "ckpt" / "step_9").symlink_to(tmp_path / "n2")  # newest, but a link
    res = brctl("-i", inv_path, "ckpt", "backup", "-w", "n1")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "warning: n1: 'step_9' skipped: symlink; not followed" in res.stderr
    copy = tmp_path / "n4" / "ckpt.brctl-backup" / "n1" / "step_1"
    assert {k: v for k, v in tree(copy).items() if not k.endswith("manifest.json")} == want


def test_dry_runs_show_every_file_from_where_to_where_and_write_nothing(
        brctl: Any, cluster: Any, tmp_path: Path) -> None:
    inv_path, _inv = cluster
    state = tmp_path / "state"
    for n in NODES:
        make_step(tmp_path, n, "step_100")
    before = {n: tree(tmp_path / n) for n in [*NODES, "spare"]}
    res = brctl("-i", inv_path, "--json", "ckpt", "backup", "--dry-run")
    assert res.exit_code == 0, res.stdout + res.stderr
    copies = {c["owner"]: c for c in res.json["copies"]}
    n1 = copies["n1"]
    assert (n1["state"], n1["step"], n1["dest"], n1["copied"]) == ("planned", "step_100", "n4", 0)
    assert n1["send"] == ["step_100/model_rank0.pt", "step_100/optim/rank0.bin"]
    assert n1["from_path"] == f"n1:{tmp_path}/n1/ckpt/step_100"
    assert n1["to_path"] == f"n4:{tmp_path}/n4/ckpt.brctl-backup/n1/step_100"
    assert n1["bytes"] == sum((tmp_path / "n1" / "ckpt" / f).stat().st_size for f in n1["send"])
    human = brctl("-i", inv_path, "ckpt", "backup", "--dry-run", "-w", "n1")
    assert "would copy step_100 from n1:" in human.stdout and "optim/rank0.bin" in human.stdout
    # nothing was created on any machine (not even the backup root), nothing recorded
    assert {n: tree(tmp_path / n) for n in [*NODES, "spare"]} == before
    assert not (tmp_path / "n4" / "ckpt.brctl-backup").exists() and not state.exists()

    assert brctl("-i", inv_path, "ckpt", "backup").exit_code == 0
    make_step(tmp_path, "spare", "step_100")  # the target already holds a step of that name
    before = {n: tree(tmp_path / n) for n in [*NODES, "spare"]}
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n1",
                "--dry-run")
    assert res.exit_code == 0, res.stdout + res.stderr
    (copy,) = res.json["copies"]
    assert (copy["state"], copy["source"], copy["dest"], copy["step"]) == ("planned", "n4", "spare",
                                                                           "step_100")
    assert copy["from_path"] == f"n4:{tmp_path}/n4/ckpt.brctl-backup/n1/step_100"
    assert copy["to_path"] == f"spare:{tmp_path}/spare/ckpt/step_100"
    assert copy["send"] == n1["send"] and any("moved aside" in n for n in copy["notes"])
    assert {n: tree(tmp_path / n) for n in [*NODES, "spare"]} == before
    assert not [p for p in (tmp_path / "spare" / "ckpt").iterdir() if p.name.startswith(".brctl")]
    assert not state.exists()  # a dry run is not in the audit trail


def test_a_hand_restore_is_in_the_audit_trail(brctl: Any, cluster: Any, tmp_path: Path) -> None:
    from brctl.operations.ledger.state import DaemonState
    from brctl.state import Store

    inv_path, inv = cluster
    make_step(tmp_path, "n2", "step_100")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n2").exit_code == 0
    res = brctl("-i", inv_path, "ckpt", "restore", "--to", "spare", "--for", "n2", "--by", "dave")
    assert res.exit_code == 0, res.stderr
    store = Store(tmp_path / "state")
    try:
        (event,) = [e for e in DaemonState(store, inv.job_key).events() if e["kind"] == "restore"]
    finally:
        store.close()
    assert event["nodes"] == ["spare"] and event["detail"]["operator"] == "dave"
    assert (event["detail"]["for"], event["detail"]["from"], event["detail"]["state"]) == (
        "n2", "n3", "ok")
    log = (tmp_path / "state" / "daemon-events.jsonl").read_text()
    assert '"restore"' in log and "dave" in log


def _with_job_user(inv_path: Path, user: str) -> Path:
    doc = yaml.safe_load(inv_path.read_text())
    doc["job"]["user"] = user
    inv_path.write_text(yaml.safe_dump(doc))
    return inv_path


def test_restore_onto_a_fresh_standby_gives_ckpt_dir_and_shards_to_job_user(
        brctl: Any, cluster: Any, tmp_path: Path) -> None:
    """R2: the standby has no ckpt.dir. With job.user the restore makes it for that user
    and hands it the shards (the job can rotate them); without, they stay root's, said."""
    inv_path, _inv = cluster
    make_step(tmp_path, "n2", "step_7")
    assert brctl("-i", inv_path, "ckpt", "backup", "-w", "n2").exit_code == 0
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n2")
    assert res.exit_code == 0, res.stdout + res.stderr
    (copy,) = res.json["copies"]
    assert (tmp_path / "spare" / "ckpt").stat().st_uid == 0
    assert any("restored shards of step_7 are root-owned" in w and "set job.user" in w
               for w in copy["warnings"]), copy
    shutil.rmtree(tmp_path / "spare")
    res = brctl("-i", _with_job_user(inv_path, "nobody"), "--json", "ckpt", "restore",
                "--to", "spare", "--for", "n2")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert res.json["copies"][0]["warnings"] == []
    ckpt = tmp_path / "spare" / "ckpt"
    assert {p.stat().st_uid for p in [ckpt, *ckpt.rglob("*")]} == {65534}
    assert (tmp_path / "spare").stat().st_uid == 0  # made above it: root's, as before


def test_restore_from_the_legacy_area_warns_of_what_the_job_planted_there(
        brctl: Any, cluster: Any, tmp_path: Path) -> None:
    """R3: a copy under the old default backup root (inside the peer's ckpt.dir) is read by
    the same rules; the symlinked step the job put beside it is a warning, not silence."""
    inv_path, inv = cluster
    peer = ops.plan(inv).backups()["n2"]
    want = make_step(tmp_path, "n2", "step_7")
    legacy = tmp_path / peer / "ckpt" / ".brctl-backup" / "n2" / "step_7"
    entries = []
    for rel, sha in want.items():
        data = (tmp_path / "n2" / "ckpt" / rel).read_bytes()
        (legacy / rel).parent.mkdir(parents=True, exist_ok=True)
        (legacy / rel).write_bytes(data)
        entries.append({"path": rel, "size": len(data), "sha256": sha, "mode": 0o644})
    (legacy / ".brctl-manifest.json").write_text(json.dumps(
        {"source": "n2", "step": "step_7", "files": entries, "committed_at": 1.0}))
    (legacy.parent / "step_9").symlink_to(tmp_path / "n2" / "ckpt" / "step_7")
    res = brctl("-i", inv_path, "--json", "ckpt", "restore", "--to", "spare", "--for", "n2")
    assert res.exit_code == 0, res.stdout + res.stderr
    (copy,) = res.json["copies"]
    assert copy["step"] == "step_7" and tree(tmp_path / "spare" / "ckpt") == want
    assert any("old default backup root" in w for w in copy["warnings"])
    assert any(f"{peer}: 'step_9' skipped: " in w and "symlink" in w for w in copy["warnings"]), copy
