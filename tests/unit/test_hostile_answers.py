"""Controller code against node answers of the wrong shape (``ckpt``, the daemon's log tails).

Every byte a node sends is hostile (README "Safe by default"). A document that
is valid JSON but has the wrong types (a list of numbers where steps were expected,
a number where a list of names was) must end that copy ``refused`` with the node
named, never raise out of the operation: the daemon calls ``restore`` as a step it
re-runs after a restart, and reads log tails at every poll, so an exception there is
a crash loop that one compromised machine could keep going.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.core.transport import Node, NodeState, RunResult
from brctl.load.inventory import load_inventory
from brctl.operations.ckpt import copy as ckpt_copy
from brctl.operations.ckpt import restores as ckpt_restore
from brctl.remote.probes import ProbeResult

SHA = "ab" * 32
Answer = Callable[[str, Mapping[str, Any]], Any]


class ScriptedRunner:
    """A probe runner whose nodes answer what ``answer(module, request)`` returns."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def run(self, nodes: Iterable[Node], module: str, request: Any, **_: Any) -> dict[str, ProbeResult]:
        out = {}
        for node in nodes:
            req = dict(request(node) if callable(request) else request)
            self.requests.append((module, req))
            doc = self.answer(module, req)
            run = RunResult(node.name, NodeState.OK, 0, "", "", 0.0)
            out[node.name] = ProbeResult(node.name, run, doc, None)
        return out


@pytest.fixture
def inv(tmp_path: Path) -> Any:
    doc = {"nodes": [{"name": n, "connection": "local", "gpus": 1, "python": sys.executable}
                     for n in ("n1", "n2", "n3")],
           "job": {"nodes": "n[1-2]"}, "ckpt": {"dir": "/nonexistent/ckpt"}}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path)


BAD_LISTINGS = [
    {"steps": [1]},
    {"steps": "step_1"},
    {"steps": [{"committed": True, "name": ["step_1"]}]},
]


@pytest.mark.parametrize("listing", BAD_LISTINGS)
def test_restore_refuses_a_malformed_listing(inv: Any, listing: Any) -> None:
    runner = ScriptedRunner(lambda module, req: listing)
    rep = ckpt_restore.restore(None, inv, {"n1": "n2"}, target="n3", evicted="n1",  # type: ignore[arg-type]
                               runner=runner)  # type: ignore[arg-type]
    (copy,) = rep.copies
    assert copy.state == "refused", copy
    assert "n2" in (copy.error or "")


@pytest.mark.parametrize("verdict", [{"ok": False, "mismatched": 7},
                                     {"ok": False, "missing": [{"x": 1}], "mismatched": None},
                                     {"ok": True, "files": [3]}])
def test_restore_refuses_a_malformed_verify_answer(inv: Any, verdict: Any) -> None:
    def answer(module: str, req: Mapping[str, Any]) -> Any:
        if req["op"] == "scan_backup":
            return {"steps": [{"committed": True, "name": "step_1"}]}
        return verdict

    rep = ckpt_restore.restore(None, inv, {"n1": "n2"}, target="n3", evicted="n1",  # type: ignore[arg-type]
                               runner=ScriptedRunner(answer))  # type: ignore[arg-type]
    (copy,) = rep.copies
    assert copy.state in ("refused", "failed"), copy
    assert "n2" in (copy.error or "") + " ".join(copy.notes)


BAD_SCANS = [
    {"steps": [1]},
    {"steps": [], "skipped": [[1, 2, 3]]},
    {"steps": [], "skipped": 5},
    {"steps": [{"eligible": True, "files": [], "name": "step_1", "skipped": [None]}]},
]


@pytest.mark.parametrize("scan", BAD_SCANS)
def test_backup_refuses_a_malformed_scan(inv: Any, scan: Any) -> None:
    rep = ckpt_copy.backup(None, inv, {"n1": "n2"}, runner=ScriptedRunner(lambda m, r: scan))  # type: ignore[arg-type]
    (copy,) = rep.copies
    assert copy.state == "refused", copy
    assert "n1" in (copy.error or "")


