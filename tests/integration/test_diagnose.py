"""brctl diagnose over the real sshd cluster, faults injected only through node env.

Each scenario proves the ladder names exactly the injected machine, with the right
decision, and stops at the stage that found it:

- a fake ``dcgmi`` on node02's PATH (real-format failing JSON, exit 226) → eud
  names node02, evict, no collective stage runs;
- a sitecustomize on node03's PYTHONPATH corrupting its all-to-all and another on
  node02's delaying it (a deterministic slowdown, not timing noise) → eud skipped (no
  dcgmi), alltoall names node03 (wrong data) and node02 (bus bandwidth below the
  fleet median of the three machines that passed), allgather never runs;
- a sitecustomize on node04's PYTHONPATH hanging its all-gather → alltoall passes,
  the wide all-gather fails, re-pairing names node04 alone;
- a user-code traceback → rollback, no stage runs, nothing evicted;
- a live training process on node02 → refused (exit 4) before any stage; with
  ``--force`` the ladder runs, and a stage that can test nothing (no dcgmi) gives an
  incomplete verdict (exit 3), never "clean".
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import validated
from tests.kits.cluster import SshCluster, scaled
from tests.kits.trainjob import TAG, start_trainjob
from tests.kits.waiting import wait_for

FAULTS = Path(__file__).parent / "diagnose_faults"
DATA = Path(__file__).parent.parent / "unit" / "data"
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _inventory(tmp_path: Path, cluster: SshCluster, gpus: int,
               node_env: dict[str, dict[str, str]],
               process_match: str = "brctl-test-never-running",
               allgather_timeout: float = 20) -> Path:
    inv: dict[str, Any] = cluster.inventory(
        job={"name": "t", "process_match": process_match}, node_env=node_env,
        python=sys.executable,
        # The collective timeouts count from readiness (torch imported, all ranks met);
        # the start-up limit absorbs torch's import on two loaded cores.
        extra={"diagnose": {"alltoall_timeout": scaled(30), "allgather_timeout": scaled(allgather_timeout),
                            "startup_timeout": scaled(240),
                            "alltoall_bytes": 65536, "allgather_bytes": 4096, "iterations": 2}})
    for entry in inv["nodes"]:
        entry["gpus"] = gpus
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _logs(tmp_path: Path, cluster: SshCluster, bad: str, sample: str) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in cluster.names:
        (logs / f"{name}.log").write_text((DATA / sample).read_text() if name == bad else "ok\n")
    return logs


def _run(brctl: Any, inv: Path, *args: str) -> Any:
    res = brctl("-i", inv, "--json", "diagnose", *args)
    assert res.stdout, res.stderr
    return res, res.json


@pytest.mark.slow
def test_fake_dcgmi_names_the_machine_and_stops_at_eud(brctl: Any, ssh_cluster: SshCluster,
                                                       tmp_path: Path, state_dir: Path) -> None:
    bindir = tmp_path / "bin"
    shutil.copytree(FAULTS / "bin", bindir)
    inv = _inventory(tmp_path, ssh_cluster, 1, {"node02": {"PATH": f"{bindir}:{NODE_PATH}"}})
    logs = _logs(tmp_path, ssh_cluster, "node02", "logs_cuda_illegal.log")
    res, doc = _run(brctl, inv, "--logs", str(logs))
    assert res.exit_code == 1, res.stderr
    assert doc["symptom"] == "cuda-error" and doc["matched_nodes"] == ["node02"]
    assert [s["name"] for s in doc["stages"]] == ["eud"]  # stopped early
    eud = doc["stages"][0]
    assert eud["faulty"] == ["node02"] and eud["nodes_tested"] == ["node02"]
    verdict = eud["nodes"]["node02"]
    assert verdict["details"]["exit_code"] == 226
    assert "GPU 1: memory: Fail" in verdict["evidence"][0]
    assert (doc["decision"], doc["faulty"]) == ("evict", ["node02"])


@pytest.mark.slow
def test_corrupted_and_slow_alltoall_name_their_machines(brctl: Any, ssh_cluster: SshCluster,
                                                         tmp_path: Path, state_dir: Path) -> None:
    env = {"node03": {"PYTHONPATH": str(FAULTS / "corrupt_alltoall")},
           "node02": {"PYTHONPATH": str(FAULTS / "slow_alltoall")}}
    inv = _inventory(tmp_path, ssh_cluster, 2, env)
    logs = _logs(tmp_path, ssh_cluster, "node01", "logs_nccl_timeout.log")
    res, doc = _run(brctl, inv, "--logs", str(logs))
    assert res.exit_code == 1, res.stderr
    assert doc["symptom"] == "nccl"
    assert [s["name"] for s in doc["stages"]] == ["eud", "alltoall"]
    assert doc["stages"][0]["nodes_tested"] == []  # no dcgmi on any node: skipped
    a2a = doc["stages"][1]
    assert a2a["faulty"] == ["node02", "node03"] and len(a2a["nodes_tested"]) == 4
    verdicts = a2a["nodes"]
    bad = verdicts["node03"]
    assert bad["evidence"][0] == "wrong data received" and bad["details"]["backend"] == "gloo"
    slow = verdicts["node02"]
    assert "below 0.1 x the fleet median" in slow["evidence"][0], slow
    assert slow["details"]["busbw_gbps"] < 0.1 * slow["details"]["median_gbps"]
    assert verdicts["node01"]["status"] == verdicts["node04"]["status"] == "pass"
    assert (doc["decision"], doc["faulty"]) == ("evict", ["node02", "node03"])


@pytest.mark.slow
@pytest.mark.timeout(scaled(600))
def test_hung_allgather_names_the_machine_after_repairing(brctl: Any, ssh_cluster: SshCluster,
                                                          tmp_path: Path, state_dir: Path) -> None:
    env = {"node04": {"PYTHONPATH": str(FAULTS / "hang_allgather")}}
    # Each round with node04 waits its all-gather out (timeout + the probe's 5 s grace): 6 s
    # is far above a healthy 4 KiB all-gather's milliseconds after readiness, and three such
    # rounds cost 33 s where 20 s cost 75.
    inv = _inventory(tmp_path, ssh_cluster, 1, env, allgather_timeout=6)
    res, doc = _run(brctl, inv, "--symptom", "hang")
    assert res.exit_code == 1, res.stderr
    assert doc["stages"][1]["faulty"] == [], doc["stages"][1]["nodes"]
    assert [s["name"] for s in doc["stages"]] == ["eud", "alltoall", "allgather"]
    assert doc["stages"][1]["faulty"] == []
    gather = doc["stages"][2]
    assert gather["faulty"] == ["node04"]
    first = gather["rounds"][0]
    assert first == [{"members": ssh_cluster.names, "ok": False}]  # the wide group failed
    assert all(g["ok"] for rnd in gather["rounds"][1:] for g in rnd if "node04" not in g["members"])
    assert (doc["decision"], doc["faulty"]) == ("evict", ["node04"])


def test_user_code_traceback_rolls_back_and_never_evicts(brctl: Any, ssh_cluster: SshCluster,
                                                         tmp_path: Path, state_dir: Path) -> None:
    inv = _inventory(tmp_path, ssh_cluster, 1, {})
    logs = _logs(tmp_path, ssh_cluster, "node03", "logs_user_code.log")
    res, doc = _run(brctl, inv, "--logs", str(logs))
    assert res.exit_code == 1
    assert doc["symptom"] == "user-code" and doc["matched_nodes"] == ["node03"]
    assert doc["stages"] == [] and doc["faulty"] == []
    assert doc["decision"] == "rollback" and "KeyError" in doc["evidence"][0]["text"]


@pytest.mark.slow
def test_live_training_processes_refuse_and_force_proceeds(brctl: Any, ssh_cluster: SshCluster,
                                                           tmp_path: Path,
                                                           state_dir: Path) -> None:
    inv = _inventory(tmp_path, ssh_cluster, 1, {}, process_match=TAG)
    books = tmp_path / "books"  # a one-stage playbook keeps the --force run short
    books.mkdir()
    (books / "eud-only.yaml").write_text(
        "name: eud-only\nsymptom: test\nmatch: [{log: never-in-these-logs}]\n"
        "stages: [{name: eud}]\n")
    with start_trainjob(ssh_cluster, tmp_path / "job", nodes=["node02"], nproc=1,
                        step_seconds=0.5) as job:
        wait_for(lambda: job.pids("node02"), "the training job's rank on node02")
        refused = brctl("-i", inv, "--json", "diagnose", "--playbooks", books,
                        "--symptom", "eud-only")
        assert refused.exit_code == 4, refused.stderr
        error = validated(json.loads(refused.stdout))  # refused before any verdict: the error document only
        assert error["schema"] == "brctl.error/1" and error["status"] == "refused", error
        assert "alive on node02" in error["message"] and "--force" in error["hint"]
        assert "alive on node02" in refused.stderr and "--force" in refused.stderr
        res, doc = _run(brctl, inv, "--force", "--playbooks", str(books), "--symptom", "eud-only")
    # No dcgmi anywhere: the only stage skipped every machine. Untested is not clean.
    assert res.exit_code == 3, res.stderr
    assert [s["name"] for s in doc["stages"]] == ["eud"]
    assert doc["stages"][0]["nodes_tested"] == [] and doc["faulty"] == []
    assert "dcgmi not found" in doc["stages"][0]["skipped"][0]
    assert sorted(doc["incomplete"]) == ssh_cluster.names
    assert "no stage could test anything" in doc["reason"] and "passed" not in doc["reason"]
