"""``brctl stacks``' human lines for the recorder evidence, from real recorded gloo dumps."""

from __future__ import annotations

from brctl.analysis.fusion import analyse_collectives
from brctl.render.stacks import collective_lines
from tests.unit.test_recorder_analysis import STUCK, load, records, topo_of


def test_stuck_groups_one_line_each_with_who_waits_on_whom() -> None:
    doc = load("skip")
    lines = collective_lines(analyse_collectives([records(doc)], topo_of(doc), stuck_after=STUCK))
    dp = [x for x in lines if "DATA_PARALLEL_GROUP (ranks 1,3)" in x]
    assert len(dp) == 1 and dp[0].startswith("stuck: all_reduce #3 of ")
    assert "3 never entered (culprit)" in dp[0]
    (tp,) = [x for x in lines if "TENSOR_MODEL_PARALLEL_GROUP (ranks 0-1)" in x]
    assert "1 waits in #3 of DATA_PARALLEL_GROUP" in tp


def test_in_flight_is_one_count_line() -> None:
    doc = load("skip")
    lines = collective_lines(analyse_collectives([records(doc)], topo_of(doc)))
    assert lines == ["in flight (not stuck, younger than 60 s): 3 group instances"]


def test_straggler_table() -> None:
    doc = load("slowpp")
    lines = collective_lines(analyse_collectives([records(doc)], topo_of(doc)))
    at = lines.index("stragglers (arrival: enqueue, threshold 20 ms):")
    rows = lines[at + 1:]
    assert rows[0].startswith("  rank 0  DATA_PARALLEL_GROUP  last in 8/8") and \
        rows[0].endswith("straggler")
    assert rows[1].startswith("  rank 2 ") and rows[1].endswith("victim of rank 0")
