"""The Slurm test harness itself: a real job's processes are seen over SSH on its machines,
fake GPUs reach the job, drains show in ``sinfo -R``, and teardown leaves nothing running."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from tests.kits.cluster import scaled
from tests.kits.slurm_cluster import SlurmCluster, _ports_free, _start_time


def _ssh(cluster: SlurmCluster, name: str, command: str) -> str:
    argv = ["ssh", "-i", str(cluster.client_key), "-p", str(cluster.port),
            "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"root@{cluster.address(name)}", command]
    return subprocess.run(argv, capture_output=True, text=True, check=True,
                          timeout=scaled(20)).stdout


def test_job_processes_are_seen_over_ssh_on_their_machine_only(slurm_cluster: SlurmCluster) -> None:
    tag = "brctl-harness-tag"
    job = slurm_cluster.sbatch(f"exec srun sh -c 'echo gpus=$CUDA_VISIBLE_DEVICES; sleep 300; true {tag}'",
                               "-N", "2", "-w", "node02,node03", "--gres=gpu:2")
    try:
        slurm_cluster.wait_job(job, {"RUNNING"})
        deadline = time.monotonic() + scaled(20)
        while not slurm_cluster.node_pids("node03", tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        # the bracket keeps grep's own command line from matching
        find = f"hostname; grep -l '{tag[:-1]}[{tag[-1]}]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
        seen = {}
        for name in slurm_cluster.names:
            hostname, count = _ssh(slurm_cluster, name, find).split()
            assert hostname == name  # the machine's own UTS namespace, shared with its slurmd
            seen[name] = int(count)
        # node02 also holds the batch script's srun, whose command line names the tag
        assert seen["node01"] == seen["node04"] == 0 and seen["node02"] >= 1 and seen["node03"] == 1
        assert slurm_cluster.node_state("node02") == "allocated"
        # the fake GPUs reach the job as real ones would
        out = slurm_cluster.root / f"job-{job}.out"
        assert out.read_text().count("gpus=0,1") == 2
    finally:
        slurm_cluster.reset()


def test_drain_and_resume_show_in_sinfo(slurm_cluster: SlurmCluster) -> None:
    try:
        slurm_cluster.slurm("scontrol", "update", "NodeName=node04", "State=DRAIN",
                            "Reason=harness check")
        assert "harness check" in slurm_cluster.slurm("sinfo", "-R", "-h", "-o", "%n %E")
        assert slurm_cluster.node_state("node04") == "drained"
    finally:
        slurm_cluster.reset()
    assert slurm_cluster.node_state("node04") == "idle"


def test_teardown_stops_every_recorded_process(
        make_slurm_cluster: Callable[..., SlurmCluster]) -> None:
    cluster = make_slurm_cluster(2, gpus=0)
    job = cluster.sbatch("sleep 300", "-w", "node01")
    cluster.wait_job(job, {"RUNNING"})
    ctld = cluster._ctld
    munged = cluster._munged
    assert ctld is not None and munged is not None
    namespaces = [p.pid for p in cluster._procs.values()]
    cluster.stop()
    assert _start_time(ctld.pid) is None
    assert _start_time(munged[0]) != munged[1]
    assert all(_start_time(pid) is None for pid in namespaces)
    assert not cluster.munge_dir.exists()
    assert _ports_free(range(cluster.ctld_port, cluster.ctld_port + 3))  # nothing listens
