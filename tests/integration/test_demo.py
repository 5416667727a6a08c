"""The demo's local machines run brctl's probes with the project's own Python, so the
diagnose ladder's all-to-all and all-gather really run (gloo over loopback) and pass.

The inventory is the one ``scripts/demo`` writes (``scripts/demo_inventory.py``); the
ladder runs through the real CLI on two of its machines. It reads the demo's scratch
paths but writes none of them (``/tmp/brctl-demo`` belongs to a running demo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import validated
from tests.kits.cluster import scaled

ROOT = Path(__file__).resolve().parents[2]


def demo_inventory(tmp_path: Path) -> Path:
    out = tmp_path / "inventory.yaml"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "demo_inventory.py"),
                    str(ROOT / "examples" / "demo.yaml"), str(out), sys.executable, str(ROOT),
                    str(tmp_path / "backup")],
                   check=True, timeout=scaled(60))
    return out


def test_the_demo_inventory_gives_the_machines_this_python_and_absolute_paths(
        tmp_path: Path) -> None:
    doc = yaml.safe_load(demo_inventory(tmp_path).read_text())
    assert doc["ssh"]["python"] == sys.executable
    assert doc["ckpt"]["backup_dir"] == "$DEMO_BACKUP"  # never under /tmp: refused there
    for entry in doc["nodes"] + doc["standby"]:
        assert entry["env"]["DEMO_BACKUP"] == str(tmp_path / "backup" / entry["name"])
        for path in entry["env"]["PYTHONPATH"].split(":"):
            assert os.path.isabs(path) and Path(path).is_dir(), path


@pytest.mark.slow
@pytest.mark.timeout(int(scaled(600)))
def test_the_demo_machines_run_the_ladder_all_to_all_and_all_gather_passing(
        tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the collectives need torch in this interpreter")
    inv = demo_inventory(tmp_path)
    env = {**os.environ, "BRCTL_STATE": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    # --force: a demo running on this host has live training processes; the stages here
    # take no GPU (gloo on CPU) and touch none of its files
    res = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "--json", "diagnose",
                          "-w", "local[1-2]", "--symptom", "nccl", "--force"],
                         capture_output=True, text=True, timeout=scaled(540), env=env,
                         check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = validated(json.loads(res.stdout))
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["eud", "alltoall", "allgather"]
    assert stages["eud"]["nodes_tested"] == []  # no dcgmi on this host: skipped, said so
    for name in ("alltoall", "allgather"):
        assert sorted(stages[name]["nodes_tested"]) == ["local1", "local2"], stages[name]
        assert stages[name]["faulty"] == []
    assert doc["decision"] == "reattempt" and "alltoall and allgather passed" in doc["reason"]
