"""brctl stacks over the real sshd cluster against a real gloo training job.

Four machines (each its own PID namespace, so each sees only its own ranks), two
ranks per machine, pp=2, dp=4: stage 0 is ranks 0-3 on node01-02, stage 1 ranks
4-7 on node03-04, and PP group 0 = ranks {0, 4} = node01 + node03. Real py-spy
dumps every rank; brctl runs its probe with the node's python over ssh.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kits.cluster import SshCluster, scaled
from tests.kits.trainjob import TAG, start_trainjob

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = {"tp": 1, "pp": 2, "process_match": TAG}


def _write_inventory(cluster: SshCluster, tmp_path: Path) -> Path:
    import yaml

    inv = cluster.inventory(job=JOB, python=sys.executable)
    for entry in inv["nodes"]:
        entry["gpus"] = 2
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _saved_ranks(save: Path) -> dict[str, list[int]]:
    return {d.name: sorted(int(f.name.split("-")[0]) for f in d.iterdir())
            for d in sorted(save.iterdir()) if d.is_dir() and not d.name.startswith("round-")}


def test_hung_rank_evicts_its_pp_group(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    inv = _write_inventory(ssh_cluster, tmp_path)
    with start_trainjob(ssh_cluster, tmp_path / "job", nproc=2, pp=2,
                        env={"TRAINJOB_HANG_RANK": "0", "TRAINJOB_FAULT_STEP": "3"}) as job:
        job.wait_step(2, rank=5)
        time.sleep(scaled(1.0))  # the others reach their wait on rank 0
        assert job.last_step(0) == 2  # rank 0 hangs before logging step 3
        save = tmp_path / "save"
        res = brctl("-i", inv, "--json", "stacks", "--rounds", "2", "--interval", "0.5",
                    "--save", save)
        assert res.exit_code == 1, res.stderr
        doc = res.json
        # each machine saw exactly its own two ranks (PID namespaces) and py-spy dumped them
        assert _saved_ranks(save) == {n: job.ranks_on(n) for n in ssh_cluster.names}
        dump = json.loads(next((save / "node01").glob("0-*.json")).read_text())
        main = next(t for t in dump if t["os_thread_id"] == t["pid"])
        assert "stuck_in_data_loader" in [f["name"] for f in main["frames"]]
        assert {(o["rank"], o["node"]) for o in doc["outliers"]} == {(0, "node01"), (4, "node03")}
        assert doc["schema"] == "brctl.stacks/2"
        [group] = doc["suspect_groups"]
        assert (group["kind"], group["indices"], group["members"]) == (
            "pp", [0], ["node01", "node03"])
        assert "all 2 outlier ranks" in group["why"]
        assert doc["evict"] == ["node01", "node03"] and job.machine_of(0) in doc["evict"]
        sigs = {c["ranks"]: c["signature"][-2:] for c in doc["classes"]}
        assert any("stuck_in_data_loader" in s[-1] for s in sigs.values())
        assert doc["nodes"]["node01"]["workers"] == 2  # the data-loader workers, not ranks
        # offline analysis of what was saved gives the same verdict
        again = brctl("--json", "stacks", "--from", save)
        assert again.exit_code == 1 and again.json["evict"] == doc["evict"]
        human = brctl("stacks", "--from", save)
        assert "rank 0 (1)" in human.stdout and "evict: node[01,03]" in human.stdout


def test_slow_rank_evicts_its_pp_group(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    inv = _write_inventory(ssh_cluster, tmp_path)
    with start_trainjob(ssh_cluster, tmp_path / "job", nproc=2, pp=2,
                        env={"TRAINJOB_SLOW_RANK": "0", "TRAINJOB_SLOW_SECONDS": "2.5"}) as job:
        first = job.wait_step(1, rank=7)
        res = brctl("-i", inv, "--json", "stacks", "--rounds", "3", "--interval", "1")
        assert res.exit_code == 1, res.stderr
        assert job.wait_step(first + 2, rank=7) > first  # slow, not hung: steps still advance
        doc = res.json
        assert doc["rounds"] == 3
        # Rank 0 is slow and its pipeline peer (rank 4, node03) waits on it: when most
        # rounds see both, the PP group {node01, node03} is named. On a loaded machine
        # the dumps of one round are not simultaneous and some rounds catch rank 0
        # alone; the vote (outliers per member) may then name its own machine, the
        # smaller group. A round can also catch rank 0 as its stage is released (it
        # spends ~0.1 s of each step outside slow_compute) while rank 4 still waits:
        # that is why rank 0 is slowed well past a round's spread. Either way the
        # slow machine is evicted and nothing outside its PP group.
        [suspect] = doc["suspect_groups"]
        assert (suspect["kind"], suspect["indices"], doc["evict"]) in (
            ("pp", [0], ["node01", "node03"]), ("tp", [0], ["node01"])), suspect
        assert {o["rank"] for o in doc["outliers"]} >= {0}
