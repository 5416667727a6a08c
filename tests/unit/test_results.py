"""One fan-out's results: the verdict (incomplete, failed, exit code) and folding live in one type."""

from __future__ import annotations

from collections.abc import Sequence

from brctl.core.errors import ExitCode
from brctl.core.transport import Node, NodeState, Results, RunResult
from brctl.remote.fake import FakeTransport, Reply
from brctl.remote.fanout import run_all


def result(node: str, state: NodeState, code: int | None = 0, out: str = "") -> RunResult:
    return RunResult(node, state, code, out, "", 0.1)


def test_exit_code_precedence_incomplete_over_failed_over_ok() -> None:
    ok = [result("n1", NodeState.OK), result("n2", NodeState.OK)]
    assert Results(ok).exit_code is ExitCode.OK
    failed = [*ok, result("n3", NodeState.FAILED, 2)]
    assert Results(failed).exit_code is ExitCode.FINDINGS
    assert Results(failed).failed() == ["n3"]
    lost = [*failed, result("n4", NodeState.TIMEOUT, None)]
    assert Results(lost).exit_code is ExitCode.INCOMPLETE
    assert Results(lost).incomplete() == ["n4"] and Results(lost).failed() == ["n3"]


def test_folded_groups_identical_outcomes_largest_first() -> None:
    rs = Results([result("gpu1", NodeState.OK, out="a"), result("gpu2", NodeState.FAILED, 1),
                  result("gpu3", NodeState.OK, out="a"), result("gpu4", NodeState.OK, out="a")])
    folded = rs.folded()
    assert [(nodes, count) for nodes, _, count in folded] == [("gpu[1,3-4]", 3), ("gpu2", 1)]
    assert folded[0][1].stdout == "a" and folded[1][1].exit_code == 1


def test_run_all_returns_results_in_node_order_with_the_json_contract() -> None:
    def handler(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        return Reply(stdout=node.name, exit_code=0 if node.name != "b" else 3)

    nodes = [Node(name, name, connection="local") for name in ("c", "a", "b")]
    rs = run_all(FakeTransport(handler), nodes, ["x"])
    assert isinstance(rs, Results) and list(rs) == ["c", "a", "b"]
    assert rs.exit_code is ExitCode.FINDINGS
    assert rs.to_json()["b"] == {"state": "failed", "exit_code": 3, "stdout": "b", "stderr": "",
                                 "seconds": 0.0}
