"""``brctl ckpt`` under attack, over real sshd machines (README "Safe by default").

The job runs as uid 65534 and owns ``/local/ckpt`` on every machine; brctl logs in
as root. Attacks are planted by that user on the machine itself (``setpriv --reuid
65534 --regid 65534 --clear-groups`` over ``brctl exec``), or by a compromised
machine whose ``python`` is a wrapper that forges the probes' answers. Every node
has two root-only canaries: ``/local/secret`` (a file nobody else may read) and
``/local/victim`` (a directory nobody else may write). After each attack: the
canaries are untouched, no byte of the secret is anywhere else, and the copy says
why it was refused, naming the node and the bad name.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kits.cluster import SshCluster

pytestmark = [pytest.mark.integration]

JOB_UID = 65534
SECRET = b"CANARY-root-only-secret"
PRIVATE = ("/local/ckpt", "/local/ckpt.brctl-backup", "/local/secret", "/local/victim",
           "/local/tools")
AS_JOB = ["setpriv", "--reuid", str(JOB_UID), "--regid", str(JOB_UID), "--clear-groups",
          "sh", "-c"]

# A compromised machine: its ``python`` runs the real one and rewrites the JSON
# answers of ckpt probes with ``forge(request, answer)``; bulk streams pass through.
HOSTILE = r'''#!/usr/bin/python3
import json, os, subprocess, sys
REAL = "/usr/bin/python3"
def forge(req, doc):
%s
    return doc
args = sys.argv[1:]
if any('"op": "send"' in a or '"op": "receive"' in a for a in args):
    os.execv(REAL, [REAL, *args])
data = sys.stdin.buffer.read()
proc = subprocess.run([REAL, *args], input=data, capture_output=True)
out = proc.stdout
try:
    req, doc = json.loads(data), json.loads(out)
except ValueError:
    req = doc = None
if isinstance(req, dict) and isinstance(doc, dict):
    if req.get("op") == "batch":
        for item in req.get("items", []):
            key = str(item.get("key"))
            if key in doc.get("results", {}):
                doc["results"][key] = forge(item, doc["results"][key])
    else:
        doc = forge(req, doc)
    out = json.dumps(doc).encode() + b"\n"
sys.stdout.buffer.write(out)
sys.stderr.buffer.write(proc.stderr)
sys.exit(proc.returncode)
'''

# The job on the target, timed by brctl itself: right before the bytes arrive, it
# renames brctl's staging dir away and puts its own thing under that name.
SWAP_STAGING = r'''#!/bin/sh
case "$*" in *'"op": "receive"'*)
  setpriv --reuid 65534 --regid 65534 --clear-groups sh -c '
    cd /local/ckpt && for d in .brctl-restore-*; do
      mv "$d" "moved$d" && %s
    done' ;;
esac
exec /usr/bin/python3 "$@"
'''


class Rig:
    """Three machines: node01, node02 (the job, backing each other up) and node03 (standby)."""

    def __init__(self, cluster: SshCluster, brctl: Any, tmp_path: Path) -> None:
        self.cluster, self.brctl, self.tmp = cluster, brctl, tmp_path
        self.plan = tmp_path / "plan.yaml"
        self.plan.write_text(yaml.safe_dump({"placements": [
            {"node": "node01", "backup_node": "node02"},
            {"node": "node02", "backup_node": "node01"}]}))
        for n in cluster.names:
            for d, mode in (("/local/ckpt", 0o755), ("/local/secret", 0o700),
                            ("/local/victim", 0o700), ("/local/tools", 0o755)):
                os.chmod(cluster.node_path(n, d), mode)
            os.chown(cluster.node_path(n, "/local/ckpt"), JOB_UID, JOB_UID)
            (cluster.node_path(n, "/local/secret") / "shadow").write_bytes(SECRET)
            (cluster.node_path(n, "/local/victim") / "keep").write_bytes(b"victim file")
        self.write_inventory()

    def write_inventory(self, python: dict[str, str] | None = None, **ckpt: Any) -> None:
        inv = self.cluster.inventory(job={"tp": 1, "pp": 2}, names=["node01", "node02", "node03"],
                                     python="/usr/bin/python3",
                                     extra={"ckpt": {"dir": "/local/ckpt", **ckpt}})
        for entry in inv["nodes"]:
            entry["gpus"] = 1
            if python and entry["name"] in python:
                entry["python"] = python[entry["name"]]
        inv["standby"] = [e for e in inv["nodes"] if e["name"] == "node03"]
        inv["nodes"] = [e for e in inv["nodes"] if e["name"] != "node03"]
        inv["job"]["nodes"] = "node[01-02]"
        (self.tmp / "inventory.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))

    def run(self, *args: str) -> Any:
        return self.brctl("-i", self.tmp / "inventory.yaml", "--json", "ckpt", *args)

    def backup(self, node: str = "node01") -> Any:
        return self.run("backup", "-w", node, "--plan", str(self.plan))

    def restore(self, *extra: str) -> Any:
        # One relay at a time: the swapping wrapper acts once, not once per lane at once.
        return self.run("restore", "--to", "node03", "--for", "node01", "--plan", str(self.plan),
                        "--parallel", "1", *extra)

    def as_job(self, node: str, script: str) -> Any:
        """Run ``script`` on ``node`` as the job user (uid 65534)."""
        return self.brctl("-i", self.tmp / "inventory.yaml", "--json", "exec", "-w", node, "--",
                          *AS_JOB, script)

    def tool(self, node: str, name: str, text: str) -> str:
        """A root-owned executable in the node's private /local/tools; → its path there."""
        path = self.cluster.node_path(node, f"/local/tools/{name}")
        path.write_text(text)
        path.chmod(0o755)
        return f"/local/tools/{name}"

    def shards(self, node: str, step: str) -> None:
        made = self.as_job(node, f"cd /local/ckpt && mkdir -p {step}/optim && "
                                 f"head -c 200000 /dev/urandom > {step}/model.pt && "
                                 f"head -c 50000 /dev/urandom > {step}/optim/rank0.bin")
        assert made.exit_code == 0, made.stdout

    def assert_canaries_intact(self) -> None:
        """Secrets unread (no copy anywhere), victims unwritten and not removed."""
        for n in self.cluster.names:
            assert (self.cluster.node_path(n, "/local/secret") / "shadow").read_bytes() == SECRET
            victim = self.cluster.node_path(n, "/local/victim")
            assert sorted(p.name for p in victim.iterdir()) == ["keep"], n
            for d in ("/local/ckpt", "/local/ckpt.brctl-backup"):
                for p in self.cluster.node_path(n, d).rglob("*"):
                    if p.is_file() and not p.is_symlink():
                        assert SECRET not in p.read_bytes(), p


