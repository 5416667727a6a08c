"""The stacks probe's reduced answer: built from real py-spy JSON, read back, and refused when hostile."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.stacks.pyspy import (
    FRAMES_PER_RANK,
    FRAMES_SPARE,
    MAX_DEPTH,
    FrameCache,
    PySpyFormatError,
    frame_table,
    packed_ints,
    packed_stacks,
    parse_dump,
)
from brctl.analysis.stacks.tree import Frame
from brctl.core.errors import ExitCode
from brctl.core.transport import NodeState, RunResult
from brctl.diagnostics.pyspy_frames import PACKED, RAW, hex_ints, main_frames, pack
from brctl.diagnostics.stacks_probe import main_stacks
from brctl.operations.stacks import ops as op
from brctl.remote.probes import ProbeResult, parse_document

DATA = Path(__file__).parent / "data"
GOLDEN_PID = 27080  # the process tests/unit/data/pyspy_dump.json was taken from


def golden_dump(pid: int = GOLDEN_PID, line: int | None = None, function: str | None = None) -> str:
    """The real py-spy dump, with its main thread's innermost line or function changed when asked."""
    threads = json.loads((DATA / "pyspy_dump.json").read_text())
    for t in threads:
        t["pid"] = pid
        if t["thread_name"] == "MainThread":
            t["os_thread_id"] = pid
            if line is not None:
                t["frames"][0]["line"] = line
            if function is not None:
                t["frames"][0]["name"] = function
    return json.dumps(threads, indent=2)


def _answer(dumps: list[dict[str, Any]], world: int = 4) -> dict[str, Any]:
    """The probe's packed document for ranks 0.. with the given (unreduced) dumps."""
    procs = [{"pid": d["pid"], "role": "rank", "rank": i, "local_rank": i, "world_size": world}
             for i, d in enumerate(dumps)]
    return {"format": PACKED, "py_spy": "/usr/bin/py-spy", "py_spy_missing": False,
            "schema": "brctl.probe/1", **pack(procs, main_stacks(dumps))}


def _read(docs: dict[str, Any]) -> dict[str, op.NodeCollection]:
    """The controller's reading of each machine's answer, from the text it printed."""
    results = {}
    for name, doc in docs.items():
        text = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")) + "\n"
        run = RunResult(name, NodeState.OK, 0, text, "", 0.1)
        results[name] = ProbeResult(name, run, *parse_document(run))
    return op.read_answers(results)


def test_the_reduced_answer_reads_back_as_the_stacks_of_the_raw_dumps() -> None:
    texts = [golden_dump(101), golden_dump(102, line=7), golden_dump(103), "garbage", None]
    dumps = [{"pid": 101 + i, "output": t, "seconds": 0.1,
              "error": None if t is not None else "py-spy did not finish within 10s"}
             for i, t in enumerate(texts)]
    doc = _answer(copy.deepcopy(dumps), world=5)
    assert "output" not in doc and "dumps" not in doc and '"pid"' not in json.dumps(doc)
    heads = list(packed_ints(doc["stacks"], "i", "stacks"))
    assert heads[2:4] == [4, 1]  # rank 1 shares 4 frames with rank 0: one frame moved
    assert heads[6:] == [0, -1, 0, -1]
    assert doc["errors"] == [[3, "unusable py-spy output: not JSON: "
                              "Expecting value: line 1 column 1 (char 0)"],
                             [4, "py-spy did not finish within 10s"]]
    assert list(packed_ints(doc["ranks"], "i", "ranks"))[:8] == [0, 101, 0, 5, 1, 102, 1, 5]
    [node] = _read({"m1": doc}).values()
    assert node.answered
    got = {r.rank: r.stack for r in node.ranks}
    for rank in range(3):
        assert got[rank] == parse_dump(texts[rank] or "", 101 + rank)
    assert got[0] != got[1] and got[0] == got[2]
    assert got[0][0] is got[1][0]  # frames interned across ranks
    assert [(r.rank, r.error) for r in node.ranks if r.stack is None] == [
        (3, doc["errors"][0][1]), (4, "py-spy did not finish within 10s")]
    assert [(r.local_rank, r.world_size) for r in node.ranks] == [(i, 5) for i in range(5)]