@pytest.mark.parametrize("present", [
    {"steps": [7]},
    {"steps": [{"name": "step_1", "present": ["a"], "committed": True}]},
    {"steps": [{"name": "step_1", "present": {}, "committed": True, "manifest": [1, 2]}]},
])
def test_backup_refuses_a_malformed_peer_listing(inv: Any, present: Any) -> None:
    files = [{"path": "step_1/a.pt", "size": 1, "sha256": SHA, "mode": 0o644}]

    def answer(module: str, req: Mapping[str, Any]) -> Any:
        if req["op"] == "scan":
            return {"dir": "/x", "steps": [{"name": "step_1", "eligible": True, "files": files,
                                            "skipped": []}], "skipped": []}
        return {"results": {"n1": present}}

    rep = ckpt_copy.backup(None, inv, {"n1": "n2"}, runner=ScriptedRunner(answer))  # type: ignore[arg-type]
    (copy,) = rep.copies
    assert copy.state == "refused", copy
    assert "n2" in (copy.error or "")


@pytest.mark.parametrize("doc", [{"mismatched": [1, 2]}, {"missing": 3}, {"mismatched": {"a": 1}}])
def test_a_malformed_receive_answer_is_an_error_not_a_crash(doc: Any) -> None:
    node = Node(name="d", address="127.0.0.1")
    lane = ckpt_copy.Lane(Node(name="s", address="127.0.0.1"), {}, node, {}, ())
    got = RunResult("d", NodeState.OK, 0, __import__("json").dumps(doc) + "\n", "", 0.0)
    out = ckpt_copy._lane_outcome(lane, None, got)
    assert out is not None and "d" in str(out)


@pytest.mark.parametrize("answer", [{"files": 5}, {"files": [1, None]},
                                    {"files": [{"mtime": "late", "tail": "x"}]},
                                    {"files": [{"mtime": 1, "tail": ["x"]}]}, {"files": {}}])
def test_the_daemons_log_tails_survive_a_malformed_answer(tmp_path: Path, answer: Any) -> None:
    from brctl.operations.daemon.hooks import LiveHooks

    doc = {"nodes": [{"name": n, "connection": "local", "gpus": 1, "python": sys.executable}
                     for n in ("n1", "n2")],
           "job": {"nodes": "n[1-2]", "log_paths": ["/var/log/train/*.log"]}}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    inv = load_inventory(path)
    good = {"files": [{"path": "/b", "mtime": 2.0, "tail": "step 20"},
                      {"path": "/a", "mtime": 1.0, "tail": "step 10"}]}
    hooks = LiveHooks(inv, None, None, tmp_path)  # type: ignore[arg-type]
    hooks.runner = ScriptedRunner(lambda m, r: answer)  # type: ignore[assignment]
    assert set(hooks.log_tails(list(inv.nodes.values())).values()) <= {""}
    hooks.runner = ScriptedRunner(lambda m, r: good)  # type: ignore[assignment]
    assert hooks.log_tails([inv.nodes["n1"]]) == {"n1": "step 10\nstep 20"}


def test_the_daemons_records_take_a_node_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    """A job's step named with a byte that is not UTF-8 reaches the controller as a lone
    surrogate (JSON escapes it; Python decodes it). SQLite refuses such text: written
    raw into a step's outcome it raised out of the daemon, which re-ran the (idempotent)
    restore at every restart and crashed again."""
    from brctl.operations.ledger.state import DONE, DaemonState
    from brctl.state import Store

    store = Store(tmp_path / "state")
    try:
        state = DaemonState(store, "llm")
        step = b"step_\xff".decode("utf-8", "surrogateescape")
        state.intend("p/1", "restore", "n3", {}, f"restore {step}", 1.0)
        state.finish("p/1", DONE, 2.0, f"restored {step} of n1 onto n3")
        state.mark_checked("n3", False, f"{step}: failed", 3.0)
        act = state.action("p/1")
        assert act is not None and act.state == DONE
        assert act.reason == "restored step_\\udcff of n1 onto n3"
    finally:
        store.close()


# The diagnose ladder (issue 17): every stage's answer, through `brctl diagnose`. -----------
#
# m1's log holds the NCCL watchdog line, so the nccl playbook runs every stage: eud
# (dcgmi diag), alltoall, allgather (a wide group, then pairs). One machine answers one
# stage out of shape; the others answer as the real probes do.

_CLEAN_TREE = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
    {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]}]}]},
    "metadata": {"version": "4.1.1", "Driver Version Detected": "570.124.06"}}