@pytest.fixture
def rig(make_cluster: Callable[..., SshCluster], brctl: Any, tmp_path: Path) -> Rig:
    return Rig(make_cluster(3, private_dirs=PRIVATE), brctl, tmp_path)


def _copy(res: Any) -> dict[str, Any]:
    (copy,) = res.json["copies"]
    return dict(copy)


def test_symlinked_step_file_and_fifo_are_skipped_never_read(rig: Rig) -> None:
    rig.shards("node01", "step_100")
    planted = rig.as_job("node01", "cd /local/ckpt && ln -s /local/secret step_999 && "
                                   "ln -s /local/secret/shadow step_100/optim/leak.pt && "
                                   "mkfifo step_100/pipe")
    assert planted.exit_code == 0
    res = rig.backup()
    assert res.exit_code == 0, res.stdout
    copy = _copy(res)
    assert (copy["state"], copy["step"], copy["files"]) == ("ok", "step_100", 2)
    warnings = " ".join(copy["warnings"])
    assert "'step_999' skipped: symlink" in warnings and "'step_100/optim/leak.pt' skipped" in warnings
    root = rig.cluster.node_path("node02", "/local/ckpt.brctl-backup")
    got = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert got == ["node01/step_100/.brctl-manifest.json", "node01/step_100/step_100/model.pt",
                   "node01/step_100/step_100/optim/rank0.bin"]
    # What brctl made in the backup root is root's, 0700, and out of the job user's reach.
    for made in (root / "node01", root / "node01" / "step_100"):
        st = made.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    tried = rig.as_job("node02", "ln -s /local/victim /local/ckpt.brctl-backup/node01/step_200")
    assert tried.exit_code == 1 and "Permission denied" in tried.stdout
    rig.assert_canaries_intact()


