"""The built-in Slurm hooks (no ``job.*_command`` templates) over a real Slurm: brctl evict
drains with its reason (seen in ``sinfo -R``), unevict resumes only its own drains, and a
restart pins the requeued job to exactly the planned machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from brctl.load.inventory import load_inventory
from brctl.operations.jobadapter import JobAdapter
from brctl.operations.slurm.job import Slurm, resolve
from tests.kits.slurm_cluster import SlurmCluster

Brctl = Callable[..., Any]
LOOSE_CAPS = {"max_evict_fraction": 1.0, "max_evictions_per_hour": 100}


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's Slurm (SLURM_CONF set), reset afterwards."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    yield slurm_cluster
    slurm_cluster.reset()


def _inventory(cluster: SlurmCluster, tmp_path: Path, job: str) -> Path:
    inv = cluster.inventory(extra={"daemon": LOOSE_CAPS})
    inv["job"] = {"slurm": {"job": job}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def _reasons(cluster: SlurmCluster) -> dict[str, str]:
    out = cluster.slurm("sinfo", "-R", "-h", "-N", "-o", "%n|%E")
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_evict_drains_with_its_reason_and_unevict_resumes_only_its_own(
        slurm: SlurmCluster, tmp_path: Path, brctl: Brctl, state_dir: Path) -> None:
    job = slurm.sbatch("exec srun sleep 300", "-N", "2", "-w", "node02,node03")
    slurm.wait_job(job, {"RUNNING"})
    inv = _inventory(slurm, tmp_path, job)
    res = brctl("-i", inv, "evict", "node03", "--reason", "xid 79 on GPU 1\nfallen off the bus")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert _reasons(slurm) == {"node03": "brctl: xid 79 on GPU 1 fallen off the bus"}
    assert slurm.node_state("node03") in ("draining", "drained")  # the job still holds it
    res = brctl("-i", inv, "unevict", "node03")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert _reasons(slurm) == {}
    assert slurm.node_state("node03").rstrip("*") == "allocated"  # "*": being pinged
    # a drain someone else set is theirs: evict keeps its reason, unevict does not lift it
    slurm.slurm("scontrol", "update", "NodeName=node04", "State=DRAIN", "Reason=repair 4711")
    assert brctl("-i", inv, "evict", "node04", "--reason", "ecc").exit_code == 0
    brctl("-i", inv, "unevict", "node04")
    assert _reasons(slurm) == {"node04": "repair 4711"}


def test_restart_requeues_the_job_onto_exactly_the_planned_machines(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch("exec srun sleep 300", "-N", "2", "-w", "node02,node03")
    slurm.wait_job(job, {"RUNNING"})
    listed = load_inventory(_inventory(slurm, tmp_path, job))
    inv, _ = resolve(listed, Slurm(listed.slurm))
    assert inv.job is not None and list(inv.job.nodes) == ["node02", "node03"]
    adapter = JobAdapter(inv, timeout=60)
    assert adapter.running(["node02", "node03"]) is True
    assert adapter.restarted_on(["node01", "node03"]) is False
    run = adapter.restart(["node01", "node03"])
    assert run is not None and run.ok, run
    assert f"job {job}: " in run.stdout and "ReqNodeList node[01,03]" in run.stdout
    assert "ExcNodeList node02" in run.stdout
    assert adapter.restarted_on(["node01", "node03"]) is True, run.stdout  # the state it was left in
    slurm.wait_job(job, {"RUNNING"}, timeout=60)
    again, sjob = resolve(listed, Slurm(listed.slurm))  # asked afresh
    assert again.job is not None and list(again.job.nodes) == ["node01", "node03"]
    assert sjob.restarts == 1
