"""Job-owned paths brctl touches as root, attacked by the job user over the real sshd cluster.

The job runs as uid 65534 and owns its log directory (``/var/log/train``) and, here,
the update root (``/opt/train``) on every machine; brctl logs in as root. The job
user plants links on the machine itself (``setpriv --reuid 65534 --regid 65534
--clear-groups`` over ``brctl exec``) towards a root-only canary (``/local/secret``).
Nothing of the canary may be shipped to the controller or written to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kits.cluster import SshCluster, scaled

pytestmark = [pytest.mark.integration]

JOB_UID = 65534
SECRET = "CANARY-root-only-secret"
AS_JOB = ["setpriv", "--reuid", str(JOB_UID), "--regid", str(JOB_UID), "--clear-groups",
          "sh", "-c"]


class Rig:
    """Two machines whose job user (uid 65534) owns /var/log/train and /opt/train."""

    def __init__(self, cluster: SshCluster, brctl: Any, tmp_path: Path) -> None:
        self.cluster, self.brctl = cluster, brctl
        for n in cluster.names:
            secret = cluster.node_path(n, "/local/secret")
            secret.chmod(0o700)
            (secret / "shadow.log").write_text(f"{SECRET}\n" * 4)
            for job_dir in ("/var/log/train", "/opt/train"):
                cluster.node_path(n, job_dir).chmod(0o755)
                os.chown(cluster.node_path(n, job_dir), JOB_UID, JOB_UID)
        inv = cluster.inventory(job={"name": "t", "process_match": "brctl-test-never-running",
                                     "log_paths": ["/var/log/train/*.log"]},
                                python="/usr/bin/python3",
                                extra={"update": {"root": "/opt/train"},
                                       "ssh": {"command_timeout": scaled(60)}})
        for entry in inv["nodes"]:
            entry["gpus"] = 1
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))

    def run(self, *args: str) -> Any:
        return self.brctl("-i", self.inventory, "--json", *args)

    def as_job(self, node: str, script: str) -> None:
        """Run ``script`` on ``node`` as the job user."""
        res = self.run("exec", "-w", node, "--", *AS_JOB, script)
        assert res.exit_code == 0, res.stdout + res.stderr

    def secret(self, node: str) -> dict[str, str]:
        top = self.cluster.node_path(node, "/local/secret")
        return {str(p.relative_to(top)): p.read_text() if p.is_file() else "dir"
                for p in sorted(top.rglob("*"))}


@pytest.fixture
def rig(make_cluster: Any, brctl: Any, tmp_path: Path) -> Rig:
    cluster = make_cluster(2, private_dirs=("/opt/train", "/var/log/train", "/local/secret"))
    return Rig(cluster, brctl, tmp_path)


def test_a_log_linked_to_a_root_file_is_reported_never_shipped(rig: Rig, tmp_path: Path) -> None:
    rig.as_job("node01", "ln -s /local/secret/shadow.log /var/log/train/rank0.log")
    rig.as_job("node02", "echo 'step 5 loss 1.0' > /var/log/train/rank0.log")
    books = tmp_path / "books"  # one stage that tests nothing here (no dcgmi): a short run
    books.mkdir()
    (books / "eud-only.yaml").write_text(  # a line of the canary would match too, and show
        f"name: eud-only\nsymptom: test\nmatch: [{{log: 'step 5|{SECRET}'}}]\n"
        "stages: [{name: eud}]\n")
    res = rig.run("diagnose", "--playbooks", str(books), "--symptom", "eud-only")
    assert res.stdout, res.stderr
    shown = [e["text"] for e in res.json["evidence"]]
    assert shown and not any(SECRET in text for text in shown), shown
    notes = res.json["notes"]
    assert any("rank0.log' is a symlink; not followed" in n for n in notes["node01"]), notes
    assert "node02" not in notes  # the job's real log was read
    assert res.json["matched_nodes"] == ["node02"], res.json


def test_a_link_in_the_update_root_is_refused_on_that_machine(rig: Rig, tmp_path: Path) -> None:
    before = rig.secret("node01")
    rig.as_job("node01", "ln -s /local/secret /opt/train/releases")
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("VERSION = 'v1'\n")
    res = rig.run("update", "push", str(src), "-V", "v1")
    # refused (exit 4), as the same plant in ckpt.dir is: brctl would not act there
    assert res.exit_code == 4, res.stdout + res.stderr
    bad, good = res.json["nodes"]["node01"], res.json["nodes"]["node02"]
    assert bad["state"] == "refused" and "/opt/train/releases is a symlink" in bad["message"]
    assert good["state"] == "staged"
    assert rig.secret("node01") == before  # nothing staged through the link
    staged = rig.cluster.node_path("node02", "/opt/train/releases/v1/train.py")
    assert staged.read_text() == "VERSION = 'v1'\n"
