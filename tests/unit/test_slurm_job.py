"""``job.slurm`` and ``slurm:`` in the inventory (strict schema, errors at their line), and
the parsing of what Slurm's client commands print (hostile or malformed answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from brctl.config.slurm import SlurmJobSection, SlurmSection
from brctl.core.errors import IncompleteError, InputError
from brctl.load.inventory import load_inventory
from brctl.operations.slurm.hooks import drain_reason
from brctl.operations.slurm.job import Slurm
from tests.unit.test_slurm_json import Canned

BASE = "nodes:\n  - name: node[01-04]\n"


def _load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE + text)
    return load_inventory(path)


def test_a_slurm_job_has_no_machines_until_asked(tmp_path: Path) -> None:
    inv = _load(tmp_path, "slurm:\n  partition: gpu\njob:\n  slurm:\n    job: 12345\n")
    assert inv.job.slurm == SlurmJobSection(job="12345") and inv.job.nodes == ()
    assert inv.job.source == "Slurm job 12345 (not asked yet)"
    assert inv.slurm == SlurmSection(partition="gpu")
    inv = _load(tmp_path, "job:\n  slurm: {name: pretrain, user: alice}\n")
    assert inv.job.slurm.describe() == "job named 'pretrain' (user alice)"
    # without job.slurm.user, the name is looked up among job.user's jobs
    inv = _load(tmp_path, "job:\n  user: bob\n  slurm: {name: pretrain}\n")
    assert inv.job.slurm == SlurmJobSection(name="pretrain", user="bob")


@pytest.mark.parametrize(("text", "where"), [
    ("job:\n  tp: 1\n", r"inv.yaml:3: job.nodes: required key is missing \(or give job.slurm"),
    ("job:\n  slurm: {job: 1, name: x}\n", r"inv.yaml:4: job.slurm: give the job's id"),
    ("job:\n  slurm: {}\n", r"inv.yaml:4: job.slurm: give the job's id"),
    # a name alone would match every user's jobs (issue 35, item 7)
    ("job:\n  slurm: {name: train}\n", r"inv.yaml:4: job.slurm: a job given by name \('train'\) "
     r"needs its user: job.slurm.user \(or job.user\), or give its id"),
    ("job:\n  slurm:\n    job: '1; scancel -u alice'\n", r"inv.yaml:5: job.slurm.job: got"),
    ("job:\n  slurm:\n    name: --uid=0\n", r"inv.yaml:5: job.slurm.name: got"),
    ("job:\n  slurm:\n    jobid: 7\n", r"inv.yaml:5: job.slurm.jobid: unknown key"),
    ("slurm:\n  partition: gpu\n  timeout: 0\n", r"inv.yaml:5: slurm.timeout: got 0"),
    ("slurm:\n  partiton: gpu\n", r"inv.yaml:4: slurm.partiton: unknown key"),
])
def test_bad_slurm_sections_are_exit_2_at_their_line(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(InputError, match=where) as info:
        _load(tmp_path, text)
    assert info.value.code == 2


def _squeue(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"meta": {"plugin": {"data_parser": "data_parser/v0.0.40"}}, "jobs": list(jobs)}


def _entry(job_id: Any, state: str = "RUNNING", **kw: Any) -> dict[str, Any]:
    return {"job_id": job_id, "job_state": [state], "name": "train", "user_name": "alice",
            "nodes": "node[01-02]", "restart_cnt": 0, "array_job_id": 0, "array_task_id": None,
            "required_nodes": "", "excluded_nodes": "", "state_reason": "None", **kw}


def _canned(*jobs: dict[str, Any], hostnames: str = "node01\nnode02\n") -> Canned:
    def answer(argv: Any) -> Any:
        return (0, hostnames.encode(), b"") if list(argv[:3]) == ["scontrol", "show", "hostnames"] \
            else None
    return Canned("23.11.0", _squeue(*jobs), answer=answer)


def test_the_job_is_picked_from_json() -> None:
    slurm = _canned(_entry(5, "COMPLETED"), _entry(9, "PENDING", nodes=""), _entry(8, "RUNNING"),
                    _entry(6, "COMPLETED", name="other"))
    job = slurm.find(SlurmJobSection(job="8"))
    assert (job.job_id, job.state, job.nodes) == ("8", "RUNNING", ("node01", "node02"))
    assert ("scontrol", "show", "hostnames", "node[01-02]") in slurm.calls
    assert slurm.find(SlurmJobSection(name="train", user="alice")).job_id == "8"  # running
    waiting = slurm.find(SlurmJobSection(job="9"))
    assert waiting.nodes == () and not waiting.running  # never a list while it waits
    with pytest.raises(InputError, match="Slurm has no job 77"):
        slurm.find(SlurmJobSection(job="77"))


def test_the_job_users_own_held_job_of_the_name_is_never_the_job_nor_exit_2() -> None:
    """trust-slurm #1: the job user's ``sbatch -J train --hold`` made two live jobs of the
    name: exit 2 at ``daemon run``'s start, which the unit does not restart on."""
    held = _entry(12, "PENDING", nodes="", state_reason="JobHeldUser")
    want = SlurmJobSection(name="train", user="alice")
    assert _canned(_entry(8, "RUNNING"), held).find(want).job_id == "8"
    waiting = _canned(_entry(8, "PENDING", nodes="", state_reason="BeginTime"), held)
    assert waiting.find(want).job_id == "8"  # the real job, requeued, between runs
    with pytest.raises(IncompleteError, match=r"2 live Slurm jobs .* 8, 13") as info:
        _canned(_entry(8, "RUNNING"), _entry(13, "RUNNING"), held).find(want)
    assert info.value.code == 3


