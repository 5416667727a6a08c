"""The collective analysis (wavefront, wait-for graph, mismatch, stragglers, fusion) on real
recorded gloo dumps (``tests/fixtures/recorder``, recorded by ``record.py``) and edited copies.

The dumps were taken 2.5 s into each fault, so ``stuck_after`` below that (2 s) makes them
stuck and the default (60 s) leaves them in flight: in flight is not stuck.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from brctl.analysis.collectives import GroupRecord, RankRecord, decode_summary
from brctl.analysis.fusion import analyse_collectives, fuse
from brctl.analysis.stacks.tree import Frame, RankSample, Round, analyse
from brctl.analysis.topology import Topology
from brctl.diagnostics.recorder import summarise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recorder"
STUCK = 2.0  # seconds: below the 2.5 s the faults had lasted when dumped


def load(scenario: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / f"{scenario}.json").read_text())
    return doc


def topo_of(doc: dict[str, Any]) -> Topology:
    lay = doc["layout"]
    return Topology.build(["m0", "m1"], [2, 2], tp=lay["tp"], pp=lay["pp"])


def records(doc: dict[str, Any], table: bool = True, drop: tuple[int, ...] = ()
            ) -> dict[int, RankRecord]:
    return {r["rank"]: decode_summary(
        json.loads(json.dumps(summarise(r["dump"], r["table"] if table else None, r["clock_ns"]))),
        r["rank"], doc["layout"]["world"]) for r in doc["ranks"] if r["rank"] not in drop}


def verdicts(coll: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {f"{v.group.desc}{list(v.group.members)}#{v.seq}": (v.verdict, v.missing)
            for v in coll.wave.groups}


def test_skipped_collective_names_the_rank_that_never_entered_not_its_victims() -> None:
    doc = load("skip")
    topo = topo_of(doc)
    coll = analyse_collectives([records(doc)], topo, stuck_after=STUCK)
    assert [(c.rank, c.why) for c in coll.culprits] == [(3, "never_entered")]
    assert coll.culprits[0].text == \
        "rank 3 never entered all_reduce #3 of DATA_PARALLEL_GROUP (ranks 1,3)"
    v = verdicts(coll)
    assert v["DATA_PARALLEL_GROUP[1, 3]#3"] == ("stuck", (3,))
    # rank 1 is missing from tp #4 because it waits in dp #3: a victim, not a culprit
    (tp01,) = [g for g in coll.wave.groups if g.group.members == (0, 1)]
    assert tp01.missing == (1,) and [w[0] for w in tp01.waits] == [1]
    assert coll.wave.waiting == {0, 1, 2}


def test_a_wait_for_cycle_is_broken_by_the_order_the_other_ranks_ran() -> None:
    # rank 3 skipped dp #3 and went on to the world's #3: rank 1 waits in dp, the others in
    # the world's collective, which rank 1 cannot reach; everyone else ran dp before it
    doc = load("cycle")
    coll = analyse_collectives([records(doc)], topo_of(doc), stuck_after=STUCK)
    assert [(c.rank, c.why) for c in coll.culprits] == [(3, "never_entered")]
    assert coll.wave.waiting == {0, 1, 2}
    # with no rank to tell the order (the witnesses' dumps lost), the cycle itself is named
    blind = {r: rec for r, rec in records(doc).items() if r in (1, 3)}
    coll = analyse_collectives([blind], topo_of(doc), stuck_after=STUCK)
    assert {c.why for c in coll.culprits} <= {"cycle", "no_answer"}


def test_in_flight_is_not_stuck() -> None:
    for scenario in ("skip", "inflight", "healthy", "mismatch"):
        coll = analyse_collectives([records(load(scenario))], topo_of(load(scenario)))
        assert {v for v, _ in verdicts(coll).values()} == {"in_flight"}, scenario
        assert coll.culprits == () and coll.communicator == ()


def test_the_same_frontier_in_two_captures_is_stuck_whatever_its_age() -> None:
    doc = load("skip")
    first = records(doc)
    later = {r: rec._replace(clock_ns=rec.clock_ns + 10 * 10**9) for r, rec in first.items()}
    coll = analyse_collectives([first, later], topo_of(doc), stuck_after=3600)
    assert [c.rank for c in coll.culprits] == [3]  # the very entries, 10 s apart
    # the same answers twice with no time between (--interval 0): nothing is "again"
    coll = analyse_collectives([first, first], topo_of(doc), stuck_after=3600)
    assert coll.culprits == () and {v.verdict for v in coll.wave.groups} == {"in_flight"}
    healthy = load("healthy")
    coll = analyse_collectives([records(healthy), later], topo_of(doc), stuck_after=3600)
    assert all(v.verdict == "in_flight" for v in coll.wave.groups if v.seq == 4)


def test_type_mismatch_names_the_rank_that_called_broadcast() -> None:
    doc = load("mismatch")
    coll = analyse_collectives([records(doc)], topo_of(doc), stuck_after=STUCK)
    assert [(c.rank, c.why) for c in coll.culprits] == [(1, "mismatch")]
    assert "broadcast" in coll.culprits[0].text and "all_reduce #2" in coll.culprits[0].text


def all_waiting(scenario: str) -> dict[str, Any]:
    """The recorded dumps with every group's last collective pending on every rank, 2 min old
    (the communicator's picture: everyone joined, none completed)."""
    doc = copy.deepcopy(load(scenario))
    for r in doc["ranks"]:
        for name in {e["process_group"][0] for e in r["dump"]["entries"]}:
            mine = [e for e in r["dump"]["entries"] if e["process_group"][0] == name]
            for e in mine:
                e["retired"] = e is not mine[-1]
        r["dump"]["pg_status"] = {}
        r["clock_ns"] += 120 * 10**9
    return doc


def test_size_and_dtype_mismatch_from_edited_dumps() -> None:
    for key, value in (("input_sizes", [[8]]), ("input_dtypes", ["Half"])):
        doc = all_waiting("healthy")
        last = [e for e in doc["ranks"][3]["dump"]["entries"]
                if e["process_group"][1] == "DATA_PARALLEL_GROUP"][-1]
        last[key] = value
        coll = analyse_collectives([records(doc)], topo_of(doc))
        # a tie in the two-rank group, broken by the other dp instance at the same #3
        assert [(c.rank, c.why) for c in coll.culprits] == [(3, "mismatch")], key
        assert str(value[0]).strip("[]'") in coll.culprits[0].text


def test_members_from_the_layout_when_no_table_is_served() -> None:
    doc = load("skip")
    coll = analyse_collectives([records(doc, table=False)], topo_of(doc), stuck_after=STUCK)
    assert [c.rank for c in coll.culprits] == [3]
    assert {v.group.source for v in coll.wave.groups} == {"layout"}
    assert {(v.group.kind, v.group.members) for v in coll.wave.groups} == {
        ("dp", (1, 3)), ("tp", (0, 1)), ("tp", (2, 3))}


def test_a_dead_rank_is_named_by_its_absence() -> None:
    doc = load("skip")  # rank 3's answer never came: the survivors' dumps decide
    coll = analyse_collectives([records(doc, drop=(3,))], topo_of(doc), stuck_after=STUCK)
    assert [(c.rank, c.why) for c in coll.culprits] == [(3, "no_answer")]


def test_every_member_joined_none_completed_is_the_communicator() -> None:
    doc = all_waiting("healthy")
    coll = analyse_collectives([records(doc)], topo_of(doc))
    assert coll.culprits == ()
    assert {v.verdict for v in coll.wave.groups} == {"communicator"}
    stacks = analyse([_round(topo_of(doc))], topo_of(doc))
    fused = fuse(stacks, coll, topo_of(doc), _round(topo_of(doc)))
    assert fused.evict == () and {g.kind for g in fused.suspects} == {"communicator"}


def test_wrapped_buffers_still_decide() -> None:
    doc = copy.deepcopy(load("skip"))
    for r in doc["ranks"]:
        r["dump"]["entries"] = r["dump"]["entries"][-3:]  # TORCH_FR_BUFFER_SIZE=3
    coll = analyse_collectives([records(doc)], topo_of(doc), stuck_after=STUCK)
    assert all(rec.wrapped for rec in records(doc).values())
    assert [c.rank for c in coll.culprits] == [3]


def test_straggler_is_the_earliest_late_rank_along_the_pipeline() -> None:
    doc = load("slowpp")
    topo = topo_of(doc)
    coll = analyse_collectives([records(doc)], topo)
    roles = {s.rank: (s.victim_of, s.late_in, s.window) for s in coll.late}
    assert roles[0][0] is None and roles[2][0] == 0  # rank 2 is late because rank 0 is
    assert set(roles) == {0, 2} and roles[0][1] > roles[0][2] // 2
    assert coll.arrival == "enqueue"
    high = analyse_collectives([records(doc)], topo, straggler_threshold_ms=500)
    assert high.late == ()
    assert analyse_collectives([records(load("healthy"))], topo_of(load("healthy"))).late == ()


def _round(topo: Topology, odd: dict[int, tuple[Frame, ...] | None] | None = None) -> Round:
    wait = (Frame("<module>", "train.py", 1), Frame("step", "train.py", 40),
            Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2))
    odd = odd or {}
    return Round(tuple(RankSample(r, topo.machine_of(r), 100 + r, odd.get(r, wait),
                                  None if odd.get(r, wait) is not None else "timed out")
                       for r in range(topo.world)))


