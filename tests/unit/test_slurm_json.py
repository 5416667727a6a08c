"""Slurm's JSON across releases (issue 35, item 4): every data parser's shapes read alike,
an entry brctl cannot read is exit 3 naming the field and the data parser (never "no such
job"), and a lookup asks for one job (or one user's jobs), never the whole queue.

The fixtures (tests/fixtures/slurm/) are written from SchedMD's data_parser source for each
release, the provenance in each file's header; 22.05 is also checked live
(tests/integration/test_slurm_job.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from brctl.config.slurm import SlurmJobSection, SlurmSection
from brctl.core.errors import IncompleteError, InputError
from brctl.core.nodeset import expand
from brctl.operations.slurm.hooks import SlurmHooks
from brctl.operations.slurm.job import Slurm

FIXTURES = Path(__file__).parent.parent / "fixtures" / "slurm"
PARSERS = ["v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43"]
RELEASE = {"v0.0.38": "22.05.8", "v0.0.39": "23.02.7", "v0.0.40": "23.11.10",
           "v0.0.41": "24.05.8", "v0.0.42": "24.11.7", "v0.0.43": "25.05.8"}
GONE = b"slurm_load_jobs error: Invalid job id specified\n"


def fixture(kind: str, parser: str) -> dict[str, Any]:
    """A fixture's document (its '#' header lines are the provenance, not JSON)."""
    text = (FIXTURES / f"{kind}-{parser}.json").read_text()
    doc = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    assert isinstance(doc, dict)
    return doc


