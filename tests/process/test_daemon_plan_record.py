"""``PlanRecord``: the recorded plan as one typed value, and a malformed one abandoned.

A record the daemon cannot read (a damaged database, another brctl's) used to be a
``KeyError`` at every start: the daemon died, systemd restarted it, it died again.
Now it is an abandoned plan with a page, and the daemon stays up, halted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brctl.analysis.daemon.plan import PlanRecord, Release, steps_for
from brctl.analysis.daemon.policy import Plan
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store
from tests.process.test_daemon_crashpoints import daemon, dead_holder
from tests.process.test_daemon_loop import Clock, Script, hooks_log


def record() -> PlanRecord:
    plan = Plan("evict", ("n3",), "n3: ecc", restart=True)
    members = ("n1", "n2", "n3", "n4")
    steps = steps_for(plan, members=members, replacements={"n3": "s1"},
                      release=Release("v1", None, ("v1", "sha"), None), stop=True)
    return PlanRecord(plan, steps, members, {"n3": "s1"},
                      {"kind": "gpu_fault", "nodes": ["n3"], "reason": "ecc"}, "", "hand",
                      ("alice",), "llm/plan/7")


def test_a_plan_record_round_trips_through_its_json() -> None:
    rec = record()
    doc = json.loads(json.dumps(rec.to_json()))  # as the action log stores it
    assert PlanRecord.from_json(doc) == rec
    assert rec.expected_members(swapped=True) == ["n1", "n2", "s1", "n4"]
    assert rec.incident_kind == "gpu_fault"
    bare = PlanRecord(Plan("reattempt", (), "crash", restart=True), (), ("n1",))
    assert "follows" not in bare.to_json() and PlanRecord.from_json(bare.to_json()) == bare


@pytest.mark.parametrize("damage", [
    lambda d: d["plan"].pop("reason"), lambda d: d.pop("plan"), lambda d: d.pop("members"),
    lambda d: d.__setitem__("steps", {"not": "a list"}),
    lambda d: d["steps"][0].__setitem__("kind", "format-disk"),
    lambda d: d["plan"].__setitem__("decision", "reboot"),
    lambda d: d.__setitem__("incident", "crash"),
])
def test_a_malformed_record_is_a_value_error_never_a_key_error(damage: object) -> None:
    doc = record().to_json()
    damage(doc)  # type: ignore[operator]
    with pytest.raises(ValueError, match="malformed plan record"):
        PlanRecord.from_json(doc)


def test_a_plan_record_without_a_reason_is_abandoned_with_a_page(tmp_path: Path) -> None:
    doc = record().to_json()
    del doc["plan"]["reason"]
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    clock = Clock()
    state.acquire_lease("first", dead_holder().to_json(), clock.now, 60, lambda _h: None)
    state.admit("llm/plan/1", doc, "n3: ecc", clock.now, evict=["n3"], source="daemon",
                operator=None, caps=lambda _t: None)
    state.intend("llm/plan/1/evict/n3", "evict", "n3", {}, "n3: ecc", clock.now)  # then killed
    script = Script()
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()  # no KeyError: the plan is abandoned, the daemon stays up, halted
    plan = state.action("llm/plan/1")
    assert plan is not None and plan.state == "abandoned" and "malformed" in plan.reason
    assert state.action("llm/plan/1/evict/n3").state == "unknown"  # type: ignore[union-attr]
    assert second.halted and hooks_log(tmp_path) == []
    assert '"plan", "abandoned"' in (tmp_path / "notify.jsonl").read_text()
    assert state.crash_history(0.0) == []  # the ladder skips what it cannot read
    store.close()