def test_fusion_evicts_the_culprits_group_and_cites_recorder_and_stack() -> None:
    doc = load("skip")
    topo = topo_of(doc)
    loader = (Frame("<module>", "train.py", 1), Frame("next_batch", "loader.py", 88))
    rnd = _round(topo, {3: loader})
    stacks = analyse([rnd], topo)
    fused = fuse(stacks, analyse_collectives([records(doc)], topo, stuck_after=STUCK), topo, rnd)
    assert fused.evict == ("m1",)
    (g,) = fused.suspects
    assert g.evidence == ("rank 3 never entered all_reduce #3 of DATA_PARALLEL_GROUP (ranks 1,3)"
                          "; its main thread: loader.py:88 next_batch",)
    assert {o.rank for o in fused.outliers} == {3}


def test_identical_stacks_still_evict_from_the_recorder() -> None:
    doc = load("skip")  # every rank parked in the same collective: stacks see nothing
    topo = topo_of(doc)
    rnd = _round(topo)
    stacks = analyse([rnd], topo)
    assert stacks.evict == ()
    fused = fuse(stacks, analyse_collectives([records(doc)], topo, stuck_after=STUCK), topo, rnd)
    assert fused.evict == ("m1",) and [o.reason for o in fused.outliers] == ["collective"]
    calm = fuse(stacks, analyse_collectives([records(doc)], topo), topo, rnd)
    assert calm.evict == () and calm.collectives is not None