def _good_evidence(node: str) -> dict[str, Any]:
    line = "[rank3]: Watchdog caught collective operation timeout" if node == "m1" else "step 7"
    return {"logs": {"/log/train.log": [line]}, "log_errors": [], "xid_lines": [],
            "kernel_error": None, "processes": []}


def _good_dcgm() -> dict[str, Any]:
    return {"argv": ["dcgmi", "diag", "-r", "2", "-j"], "exit_code": 0,
            "stdout": json.dumps(_CLEAN_TREE), "stderr": "", "seconds": 31.5}


def _good_collective(op: str) -> dict[str, Any]:
    if op == "free_port":
        return {"op": "free_port", "port": 29500}
    return {"op": op, "status": "pass", "phase": None, "backend": "gloo", "world": 2,
            "timeout": 60.0, "startup_timeout": 300.0, "hung_ranks": [], "errors": [],
            "mismatches": [], "busbw_gbps": 1.5, "startup_seconds": 2.0, "seconds": 3.5}


def _good(stage: str, node: str) -> dict[str, Any]:
    if stage == "evidence":
        return _good_evidence(node)
    return _good_dcgm() if stage == "eud" else _good_collective(stage)


NAN, INF, HUGE = float("nan"), float("inf"), 10 ** 400
DEEP = "[" * 100_000 + "]" * 100_000  # past json's nesting depth: RecursionError, not ValueError


def _tree(**diag: Any) -> str:
    return json.dumps({"DCGM Diagnostic": diag})


BAD_STAGE_ANSWERS: dict[str, list[Any]] = {
    "evidence": [
        {"logs": ["/log/train.log"]}, {"logs": {"/l": "one line"}}, {"logs": {"/l": [1, None]}},
        {"logs": {"/l": [["nested", ["garbage"]]]}}, {"log_errors": "x"},
        {"log_errors": [{"a": 1}]}, {"xid_lines": [None]}, {"xid_lines": "NVRM: Xid"},
        {"kernel_error": ["x"]}, {"kernel_error": NAN}, {"processes": "yes"},
        {"processes": [[1]]}, {"processes": [{"pid": 1}]},
        {"processes": [{"pid": "1", "cmdline": "train"}]}, DEEP, [1, 2], "a string",
    ],
    "eud": [
        {"exit_code": "x"}, {"exit_code": None}, {"exit_code": 1.5}, {"exit_code": [0]},
        {"exit_code": 0, "stdout": 5}, {"exit_code": 0, "stdout": {"a": 1}},
        {"exit_code": 0, "stdout": "", "stderr": ["x"]}, {"skipped": ["no dcgmi"]},
        {"timed_out": True, "seconds": "x"}, {"timed_out": True, "seconds": NAN},
        {"timed_out": True, "seconds": INF}, {"timed_out": True, "seconds": HUGE},
        {"timed_out": True}, {"timed_out": "yes", "exit_code": 0},
        {"exit_code": 0, "stdout": '{"DCGM Diagnostic": 5}'},
        {"exit_code": 0, "stdout": _tree(test_categories=5)},
        {"exit_code": 0, "stdout": _tree(test_categories=[5])},
        {"exit_code": 0, "stdout": _tree(test_categories=[{"tests": [1]}])},
        {"exit_code": 0, "stdout": _tree(test_categories=[{"tests": [{"results": ["x"]}]}])},
        {"exit_code": 0, "stdout": _tree(test_categories=[{"tests": [{"results": [
            {"status": "Fail", "warnings": [3]}]}]}])},
        {"exit_code": 226, "stdout": _tree(test_categories=[{"tests": [{"results": [
            {"status": "Fail", "warnings": [{"warning": {"deep": [1]}}]}]}]}])},
        {"exit_code": 0, "stdout": _tree(runtime_error=[["x"]])},
        {"exit_code": 0, "stdout": json.dumps({"DCGM Diagnostic": {}, "metadata": 5})},
        {"exit_code": 0, "stdout": json.dumps({"DCGM Diagnostic": {}, "metadata": {"version": [1]}})},
        {"exit_code": 0, "stdout": "[1, 2]"}, {"exit_code": 0, "stdout": '"text"'},
        {"exit_code": 0, "stdout": "NaN"}, {"exit_code": 0, "stdout": "1e999"},
        {"exit_code": 0, "stdout": DEEP}, {"exit_code": 0, "stdout": "1" * 5000}, DEEP,
    ],
    "free_port": [{"port": "29500"}, {"port": [1]}, {"port": 1.5}, {"port": NAN},
                  {"port": {"a": 1}}, DEEP],
}
_COLLECTIVE_BAD: list[Any] = [
    {"status": 5}, {"status": ["pass"]}, {"status": "pass", "busbw_gbps": "fast"},
    {"status": "pass", "busbw_gbps": NAN}, {"status": "pass", "busbw_gbps": INF},
    {"status": "pass", "busbw_gbps": -INF}, {"status": "pass", "busbw_gbps": HUGE},
    {"status": "pass", "backend": ["nccl"]}, {"status": "pass", "backend": {"x": 1}},
    {"status": "pass", "seconds": "3"}, {"status": "pass", "seconds": HUGE},
    {"status": "pass", "seconds": NAN}, {"status": "pass", "world": "2"},
    {"status": "hang", "errors": [1]}, {"status": "hang", "errors": "boom"},
    {"status": "hang", "phase": "startup", "startup_timeout": {}, "hung_ranks": [[0]]},
    {"status": "hang", "timeout": [60]}, {"status": "wrong_data", "mismatches": "x"},
    {"status": "wrong_data", "mismatches": [{"rank": 1}]}, {"status": "error", "errors": [None]},
    {"skipped": 3}, {"skipped": None}, {"skipped": ["torch"]}, DEEP,
]
BAD_STAGE_ANSWERS["alltoall"] = _COLLECTIVE_BAD
BAD_STAGE_ANSWERS["allgather"] = _COLLECTIVE_BAD


