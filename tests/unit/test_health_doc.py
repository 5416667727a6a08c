"""A node's health document is checked for shape where it arrives: a hostile answer is
that node's error, never a crash of the whole sweep."""

from __future__ import annotations

from typing import Any

import pytest

from brctl.analysis.health.doc import malformed
from brctl.analysis.inventory import from_document
from brctl.core.errors import ExitCode
from brctl.core.transport import NodeState, RunResult
from brctl.operations.health import judge
from brctl.remote.probes import ProbeResult
from tests.unit.test_health_analysis import doc, gpu


def test_an_honest_document_fits() -> None:
    assert malformed(doc()) is None
    assert malformed({}) is None  # every part may be absent (the checks say why)


@pytest.mark.parametrize(("part", "where"), [
    ({"nvml": "x"}, "document.nvml: expected an object or null, got str"),
    ({"nvml": {"status": "ok", "gpus": [gpu(0, temperature="hot")]}},
     "document.nvml.gpus[0].temperature"),
    ({"disk": {"/": {"total": "a", "free": 1}}}, "document.disk['/'].total"),
    ({"kernel_log": {"events": [{"code": "x"}]}}, "document.kernel_log.events[0].code"),
    ({"ib": {"ports": ["x"]}}, "document.ib.ports[0]: expected an object"),
    ({"process": {"pids": "12"}}, "document.process.pids"),
])
def test_a_document_out_of_shape_is_named_by_path(part: dict[str, Any], where: str) -> None:
    why = malformed(doc(**part))
    assert why is not None and why.startswith(where)


def test_a_hostile_answer_is_that_nodes_error_and_the_run_is_incomplete() -> None:
    inv = from_document({"nodes": [{"name": "gpu[1-2]", "address": "127.0.0.[1-2]"}]}, "inv.yaml")
    answers = {"gpu1": doc(), "gpu2": doc(nvml="not an object")}
    results = {name: ProbeResult(name, RunResult(name, NodeState.OK, 0, "", "", 0.1), d, None)
               for name, d in answers.items()}
    report, samples = judge(inv, list(inv.nodes.values()), results, {})
    assert report.nodes["gpu1"].answered and report.nodes["gpu1"].status != "error"
    bad = report.nodes["gpu2"]
    assert bad.status == "error" and not bad.answered
    assert bad.error == "malformed health document: document.nvml: expected an object or null, got str"
    assert report.exit_code is ExitCode.INCOMPLETE
    assert set(samples) == {"gpu1"}  # nothing kept from an answer that could not be read