def test_fusion_names_the_straggler_not_its_victims() -> None:
    doc = load("slowpp")
    topo = topo_of(doc)
    rnd = _round(topo)
    fused = fuse(analyse([rnd], topo), analyse_collectives([records(doc)], topo), topo, rnd)
    assert [(o.rank, o.reason) for o in fused.outliers] == [(0, "straggler")]
    assert fused.evict == (topo.machine_of(0),)


def test_a_stack_minority_the_recorder_does_not_back_is_not_evicted() -> None:
    doc = load("slowpp")  # m0: ranks 0, 1 (stage 0); m1: ranks 2, 3 (stage 1)
    topo = topo_of(doc)
    odd = (Frame("<module>", "train.py", 1), Frame("log_metrics", "metrics.py", 9))
    rnd = _round(topo, {3: odd})  # stage 1 votes 1 vs 1: the healthy rank 3 is the minority
    stacks = analyse([rnd], topo)
    assert [(o.rank, o.reason) for o in stacks.outliers] == [(3, "minority")]
    fused = fuse(stacks, analyse_collectives([records(doc)], topo), topo, rnd)
    assert fused.evict == ("m0",)  # the straggler's machine alone, not rank 3's too
    assert {o.rank: o.reason for o in fused.outliers} == {0: "straggler", 3: "minority"}
    assert "not evicted" in next(o.detail for o in fused.outliers if o.rank == 3)


def _shift(doc: dict[str, Any], ranks: set[int], ns: int) -> dict[str, Any]:
    """The dumps with ``ranks``' machine clock moved by ``ns`` (every time it wrote)."""
    doc = copy.deepcopy(doc)
    for r in doc["ranks"]:
        if r["rank"] in ranks:
            r["clock_ns"] += ns
            for e in r["dump"]["entries"]:
                e["time_created_ns"] += ns
    return doc


def test_one_machines_clock_never_evicts_another() -> None:
    # healthy 2x2 job; m0's clock 200 ms behind: m1's ranks look 200 ms late in dp
    doc = _shift(load("healthy"), {0, 1}, -200 * 10**6)
    topo = topo_of(doc)
    coll = analyse_collectives([records(doc)], topo)
    assert coll.late and not any(x.trusted for x in coll.late)
    rnd = _round(topo)
    assert fuse(analyse([rnd], topo), coll, topo, rnd).evict == ()
    # one rank per machine: the slow rank's 1-vs-1 dp comparison spans two clocks too
    wide = Topology.build(["m0", "m1", "m2", "m3"], [1, 1, 1, 1], tp=1, pp=2)
    coll = analyse_collectives([records(load("slowpp"))], wide)
    assert {x.rank for x in coll.late} == {0, 2} and not any(x.trusted for x in coll.late)