def _diagnose_cli(tmp_path: Path, bad_stage: str, bad_node: str, bad: Any) -> tuple[int, str, str]:
    """``brctl --json diagnose`` over 3 fake machines; ``bad_node`` answers ``bad`` (a
    document, or raw text) to ``bad_stage``."""
    from brctl.cli.app import run
    from brctl.env import Env
    from brctl.remote.fake import FakeTransport, Reply
    from brctl.remote.probes import probe_call
    from brctl.render.output import Output

    modules = {"brctl.diagnostics.evidence": "evidence", "brctl.diagnostics.dcgm": "eud"}

    def handle(node: Node, argv: Any, stdin: bytes | None) -> Reply:
        module, _ = probe_call(argv)
        request = json.loads(stdin or b"{}")
        stage = modules.get(module) or request["op"]
        doc = bad if (stage, node.name) == (bad_stage, bad_node) else _good(stage, node.name)
        text = doc if isinstance(doc, str) else json.dumps(doc if not isinstance(doc, dict)
                                                             else {"schema": "brctl.probe/1", **doc})
        return Reply(stdout=text + "\n")

    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "m[1-3]", "address": "10.0.0.[1-3]", "gpus": 2}],
        "job": {"name": "llm", "nodes": "m[1-3]", "log_paths": ["/log/*.log"]}}))
    out, err = io.StringIO(), io.StringIO()
    env = Env(output=Output(stdout=out, stderr=err), transport_given=FakeTransport(handle),
              environ={"BRCTL_STATE": str(tmp_path / "state")})
    code = run(["-i", str(inv), "--json", "diagnose"], env=env)
    return code, out.getvalue(), err.getvalue()


def test_the_ladder_over_honest_machines_is_clean(tmp_path: Path) -> None:
    code, out, err = _diagnose_cli(tmp_path, "", "", None)
    assert code == 0, err
    doc = json.loads(out)
    assert [s["name"] for s in doc["stages"]] == ["eud", "alltoall", "allgather"]


@pytest.mark.parametrize(("stage", "bad"), [(stage, bad) for stage, docs in BAD_STAGE_ANSWERS.items()
                                            for bad in docs])
def test_a_malformed_diagnose_answer_is_that_machines_error(tmp_path: Path, stage: str,
                                                            bad: Any) -> None:
    node = "m1" if stage == "free_port" else "m2"  # m1 is the wide group's rendezvous
    code, out, err = _diagnose_cli(tmp_path, stage, node, bad)
    assert code in (1, 3), (code, err)
    assert "Traceback" not in err
    doc = json.loads(out)
    assert node in doc["incomplete"] or node in doc["faulty"], doc
    assert set(doc["incomplete"]) | set(doc["faulty"]) == {node}  # the others were judged


