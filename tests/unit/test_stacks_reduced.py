"""The stacks probe's reduced answer: built from real py-spy JSON, read back, and refused when hostile."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.pyspy import frame_table, parse_dump, reduced_stack
from brctl.analysis.stacks import Frame
from brctl.core.errors import ExitCode
from brctl.core.transport import NodeState, RunResult
from brctl.diagnostics.pyspy_frames import main_frames
from brctl.diagnostics.stacks_probe import reduce_dumps
from brctl.operations import stacks as op
from brctl.remote.probes import ProbeResult, parse_document

DATA = Path(__file__).parent / "data"
GOLDEN_PID = 27080  # the process tests/unit/data/pyspy_dump.json was taken from


def _golden(pid: int = GOLDEN_PID, line: int | None = None) -> str:
    """The real py-spy dump, with its main thread's innermost line changed when asked."""
    threads = json.loads((DATA / "pyspy_dump.json").read_text())
    for t in threads:
        t["pid"] = pid
        if t["thread_name"] == "MainThread":
            t["os_thread_id"] = pid
            if line is not None:
                t["frames"][0]["line"] = line
    return json.dumps(threads, indent=2)


def _answer(dumps: list[dict[str, Any]], world: int = 4) -> dict[str, Any]:
    """The probe's document for ranks 0.. with the given (unreduced) dumps, then reduced."""
    procs = [{"pid": d["pid"], "ppid": 1, "role": "rank", "state": "S", "rank": i,
              "local_rank": i, "world_size": world, "environ_readable": True,
              "rank_pid": d["pid"]} for i, d in enumerate(dumps)]
    doc = {"processes": procs, "py_spy": "/usr/bin/py-spy", "py_spy_missing": False,
           "dumps": dumps, "schema": "brctl.probe/1"}
    doc["frames"] = reduce_dumps(doc["dumps"])
    return doc


def _read(docs: dict[str, Any]) -> dict[str, op.NodeCollection]:
    """The controller's reading of each machine's answer, from the text it printed."""
    results = {}
    for name, doc in docs.items():
        text = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")) + "\n"
        run = RunResult(name, NodeState.OK, 0, text, "", 0.1)
        results[name] = ProbeResult(name, run, *parse_document(run))
    return op.read_answers(results)


def test_the_reduced_answer_reads_back_as_the_stacks_of_the_raw_dumps() -> None:
    texts = [_golden(101), _golden(102, line=7), _golden(103), "garbage", None]
    dumps = [{"pid": 101 + i, "output": t, "seconds": 0.1,
              "error": None if t is not None else "py-spy did not finish within 10s"}
             for i, t in enumerate(texts)]
    doc = _answer(copy.deepcopy(dumps), world=5)
    assert all("output" not in d and "seconds" not in d for d in doc["dumps"])
    assert doc["dumps"][1]["prefix"] == 4 and len(doc["dumps"][1]["stack"]) == 1  # one frame moved
    assert doc["dumps"][3] == {"pid": 104, "error": "unusable py-spy output: not JSON: "
                               "Expecting value: line 1 column 1 (char 0)"}
    assert doc["dumps"][4] == {"pid": 105, "error": "py-spy did not finish within 10s"}
    [node] = _read({"m1": doc}).values()
    assert node.answered
    got = {r.rank: r.stack for r in node.ranks}
    for rank in range(3):
        assert got[rank] == parse_dump(texts[rank] or "", 101 + rank)
    assert got[0] != got[1] and got[0] == got[2]
    assert got[0][0] is got[1][0]  # frames interned across ranks
    assert [(r.rank, r.error) for r in node.ranks if r.stack is None] == [
        (3, doc["dumps"][3]["error"]), (4, "py-spy did not finish within 10s")]


def test_a_reduced_answer_is_a_fraction_of_py_spys_json() -> None:
    texts = [_golden(200 + i, line=i % 3) for i in range(8)]
    raw = {"dumps": [{"pid": 200 + i, "output": t, "seconds": 0.1, "error": None}
                     for i, t in enumerate(texts)]}
    reduced = _answer(copy.deepcopy(raw["dumps"]), world=8)
    assert len(json.dumps(reduced)) * 4 < len(json.dumps(raw))