def test_json_keys() -> None:
    doc = load("skip")
    topo = topo_of(doc)
    coll = analyse_collectives([records(doc)], topo, stuck_after=STUCK)
    out = coll.to_json()
    assert out["collective_culprits"][0]["rank"] == 3 and out["stuck_after_s"] == STUCK
    assert {g["verdict"] for g in out["collective_groups"]} == {"stuck"}
    row = coll.rank_json(1)
    assert row is not None
    (dp,) = [g for g in row.values() if g["desc"] == "DATA_PARALLEL_GROUP"]
    assert dp["pending"]["seq"] == 3 and dp["pending"]["age_s"] > STUCK
    assert coll.rank_json(7) is None


def test_json_keys_match_the_shipped_schema() -> None:
    import jsonschema

    from brctl.schemas.documents import STACKS_RECORDER

    schema = {"type": "object", "properties": STACKS_RECORDER,
              "required": list(STACKS_RECORDER), "additionalProperties": False}
    for scenario, stuck in (("skip", STUCK), ("mismatch", STUCK), ("slowpp", 60.0)):
        doc = load(scenario)
        out = analyse_collectives([records(doc)], topo_of(doc), stuck_after=stuck).to_json()
        jsonschema.validate(out, schema)  # every key documented, every type as documented
    doc = all_waiting("healthy")
    jsonschema.validate(analyse_collectives([records(doc)], topo_of(doc)).to_json(), schema)


def _summaries(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: json.loads(json.dumps(summarise(r["dump"], r["table"], r["clock_ns"])))
            for r in doc["ranks"]}


def _decoded(sums: dict[int, dict[str, Any]]) -> dict[int, RankRecord]:
    return {r: decode_summary(s, r, 4) for r, s in sums.items()}


def test_one_machines_pending_claim_names_but_never_evicts() -> None:
    doc = copy.deepcopy(load("healthy"))
    for r in doc["ranks"]:  # every collective done a moment ago: between two collectives
        for e in r["dump"]["entries"]:
            e["retired"] = True
    sums = _summaries(doc)
    topo = topo_of(doc)
    # m0's rank 0 claims dp's next collective pending for 120 s; its peer rank 2 (m1) never
    # enqueued it: only m0's word says anything hangs
    (dp,) = [n for n, g in sums[0]["groups"].items() if g["desc"] == "DATA_PARALLEL_GROUP"]
    g = sums[0]["groups"][dp]
    g["last_enqueued"] += 1
    g["pending"] = {"seq": g["last_enqueued"], "op": "all_reduce", "sizes": [[4]],
                    "dtypes": ["Float"], "enqueued_ns": sums[0]["clock_ns"] - 120 * 10**9,
                    "started_ns": None}
    coll = analyse_collectives([_decoded(sums)], topo)
    assert [(c.rank, c.why, c.corroborated) for c in coll.culprits] == [
        (2, "never_entered", False)]
    rnd = _round(topo)
    assert fuse(analyse([rnd], topo), coll, topo, rnd).evict == ()
    # the culprit's own stack outside any collective (a GIL held in native code, a loader)
    # backs the claim: then it is evicted
    native = (Frame("<module>", "train.py", 1), Frame("hold_gil", "train.py", 24))
    rnd = _round(topo, {2: native})
    assert fuse(analyse([rnd], topo), coll, topo, rnd).evict == ("m1",)


def test_an_invented_group_of_one_rank_evicts_nobody() -> None:
    doc = load("healthy")
    sums = {r: s for r, s in _summaries(doc).items() if r in (0, 1)}  # m1 gave no answer
    sums[0]["groups"]["x"] = {
        "desc": "", "ranks": [0, 1, 2, 3], "last_enqueued": 1, "last_completed": 0,
        "pending": {"seq": 1, "op": "all_reduce", "sizes": [], "dtypes": [],
                    "enqueued_ns": sums[0]["clock_ns"] - 600 * 10**9, "started_ns": None},
        "recent": "", "ops": []}
    topo = topo_of(doc)
    coll = analyse_collectives([_decoded(sums)], topo)
    assert {c.rank for c in coll.culprits} == {2, 3}  # named from rank 0's word ...
    assert not any(c.corroborated for c in coll.culprits)  # ... never evicted on it
    rnd = _round(topo)
    assert fuse(analyse([rnd], topo), coll, topo, rnd).evict == ()
    sums[0]["groups"]["x"]["ranks"] = [1, 2, 3]  # a table about a group it is not in: ignored
    inst = analyse_collectives([_decoded(sums)], topo).instances["x"]
    assert inst.source != "table"


