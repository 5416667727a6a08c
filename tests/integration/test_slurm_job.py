"""``job.slurm`` over a real Slurm (tests/kits/slurm_cluster.py): the job's machines,
state and restart count come from the scheduler at every command, never a stale list."""

from __future__ import annotations

import os
import shutil
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
    for want in ({"job": 987654}, {"name": "no-such-job", "user": "root"}):
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
    inv = _inventory(slurm, tmp_path, {"name": "train", "user": "root"}, names=["node01"])
    res = brctl("-i", inv, "nodes", env=env)
    assert res.exit_code == 2 and "not under nodes:" in res.stderr, res.stderr
    inv = _inventory(slurm, tmp_path, {"name": "train", "user": "root"}, names=["node01"],
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


def _logging_squeue(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose ``squeue`` records its argv (one call a line) and runs the real one."""
    shim, log = tmp_path / "bin", tmp_path / "squeue.log"
    shim.mkdir()
    real = shutil.which("squeue")
    assert real is not None
    (shim / "squeue").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    (shim / "squeue").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}, log


def test_22_05_looks_up_one_job_never_the_queue(slurm: SlurmCluster, tmp_path: Path,
                                               brctl: Brctl) -> None:
    """Issue 35, item 4, live on 22.05 (its --json ignores -j, so a lookup is the text form
    with fields no user can fill): a job name written as that form's fields changes nothing,
    and no squeue call reads the whole queue (beyond ~40,000 jobs that is more than brctl
    parses: every job.slurm command failed)."""
    env, log = _logging_squeue(tmp_path)
    env["SLURM_CONF"] = str(slurm.conf)
    forged = "x|RUNNING|node01|0|root||None|"
    held = slurm.sbatch("sleep 300", "--hold", "-J", forged)
    # names of their own: an earlier test's job of the same name may still be COMPLETING
    job = slurm.sbatch("exec srun sleep 300", "-N", "1", "-w", "node03", "-J", "lookup")
    slurm.wait_job(job, {"RUNNING"})
    doc = brctl("-i", _inventory(slurm, tmp_path, {"job": int(held)}), "--json", "nodes", env=env).json
    assert (doc["job"]["state"], doc["job"]["members"]) == ("PENDING", [])
    doc = brctl("-i", _inventory(slurm, tmp_path, {"name": "lookup", "user": "root"}), "--json",
                "nodes", env=env).json
    assert (doc["job"]["state"], doc["job"]["members"]) == ("RUNNING", ["node03"])
    calls = log.read_text().splitlines()
    assert calls and all("--json" not in c for c in calls), calls
    assert all(" -j " in f" {c} " or " -u " in f" {c} " or c == "--version" for c in calls), calls


def test_a_job_named_without_its_user(slurm: SlurmCluster, tmp_path: Path, brctl: Brctl) -> None:
    """Issue 35, item 7: a name alone matched every user's jobs: another user's held job of
    that name made every command exit 2, and once the real job was over the other user's
    live job was taken for it. Now the load asks for the user, and a name is looked up
    among that user's jobs only. (Their job stays held: it is as live as a running one to
    the lookup, and a job of nobody's cannot run here, under pytest's 0700 directories.)"""
    env = {"SLURM_CONF": str(slurm.conf)}
    try:
        slurm.sbatch("sleep 300", "--hold", "--uid=nobody", "-o", "/dev/null", "--chdir=/tmp",
                     "-J", "shared")
        ours = slurm.sbatch("exec srun sleep 300", "-N", "1", "-w", "node02", "-J", "shared")
        slurm.wait_job(ours, {"RUNNING"})
        res = brctl("-i", _inventory(slurm, tmp_path, {"name": "shared"}), "nodes", env=env)
        assert res.exit_code == 2 and "needs its user: job.slurm.user (or job.user)" in res.stderr, \
            res.stderr
        inv = _inventory(slurm, tmp_path, {"name": "shared", "user": "root"})
        res = brctl("-i", inv, "--json", "nodes", env=env)
        assert res.exit_code == 0, res.stdout + res.stderr
        doc = res.json
        assert (doc["job"]["members"], doc["job"]["source"]) == (["node02"],
                                                                 f"Slurm job {ours} (RUNNING)")
        # our job ends, theirs lives on: ours is said to be over, theirs never taken for it
        slurm.slurm("scancel", ours)
        slurm.wait_job(ours, {"CANCELLED"})
        res = brctl("-i", inv, "--json", "nodes", env=env)
        assert res.exit_code == 0, res.stdout + res.stderr
        doc = res.json
        assert (doc["job"]["state"], doc["job"]["members"]) == ("CANCELLED", [])
        assert doc["job"]["source"].startswith(f"Slurm job {ours} (CANCELLED")
        res = brctl("-i", inv, "exec", "-w", "@job", "hostname", env=env)
        assert res.exit_code == 3 and "not running" in res.stderr, res.stderr
    finally:
        slurm.slurm("scancel", "--user=nobody", check=False)  # reset() cancels root's jobs only


def test_the_job_users_own_held_job_of_the_name_is_not_the_job(
        slurm: SlurmCluster, tmp_path: Path, brctl: Brctl) -> None:
    """trust-slurm #1: the job user may ``sbatch -J NAME --hold`` a job of the job's own
    name: two live jobs of that name were exit 2 (final under the shipped unit)."""
    env = {"SLURM_CONF": str(slurm.conf)}
    slurm.sbatch("sleep 300", "--hold", "-J", "twin")
    ours = slurm.sbatch("exec srun sleep 300", "-N", "1", "-w", "node02", "-J", "twin")
    slurm.wait_job(ours, {"RUNNING"})
    res = brctl("-i", _inventory(slurm, tmp_path, {"name": "twin", "user": "root"}), "--json",
                "nodes", env=env)
    assert res.exit_code == 0, res.stdout + res.stderr
    assert (res.json["job"]["members"], res.json["job"]["source"]) == (
        ["node02"], f"Slurm job {ours} (RUNNING)")