def test_a_backup_root_the_job_can_write_is_refused(rig: Rig) -> None:
    rig.shards("node01", "step_100")
    rig.write_inventory(backup_dir="/local/ckpt/.brctl-backup")  # the old default, set explicitly
    res = rig.backup()
    assert res.exit_code == 4, res.stdout
    copy = _copy(res)
    assert copy["state"] == "refused"
    assert "node02" in copy["error"] and "/local/ckpt is owned by" in copy["error"]
    assert "ckpt.backup_dir" in copy["error"]  # the suggested setting
    assert not rig.cluster.node_path("node02", "/local/ckpt/.brctl-backup").exists()
    rig.assert_canaries_intact()


def _legacy_backup(rig: Rig) -> None:
    """A committed copy of node01's step_100 under the old default on node02, as brctl made it."""
    rig.shards("node01", "step_100")
    assert rig.backup().exit_code == 0
    new = rig.cluster.node_path("node02", "/local/ckpt.brctl-backup/node01")
    old = rig.cluster.node_path("node02", "/local/ckpt/.brctl-backup")
    old.mkdir()
    new.rename(old / "node01")


def test_old_default_backups_restore_with_a_note(rig: Rig) -> None:
    _legacy_backup(rig)
    res = rig.restore()
    assert res.exit_code == 0, res.stdout
    copy = _copy(res)
    assert (copy["state"], copy["step"]) == ("ok", "step_100")
    assert any("old default backup root" in w for w in copy["warnings"])
    rig.assert_canaries_intact()


@pytest.mark.parametrize("plant", [
    "ln -s /local/secret /local/ckpt/.brctl-backup/node01/step_100/step_100/optim",
    "rm -r /local/ckpt/.brctl-backup/node01/step_100/step_100 && "
    "ln -s /local/secret /local/ckpt/.brctl-backup/node01/step_100/step_100",
])
def test_a_replaced_old_default_backup_is_refused(rig: Rig, plant: str) -> None:
    _legacy_backup(rig)
    legacy = rig.cluster.node_path("node02", "/local/ckpt/.brctl-backup")
    for p in [legacy, *legacy.rglob("*")]:  # as if the job had made it: it is in its dir
        os.lchown(p, JOB_UID, JOB_UID)
    if "optim" in plant:
        assert rig.as_job("node02", "rm -r /local/ckpt/.brctl-backup/node01/step_100/step_100/optim"
                          ).exit_code == 0
    assert rig.as_job("node02", plant).exit_code == 0
    res = rig.restore()
    assert res.exit_code == 4, res.stdout
    copy = _copy(res)
    assert copy["state"] == "refused" and "node02" in copy["error"]
    assert "symlink; not followed" in copy["error"]
    assert not rig.cluster.node_path("node03", "/local/ckpt/step_100").exists()
    rig.assert_canaries_intact()


@pytest.mark.parametrize(("swap", "why"), [
    ('ln -s /local/victim "$d"', "symlink; not followed"),
    ('mkdir -m 700 "$d"', "was replaced (owner uid 65534"),
])
def test_a_replaced_restore_staging_dir_is_refused(rig: Rig, swap: str, why: str) -> None:
    rig.shards("node01", "step_100")
    assert rig.backup().exit_code == 0
    rig.write_inventory(python={"node03": rig.tool("node03", "python", SWAP_STAGING % swap)})
    res = rig.restore()
    assert res.exit_code == 4, res.stdout
    copy = _copy(res)
    assert copy["state"] == "refused" and "node03" in copy["error"] and why in copy["error"]
    assert not rig.cluster.node_path("node03", "/local/ckpt/step_100").exists()
    rig.assert_canaries_intact()


def test_restored_shards_belong_to_the_job_which_can_rotate_them(rig: Rig) -> None:
    rig.shards("node01", "step_100")
    assert rig.as_job("node01", "cd /local/ckpt/step_100 && chmod 640 model.pt && "
                                "chmod 4755 optim/rank0.bin").exit_code == 0
    assert rig.backup().exit_code == 0
    refused = rig.run("restore", "--to", "node02", "--for", "node01", "--from", "node01")
    assert refused.exit_code == 4 and "live member" in refused.stderr
    res = rig.restore()
    assert res.exit_code == 0, res.stdout
    step = rig.cluster.node_path("node03", "/local/ckpt/step_100")
    for p, mode in ((step, 0o755), (step / "model.pt", 0o640), (step / "optim" / "rank0.bin", 0o644)):
        st = p.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (JOB_UID, JOB_UID, mode), p
    assert not [p for p in rig.cluster.node_path("node03", "/local/ckpt").iterdir()
                if p.name.startswith(".brctl-restore-")]
    rotated = rig.as_job("node03", "cd /local/ckpt && mv step_100 step_100.old && rm -r step_100.old")
    assert rotated.exit_code == 0, rotated.stdout
    rig.assert_canaries_intact()


