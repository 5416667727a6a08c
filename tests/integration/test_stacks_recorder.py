"""brctl stacks reads the flight recorder of a real hung gloo job over the sshd cluster.

One 8-rank job, TP2 PP2 DP2 over four machines (two ranks each, Megatron's order:
node04 holds ranks 6 and 7 of stage 1), opted in with ``brctl.job`` and run as an
unprivileged uid. Rank 7 skips its data-parallel all_reduce at step 4 and goes on
to the world's loss all_reduce, so the job hangs: rank 5 waits in
``DATA_PARALLEL_GROUP`` sequence 4 (members 5 and 7), everyone else in the loss
all_reduce. The one hang serves three reads: with ptrace and the sockets; without
the sockets (the job's socket directory moved away: a job that did not opt in);
and with the probe denied ``CAP_SYS_PTRACE`` (py-spy and environ refused: the
sockets alone).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kits.cluster import SshCluster
from tests.kits.frjob import start_frjob
from tests.kits.trainjob import TAG
from tests.kits.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UID = 61032  # the job's user: an unprivileged uid no one else here runs as
SOCKETS = Path(f"/tmp/brctl-job-{UID}")  # brctl.job's default directory for that uid


def _inventory(cluster: SshCluster, tmp_path: Path, python: str = sys.executable, *,
               tp: int = 2, pp: int = 2, gpus: int = 2, names: list[str] | None = None) -> Path:
    import yaml

    inv = cluster.inventory(names=names, job={"tp": tp, "pp": pp, "process_match": TAG},
                            python=python)
    for entry in inv["nodes"]:
        entry["gpus"] = gpus
    path = tmp_path / f"inventory-{Path(python).name}.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _no_ptrace_python(tmp_path: Path) -> str:
    """An interpreter for the probe that cannot ptrace: the machine's sshd without
    CAP_SYS_PTRACE, as a container without SYS_PTRACE runs it."""
    wrapper = tmp_path / "python-no-ptrace"
    wrapper.write_text("#!/bin/sh\nexec setpriv --bounding-set=-sys_ptrace "
                       f"--inh-caps=-sys_ptrace {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def _saved_group(save: Path, node: str, rank: int, desc: str) -> dict[str, Any]:
    """The group ``desc`` of ``rank``'s saved recorder, summarised as the probe does."""
    from brctl.diagnostics.recorder import summarise

    [meta] = (save / node).glob(f"{rank}-*.fr-meta.json")
    dump = json.loads(meta.with_name(meta.name.replace("-meta", "")).read_text())
    info = json.loads(meta.read_text())
    summary = summarise(dump, info["table"], info["clock_ns"])
    [group] = [g for g in summary["groups"].values() if g["desc"] == desc]
    return dict(group)


def _assert_rank7_named(code: int, doc: dict[str, Any], main_thread: bool) -> None:
    """Rank 7's machine is evicted, and only it; the evidence names group and sequence;
    rank 5, which waits on it in that group, is not blamed."""
    assert (code, doc["evict"]) == (1, ["node04"]), doc
    assert [o["rank"] for o in doc["outliers"]] == [7], doc["outliers"]
    [culprit] = doc["collective_culprits"]
    assert (culprit["rank"], culprit["seq"]) == (7, 4), culprit
    text = "rank 7 never entered all_reduce #4 of DATA_PARALLEL_GROUP (ranks 5,7)"
    [suspect] = doc["suspect_groups"]
    assert text in suspect["evidence"][0] and suspect["members"] == ["node04"], suspect
    assert ("its main thread:" in suspect["evidence"][0]) is main_thread
    assert doc["ranks"]["7"]["collectives"] is not None


def _wait_log(job: Any, rank: int, text: str, timeout: float = 120) -> None:
    wait_for(lambda: text in job.log(rank), f"rank {rank} to log {text!r}", timeout, every=0.2)


@pytest.fixture
def job_sockets() -> Iterator[Path]:
    """brctl.job's default directory of the job's uid, empty before and removed after
    (SIGKILLed ranks leave their sockets)."""
    shutil.rmtree(SOCKETS, ignore_errors=True)
    try:
        yield SOCKETS
    finally:
        shutil.rmtree(SOCKETS, ignore_errors=True)


