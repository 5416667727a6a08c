"""Pure update planning: transfer and switch plans, drift, due windows, rollback targets."""

from __future__ import annotations

import pytest

from brctl.analysis.update import (
    Event,
    NodeView,
    Pending,
    check_version,
    drift,
    is_due,
    plan_switch,
    plan_transfer,
    rollback_target,
)
from brctl.commands._options import parse_duration
from brctl.core.errors import UsageError

SHA = "a" * 64
OTHER = "b" * 64


def view(current=None, releases=None, partial=None):
    return NodeView(current, releases or {}, partial or {})


@pytest.mark.parametrize("partial", [{SHA: "abc"}, {SHA: [1]}, {SHA: None}, {SHA: 1e400},
                                     {SHA: True}])
def test_a_node_view_drops_partial_counts_that_are_not_integers(partial):
    """A hostile node's inspect answer must not crash ``update push`` for the whole fleet."""
    got = NodeView.from_document({"current": "v1", "releases": {"v1": SHA},
                                  "partial": {**partial, OTHER: 10}})
    assert dict(got.partial) == {OTHER: 10} and dict(got.releases) == {"v1": SHA}


def test_transfer_plan_skips_holders_resumes_partials_and_refuses_conflicts():
    views = {
        "n1": view("v1", {"v1": OTHER, "v2": SHA}),  # already staged: skip
        "n2": view("v1", {"v1": OTHER}, {SHA: 400}),  # cut transfer: resume at 400
        "n3": view(None, {}, {SHA: 5000}),  # partial longer than the artifact: restart
        "n4": view("v2", {"v2": OTHER}),  # same version, other code: immutable
        "n5": None,  # did not answer
        "n6": view(None, {}, {OTHER: 10}),  # partial of another artifact: from 0
    }
    plan = plan_transfer(views, "v2", SHA, size=1000)
    assert plan.skip == ("n1",)
    assert dict(plan.send) == {"n2": 400, "n3": 0, "n6": 0}
    assert set(plan.conflict) == {"n4"} and "immutable" in plan.conflict["n4"]
    assert plan.unknown == ("n5",)


def test_switch_plan_all_or_nothing_inputs():
    views = {"a": view("v1", {"v1": OTHER, "v2": SHA}), "b": view("v2", {"v2": SHA}),
             "c": view("v1", {"v1": OTHER}), "d": None,
             "e": view("v1", {"v2": OTHER})}  # v2 with the wrong checksum counts as lagging
    plan = plan_switch(views, "v2", SHA)
    assert plan.ready == ("a",) and plan.already == ("b",)
    assert plan.lagging == ("c", "e") and plan.unknown == ("d",)


@pytest.mark.parametrize("currents, job, expected", [
    ({"a": "v2", "b": "v2", "c": "v1"}, "v2", ["c"]),
    ({"a": "v2", "b": "v2", "c": None}, "v2", ["c"]),  # no release at all drifts too
    ({"a": "v1", "b": "v1", "c": "v2"}, None, ["c"]),  # no record: majority wins
    ({"a": "v1", "b": "v2"}, None, ["b"]),  # a tie: stable choice (lowest name)
    ({"a": None, "b": None}, None, []),
    ({}, "v1", []),
    ({"a": "v1", "b": "v1"}, "v2", ["a", "b"]),  # all drifted from the recorded version
])
def test_drift(currents, job, expected):
    assert drift(currents, job) == expected


def test_due_window():
    lazy = Pending("v2", SHA, since=1000.0, window_s=3600.0)
    assert not is_due(lazy, 1000.0 + 3599) and is_due(lazy, 1000.0 + 3600)
    assert is_due(Pending("v2", SHA, 1000.0, 3600.0, urgent=True), 1000.0)
    assert not is_due(None, 1e12)
    assert lazy.to_json()["due_at"] == 4600.0


def ev(i, action, version, frm, outcome="ok", switched=True):
    return Event(i, float(i), "me@host", action, version, SHA, frm, ("n1",), outcome,
                 {"switched": switched and outcome == "ok"})


def test_rollback_walks_back_one_update_per_rollback():
    events = [ev(1, "push", "v1", None, switched=False), ev(2, "apply", "v1", None),
              ev(3, "apply", "v2", "v1"), ev(4, "apply", "v3", "v2")]
    assert rollback_target(events, "v3") == "v2"
    events.append(ev(5, "rollback", "v2", "v3"))
    assert rollback_target(events, "v2") == "v1"  # not back to v3
    events.append(ev(6, "rollback", "v1", "v2"))
    assert rollback_target(events, "v1") is None  # the first release: nothing before it
    assert rollback_target(events, None) is None


def test_rollback_ignores_failed_switches():
    events = [ev(1, "apply", "v1", None), ev(2, "apply", "v2", "v1", outcome="rolled_back"),
              ev(3, "apply", "v2", "v1")]
    assert rollback_target(events, "v2") == "v1"
    assert rollback_target([ev(1, "apply", "v2", "v1", outcome="failed")], "v2") is None


@pytest.mark.parametrize("good", ["v1", "2026.11.29-rc1", "a", "x" * 128, "v1+cu124", "A_b-c"])
def test_versions_accepted(good):
    assert check_version(good) == good


@pytest.mark.parametrize("bad", ["", ".", "..", "-x", ".hidden", "a/b", "a b", "x" * 129, "ü"])
def test_versions_refused(bad):
    with pytest.raises(UsageError, match="--version"):
        check_version(bad)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("45m", 2700), ("24h", 86400),
                                           ("2d", 172800), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text, "--window") == seconds


@pytest.mark.parametrize("bad", ["", "0", "-1h", "1w", "h", "soon", "٣h", "9" * 400])
def test_bad_durations(bad):
    with pytest.raises(UsageError, match="--window"):
        parse_duration(bad, "--window")


def test_retained_keeps_recent_and_protected_releases():
    from brctl.analysis.update import retained

    pushed = ["v1", "v2", "v3", "v4", "v5"]
    assert retained(pushed, 2, ["v5", "v4", None]) == {"v4", "v5"}
    assert retained(pushed, 2, ["v1", "v5", "v3"]) == {"v1", "v3", "v4", "v5"}  # rolled back
    assert retained(pushed, 10, []) == set(pushed)
    assert retained([], 3, [None]) == set()