ESCAPE = "../../../../local/victim"


@pytest.mark.parametrize(("node", "forge", "action"), [
    # A compromised source names its step (and files) outside every root.
    ("node01", f'''    if req.get("op") == "scan":
        for s in doc["steps"]:
            s["name"] = "{ESCAPE}"
            for f in s.get("files", []):
                f["path"] = "{ESCAPE}/authorized_keys"''', "backup"),
    # A step name that matches nothing the operator configured.
    ("node01", '''    if req.get("op") == "scan":
        doc["steps"][0]["name"] = "authorized_keys"''', "backup"),
    # A compromised peer forges the listing and the checked files of a restore.
    ("node02", f'''    if req.get("op") == "scan_backup" and req.get("deep") is False:
        doc["steps"] = [{{"name": "{ESCAPE}", "committed": True}}]''', "restore"),
    ("node02", f'''    if req.get("op") == "verify":
        for f in doc.get("files", []):
            f["path"] = "step_100/../{ESCAPE}/authorized_keys"''', "restore"),
    # A compromised target names a staging dir that is not one (a later drop would rmtree it).
    ("node03", '''    if req.get("op") == "stage":
        doc["staging"] = "../../local/victim"''', "restore"),
])
def test_forged_answers_never_steer_a_write_read_or_remove(rig: Rig, node: str, forge: str,
                                                           action: str) -> None:
    rig.shards("node01", "step_100")
    if action == "restore":
        assert rig.backup().exit_code == 0
    rig.write_inventory(python={node: rig.tool(node, "python", HOSTILE % forge)})
    res = rig.backup() if action == "backup" else rig.restore()
    assert res.exit_code == 4, res.stdout
    copy = _copy(res)
    assert copy["state"] == "refused" and node in copy["error"], copy
    assert ("victim" in copy["error"] or "authorized_keys" in copy["error"]), copy["error"]
    assert not rig.cluster.node_path("node03", "/local/ckpt/step_100").exists()
    rig.assert_canaries_intact()
    assert json.dumps(res.json)  # one document, errors included


def test_a_fresh_standby_gets_a_ckpt_dir_and_shards_of_job_user(rig: Rig) -> None:
    """Audit R2: the standby has no ckpt.dir at all. With job.user, the restore makes it
    for that user (uid 65534) with the shards, so the job can rotate them there; what
    is made above it stays root's."""
    fresh = "/local/tools/fresh/ckpt"
    src = rig.cluster.node_path("node01", fresh)
    (src / "step_100").mkdir(parents=True)
    (src / "step_100" / "model.pt").write_bytes(os.urandom(4096))
    for p in (src, src / "step_100", src / "step_100" / "model.pt"):
        os.chown(p, JOB_UID, JOB_UID)
    rig.write_inventory(dir=fresh)
    inv_path = rig.tmp / "inventory.yaml"
    inv = yaml.safe_load(inv_path.read_text())
    inv["job"]["user"] = "nobody"
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    assert rig.backup().exit_code == 0
    assert not rig.cluster.node_path("node03", "/local/tools/fresh").exists()
    res = rig.restore()
    assert res.exit_code == 0, res.stdout
    copy = _copy(res)
    assert copy["state"] == "ok" and copy["warnings"] == [], copy
    made = rig.cluster.node_path("node03", fresh)
    assert {p.stat().st_uid for p in [made, *made.rglob("*")]} == {JOB_UID}
    assert made.parent.stat().st_uid == 0
    rotated = rig.as_job("node03", f"cd {fresh} && mv step_100 step_100.old && rm -r step_100.old")
    assert rotated.exit_code == 0, rotated.stdout
    rig.assert_canaries_intact()