def test_a_finished_name_resolves_to_its_newest_job() -> None:
    slurm = _canned(_entry(5, "COMPLETED"), _entry(11, "FAILED"), _entry(10, "NODE_FAIL"))
    job = slurm.find(SlurmJobSection(name="train", user="alice"))
    assert (job.job_id, job.state, job.nodes) == ("11", "FAILED", ())
    assert "Slurm has no job named 'train' (user bob)" in _no_job(slurm, SlurmJobSection(
        name="train", user="bob"))


def _no_job(slurm: Slurm, want: SlurmJobSection) -> str:
    with pytest.raises(InputError) as info:
        slurm.find(want)
    return info.value.message


@pytest.mark.parametrize("name", ["-rf", "../etc", "node01;reboot", "a b"])
def test_a_hostile_machine_name_from_slurm_is_refused(name: str) -> None:
    slurm = _canned(_entry(3), hostnames=f"node01\n{name}\n")
    with pytest.raises(IncompleteError, match="will not use"):
        slurm.find(SlurmJobSection(job="3"))


def test_drain_reasons_are_one_prefixed_line() -> None:
    assert drain_reason("xid 79\n\x1b[31mred") == "brctl: xid 79 [31mred"
    assert len(drain_reason("x" * 1000)) == 200


@pytest.mark.parametrize(("state", "running"), [
    ("RUNNING", True), ("PENDING", None), ("CONFIGURING", None),
    ("NODE_FAIL", False), ("FAILED", False), ("TIMEOUT", False), ("COMPLETED", False)])
def test_the_jobs_slurm_state_is_the_daemons_running_signal(state: str, running: Any) -> None:
    from brctl.operations.slurm.hooks import SlurmHooks

    slurm = _canned(_entry(3, state), hostnames="node01\n")
    assert SlurmHooks(slurm, "3").running() is running  # a job that is over: a stopped job
    assert SlurmHooks(slurm, "4").running() is False  # gone


def test_the_daemon_reads_the_allocation_only_while_it_runs() -> None:
    from brctl.operations.slurm.hooks import SlurmHooks

    slurm = _canned(_entry(3), _entry(4, "PENDING", restart_cnt=2))
    seen = SlurmHooks(slurm, "3").allocation()
    assert seen is not None and seen.nodes == ("node01", "node02")
    waiting = SlurmHooks(slurm, "4").allocation()
    assert waiting is not None and (waiting.nodes, waiting.restarts) == ((), 2)


def test_a_dry_run_shows_the_builtin_drain_and_resume(tmp_path: Path) -> None:
    from brctl.operations.jobadapter import JobAdapter

    inv = _load(tmp_path, "job:\n  slurm:\n    job: 12345\n")
    adapter = JobAdapter(inv, 10)  # asks Slurm nothing until a hook runs
    assert adapter.evict_preview([], "node02", "xid 79") == (
        "scontrol", "update", "NodeName=node02", "State=DRAIN", f"Reason={drain_reason('xid 79')}")
    assert adapter.unevict_preview([], "node02") == (
        "scontrol", "update", "NodeName=node02", "State=RESUME")
    inv = _load(tmp_path, "job:\n  slurm:\n    job: 12345\n  evict_command: [drain, '{node}']\n")
    assert JobAdapter(inv, 10).evict_preview([], "node02", "x") == ("drain", "node02")
