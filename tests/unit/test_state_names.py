"""States that are named once: each field takes a Literal, and related lists derive from one."""

from __future__ import annotations

from typing import get_args

from brctl.analysis.daemon.policy import ReplayOutcome
from brctl.analysis.diagnose.decide import DECISIONS, Decision, DecisionName
from brctl.analysis.health.checks import Status
from brctl.analysis.replay.groups import VerdictName
from brctl.core.transport import NodeState
from brctl.operations.health import NoVerdict


def test_the_daemons_decisions_are_diagnoses_plus_notify() -> None:
    assert DECISIONS == get_args(DecisionName) == ("evict", "reattempt", "rollback", "replay")
    flat = [a for arg in get_args(Decision) for a in (get_args(arg) or (arg,))]
    assert flat == [*DECISIONS, "notify"]


def test_a_recorded_replay_verdict_reads_back_as_one_replay_gives() -> None:
    for verdict in get_args(VerdictName):
        assert ReplayOutcome.from_json(ReplayOutcome(verdict).to_json()).verdict == verdict
    assert ReplayOutcome.from_json({"verdict": "bogus"}).verdict == "incomplete"


def test_a_machine_without_a_health_verdict_says_which_transport_state() -> None:
    stopped = {s.value for s in NodeState if not s.ran}
    assert set(get_args(NoVerdict)) == stopped | {"error"}
    assert not set(get_args(NoVerdict)) & set(get_args(Status))


def test_a_pool_machines_standing_is_a_self_check_outcome_or_why_it_has_none() -> None:
    from brctl.analysis.daemon.policy import StandbyOutcome
    from brctl.operations.standby.ops import Standing

    flat = [a for arg in get_args(Standing) for a in (get_args(arg) or (arg,))]
    assert flat == [*get_args(StandbyOutcome), "unchecked", "quarantined", "in-job"]


def test_a_decision_read_back_is_one_of_the_named_ones_or_nothing() -> None:
    from brctl.analysis.diagnose.decide import as_decision

    assert [as_decision(d) for d in (*get_args(DecisionName), "notify")] == [*DECISIONS, "notify"]
    assert as_decision("rm -rf") is None and as_decision(None) is None and as_decision(3) is None