def _arrivals(offsets_ms: dict[int, float], desc: str = "DATA_PARALLEL_GROUP"
              ) -> dict[int, RankRecord]:
    """Edited records: one dp group, 10 collectives 1 s apart, each rank's enqueue times
    moved by its offset (a clock error, or lateness). Built from the recorded gloo
    summary's own fields (version, backend) so only the times are invented."""
    base = records(load("healthy"))[0]
    members = tuple(sorted(offsets_ms))
    t0 = base.clock_ns - 20 * 10**9
    out = {}
    for r, off in offsets_ms.items():
        recent = tuple((q, t0 + q * 10**9 + int(off * 1e6), 0) for q in range(1, 11))
        g = GroupRecord("9", desc, members, 10, 10, None, recent, ("all_reduce",) * 10)
        out[r] = base._replace(rank=r, groups={"9": g})
    return out


def test_three_machines_are_too_few_to_outvote_one_bad_clock() -> None:
    three = Topology.build([f"m{i}" for i in range(6)], [1] * 6, tp=1, pp=2)  # dp {0,1,2}
    coll = analyse_collectives([_arrivals({0: -200, 1: 0, 2: -1})], three)
    assert not any(x.trusted for x in coll.late)
    four = Topology.build([f"m{i}" for i in range(8)], [1] * 8, tp=1, pp=2)  # dp {0,1,2,3}
    coll = analyse_collectives([_arrivals({0: -200, 1: 0, 2: -1, 3: 1})], four)
    assert not any(x.trusted for x in coll.late)
    coll = analyse_collectives([_arrivals({0: 0, 1: 2, 2: -1, 3: 60})], four)
    assert [(x.rank, x.trusted) for x in coll.late] == [(3, True)]  # truly 60 ms late


def test_one_rank_cannot_pick_the_side_of_a_cycle() -> None:
    doc = copy.deepcopy(load("cycle"))
    entries = doc["ranks"][2]["dump"]["entries"]  # rank 2 (m1) tells the opposite order
    world = next(e for e in entries if e["process_group"][1] == "default_pg"
                 and e["collective_seq_id"] == 3)
    dp = next(e for e in entries if e["process_group"][1] == "DATA_PARALLEL_GROUP"
              and e["collective_seq_id"] == 3)
    dp["time_created_ns"] = world["time_created_ns"] + 10**6
    coll = analyse_collectives([records(doc)], topo_of(doc), stuck_after=STUCK)
    assert {(c.rank, c.why) for c in coll.culprits} == {(1, "cycle"), (3, "cycle")}


def test_one_machine_s_word_and_a_stack_outside_collectives_evict_no_one() -> None:
    """Review #20: m0 claims its ranks have waited 2 minutes in the next collective while
    m1's ranks, honest and healthy, sit between two collectives (all completed), where a
    py-spy stack shows no torch.distributed frame. Such a stack is what every healthy rank
    shows too, so it must not back the lone machine's word: nothing is evicted."""
    from brctl.analysis.collectives import Pending

    doc = load("healthy")
    topo = topo_of(doc)
    out = {}
    for r, rec in records(doc).items():
        groups = {}
        for name, g in rec.groups.items():
            if topo.machine_of(r) == "m1":
                g = g._replace(pending=None, last_completed=g.last_enqueued)
            else:
                seq = g.last_enqueued + 1
                g = g._replace(last_enqueued=seq, pending=Pending(
                    seq, "all_reduce", ((4,),), ("float",), rec.clock_ns - 120 * 10**9, None))
            groups[name] = g
        out[r] = rec._replace(groups=groups)
    coll = analyse_collectives([out], topo)
    forward = (Frame("<module>", "train.py", 1), Frame("step", "train.py", 40),
               Frame("forward", "model.py", 120))
    rnd = Round(tuple(RankSample(r, topo.machine_of(r), 100 + r, forward, None)
                      for r in range(topo.world)))
    fused = fuse(analyse([rnd], topo), coll, topo, rnd)
    assert fused.evict == ()
