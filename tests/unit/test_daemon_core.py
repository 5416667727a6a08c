"""The daemon's pure core: steps from logs, progress, incidents, plans, caps, standby picks."""

from __future__ import annotations

import itertools

import pytest

from brctl.analysis.daemon.policy import (
    Finding,
    Incident,
    Observation,
    Plan,
    Progress,
    detect,
    fail_slow,
    job_step,
    last_step,
    observe,
    pick_standbys,
    plan_for,
    refusal,
    swap_members,
)
from brctl.config.daemon import DEFAULT_PROGRESS_REGEX, DaemonSection

CFG = DaemonSection(poll_interval=1, stall_after=10, startup_grace=30, fail_slow_factor=3,
                    fail_slow_min_samples=3, max_evictions_per_hour=2, max_evict_fraction=0.5,
                    max_restarts_without_progress=2)
MEMBERS = ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize("line,step", [
    (" iteration      120/  500000 | consumed samples: 1920 | lm loss: 3.2E+00", 120),
    ("step: 42  loss: 2.1", 42),
    ("Epoch 1: 10%| step=7, loss=0.3", 7),
    ("[rank0] Step 99 done", 99),
    ("global_step#3", 3),
])
def test_default_regex_reads_common_step_lines(line: str, step: int) -> None:
    assert last_step("noise\n" + line + "\nmore noise", DEFAULT_PROGRESS_REGEX) == step


def test_last_match_wins_not_largest() -> None:
    text = "step 57\nrestarting from checkpoint step_40\nstep 41\n"
    assert last_step(text, r"^step (\d+)") == 41
    assert last_step("nothing here", DEFAULT_PROGRESS_REGEX) is None
    assert job_step({"a": None, "b": 3, "c": 5}) == 5
    assert job_step({"a": None}) is None


def test_observe_measures_step_times_between_polls() -> None:
    p = Progress.start(0.0)
    p, moved = observe(p, 10, 1.0, 20)
    assert not moved and p.step == 10 and not p.moved_since_start  # a baseline, maybe stale
    p, moved = observe(p, 10, 1.0, 20)
    p, moved = observe(p, 20, 3.0, 20)
    assert moved and p.step_times == (0.2,) and p.moved_since_start
    p, moved = observe(p, 20, 9.0, 20)
    assert not moved and p.moved_at == 3.0
    p, moved = observe(p, 5, 10.0, 20)  # went back: a restart from a checkpoint is progress
    assert moved and p.step == 5 and p.step_times == (0.2,)


def test_fail_slow_needs_history_and_factor() -> None:
    p = Progress(10, 0, 0, (1.0, 1.1, 0.9))
    assert fail_slow(p, CFG) is None  # too few samples
    p = Progress(10, 0, 0, (1.0, 1.1, 0.9, 1.0, 2.9))
    assert fail_slow(p, CFG) is None  # under 3x
    p = Progress(10, 0, 0, (1.0, 1.1, 0.9, 1.0, 3.5))
    assert "3.5x" in (fail_slow(p, CFG) or "")


def test_detect_orders_gpu_fault_crash_hang_failslow() -> None:
    p = Progress(100, moved_at=0, started_at=0, step_times=(1.0,) * 4 + (9.0,), moved_since_start=True)
    obs = Observation(now=20, evict_candidates={"n2": "ecc: volatile uncorrectable",
                                                "spare": "not in job"},
                      running=False, stopped_on=("n3",))
    inc = detect(obs, p, CFG, MEMBERS)
    assert inc == Incident("gpu_fault", ("n2",), "n2: ecc: volatile uncorrectable")
    inc = detect(Observation(now=20, running=False, stopped_on=("n3",)), p, CFG, MEMBERS)
    assert inc is not None and inc.kind == "crash" and inc.nodes == ("n3",)
    inc = detect(Observation(now=20, running=True), p, CFG, MEMBERS)
    assert inc is not None and inc.kind == "hang"
    inc = detect(Observation(now=5, running=True), p, CFG, MEMBERS)
    assert inc is not None and inc.kind == "fail_slow"
    assert detect(Observation(now=5, running=True), Progress(1, 0, 0, (), True), CFG, MEMBERS) is None


def test_startup_grace_before_first_step_and_before_crash() -> None:
    fresh = Progress.start(100.0, 7)
    assert detect(Observation(now=120, running=True), fresh, CFG, MEMBERS) is None  # < grace 30
    inc = detect(Observation(now=131, running=True), fresh, CFG, MEMBERS)
    assert inc is not None and inc.kind == "hang"
    # a restart script that has not launched the ranks yet is not a crash
    assert detect(Observation(now=100.5, running=False), fresh, CFG, MEMBERS) is None


@pytest.mark.parametrize("decision,faulty,expect", [
    ("evict", ("n3",), Plan("evict", ("n3",), "bad gpu", True)),
    ("evict", (), Plan("reattempt", (), "bad gpu", True)),
    ("reattempt", (), Plan("reattempt", (), "bad gpu", True)),
    ("rollback", (), Plan("rollback", (), "bad gpu", True)),
    ("replay", (), Plan("replay", (), "bad gpu", False)),
    (None, (), Plan("reattempt", (), "bad gpu", True)),
])
def test_crash_plans_follow_diagnose(decision: object, faulty: tuple[str, ...], expect: Plan) -> None:
    inc = Incident("crash", (), "gone")
    assert plan_for(inc, Finding(decision, faulty, "bad gpu")) == expect  # type: ignore[arg-type]


