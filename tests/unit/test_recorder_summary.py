"""The node's recorder summary and the controller's decoder, on real recorded gloo dumps.

The dumps are ``tests/fixtures/recorder/*.json``, recorded once by ``record.py`` beside
them from real torch gloo ranks (each fault made by the workload); edited copies make
what a real gloo job cannot show (a wrapped buffer, NCCL's states, hostile answers).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.collectives import CollectiveFormatError, decode_summary
from brctl.diagnostics.recorder import RecorderFormatError, pack_recent, summarise, unpack_recent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recorder"


def load(scenario: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"{scenario}.json").read_text())
    return doc


def summaries(scenario: str) -> dict[int, dict[str, Any]]:
    return {r["rank"]: summarise(r["dump"], r["table"], r["clock_ns"])
            for r in load(scenario)["ranks"]}


def by_desc(summary: dict[str, Any], desc: str) -> dict[str, Any]:
    (g,) = [g for g in summary["groups"].values() if g["desc"] == desc]
    return g


def test_skip_wavefront_per_rank() -> None:
    s = summaries("skip")
    dp = {r: by_desc(s[r], "DATA_PARALLEL_GROUP") for r in s}
    tp = {r: by_desc(s[r], "TENSOR_MODEL_PARALLEL_GROUP") for r in s}
    # rank 3 skipped dp #3: it enqueued only two; rank 1 waits in #3
    assert (dp[3]["last_enqueued"], dp[3]["pending"]) == (2, None)
    assert dp[1]["pending"]["seq"] == 3 and dp[1]["pending"]["op"] == "all_reduce"
    assert dp[1]["ranks"] == [1, 3]
    # ranks 0 and 2 went on to tp #4 and wait there
    assert tp[0]["pending"]["seq"] == 4 and tp[2]["pending"]["seq"] == 4
    assert s[0]["backend"] == "gloo" and s[0]["version"] == "2.10" and not s[0]["wrapped"]
    assert s[0]["step"] == 3
    pend = dp[1]["pending"]
    assert pend["sizes"] == [[4]] and pend["dtypes"] == ["Float"] and pend["started_ns"] is None
    assert 0 < s[1]["clock_ns"] - pend["enqueued_ns"] < 60 * 10**9


def test_recent_window_and_ops_runs() -> None:
    s = summaries("slowpp")
    dp = by_desc(s[0], "DATA_PARALLEL_GROUP")
    assert [row[0] for row in unpack_recent(dp["recent"])] == list(range(1, 9))
    assert dp["ops"] == [["all_reduce", 8]]
    short = summarise(load("slowpp")["ranks"][0]["dump"], None, 0, k=3)
    g = next(iter(short["groups"].values()))
    assert [row[0] for row in unpack_recent(g["recent"])] == [6, 7, 8] and g["ranks"] is None


def test_large_groups_and_the_world_ship_no_member_list() -> None:
    r = load("skip")["ranks"][0]
    table = copy.deepcopy(r["table"])
    table["groups"]["0"] = {"desc": "default_pg", "ranks": list(range(4))}
    (dp,) = [n for n, g in table["groups"].items() if g["desc"] == "DATA_PARALLEL_GROUP"]
    table["groups"][dp]["ranks"] = list(range(0, 4000, 2))  # a 2,000-rank dp group
    s = summarise(r["dump"], table, r["clock_ns"])
    assert s["groups"]["0"]["ranks"] is None and s["groups"][dp]["ranks"] is None
    assert by_desc(s, "TENSOR_MODEL_PARALLEL_GROUP")["ranks"] == [0, 1]


def test_mismatch_op_is_recorded_as_called() -> None:
    s = summaries("mismatch")
    assert by_desc(s[1], "DATA_PARALLEL_GROUP")["pending"]["op"] == "broadcast"
    assert by_desc(s[3], "DATA_PARALLEL_GROUP")["pending"]["op"] == "all_reduce"


def test_wrapped_buffer_keeps_pg_status_counts() -> None:
    r = load("skip")["ranks"][0]
    dump = copy.deepcopy(r["dump"])
    dump["entries"] = dump["entries"][-2:]  # what TORCH_FR_BUFFER_SIZE=2 keeps
    s = summarise(dump, r["table"], r["clock_ns"])
    assert s["wrapped"]
    tp = by_desc(s, "TENSOR_MODEL_PARALLEL_GROUP")
    assert tp["last_enqueued"] == 4 and tp["pending"]["seq"] == 4
    dump["entries"] = dump["entries"][-1:]
    dump["pg_status"] = {}
    s = summarise(dump, r["table"], r["clock_ns"])
    # a group with no entry left is unknown, not idle
    assert by_desc(s, "DATA_PARALLEL_GROUP")["last_enqueued"] == -1


def test_nccl_states_and_older_field_names() -> None:
    r = load("skip")["ranks"][1]
    dump = copy.deepcopy(r["dump"])
    for e in dump["entries"]:
        e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
        e["state"] = "completed" if e["retired"] else "started"
        e["time_discovered_started_ns"] = e["time_created_ns"] + 1000
        e["seq_id"] = e.pop("collective_seq_id")
        del e["retired"], e["is_p2p"]
    s = summarise(dump, None, r["clock_ns"])
    assert s["backend"] == "nccl"
    dp = by_desc(s, "DATA_PARALLEL_GROUP")
    assert dp["pending"]["started_ns"] == dp["pending"]["enqueued_ns"] + 1000
    assert dp["last_completed"] == 2


@pytest.mark.parametrize("edit", [
    lambda d: d.__setitem__("entries", {"a": 1}),
    lambda d: d["entries"][0].__setitem__("collective_seq_id", "x" * 30),
    lambda d: d["entries"][0].__setitem__("input_sizes", [["4"]]),
    lambda d: d["entries"][0].__setitem__("time_created_ns", None),
    lambda d: d["entries"][0].__setitem__("time_created_ns", 2**70),  # not an int64
    lambda d: d["entries"][-1].__setitem__("time_created_ns", 10**400),
    lambda d: d["pg_status"]["1"].__setitem__("last_enqueued_collective", "9" * 25),
    lambda d: d.__setitem__("pg_status", []),
])
def test_malformed_dump_is_the_ranks_error(edit: Any) -> None:
    r = load("skip")["ranks"][0]
    dump = copy.deepcopy(r["dump"])
    edit(dump)
    with pytest.raises(RecorderFormatError):
        summarise(dump, r["table"], r["clock_ns"])


def test_decoder_round_trips_every_recorded_rank() -> None:
    for scenario in ("healthy", "inflight", "skip", "mismatch", "slowpp"):
        for rank, s in summaries(scenario).items():
            rec = decode_summary(json.loads(json.dumps(s)), rank, 4)
            assert rec.rank == rank and rec.clock_ns == s["clock_ns"]
            for name, g in s["groups"].items():
                got = rec.groups[name]
                assert got.last_enqueued == g["last_enqueued"]
                assert got.recent == tuple(unpack_recent(g["recent"]))
                assert all(t > 0 for _, t, _ in got.recent)
                assert len(got.ops) == len(got.recent)


@pytest.mark.parametrize("edit, where", [
    (lambda s, g: s.__setitem__("v", 2), "version"),
    (lambda s, g: g.__setitem__("ranks", [0, 9]), "ranks"),
    (lambda s, g: g.__setitem__("recent", [[1, 2, None]] * 3), "recent"),
    (lambda s, g: g.__setitem__("recent", pack_recent([(1, 2, 0)] * 65)), "recent"),
    (lambda s, g: g.__setitem__("recent", pack_recent([(1, 2, 0)])[:-4]), "recent"),
    (lambda s, g: g.__setitem__("recent", "!!!!"), "recent"),
    (lambda s, g: g.__setitem__("ops", [["all_reduce", 99]]), "ops"),
    (lambda s, g: g.__setitem__("desc", "x" * 500), "desc"),
    (lambda s, g: g["pending"].__setitem__("sizes", [[[1]]]), "sizes"),
    (lambda s, g: s.__setitem__("groups", {str(i): g for i in range(600)}), "groups"),
    (lambda s, g: s.__setitem__("clock_ns", 1.5), "clock_ns"),
    (lambda s, g: s.__setitem__("clock_ns", 10**400), "clock_ns"),  # would overflow a float
    (lambda s, g: s.__setitem__("clock_ns", 2**63), "clock_ns"),
    (lambda s, g: g["pending"].__setitem__("enqueued_ns", -(10**400)), "enqueued_ns"),
    (lambda s, g: g["pending"].__setitem__("seq", 2**63), "seq"),
    (lambda s, g: g.__setitem__("last_enqueued", 10**30), "last_enqueued"),
    (lambda s, g: s.__setitem__("step", 10**400), "step"),
])
def test_decoder_refuses_hostile_summaries(edit: Any, where: str) -> None:
    s = copy.deepcopy(summaries("skip")[1])
    g = by_desc(s, "DATA_PARALLEL_GROUP")
    edit(s, g)
    with pytest.raises(CollectiveFormatError, match=where):
        decode_summary(s, 1, 4)
