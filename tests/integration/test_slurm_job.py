"""``job.slurm`` over a real Slurm (tests/kits/slurm_cluster.py): the job's machines,
state and restart count come from the scheduler at every command, never a stale list."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.kits.slurm_cluster import SlurmCluster

Brctl = Callable[..., Any]


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Any:
    """The session's Slurm, with every job cancelled and every machine resumed afterwards."""
    yield slurm_cluster
    slurm_cluster.reset()


def _inventory(cluster: SlurmCluster, tmp_path: Path, job: dict[str, Any],
               names: list[str] | None = None, **extra: Any) -> Path:
    inv = cluster.inventory(names=names, extra=extra)
    inv["job"] = {"slurm": job}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def test_a_running_job_is_where_slurm_placed_it(slurm: SlurmCluster, tmp_path: Path,
                                                brctl: Brctl) -> None:
    # a job name written to pose as another field of scontrol's text output
    job = slurm.sbatch("exec srun sleep 300", "-N", "2", "-w", "node02,node04",
                       "-J", "x NodeList=node01 JobState=RUNNING")
    slurm.wait_job(job, {"RUNNING"})
    inv = _inventory(slurm, tmp_path, {"job": int(job)})
    env = {"SLURM_CONF": str(slurm.conf)}
    doc = brctl("-i", inv, "--json", "nodes", env=env).json
    assert doc["job"]["members"] == ["node02", "node04"]
    assert doc["job"]["state"] == "RUNNING"
    assert doc["job"]["source"] == f"Slurm job {job} (RUNNING)"
    res = brctl("-i", inv, "nodes", env=env)
    assert f"machines from Slurm job {job} (RUNNING)" in res.stdout
    # @job reaches exactly those machines, at their inventory addresses
    out = brctl("-i", inv, "--json", "exec", "-w", "@job", "hostname", env=env).json
    assert {n: r["stdout"].strip() for n, r in out["nodes"].items()} == \
        {"node02": "node02", "node04": "node04"}
    # a requeue: the restart count shows, and while it waits the job has no machines
    slurm.slurm("scontrol", "requeuehold", job)
    slurm.wait_job(job, {"PENDING"})
    doc = brctl("-i", inv, "--json", "nodes", env=env).json
    assert doc["job"]["members"] == [] and doc["job"]["state"] == "PENDING"
    assert "1 restart)" in doc["job"]["source"]
    res = brctl("-i", inv, "exec", "-w", "@job", "hostname", env=env)
    assert res.exit_code == 3 and "not running" in res.stderr, res.stderr
    slurm.slurm("scontrol", "update", f"JobId={job}", "ReqNodeList=node01,node03")
    slurm.slurm("scontrol", "release", job)
    slurm.wait_job(job, {"RUNNING"}, timeout=60)
    doc = brctl("-i", inv, "--json", "nodes", env=env).json
    assert doc["job"]["members"] == ["node01", "node03"]  # asked again: never the old list


def test_pending_finished_and_unknown_jobs(slurm: SlurmCluster, tmp_path: Path,
                                           brctl: Brctl) -> None:
    env = {"SLURM_CONF": str(slurm.conf)}
    held = slurm.sbatch("sleep 300", "--hold", "-J", "waiting")
    done = slurm.sbatch("true", "-J", "finished")
    slurm.wait_job(done, {"COMPLETED"})
    for job, state in ((held, "PENDING"), (done, "COMPLETED")):
        inv = _inventory(slurm, tmp_path, {"job": job})
        doc = brctl("-i", inv, "--json", "nodes", env=env).json
        assert (doc["job"]["state"], doc["job"]["members"]) == (state, [])
        res = brctl("-i", inv, "health", "-w", "@job", env=env)
        assert res.exit_code == 3, res.stdout + res.stderr
        assert f"Slurm job {job} ({state}" in res.stderr
    inv = _inventory(slurm, tmp_path, {"name": "finished", "user": "root"})
    assert brctl("-i", inv, "--json", "nodes", env=env).json["job"]["state"] == "COMPLETED"
    for want in ({"job": 987654}, {"name": "no-such-job"}):
        inv = _inventory(slurm, tmp_path, want)
        res = brctl("-i", inv, "nodes", env=env)
        assert res.exit_code == 2, res.stderr
        assert "Slurm has no job" in res.stderr


def test_machines_outside_the_inventory_come_from_the_partition(
        slurm: SlurmCluster, tmp_path: Path, brctl: Brctl) -> None:
    env = {"SLURM_CONF": str(slurm.conf)}
    job = slurm.sbatch("exec srun sleep 300", "-N", "2", "-w", "node03,node04", "-J", "train")
    slurm.wait_job(job, {"RUNNING"})
    slurm.slurm("scontrol", "update", "NodeName=node02", "State=DRAIN", "Reason=bad fan")
    # only node01 is listed: the job's machines are addressed by their NodeAddr
    inv = _inventory(slurm, tmp_path, {"name": "train"}, names=["node01"])
    res = brctl("-i", inv, "nodes", env=env)
    assert res.exit_code == 2 and "not under nodes:" in res.stderr, res.stderr
    inv = _inventory(slurm, tmp_path, {"name": "train"}, names=["node01"],
                     slurm={"partition": "batch"})
    doc = brctl("-i", inv, "--json", "nodes", env=env).json
    assert doc["job"]["members"] == ["node03", "node04"]
    assert doc["nodes"]["node04"]["address"] == slurm.address("node04")
    assert doc["nodes"]["node04"]["gpus"] == 2  # the fake GPUs' Gres
    # the standby pool: the partition's idle machines (node02 is drained)
    roles = {n: v["role"] for n, v in doc["nodes"].items()}
    assert roles == {"node01": "standby", "node03": "job", "node04": "job"}
    out = brctl("-i", inv, "--json", "exec", "-w", "@job", "hostname", env=env).json
    assert {n: r["stdout"].strip() for n, r in out["nodes"].items()} == \
        {"node03": "node03", "node04": "node04"}


def test_standbys_from_a_reservation(slurm: SlurmCluster, tmp_path: Path, brctl: Brctl) -> None:
    env = {"SLURM_CONF": str(slurm.conf)}
    job = slurm.sbatch("exec srun sleep 300", "-N", "2", "-w", "node01,node02")
    slurm.wait_job(job, {"RUNNING"})
    slurm.slurm("scontrol", "create", "reservation", "ReservationName=spares", "Nodes=node04",
                "StartTime=now", "Duration=60", "Users=root")
    inv = _inventory(slurm, tmp_path, {"job": job}, slurm={"reservation": "spares"})
    doc = brctl("-i", inv, "--json", "nodes", env=env).json
    roles = {n: v["role"] for n, v in doc["nodes"].items()}
    assert roles == {"node01": "job", "node02": "job", "node03": "other", "node04": "standby"}
