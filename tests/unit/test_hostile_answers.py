"""Controller code against node answers of the wrong shape (``ckpt``, the daemon's log tails).

Every byte a node sends is hostile (DESIGN.md, "Trust and safety"). A document that
is valid JSON but has the wrong types (a list of numbers where steps were expected,
a number where a list of names was) must end that copy ``refused`` with the node
named, never raise out of the operation: the daemon calls ``restore`` as a step it
re-runs after a restart, and reads log tails at every poll, so an exception there is
a crash loop that one compromised machine could keep going.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.core.transport import Node, NodeState, RunResult
from brctl.inventory import load_inventory
from brctl.operations import ckpt_copy, ckpt_restore
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
    from brctl.operations.daemon_hooks import LiveHooks

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
    from brctl.operations.daemon_state import DONE, DaemonState
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
