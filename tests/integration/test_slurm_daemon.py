"""brctl daemon over a real Slurm with the built-in hooks: a machine of a running sbatch job
gets a GPU fault (the fake NVML on its PYTHONPATH), the daemon drains it in Slurm with its
reason, swaps in a checked standby from the partition and requeues the job pinned to the
new machine list; the job runs there again and every command sees it there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.conftest import validated
from tests.kits.cluster import scaled
from tests.kits.healthkit import fake_nvml, healthy_gpus
from tests.kits.slurm_cluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
TAG = "brctl-slurm-daemon-job"


def _nvml(directory: Path, node: str, ecc: int) -> dict[str, str]:
    gpus = healthy_gpus(1)
    gpus[0]["ecc_volatile"] = ecc
    return fake_nvml(directory / node, gpus)


def _wait(what: str, pred: Callable[[], Any], timeout: float, log: Path,
          daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline and daemon.poll() is None:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_gpu_fault_drains_swaps_a_partition_standby_and_requeues_the_job_there(
        make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path) -> None:
    cluster = make_slurm_cluster(4, private_dirs=("/local/ckpt", "/local/ckpt.brctl-backup"))
    logs, nvml, state = tmp_path / "logs", tmp_path / "nvml", tmp_path / "state"
    logs.mkdir()
    # every rank prints its step; the job's processes carry the tag (process_match)
    job = cluster.sbatch(
        f"exec srun sh -c 'i=0; while :; do i=$((i+1)); echo \"step $i\" >> {logs}/$(hostname).log;"
        f" sleep 0.5; done; true {TAG}'", "-N", "2", "-w", "node01,node02", "-J", "train")
    cluster.wait_job(job, {"RUNNING"})
    doc = cluster.inventory(node_env={n: _nvml(nvml, n, 0) for n in cluster.names},
                            python=sys.executable, extra={
        "slurm": {"partition": "batch"},
        "health": {"checks": ["gpu_count", "ecc", "process"]},
        "daemon": {"poll_interval": 1, "stall_after": scaled(60), "startup_grace": scaled(90),
                   "metrics_port": 0, "max_evict_fraction": 1.0, "standby_stages": []}})
    for entry in doc["nodes"]:
        entry["gpus"] = 1
    doc["job"] = {"name": "train", "slurm": {"job": job}, "process_match": TAG,
                  "log_paths": [str(logs / "*.log")]}  # no *_command: the built-in hooks
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = dict(os.environ, SLURM_CONF=str(cluster.conf), BRCTL_STATE=str(state),
               PYTHONPATH=str(ROOT))
    log = tmp_path / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), "--json", "daemon",
                               "run", "--for", str(int(scaled(240))), "--no-metrics"],
                              stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env)
    try:
        _wait("the standby self-check", lambda: "standby_check" in log.read_text(), 60, log, daemon)
        assert daemon.poll() is None, log.read_text()[-2000:]
        # an uncorrectable ECC error on node02: the same file the fake NVML reads
        _nvml(nvml, "node02", 2)
        reasons = lambda: cluster.slurm("sinfo", "-R", "-h", "-N", "-o", "%n|%E")  # noqa: E731
        _wait("node02 drained by brctl", lambda: "node02|brctl: " in reasons(), 60, log, daemon)
        assert "ecc" in reasons().lower()
        _wait("the job requeued onto node01,node03",
              lambda: _squeue(cluster, job).get("required_nodes") == "node[01,03]", 60, log, daemon)
        seen = _squeue(cluster, job)
        assert seen["excluded_nodes"] == "node02" and seen["restart_cnt"] == 1
        cluster.wait_job(job, {"RUNNING"}, timeout=90)
        _wait("ranks on node03", lambda: cluster.node_pids("node03", TAG), 30, log, daemon)
        out = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "--json", "nodes"],
                             capture_output=True, text=True, env=env, timeout=scaled(60))
        assert validated(json.loads(out.stdout))["job"]["members"] == ["node01", "node03"], \
            out.stderr + log.read_text()[-6000:]
        events = log.read_text()
        assert "action_evict" in events and "action_restart" in events
        assert "scheduler_requeue" not in events  # its own requeue is not news
        # the wait in Slurm's queue after the requeue was not a crash: one restart, no second
        kinds = [line.split()[2] for line in events.splitlines() if len(line.split()) > 2]
        assert "crash" not in kinds and kinds.count("action_restart") == 1, events[-3000:]
        assert _squeue(cluster, job)["restart_cnt"] == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def _squeue(cluster: SlurmCluster, job: str) -> dict[str, Any]:
    jobs = json.loads(cluster.slurm("squeue", "--json"))["jobs"]
    return next((j for j in jobs if str(j["job_id"]) == job), {})
