"""brctl replay over the real sshd cluster with the real torch workload (gloo on CPU).

Eight machines, two CPU "GPUs" (ranks) each, PP=2, so stage 0 is node01-04 and
stage 1 node05-08 and DP'=2 makes four groups of two machines per round. Silent
data corruption is injected by the test only: a ``sitecustomize`` on one node's
``PYTHONPATH`` (``tests/kits/replay_fault.py``) flips one bit of one matmul output per
step in every rank on that machine. The groups rendezvous over TCP at their first
node's own 127.0.0.N address (gloo on ``lo``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kits.cluster import SshCluster, scaled
from tests.kits.replay_fault import write_fault

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("torch")


def _inventory(cluster: SshCluster, tmp_path: Path, gpus: int, pp: int,
               faults: Mapping[str, dict[str, str]]) -> Path:
    env = {n: {"GLOO_SOCKET_IFNAME": "lo", **faults.get(n, {})} for n in cluster.names}
    inv = cluster.inventory(job={"tp": 1, "pp": pp}, node_env=env, python=sys.executable)
    for entry in inv["nodes"]:
        entry["gpus"] = gpus
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _replay(brctl: Callable[..., Any], inv: Path, *args: str) -> Any:
    res = brctl("-i", inv, "--json", "replay", "--steps", "3", "--device", "cpu",
                "--timeout", str(int(scaled(240))), *args)
    assert "Traceback" not in res.stderr
    return res


def _deviant(rnd: dict[str, Any]) -> list[list[str]]:
    return [g["members"] for g in rnd["groups"] if g["deviant"]]


def test_one_corrupting_machine_is_named_in_two_rounds(
    make_cluster: Callable[..., SshCluster], tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    cluster = make_cluster(8)
    bad = "node07"
    inv = _inventory(cluster, tmp_path, 2, 2, {bad: write_fault(tmp_path / "fault")})
    res = _replay(brctl, inv)
    assert res.exit_code == 1, res.stderr
    doc = res.json
    assert (doc["verdict"], doc["faulty"]) == ("found", [bad])
    assert [r["kind"] for r in doc["rounds"]] == ["horizontal", "vertical"]
    r1, r2 = doc["rounds"]
    # one deviant group per round, both holding the faulty machine, meeting only there
    assert _deviant(r1) == [["node03", bad]]
    [v] = _deviant(r2)
    assert set(v) & {"node03", bad} == {bad}
    # the healthy groups agree bitwise; the losses are real training losses
    healthy = {g["fingerprint"] for r in doc["rounds"] for g in r["groups"] if not g["deviant"]}
    assert len(healthy) == 1
    run = r1["groups"][0]["runs"][0]
    assert len(run["steps"]) == 3 and all(2.0 < x < 6.0 for x in run["losses"])
    assert set(doc["cleared"]) == ({"node03"} | set(v)) - {bad}


def test_no_fault_is_none_after_one_round(
    make_cluster: Callable[..., SshCluster], tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    cluster = make_cluster(8)
    # One rank per machine: the groups (machines per stage) are the same as with two, and
    # two ranks per machine are exercised by the test above; half the torch start-ups.
    res = _replay(brctl, _inventory(cluster, tmp_path, 1, 2, {}))
    assert res.exit_code == 0, res.stderr
    doc = res.json
    assert (doc["verdict"], doc["faulty"], len(doc["rounds"])) == ("none", [], 1)
    assert len({g["fingerprint"] for g in doc["rounds"][0]["groups"]}) == 1


def test_a_fault_that_fires_once_is_not_reproduced(
    make_cluster: Callable[..., SshCluster], tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    cluster = make_cluster(8)
    once = write_fault(tmp_path / "fault", once=tmp_path / "fired")
    res = _replay(brctl, _inventory(cluster, tmp_path, 1, 2, {"node02": once}), "--repeat", "2")
    assert res.exit_code == 1, res.stderr
    doc = res.json
    assert doc["verdict"] == "not_reproduced" and doc["faulty"] == []
    assert "node02" in doc["candidates"]
    [group] = [g for g in doc["rounds"][0]["groups"] if "node02" in g["members"]]
    assert group["status"] == "unconfirmed"
    assert [r["steps"] == doc["rounds"][0]["groups"][0]["runs"][0]["steps"]
            for r in group["runs"]] == [False, True]
    assert (tmp_path / "fired").exists()


@pytest.mark.slow
@pytest.mark.timeout(scaled(600))  # three rounds of 12 machines: 79-93 s here, once over 300 s in a full run
def test_two_corrupting_machines_are_resolved_by_a_third_round(
    make_cluster: Callable[..., SshCluster], tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    # 12 machines, one rank each, PP=3: four groups of three (one per stage). node02
    # (stage 0, group 1) and node09 (stage 2, group 0) leave four candidates after
    # two rounds; the third round replays each with known-good machines.
    cluster = make_cluster(12)
    fault = write_fault(tmp_path / "fault")
    inv = _inventory(cluster, tmp_path, 1, 3, {"node02": fault, "node09": fault})
    res = _replay(brctl, inv)
    assert res.exit_code == 1, res.stderr
    doc = res.json
    assert (doc["verdict"], sorted(doc["faulty"])) == ("found", ["node02", "node09"])
    assert [r["kind"] for r in doc["rounds"]] == ["horizontal", "vertical", "confirm"]
    confirm = doc["rounds"][2]["groups"]
    tested = {g["suspect"]: g["deviant"] for g in confirm}
    assert {s for s, dev in tested.items() if dev} == {"node02", "node09"}
    cleared = {s for s, dev in tested.items() if not dev}
    assert len(cleared) == 2 and cleared <= set(doc["cleared"])


def test_one_machine_per_stage_is_found_with_a_control_job_off_its_stage(
    make_cluster: Callable[..., SshCluster], tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    # 6 machines, one rank each, PP=2: three groups of (stage 0, stage 1). node05 alone
    # deviates, but its stage's two others (node04, node06) corrupting alike would look the
    # same in every such job: the control job runs stage 1 on a stage-0 machine, and its
    # fingerprint is the healthy one bit for bit (the workload is the slot's, not the
    # machine's).
    cluster = make_cluster(6)
    bad = "node05"
    inv = _inventory(cluster, tmp_path, 1, 2, {bad: write_fault(tmp_path / "fault")})
    res = _replay(brctl, inv)
    assert res.exit_code == 1, res.stderr
    doc = res.json
    assert (doc["verdict"], doc["faulty"]) == ("found", [bad]), doc.get("reason")
    assert [r["kind"] for r in doc["rounds"]] == ["horizontal", "vertical", "confirm"]
    confirm = doc["rounds"][2]["groups"]
    [control] = [g for g in confirm if not g.get("suspect")]
    assert set(control["members"]) <= {"node01", "node02", "node03"}, control
    assert not control["deviant"]
    healthy = {g["fingerprint"] for g in doc["rounds"][0]["groups"] if not g["deviant"]}
    assert {control["fingerprint"]} == healthy