@pytest.mark.parametrize("line", [
    "exitcode  : " + "6" * 5000 + " (pid: 1)",
    "NVRM: Xid (PCI:0000:3b:00): " + "7" * 5000 + ", pid=1, name=python, boom",
    "1" * 5000 + ",1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, fell off the bus",
])
def test_a_job_log_line_with_a_number_of_thousands_of_digits_is_not_a_crash(
        tmp_path: Path, line: str) -> None:
    """int() refuses more than 4300 digits: a job can print anything into its log."""
    answer = _good_evidence("m2")
    answer["logs"]["/log/train.log"].append(line)
    answer["xid_lines"] = [line]
    code, _, err = _diagnose_cli(tmp_path, "evidence", "m2", answer)
    assert code == 0, err  # the line is no exit code and no Xid: nothing else changes


# Property style: ~200 mutations of an honest answer (fixed seed), each through the code
# where that answer arrives. Whatever a mutation makes of it, nothing raises: an answer
# out of shape is that machine's error, one that fits is judged.

HOSTILE: list[Any] = [None, True, False, 0, -1, 7, 1.5, NAN, INF, -INF, HUGE, -HUGE, "", "x",
                      "6" * 5000, [], {}, [[["deep"]]], {"a": {"b": [1, None]}}, [1, "x", None],
                      json.loads("[" * 200 + "]" * 200)]
MUTATIONS = 200


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``value`` (the root included)."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _places(item, (*path, i))
    return out


def _mutate(rng: Any, value: Any) -> Any:
    """``value`` with one place replaced by a hostile value, deleted, wrapped or extended."""
    import copy

    value = copy.deepcopy(value)
    path = rng.choice(_places(value))
    if not path:
        return rng.choice(HOSTILE)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    key, how = path[-1], rng.random()
    if how < 0.6:
        parent[key] = copy.deepcopy(rng.choice(HOSTILE))
    elif how < 0.75 and isinstance(parent, dict):
        del parent[key]
    elif how < 0.9:
        parent[key] = [parent[key]]
    elif isinstance(parent[key], list):
        parent[key].append(copy.deepcopy(rng.choice(HOSTILE)))
    elif isinstance(parent[key], dict):
        parent[key]["extra"] = copy.deepcopy(rng.choice(HOSTILE))
    else:
        parent[key] = {"value": parent[key]}
    return value


def _mutations(seed: int, good: Any) -> list[Any]:
    import random

    rng = random.Random(seed)
    return [_mutate(rng, good) for _ in range(MUTATIONS)]


class NodeRunner:
    """A probe runner whose nodes answer ``answer(node, module, request)``; an answer that
    is not an object is no document, as ``probes.parse_document`` makes it."""

    def __init__(self, answer: Callable[[str, str, Mapping[str, Any]], Any]) -> None:
        self.answer = answer

    def run(self, nodes: Iterable[Node], module: str, request: Any, **_: Any) -> dict[str, ProbeResult]:
        out = {}
        for node in nodes:
            doc = self.answer(node.name, module, dict(request(node) if callable(request) else request))
            run = RunResult(node.name, NodeState.OK, 0, "", "", 0.0)
            ok = isinstance(doc, dict)
            out[node.name] = ProbeResult(node.name, run, doc if ok else None,
                                         None if ok else "probe output is not a JSON object")
        return out


def _ladder_inv() -> Any:
    from brctl.analysis.inventory import from_document
    return from_document({"nodes": [{"name": "m[1-3]", "address": "10.0.0.[1-3]", "gpus": 2}],
                          "job": {"name": "llm", "nodes": "m[1-3]", "log_paths": ["/log/*.log"]}},
                         "inv.yaml")


def _verdicts_are_plain(verdicts: Iterable[Any]) -> None:
    for v in verdicts:
        assert v.status in ("pass", "fail", "warn", "skip", "error")
        assert all(isinstance(e, str) for e in v.evidence), v
        json.dumps(v.to_json(), allow_nan=False)  # the report's JSON stays JSON