class Canned(Slurm):
    """Slurm whose client commands answer from documents: ``squeue --json`` (23.02+), 22.05's
    ``squeue -O`` text (from the same jobs), node documents; each call recorded."""

    def __init__(self, release: str, jobs: dict[str, Any], nodes: Optional[dict[str, Any]] = None,
                 answer: Optional[Callable[[Sequence[str]], Optional[tuple[int, bytes, bytes]]]] = None
                 ) -> None:
        super().__init__(SlurmSection())
        self.release, self.jobs_doc, self.nodes_doc, self.answer = release, jobs, nodes, answer
        self.calls: list[tuple[str, ...]] = []

    def _call(self, argv: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
        self.calls.append(tuple(argv))
        got = self.answer(argv) if self.answer is not None else None
        rc, out, err = got if got is not None else self._answer(list(argv))
        return subprocess.CompletedProcess(list(argv), rc, out, err)

    def _answer(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        if argv == ["squeue", "--version"]:
            return 0, f"slurm {self.release}\n".encode(), b""
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return 0, "".join(f"{n}\n" for n in expand(argv[3])).encode(), b""
        if argv[:2] in (["sinfo", "--json"], ["scontrol", "--json"]):
            return 0, json.dumps(self.nodes_doc).encode(), b""
        entries = self.jobs_doc["jobs"]
        wanted = [e for e in entries if _matches(e, argv)]
        if "-j" in argv and not wanted:
            return 1, b"", GONE
        if argv[:2] == ["squeue", "--json"]:
            return 0, json.dumps({**self.jobs_doc, "jobs": wanted}).encode(), b""
        if "-O" in argv:  # 22.05's text form
            return 0, "".join(_text_line(e) for e in wanted).encode(), b""
        if argv[-2:] == ["-o", "%i|%x|"]:
            return 0, "".join(f"{e['job_id']}|{e['excluded_nodes']}|\n" for e in wanted).encode(), b""
        raise AssertionError(f"unexpected call {argv}")


def _matches(entry: dict[str, Any], argv: list[str]) -> bool:
    def arg(flag: str) -> Optional[str]:
        return argv[argv.index(flag) + 1] if flag in argv else None
    job, user, name = arg("-j"), arg("-u"), arg("-n")
    array, task = (v.get("number") if isinstance(v, dict) else v
                   for v in (entry["array_job_id"], entry["array_task_id"]))
    return ((job is None or job in (str(entry["job_id"]), str(array), f"{array}_{task}")) and
            (user is None or entry["user_name"] == user) and (name is None or entry["name"] == name))


def _text_line(entry: dict[str, Any]) -> str:
    state = entry["job_state"]
    array, task = entry["array_job_id"], entry["array_task_id"]
    shown = f"{array}_{task}" if array else str(entry["job_id"])
    return (f"{shown}|{state}|{entry['nodes']}|{entry['restart_cnt']}|{entry['user_name']}|"
            f"{entry['required_nodes']}|{entry['state_reason']}|\n")


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _slurm(parser: str, **kw: Any) -> Canned:
    return Canned(RELEASE[parser], fixture("squeue", parser), fixture("nodes", parser), **kw)


def test_every_data_parser_reads_alike(parser: str) -> None:
    slurm = _slurm(parser)
    job = slurm.find(SlurmJobSection(job="8"))
    assert (job.job_id, job.state, job.nodes, job.user, job.restarts) == \
        ("8", "RUNNING", ("node01", "node02"), "alice", 0)
    assert slurm.job("10").state == "COMPLETING"  # type: ignore[union-attr]  # a flag wins, as in text
    task = slurm.job("20_3")
    assert task is not None and (task.state, task.nodelist) == ("RUNNING", "node04")
    held = slurm.job("30")
    assert held is not None and (held.state, held.restarts, held.reason) == \
        ("REQUEUE_HOLD", 1, "JobHeldAdmin")
    assert (held.required, held.excluded) == ("node[01,03]", "node02")
    assert SlurmHooks(slurm, "8").running() is True and SlurmHooks(slurm, "30").running() is None
    nodes = slurm.nodes()
    assert {n: (v.state, v.flags, v.gpus, v.partitions) for n, v in nodes.items()} == {
        "node01": ("idle", (), 2, ("batch",)), "node02": ("idle", ("DRAIN",), 2, ("batch",)),
        "node03": ("allocated", (), 2, ("batch",))}
    assert nodes["node01"].idle and nodes["node02"].drained and nodes["node02"].reason == "bad fan"


def test_a_lookup_asks_for_one_job_never_the_queue(parser: str) -> None:
    slurm = _slurm(parser)
    slurm.find(SlurmJobSection(job="30"))
    slurm.find(SlurmJobSection(name="old", user="alice"))
    asked = [c for c in slurm.calls if c[0] == "squeue" and c[1:] != ("--version",)]
    assert asked and all("-j" in c or "-u" in c for c in asked), asked
    if parser == "v0.0.38":  # 22.05: --json ignores -j; the text form prints no name
        assert all("--json" not in c for c in asked) and all("%j" not in " ".join(c) for c in asked)
        fields = {f.split(":")[0] for c in asked if "-O" in c for f in c[c.index("-O") + 1].split(",")}
        assert fields and not fields & {"Name", "Comment", "WorkDir", "Command", "AdminComment"}


def test_a_gone_job_is_gone_and_a_name_is_its_users(parser: str) -> None:
    slurm = _slurm(parser)
    with pytest.raises(InputError, match="Slurm has no job 77"):
        slurm.find(SlurmJobSection(job="77"))
    assert SlurmHooks(slurm, "77").running() is False
    # bob's held job of the same name is not alice's job
    job = slurm.find(SlurmJobSection(name="train", user="alice"))
    assert (job.job_id, job.user) == ("8", "alice")
    with pytest.raises(InputError, match="Slurm has no job named 'train' \\(user carol\\)"):
        slurm.find(SlurmJobSection(name="train", user="carol"))


BAD_JOB = [("job_state", 42), ("job_state", []), ("job_state", ["FROBNICATED"]), ("job_id", "8 x"),
           ("job_id", None), ("restart_cnt", {"set": "yes", "number": 1}), ("restart_cnt", -1),
           ("nodes", ["node01"]), ("user_name", 7), ("array_task_id", True)]


@pytest.mark.parametrize(("field", "value"), BAD_JOB)
def test_an_unreadable_job_is_exit_3_naming_field_and_parser(parser: str, field: str, value: Any) -> None:
    if parser == "v0.0.38":
        pytest.skip("22.05's lookup is the text form (below)")
    doc = fixture("squeue", parser)
    doc["jobs"][0][field] = value
    whole = json.dumps(doc).encode()  # as if Slurm answered -j 8 with this entry
    slurm = Canned(RELEASE[parser], doc, answer=lambda argv: (0, whole, b"") if "--json" in argv else None)
    with pytest.raises(IncompleteError) as info:
        slurm.find(SlurmJobSection(job="8"))
    assert info.value.code == 3
    assert f"field {field!r}" in info.value.message and parser in info.value.message, info.value.message
    assert "has no" not in info.value.message


@pytest.mark.parametrize("line", ["8|RUNNING|node01|", "8|RUNNING|node01|x|alice||None|",
                                  "8|RUNNING|node01|\u00b2|alice||None|",
                                  "8 7|RUNNING|node01|0|alice||None|", "8|run ning|n|0|a||None|"])
def test_unreadable_22_05_text_is_exit_3(line: str) -> None:
    slurm = Canned("22.05.8", {"jobs": []}, answer=lambda argv: (0, line.encode() + b"\n", b"")
                   if "-O" in argv else None)
    with pytest.raises(IncompleteError, match=r"squeue .*-j 8.*\(Slurm 22\.5, text\): line 1") as info:
        slurm.find(SlurmJobSection(job="8"))
    assert info.value.code == 3


@pytest.mark.parametrize(("field", "value"), [("state", 3), ("state", ["DRAIN"]), ("name", ""),
                                              ("partitions", [1]), ("reason", ["x"])])
def test_an_unreadable_machine_is_exit_3(parser: str, field: str, value: Any) -> None:
    doc = fixture("nodes", parser)
    doc["nodes"][1][field] = value
    slurm = Canned(RELEASE[parser], fixture("squeue", parser), doc)
    with pytest.raises(IncompleteError) as info:
        slurm.nodes()
    assert f"nodes[1]: field {field!r}" in info.value.message and parser in info.value.message


def test_the_machines_come_from_scontrol_from_23_02() -> None:
    # 23.02's sinfo --json is a summary by state ("sinfo": [...]), with no machine list
    slurm = _slurm("v0.0.39")
    slurm.nodes()
    assert ("scontrol", "--json", "show", "nodes") in slurm.calls
    assert not any(c[0] == "sinfo" for c in slurm.calls)


@pytest.mark.parametrize("answer", [b"{truncated", b"[]", json.dumps({"jobs": "x"}).encode(),
                                    b'{"jobs": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                                    b'{"jobs": [{"job_id": 1, "job_state": ' + b"[" * 900 +
                                    b"]" * 900 + b"}]}"])
def test_malformed_squeue_output_is_exit_3(answer: bytes) -> None:
    slurm = Canned("23.11.0", {"jobs": []},
                   answer=lambda argv: (0, answer, b"") if "--json" in argv else None)
    with pytest.raises(IncompleteError):
        slurm.find(SlurmJobSection(job="1"))


def test_22_05_text_reads_a_reason_last() -> None:
    line = b"8|PENDING||2|alice|node[01-02]|Resources|odd|\n"
    slurm = Canned("22.05.8", {"jobs": []}, answer=lambda argv: (0, line, b"") if "-O" in argv
                   else (0, b"8|node03|\n", b"") if "%i|%x|" in argv else None)
    job = slurm.job("8")
    assert job is not None and (job.state, job.restarts, job.required, job.reason, job.excluded) == \
        ("PENDING", 2, "node[01-02]", "Resources|odd", "node03")
    with pytest.raises(InputError, match="a name needs its user"):
        slurm.find(SlurmJobSection(name="train"))


def test_slurm_that_does_not_say_its_release_is_exit_3() -> None:
    slurm = Canned("x", {"jobs": []}, answer=lambda argv: (0, b"what?\n", b"")
                   if "--version" in argv else None)
    with pytest.raises(IncompleteError, match="not a Slurm release"):
        slurm.find(SlurmJobSection(job="1"))
