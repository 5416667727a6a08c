"""``brctl ckpt`` over a real sshd cluster: shards move between machines for real.

Six machines, each with its own private ``/local/ckpt`` (a bind mount in its own
mount namespace): a 4-machine job (TP=1, PP=2, DP=2 on one "GPU" each) and two
standbys. Shard files are written on the host side of each node's private dir
and checked there by sha256, independently of brctl.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kits.cluster import SshCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Each machine's own ckpt.dir and, beside it, the default backup root.
CKPT_DIRS = ("/local/ckpt", "/local/ckpt.brctl-backup")
JOB = ["node01", "node02", "node03", "node04"]
SPARES = ["node05", "node06"]


def _inventory(cluster: SshCluster, tmp_path: Path) -> Path:
    inv = cluster.inventory(job={"nodes": "node[01-04]", "tp": 1, "pp": 2},
                            python="/usr/bin/python3",
                            extra={"ckpt": {"dir": "/local/ckpt", "parallel": 4}})
    for entry in inv["nodes"]:
        entry["gpus"] = 1
    inv["standby"] = [e for e in inv["nodes"] if e["name"] in SPARES]
    inv["nodes"] = [e for e in inv["nodes"] if e["name"] not in SPARES]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def _write_step(cluster: SshCluster, node: str, step: str) -> dict[str, str]:
    """Two shard files (one in a subdirectory, ~1.5 MiB total); → {relative path: sha256}."""
    base = cluster.node_path(node, f"/local/ckpt/{step}")
    (base / "optim").mkdir(parents=True, exist_ok=True)
    out = {}
    for rel, size in (("model_rank0.pt", 1 << 20), ("optim/rank0.bin", 1 << 19)):
        data = os.urandom(size)
        (base / rel).write_bytes(data)
        out[f"{step}/{rel}"] = hashlib.sha256(data).hexdigest()
    return out


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".brctl" not in p.name}


def test_backup_evict_pp_group_restore_onto_standbys(
    make_cluster: Callable[..., SshCluster], brctl: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(6, private_dirs=CKPT_DIRS)
    inv = _inventory(cluster, tmp_path)

    plan = brctl("-i", inv, "--json", "ckpt", "plan")
    assert plan.exit_code == 0, plan.stderr
    peers = {p["node"]: p["backup_node"] for p in plan.json["placements"]}
    # rank = dp + 2·pp: node01 (0,0) ↔ node04 (1,1), node02 (1,0) ↔ node03 (0,1).
    assert peers == {"node01": "node04", "node04": "node01", "node02": "node03", "node03": "node02"}

    old = {n: _write_step(cluster, n, "step_100") for n in JOB}
    first = brctl("-i", inv, "--json", "ckpt", "backup")
    assert first.exit_code == 0, first.stdout + first.stderr
    new = {n: _write_step(cluster, n, "step_200") for n in JOB}
    second = brctl("-i", inv, "--json", "ckpt", "backup")
    assert second.exit_code == 0, second.stdout + second.stderr
    assert {c["step"] for c in second.json["copies"]} == {"step_200"}
    for n in JOB:  # every copy is on its peer's own disk, byte for byte
        copy = cluster.node_path(peers[n], f"/local/ckpt.brctl-backup/{n}")
        assert _tree(copy / "step_200") == new[n] and _tree(copy / "step_100") == old[n]
        assert (copy / "step_200" / ".brctl-manifest.json").is_file()
        assert not cluster.node_path(n, f"/local/ckpt.brctl-backup/{n}").exists()

    # A truncated copy is detected: restore falls back to the older complete step.
    victim = cluster.node_path("node04", "/local/ckpt.brctl-backup/node01/step_200/step_200/model_rank0.pt")
    victim.write_bytes(victim.read_bytes()[: 1 << 10])
    res = brctl("-i", inv, "--json", "ckpt", "restore", "--to", "node05", "--for", "node01")
    assert res.exit_code == 0, res.stdout + res.stderr
    (copy,) = res.json["copies"]
    assert copy["step"] == "step_100" and "corrupted or truncated" in copy["notes"][0]
    assert _tree(cluster.node_path("node05", "/local/ckpt")) == old["node01"]
    # The next backup resends exactly the damaged file.
    repair = brctl("-i", inv, "--json", "ckpt", "backup", "-w", "node01")
    (fixed,) = repair.json["copies"]
    assert (fixed["state"], fixed["copied"], fixed["skipped"]) == ("ok", 1, 1)

    # Evict the pipeline group {node01, node03}: the machines are gone for real.
    verify = brctl("-i", inv, "--json", "ckpt", "verify")
    assert verify.json["ok"] and not verify.json["violations"]
    cluster.stop_node("node01")
    cluster.stop_node("node03")
    for evicted, spare in (("node01", "node05"), ("node03", "node06")):
        res = brctl("-i", inv, "--json", "ckpt", "restore", "--to", spare, "--for", evicted)
        assert res.exit_code == 0, res.stdout + res.stderr
        (copy,) = res.json["copies"]
        assert (copy["source"], copy["step"], copy["state"]) == (peers[evicted], "step_200", "ok")
        restored = _tree(cluster.node_path(spare, "/local/ckpt"))
        assert {k: v for k, v in restored.items() if k.startswith("step_200/")} == new[evicted]

    # Backing up from a machine that is gone says so: incomplete, exit 3.
    gone = brctl("-i", inv, "--json", "ckpt", "backup", "-w", "node01")
    assert gone.exit_code == 3
    assert gone.json["copies"][0]["state"] == "incomplete"


def test_corrupted_source_read_is_not_committed(
    make_cluster: Callable[..., SshCluster], brctl: Any, tmp_path: Path
) -> None:
    """A file that changes between hashing and sending is refused, and no manifest appears."""
    cluster = make_cluster(2, private_dirs=CKPT_DIRS)
    inv = cluster.inventory(job={"nodes": "node[01-02]", "tp": 1, "pp": 2},
                            python="/usr/bin/python3")
    for entry in inv["nodes"]:
        entry["gpus"] = 1
    # PP=2, DP=1: the two machines share nothing but... the PP group: no valid peer.
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    plan = brctl("-i", path, "--json", "ckpt", "plan")
    assert plan.exit_code == 1 and not plan.json["ok"]
    assert "pp" in plan.json["placements"][0]["shared_kinds"]
    _write_step(cluster, "node01", "step_1")
    # A sitecustomize on node01 rewrites the shard after the scan hashed it: the
    # bytes the controller reads no longer match and the copy must fail.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def _tamper():\n"
        "    p = '/local/ckpt/step_1/model_rank0.pt'\n"
        "    if os.path.exists(p) and 'brctl.diagnostics.ckptfiles' in ' '.join(sys.argv):\n"
        "        open(p, 'ab').write(b'x')\n"
        "atexit.register(_tamper)\n")
    inv["nodes"][0]["env"] = {"PYTHONPATH": str(hook)}
    path.write_text(yaml.safe_dump(inv))
    res = brctl("-i", path, "--json", "ckpt", "backup", "-w", "node01")
    assert res.exit_code == 1
    (copy,) = res.json["copies"]
    assert copy["state"] == "failed" and "sha256" in copy["error"]
    assert not list(cluster.node_path("node02", "/local/ckpt.brctl-backup").rglob(".brctl-manifest.json"))