def test_parse_dcgm_never_raises_on_mutated_answers_or_dcgmi_json() -> None:
    from brctl.analysis.diagnose.stages import parse_dcgm

    tree = json.loads((Path(__file__).parent / "data" / "dcgm_diag_fail.json").read_text())
    outer = [parse_dcgm("n", doc) for doc in _mutations(1, _good_dcgm())]
    inner = [parse_dcgm("n", {"exit_code": code, "stdout": json.dumps(doc)})
             for code in (0, 226) for doc in _mutations(code, tree)]
    _verdicts_are_plain([*outer, *inner])
    assert any(v.status == "error" and "malformed" in v.evidence[0] for v in outer)
    assert any("malformed dcgmi JSON" in v.evidence[0] for v in inner)
    assert any(v.status == "fail" and "malformed" not in v.evidence[0] for v in inner)


@pytest.mark.parametrize("stage", ["evidence", "eud", "alltoall", "allgather", "free_port"])
def test_each_stage_survives_mutations_of_one_machines_answer(stage: str) -> None:
    from brctl.analysis.playbook import Stage
    from brctl.operations.diagnose import Options, _collect, _run_stage

    inv = _ladder_inv()
    nodes = list(inv.nodes.values())
    modules = {"brctl.diagnostics.evidence": "evidence", "brctl.diagnostics.dcgm": "eud"}
    bad_node = "m1" if stage == "free_port" else "m2"
    outcomes = {"judged": 0, "error": 0}
    for bad in _mutations(len(stage), _good(stage, bad_node)):
        def answer(node: str, module: str, request: Mapping[str, Any], bad: Any = bad) -> Any:
            asked = modules.get(module) or request["op"]
            return bad if (asked, node) == (stage, bad_node) else _good(asked, node)

        runner = NodeRunner(answer)
        if stage == "evidence":
            evidence, incomplete, notes, _ = _collect(inv, runner, nodes, Options(force=True))  # type: ignore[arg-type]
            assert set(evidence) | set(incomplete) == {"m1", "m2", "m3"}
            assert all(isinstance(n, str) for ns in notes.values() for n in ns)
            outcomes["error" if bad_node in incomplete else "judged"] += 1
            continue
        name = "allgather" if stage == "free_port" else stage
        report = _run_stage(inv, runner, Stage(name), nodes, Options())  # type: ignore[arg-type]
        assert [v.node for v in report.verdicts] == ["m1", "m2", "m3"]
        _verdicts_are_plain(report.verdicts)
        json.dumps(report.to_json(), allow_nan=False)
        mine = next(v for v in report.verdicts if v.node == bad_node)
        outcomes["error" if mine.status == "error" else "judged"] += 1
    assert outcomes["error"] and outcomes["judged"], outcomes  # both kinds were exercised


def test_a_checked_collective_answer_never_raises_in_the_alltoall_judge() -> None:
    from brctl.analysis.diagnose import doc as dd
    from brctl.analysis.diagnose.stages import judge_alltoall

    good = _good_collective("alltoall")
    fits = 0
    for doc in _mutations(7, good):
        if not isinstance(doc, dict) or dd.malformed(doc, dd.COLLECTIVE, "alltoall answer"):
            continue
        fits += 1
        _verdicts_are_plain(judge_alltoall({"a": doc, "b": good, "c": good, "d": good}, 0.5))
    assert fits > 20


def test_the_probe_boundary_reads_json_nested_past_the_parsers_depth_as_no_document() -> None:
    """json.loads raises RecursionError (not ValueError) on ~1000 nested arrays: a 200 kB
    answer used to raise out of every fan-out (health, diagnose, the daemon's poll)."""
    from brctl.remote.probes import parse_document, refused

    def result(stdout: str, code: int = 0) -> RunResult:
        return RunResult("n", NodeState.OK, code, stdout, "", 0.0)

    assert parse_document(result(DEEP)) == (None, f"probe output is not JSON: {DEEP[:200]!r}")
    # only a string is printed: repr recurses as deep as the parser did, from a deeper stack
    deep_error = '{"probe_error": ' + "[" * 300 + "]" * 300 + "}"
    assert parse_document(result(deep_error)) == (None, "probe failed on the node: list")
    from brctl.diagnostics.isolate import REFUSED_EXIT, REFUSED_MARK
    for line in (f"{REFUSED_MARK} {DEEP}", f"{REFUSED_MARK} [1]"):
        assert refused(result(line, REFUSED_EXIT)).state is NodeState.OK  # not a refusal it can read