def test_a_skipped_collective_read_three_ways(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any], job_sockets: Path
) -> None:
    inv = _inventory(ssh_cluster, tmp_path)
    with start_frjob(ssh_cluster, tp=2, pp=2, nproc=2, uid=UID,
                     env={"FRJOB_SKIP_RANK": "7", "FRJOB_FAULT_STEP": "4"}) as job:
        # 8 torch ranks start on 2 cores beside another xdist worker: once that took over
        # 120 s to reach step 4 (the run alone: ~40 s), so the outer bound is generous
        _wait_log(job, 7, "skipped dp all_reduce", timeout=300)
        for rank in range(8):
            _wait_log(job, rank, "step 3 loss")

        # 1. ptrace allowed, sockets served
        save = tmp_path / "save"
        res = brctl("-i", inv, "--json", "stacks", "--rounds", "2", "--interval", "6",
                    "--save", save)
        doc = res.json
        reads = doc["ranks"]
        assert sorted(reads, key=int) == [str(r) for r in range(8)], reads
        for rank, read in reads.items():
            assert (read["channel"], read["state"], read["table"], read["traceback"]) == (
                "brctl-socket", "read", True, True), (rank, read)
            assert read["node"] == job.machine_of(int(rank)) and read["stack_error"] is None
        _assert_rank7_named(res.exit_code, doc, main_thread=True)
        # the evidence as saved: the recorder as each rank answered, its clock and table
        dp = {r: _saved_group(save, job.machine_of(r), r, "DATA_PARALLEL_GROUP")
              for r in (5, 7)}
        assert dp[5]["ranks"] == dp[7]["ranks"] == [5, 7]
        assert dp[5]["pending"]["seq"] == 4 and dp[5]["pending"]["op"] == "all_reduce"
        assert dp[7]["last_enqueued"] == 3 and dp[7]["pending"] is None
        # and reloaded offline, the saved recorders give the same verdict
        again = brctl("--json", "stacks", "--from", save)
        assert (again.exit_code, again.json["evict"]) == (1, ["node04"]), again.json

        # 2. the same job as one that did not opt in: no socket where brctl looks
        hidden = SOCKETS.with_name(SOCKETS.name + ".hidden")
        SOCKETS.rename(hidden)
        try:
            res = brctl("-i", inv, "--json", "stacks")
        finally:
            hidden.rename(SOCKETS)
        assert {r["channel"] for r in res.json["ranks"].values()} == {"none"}
        assert {r["state"] for r in res.json["ranks"].values()} == {"read"}  # py-spy read them
        # today's output: every rank in one all_reduce stack, nothing to evict
        assert (res.exit_code, res.json["evict"], res.json["outliers"]) == (0, [], []), res.json
        assert [c["ranks"] for c in res.json["classes"]] == ["0-7"]

        # 3. the probe may not ptrace: py-spy and environ refused, the sockets remain
        denied = _inventory(ssh_cluster, tmp_path, _no_ptrace_python(tmp_path))
        res = brctl("-i", denied, "--json", "stacks", "--rounds", "2", "--interval", "6")
        doc = res.json
        reads = doc["ranks"]
        assert sorted(reads, key=int) == [str(r) for r in range(8)], (reads, res.stderr)
        for rank, read in reads.items():
            assert "py-spy may not ptrace" in read["stack_error"], read  # refused, and why
            assert (read["channel"], read["state"]) == ("brctl-socket", "read"), (rank, read)
            assert read["node"] == job.machine_of(int(rank))
        # the verdict from the recorders alone (no rank is unread: each socket read it)
        _assert_rank7_named(res.exit_code, doc, main_thread=False)


def test_a_healthy_job_then_a_rank_holding_the_gil(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    names = ssh_cluster.names[:2]
    inv = _inventory(ssh_cluster, tmp_path, tp=1, pp=1, gpus=1, names=names)
    trigger = tmp_path / "hold-the-gil"
    with start_frjob(ssh_cluster, tp=1, pp=1, nproc=1, nodes=names,
                     env={"FRJOB_GIL_RANK": "1", "FRJOB_FAULT_STEP": "3",
                          "FRJOB_GIL_FILE": str(trigger)}) as job:
        _wait_log(job, 1, "step 3 loss")
        # healthy, captured mid-collective twice: in flight is not stuck
        res = brctl("-i", inv, "--json", "stacks", "--rounds", "2", "--interval", "0.5")
        doc = res.json
        assert (res.exit_code, doc["evict"], doc["collective_culprits"]) == (0, [], []), doc
        assert {r["state"] for r in doc["ranks"].values()} == {"read"}
        assert all(g["verdict"] != "stuck" for g in doc["collective_groups"]), doc
        trigger.touch()
        _wait_log(job, 1, "holding the GIL")
        res = brctl("-i", inv, "--json", "stacks", "--rounds", "2", "--interval", "6")
        reads = res.json["ranks"]
        # the native recorder answers; brctl's facts and the traceback (Python) do not
        assert (reads["1"]["state"], reads["1"]["table"], reads["1"]["traceback"]) == (
            "read", False, False), reads["1"]
        assert "no answer in time" in reads["1"]["error"]
        assert (reads["0"]["table"], reads["0"]["traceback"]) == (True, True), reads["0"]
        # named, with its group's members from rank 0's table (its own did not answer)
        assert (res.exit_code, res.json["evict"]) == (1, ["node02"]), res.json
        [suspect] = res.json["suspect_groups"]
        assert "rank 1 never entered all_reduce" in suspect["evidence"][0]
        assert "DATA_PARALLEL_GROUP (ranks 0,1)" in suspect["evidence"][0]
        assert "hold_gil_in_native_code" in suspect["evidence"][0]


def test_a_slow_first_stage_then_a_slow_last_stage_named_from_one_capture(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any]
) -> None:
    """PP2 DP2 over two machines (rank = d + 2·stage: node01 is stage 0, node02 stage 1;
    each data-parallel group on one machine, one clock). A slow stage-0 rank delays its
    pipeline successor too, which is its victim; a slow last-stage rank delays no one
    downstream. Each is named from one capture of arrival times."""
    names = ssh_cluster.names[:2]
    inv = _inventory(ssh_cluster, tmp_path, tp=1, pp=2, gpus=2, names=names)
    slow = tmp_path / "slow"
    with start_frjob(ssh_cluster, tp=1, pp=2, nproc=2, nodes=names, step_seconds=0.05,
                     env={"FRJOB_SLOW_FILE": str(slow)}) as job:
        job.wait_step(1, rank=3)
        for rank, machine in ((0, "node01"), (3, "node02")):
            slow.write_text(f"{rank} 0.1")
            begun = job.last_step(3)
            job.wait_step(begun + 22, rank=3)  # the recorders' window: all slow steps
            res = brctl("-i", inv, "--json", "stacks", "--rounds", "1")
            doc = res.json
            assert (res.exit_code, doc["evict"]) == (1, [machine]), doc
            named = [s for s in doc["stragglers"] if s["role"] == "straggler" and s["trusted"]]
            assert {s["rank"] for s in named} == {rank}, doc["stragglers"]
            assert doc["straggler_threshold_ms"] == 20