def test_hang_and_failslow_plans() -> None:
    assert plan_for(Incident("hang", (), "stall"), Finding()).decision == "reattempt"
    assert plan_for(Incident("hang", (), "stall"), Finding("evict", ("n1", "n2"), "outliers")) == \
        Plan("evict", ("n1", "n2"), "outliers", True)
    assert plan_for(Incident("fail_slow", (), "slow"), Finding()) == Plan("notify", (), "slow", False)
    assert plan_for(Incident("gpu_fault", ("n4",), "xid 79"), Finding()) == \
        Plan("evict", ("n4",), "xid 79", True)


def test_caps_hour_fraction_restarts() -> None:
    one = Plan("evict", ("n1",), "r", True)
    two = Plan("evict", ("n1", "n2"), "r", True)
    ok = refusal(one, now=10_000, eviction_times=[], job_size=4, restarts_without_progress=0, cfg=CFG)
    assert ok is None
    hour = refusal(one, now=10_000, eviction_times=[9_000, 9_500], job_size=100,
                   restarts_without_progress=0, cfg=CFG)
    assert hour and "max_evictions_per_hour" in hour
    # older than an hour: not counted against the hourly cap, but still in the window fraction
    frac = refusal(two, now=10_000, eviction_times=[1_000], job_size=4, restarts_without_progress=0,
                   cfg=CFG)
    assert frac and "max_evict_fraction" in frac
    stuck = refusal(Plan("reattempt", (), "r", True), now=0, eviction_times=[], job_size=4,
                    restarts_without_progress=2, cfg=CFG)
    assert stuck and "a human must look" in stuck
    assert refusal(Plan("notify", (), "r", False), now=0, eviction_times=[], job_size=4,
                   restarts_without_progress=5, cfg=CFG) is None


def test_hourly_cap_exhaustive() -> None:
    cfg = DaemonSection(max_evictions_per_hour=3, max_evict_fraction=1.0)
    for earlier, asked in itertools.product(range(5), range(1, 4)):
        plan = Plan("evict", tuple(f"m{i}" for i in range(asked)), "r", True)
        why = refusal(plan, now=7200, eviction_times=[7100] * earlier, job_size=1000,
                      restarts_without_progress=0, cfg=cfg)
        assert (why is None) == (earlier + asked <= 3)


def test_pick_standbys_never_quarantined_or_unchecked() -> None:
    pool = ["s1", "s2", "s3", "s4"]
    got = pick_standbys(pool, checked=["s1", "s2", "s4"], quarantined=["s1"], in_use=["s2"], count=3)
    assert got == ["s4"]
    assert swap_members(["a", "b", "c"], {"b": "s4"}) == ["a", "s4", "c"]


def test_plan_after_replay_evicts_only_what_replay_proved() -> None:
    from brctl.analysis.daemon.policy import ReplayOutcome, plan_after_replay

    found = plan_after_replay(ReplayOutcome("found", ("n2",), (), "n2 deviates"))
    assert (found.decision, found.evict, found.restart) == ("evict", ("n2",), True)
    for verdict in ("none", "not_reproduced", "ambiguous", "incomplete"):
        plan = plan_after_replay(ReplayOutcome(verdict, (), ("n3",), "why"))
        assert (plan.decision, plan.evict, plan.restart) == ("reattempt", (), True)
        assert verdict in plan.reason and "n3" in plan.reason
    # found with no machine named proves nobody
    assert plan_after_replay(ReplayOutcome("found", (), (), "?")).decision == "reattempt"
    doc = ReplayOutcome("found", ("a",), ("b",), "r")
    assert ReplayOutcome.from_json(doc.to_json()) == doc


def test_standby_outcome_is_checked_only_when_a_stage_ran_and_passed() -> None:
    from brctl.analysis.daemon.policy import standby_outcome

    no_dcgmi = ("eud", "skip", ("dcgmi not found on PATH",))
    no_torch = ("alltoall", "skip", ("torch is not installed on this machine",))
    outcome, detail = standby_outcome(True, "health ok", [no_dcgmi, no_torch])
    assert outcome == "untested" and "no diagnose stage could run" in detail
    assert "dcgmi not found" in detail and "torch is not installed" in detail
    outcome, detail = standby_outcome(True, "health ok", [no_dcgmi, ("alltoall", "pass", ())])
    assert outcome == "checked" and "alltoall pass" in detail and "eud skipped" in detail
    outcome, detail = standby_outcome(True, "health ok", [("eud", "fail", ("GPU 1: Memory",)),
                                                         ("alltoall", "pass", ())])
    assert outcome == "failed" and detail == "eud: fail: GPU 1: Memory"
    assert standby_outcome(True, "ok", [("alltoall", "error", ("timed out",))])[0] == "failed"
    assert standby_outcome(False, "ecc: 2 uncorrectable", []) == ("failed", "ecc: 2 uncorrectable")
    outcome, detail = standby_outcome(True, "health ok", [])
    assert outcome == "checked" and "standby_stages is empty" in detail