def test_unknown_or_out_of_range_rank_fields_ship_as_minus_one() -> None:
    procs = [{"pid": 7, "role": "rank", "rank": 1 << 40, "local_rank": None, "world_size": -3},
             {"pid": 8, "role": "worker", "rank": 0, "local_rank": 0, "world_size": 2},
             {"pid": 6, "role": "launcher", "rank": None, "local_rank": None, "world_size": None}]
    doc = pack(procs, {})
    assert list(packed_ints(doc["ranks"], "i", "ranks")) == [-1, 7, -1, -1]
    assert doc["workers"] == 1 and doc["indices"] == "" and doc["errors"] == []
    [node] = _read({"m1": {"format": PACKED, "py_spy_missing": True, **doc}}).values()
    assert [(r.rank, r.local_rank, r.world_size, r.error) for r in node.ranks] == [
        (-1, None, None, "py-spy is not available on this machine and none could be shipped")]
    [node] = _read({"m1": {"format": PACKED, "py_spy_missing": False, **doc}}).values()
    assert node.answered and node.ranks == () and node.workers == 1  # another machine's rank


def test_a_table_past_65536_rows_ships_wide_indices() -> None:
    """10 ranks of 7,000 frames each (a stack is at most MAX_DEPTH), none shared."""
    stacks = {5 + r: [(f"f{r}.{i}", "a.py", i) for i in range(7_000)] for r in range(10)}
    doc = pack([{"pid": pid, "role": "rank", "rank": pid - 5, "local_rank": pid - 5,
                 "world_size": 10} for pid in stacks], dict(stacks))
    assert len(doc["indices"]) == 8 * 70_000
    [node] = _read({"m1": {"format": PACKED, "py_spy_missing": False, **doc}}).values()
    assert [[tuple(f) for f in r.stack or ()] for r in node.ranks] == list(stacks.values())