def test_control_characters_in_a_frame_cannot_break_the_table() -> None:
    threads = [{"pid": 9, "os_thread_id": 9, "frames": [
        {"name": "evil\tname", "short_filename": "a\nb.py", "line": 3},
        {"name": "<module>", "short_filename": "x.py", "line": True}]}]
    frames = main_frames(json.dumps(threads), 9)
    assert frames == [("<module>", "x.py", 0), ("evil\ufffdname", "a\ufffdb.py", 3)]
    doc = _answer([{"pid": 9, "output": json.dumps(threads), "seconds": 0.1, "error": None}], 1)
    [node] = _read({"m1": doc}).values()
    assert node.ranks[0].stack == parse_dump(json.dumps(threads), 9)


def _good() -> dict[str, Any]:
    return _answer([{"pid": 101 + i, "output": _golden(101 + i, line=i), "seconds": 0.1,
                     "error": None} for i in range(2)], world=2)


def _set(path: str, value: Any) -> dict[str, Any]:
    doc = _good()
    *parents, last = path.split(".")
    target: Any = doc
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


HOSTILE = [
    (_set("frames", ["<module>", "a.py", 1]), "frames: expected the frame table's text"),
    (_set("frames", "f\ta.py"), "frames row 0: expected name<TAB>file<TAB>line"),
    (_set("frames", "f\ta.py\t-1"), "frames row 0"),
    (_set("frames", "f\ta.py\t٣"), "frames row 0"),  # a digit, but not an ASCII one
    (_set("dumps.0.stack", [0, 99]), "dumps[0].stack: indices must be integers from 0 to"),
    (_set("dumps.0.stack", [-1]), "dumps[0].stack: indices must be integers"),
    (_set("dumps.0.stack", ["0"]), "dumps[0].stack: indices must be integers"),
    (_set("dumps.0.stack", [[0]]), "dumps[0].stack: indices must be integers"),
    (_set("dumps.0.stack", "0 1 2"), "dumps[0].stack: expected a list of frame indices"),
    (_set("dumps.1.prefix", 99), "dumps[1].prefix must be an integer from 0 to"),
    (_set("dumps.1.prefix", -1), "dumps[1].prefix"),
    (_set("dumps.1.prefix", "4"), "dumps[1].prefix"),
    (_set("dumps.0.pid", "101"), "dumps[0]: expected an object with an integer pid"),
    (_set("dumps.0", [101]), "dumps[0]: expected an object"),
    (_set("dumps.1.error", {"x": 1}), "dumps[1]: error and output must be strings"),
    (_set("dumps.1.output", 12), "dumps[1]: error and output must be strings"),
    (_set("processes.0", "rank 0"), "processes[0]: expected an object"),
    (_set("processes.0.pid", 1.5), "processes[0]: pid must be an integer"),
    (_set("processes", {"0": 1}), "it lacks the processes/dumps lists"),
    (_set("dumps", None), "it lacks the processes/dumps lists"),
]


@pytest.mark.parametrize(("doc", "why"), HOSTILE, ids=[w[:40] for _, w in HOSTILE])
def test_a_malformed_answer_is_that_machines_error_and_the_rest_is_analysed(
        doc: dict[str, Any], why: str) -> None:
    nodes = _read({"m1": _good(), "m2": doc})
    assert nodes["m1"].answered and len(nodes["m1"].ranks) == 2
    assert nodes["m2"].state == "probe_error" and nodes["m2"].ranks == ()
    assert (nodes["m2"].error or "").startswith("malformed stacks probe answer: ")
    assert why in (nodes["m2"].error or "")
    col = op.Collection(nodes, 0.0, 0.0)
    report = op.analyse([col], op.JobShape(("m1", "m2"), (2, 2)))
    assert report.exit_code is ExitCode.INCOMPLETE
    assert report.node_errors["m2"].startswith("probe_error: malformed stacks probe answer")
    assert {s.rank for s in report.analysis.outliers} <= {0, 1}  # m2's ranks are not judged


def test_garbage_text_from_a_machine_is_its_error() -> None:
    nodes = _read({"m1": "not json at all\n", "m2": "[1, 2]\n"})
    assert nodes["m1"].state == nodes["m2"].state == "probe_error"
    assert "not JSON" in (nodes["m1"].error or "")


def test_frame_table_rows_are_shared_between_machines() -> None:
    known: dict[str, Frame] = {}
    one = frame_table("f\ta.py\t1\ng\tb.py\t2", known)
    two = frame_table("g\tb.py\t2\nh\tc.py\t3", known)
    assert one[1] is two[0] and two[1] == Frame("h", "c.py", 3)
    assert frame_table("", known) == []
    assert reduced_stack(1, [1], two, tuple(one)) == (one[0], two[1])
