"""Recorder summaries of a collection, decoded per round: real recorded gloo dumps."""

from __future__ import annotations

import json
from pathlib import Path

from brctl.analysis.topology import Topology
from brctl.diagnostics.recorder import summarise
from brctl.operations.stacks.collectives import decode_captures
from brctl.operations.stacks.types import Collection, NodeCollection, RankRead

SKIP = Path(__file__).resolve().parents[1] / "fixtures" / "recorder" / "skip.json"


def test_summaries_decode_per_round_and_a_bad_one_is_that_ranks_error() -> None:
    doc = json.loads(SKIP.read_text())
    topo = Topology.build(["m0", "m1"], [2, 2], tp=doc["layout"]["tp"], pp=doc["layout"]["pp"])
    rows = {r["rank"]: RankRead(r["rank"], 100 + r["rank"], "brctl-socket", "read",
                                summary=summarise(r["dump"], r["table"], r["clock_ns"]))
            for r in doc["ranks"]}
    rows[3] = rows[3]._replace(summary={"v": 99})
    nodes = {m: NodeCollection(m, "ok", None, recorder={
        r: rec for r, rec in rows.items() if topo.rank_machines[r] == m}) for m in ("m0", "m1")}
    # m1 also sees rank 0 (one kernel): m0's row is the one kept
    nodes["m1"] = NodeCollection("m1", "ok", None, recorder={**nodes["m1"].recorder,
                                                             0: rows[0]._replace(summary={})})
    captures, errors = decode_captures([Collection(nodes, 0.0, 0.0)] * 2, topo)
    assert len(captures) == 2 and sorted(captures[0]) == [0, 1, 2]
    assert captures[0][1].groups and captures[0][1].rank == 1
    assert list(errors) == [3] and "summary version" in errors[3]