@pytest.mark.parametrize("body", [DEEP.encode(), json.dumps(
    {"node": "n01", "exit": 0, "seconds": HUGE, "out": ["", "", 0], "err": ["", "", 0]}).encode()])
def test_a_slurm_task_record_nested_too_deep_or_too_large_is_no_answer(body: bytes) -> None:
    import base64
    import hashlib

    from brctl.remote.slurm.frame import Frames

    nonce = "0123456789abcdef"
    text = base64.b64encode(body).decode()
    lines = [f"@brctl {nonce} begin {len(body)} {hashlib.sha256(body).hexdigest()}",
             *(f"@brctl {nonce} {text[i:i + 4096]}" for i in range(0, len(text), 4096)),
             f"@brctl {nonce} end"]
    frames = Frames(nonce, ["n01"], 1 << 20)
    for line in lines:
        frames.line(f"0: {line}".encode())
    assert frames.answers() == {}
    assert "does not hold an answer" in frames.why_not("n01")


# The other operations' answer reads (issue 17 item 4). -----------------------------------

@pytest.mark.parametrize("processes", [5, ["rank 0"], None, {"role": "rank"}, [[{"role": "rank"}]]])
def test_stacks_asks_for_py_spy_only_on_an_answer_that_lists_ranks(processes: Any) -> None:
    """py_spy_missing with processes out of shape raised before the answer was checked."""
    from brctl.operations.stacks import ops as stacks

    doc = {"py_spy_missing": True, "processes": processes, "dumps": []}
    col = stacks.collect(ScriptedRunner(lambda m, r: doc), [Node("m", "10.0.0.1")], "train")  # type: ignore[arg-type]
    assert col.nodes["m"].state == "probe_error" and col.py_spy_shipped == ()


@pytest.mark.parametrize("losses", [5, "3.5", {"a": 1}, [HUGE], [1.0, -HUGE], [[1.0]], [True],
                                    [None], None, [NAN, INF, 2]])
def test_replay_reads_a_builtin_answers_losses_out_of_shape_as_that_groups_error(
        losses: Any) -> None:
    """A float() of an integer past a float's range, or a number where a list was, raised
    out of the round (and out of the daemon's replay step)."""
    from brctl.analysis.inventory import from_document
    from brctl.operations.replay import BuiltinWorkload, RoundLauncher, replay_plan
    from brctl.remote.fake import FakeTransport, Reply

    inv = from_document({"nodes": [{"name": "g[01-04]", "address": "10.0.0.[1-4]", "gpus": 2}],
                         "job": {"nodes": "g[01-04]", "tp": 1, "pp": 2}}, "test.yaml")

    def handler(node: Node, argv: Any, stdin: bytes | None) -> Reply:
        return Reply(stdout=json.dumps({"steps": ["aa", "bb"], "losses": losses}) + "\n")

    launcher = RoundLauncher(FakeTransport(handler), inv, replay_plan(inv), BuiltinWorkload(),
                             timeout=10, port_base=33000, fanout=4)
    (run,) = launcher.run([("g01", "g02")])
    if losses is None:
        assert run.status == "ok" and run.losses == ()
    elif losses == [None]:  # a diverged loss: the workload says null (issue 35, item 10)
        assert run.status == "ok" and run.losses == (None,)
    elif isinstance(losses, list) and len(losses) == 3:  # NaN and Infinity are not JSON
        assert run.status == "error" and "NaN is not a finite number" in (run.error or ""), run
    else:
        assert run.status == "error" and "g01: malformed replay answer: document.losses" in (
            run.error or ""), run


def test_update_reads_a_release_checksum_that_is_no_string_as_none() -> None:
    """str() of a value nested as deep as the JSON parser allows recurses past the limit
    from the controller's deeper stack: a checksum must be a string, not made one."""
    from brctl.analysis.update import NodeView

    deep: list[Any] = []
    for _ in range(3000):
        deep = [deep]
    view = NodeView.from_document({"current": "v2", "releases": {"v1": deep, "v2": SHA, "v3": 7}})
    assert view.releases == {"v2": SHA}