def test_a_reduced_answer_is_a_fraction_of_py_spys_json() -> None:
    texts = [golden_dump(200 + i, line=i % 3) for i in range(8)]
    raw = {"format": RAW, "dumps": [{"pid": 200 + i, "output": t, "seconds": 0.1, "error": None}
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
    return _answer([{"pid": 101 + i, "output": golden_dump(101 + i, line=i), "seconds": 0.1,
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


def _heads(*values: int) -> str:
    return hex_ints("i", list(values))


def _chained(depth: int, n: int) -> dict[str, Any]:
    """A machine's answer: rank 0 ``depth`` frames deep, every other rank all of the
    one before it but its innermost frame, then one more: a few bytes per rank, each
    a new stack of ``depth`` frames (frames held quadratic in the answer, unchecked)."""
    ranks = [v for i in range(n) for v in (i, 1000 + i, 0, n)]
    return {"format": PACKED, "frames": "f\ta.py\t1", "workers": 0, "errors": [],
            "py_spy_missing": False, "ranks": hex_ints("i", ranks),
            "stacks": _heads(0, depth, *[depth - 1, 1] * (n - 1)),
            "indices": hex_ints("H", [0] * (depth + n - 1))}


HOSTILE = [
    (_chained(MAX_DEPTH, 40), "stacks: 327680 frames held, more than "),
    (_chained(MAX_DEPTH + 1, 2), f"stacks: a stack deeper than {MAX_DEPTH} frames"),
    (_set("stacks", _heads(0, 3, -1, 1)), "stacks: a prefix below 0"),
    (_set("frames", ["<module>", "a.py", 1]), "frames: expected the frame table's text"),
    (_set("frames", "f\ta.py"), "frames row 0: expected name<TAB>file<TAB>line"),
    (_set("frames", "f\ta.py\t-1"), "frames row 0"),
    (_set("frames", "f\ta.py\t٣"), "frames row 0"),  # a digit, but not an ASCII one
    (_set("indices", "0000ffff"), "indices: expected hex of the stacks' "),
    (_set("indices", _good()["indices"][:-4] + "0063"), "indices must be from 0 to"),
    (_set("indices", "zz" * (len(_good()["indices"]) // 2)), "indices: expected hex of 2-byte"),
    (_set("indices", [0, 1]), "indices: expected hex of the stacks' "),
    (_set("stacks", _heads(0, 99, 0, 0)), "indices: expected hex of the stacks' 99 frame indices"),
    (_set("stacks", _heads(0, -2, 0, 0)), "stacks: a frame count below -1"),
    (_set("stacks", _heads(0, 5)), "ranks: 4 integers per rank and stacks: 2 per rank"),
    (_set("stacks", "0 5 4 1"), "stacks: expected hex of 4-byte integers"),
    (_set("stacks", "0000000"), "stacks: expected hex of 4-byte integers"),  # half a byte
    (_set("stacks", 12), "stacks: expected hex of 4-byte integers"),
    (_set("ranks", _heads(0, 101, 0, 2)), "ranks: 4 integers per rank"),
    (_set("ranks", None), "ranks: expected hex"),
    (_set("workers", -1), "workers: expected a count"),
    (_set("workers", "3"), "workers: expected a count"),
    (_set("errors", [[0, "busy"]]), "errors: [0, 'busy'] is not [position of a rank without"),
    (_set("errors", [[7, "busy"]]), "errors: "),
    (_set("errors", [[True, "busy"]]), "errors: "),
    (_set("errors", [["0", "busy"]]), "errors: "),
    (_set("errors", [[0, {"x": 1}]]), "errors: "),
    (_set("errors", {"0": "busy"}), "errors: expected a list of [position, reason]"),
    (_set("format", "brctl.stacks-probe/1"), "format 'brctl.stacks-probe/1' is not this brctl"),
    (_set("format", None), "format None is not this brctl's stacks probe answer"),
    # the shape of an older probe (per-dump stacks, no format marker) is refused as such
    ({"processes": [], "dumps": [{"pid": 1, "prefix": 0, "stack": [0]}], "frames": "f\ta.py\t1"},
     "is not this brctl's stacks probe answer (brctl.stacks-probe/2); is the node running"),
    # the raw (--save) form is checked as before
    ({"format": RAW, "processes": [], "dumps": [{"pid": "101"}]},
     "dumps[0]: expected an object with an integer pid"),
    ({"format": RAW, "processes": [], "dumps": [[101]]}, "dumps[0]: expected an object"),
    ({"format": RAW, "processes": [], "dumps": [{"pid": 1, "error": {"x": 1}}]},
     "dumps[0]: error and output must be strings"),
    ({"format": RAW, "processes": [], "dumps": [{"pid": 1, "output": 12}]},
     "dumps[0]: error and output must be strings"),
    ({"format": RAW, "processes": ["rank 0"], "dumps": []}, "processes[0]: expected an object"),
    ({"format": RAW, "processes": [{"role": "rank", "rank": 0, "pid": 1.5}], "dumps": []},
     "processes[0]: pid must be an integer"),
    ({"format": RAW, "processes": {"0": 1}, "dumps": []}, "it lacks the processes/dumps lists"),
    ({"format": RAW, "processes": [], "dumps": None}, "it lacks the processes/dumps lists"),
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
    known: FrameCache = {}
    one = frame_table("f\ta.py\t1\ng\tb.py\t2", known)
    two = frame_table("g\tb.py\t2\nh\tc.py\t3", known)
    assert one[1] is two[0] and two[1] == Frame("h", "c.py", 3)
    assert frame_table("", known) == ()
    assert frame_table("f\ta.py\t1\ng\tb.py\t2", known) is one  # the same table: one lookup
    assert frame_table("f\ta.py\t1", known) == (one[0],)  # a table of one row is not a row
    with pytest.raises(PySpyFormatError, match="frames row 1"):
        frame_table("f\ta.py\t1\nbad", known)
    heads = packed_ints(hex_ints("i", [0, 1, 1, 1, 0, -1, 0, 0]), "i", "stacks")
    assert packed_stacks(heads, hex_ints("H", [0, 1]), two) == [
        (two[0],), (two[0], two[1]), None, ()]
    with pytest.raises(PySpyFormatError, match="a prefix without a stack"):
        packed_stacks(packed_ints(hex_ints("i", [0, 1, 1, -1]), "i", "s"), "0000", two)
    with pytest.raises(PySpyFormatError, match=r"stacks\[1\]: prefix must be from 0 to 1"):
        packed_stacks(packed_ints(hex_ints("i", [0, 1, 2, 0]), "i", "s"), "0000", two)


@pytest.mark.parametrize(("ranks", "asks"), [(hex_ints("i", [0, 9, 0, 1]), True), ("", False),
                                             (5, False), (None, False), ([0, 9, 0, 1], False)])
def test_py_spy_is_shipped_only_to_a_packed_answer_that_lists_ranks(ranks: Any, asks: bool) -> None:
    """Read before the answer is checked: fields out of shape must not raise there."""
    doc = {"format": PACKED, "py_spy_missing": True, "ranks": ranks}
    assert op._lacks_py_spy(doc) is asks
    assert op._lacks_py_spy({**doc, "py_spy_missing": False}) is False


def test_a_small_answer_cannot_make_the_controller_hold_quadratic_frames() -> None:
    """Each rank is rebuilt from the one before it: the frames held are bounded by
    the answer (the indices shipped, FRAMES_PER_RANK a rank, FRAMES_SPARE), refused
    before any is held, whatever the order of the ranks."""
    one = (Frame("f", "a.py", 1),)
    n = 2 + FRAMES_SPARE // (MAX_DEPTH - FRAMES_PER_RANK)  # just past the bound
    doc = _chained(MAX_DEPTH, n)
    heads = packed_ints(doc["stacks"], "i", "stacks")
    with pytest.raises(PySpyFormatError, match=r"frames held, more than \d+ \(256 a rank"):
        packed_stacks(heads, doc["indices"], one)
    # a refused rank after them changes nothing: counted before the stacks are built
    bad = packed_ints(_heads(*heads, 5, -1), "i", "stacks")  # a prefix without a stack
    with pytest.raises(PySpyFormatError, match="frames held"):
        packed_stacks(bad, doc["indices"], one)
    # one rank fewer fits
    fits = packed_stacks(heads[:-4], hex_ints("H", [0] * (MAX_DEPTH + n - 3)), one)
    assert len(fits) == n - 2 and {len(s or ()) for s in fits} == {MAX_DEPTH}


def test_deep_legal_stacks_are_accepted() -> None:
    """py-spy's deepest stacks (MAX_DEPTH frames) on every rank of a machine are read
    back, and ranks whose stack is the one before it share it (they cost nothing)."""
    table = tuple(Frame(f"f{i}", "a.py", i) for i in range(MAX_DEPTH + 8))
    # 8 ranks, each MAX_DEPTH deep, differing in the innermost frame
    heads = packed_ints(_heads(0, MAX_DEPTH, *[MAX_DEPTH - 1, 1] * 7), "i", "stacks")
    ids = list(range(MAX_DEPTH)) + [MAX_DEPTH + i for i in range(7)]
    stacks = packed_stacks(heads, hex_ints("H", ids), table)
    assert [len(s or ()) for s in stacks] == [MAX_DEPTH] * 8
    assert stacks[7] == (*table[:MAX_DEPTH - 1], table[MAX_DEPTH + 6])
    # 4,096 identical ranks, each the whole stack before it: one tuple, shared
    heads = packed_ints(_heads(0, MAX_DEPTH, *[MAX_DEPTH, 0] * 4095), "i", "stacks")
    stacks = packed_stacks(heads, hex_ints("H", list(range(MAX_DEPTH))), table)
    assert len(stacks) == 4096 and all(s is stacks[0] for s in stacks)
    assert stacks[0] == table[:MAX_DEPTH]


def test_the_probe_ships_its_deepest_stack_and_refuses_a_deeper_dump() -> None:
    def dump(depth: int) -> str:
        return json.dumps([{"pid": 9, "os_thread_id": 9, "frames": [
            {"name": f"f{i}", "short_filename": "a.py", "line": i} for i in range(depth)]}])
    doc = _answer([{"pid": 9, "output": dump(MAX_DEPTH), "seconds": 0.1, "error": None},
                   {"pid": 10, "output": dump(MAX_DEPTH + 1), "seconds": 0.1, "error": None}], 2)
    [node] = _read({"m1": doc}).values()
    assert node.state == "ok" and len(node.ranks[0].stack or ()) == MAX_DEPTH
    assert node.ranks[1].stack is None
    assert f"more than {MAX_DEPTH}" in (node.ranks[1].error or "")
