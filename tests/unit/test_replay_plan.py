"""The replay planner, judge and decoder, proven by enumeration over many job shapes.

A simulated oracle stands in for the workload: a group's per-step fingerprints
are the healthy ones unless it holds a faulty machine, in which case they
deviate from step 1 in a way that depends on which faulty machines it holds
(healthy groups agree bitwise, faulty ones rarely agree with each other).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection

import pytest

from brctl.analysis.replay.groups import (
    ReplayPlan,
    Verdict,
    decide,
    plan,
    reference_of,
    shape_of,
    split_jobs,
)
from brctl.analysis.replay.judge import GroupRun, judge_round
from brctl.analysis.topology import Topology, TopologyError, stage_of_machine
from brctl.core.errors import UsageError

HEALTHY = ("h0", "h1", "h2")


def topo(n: int, gpus: int, tp: int = 1, pp: int = 1, cp: int = 1,
         order: str = "tp-cp-ep-dp-pp") -> Topology:
    return Topology.build([f"m{i:02d}" for i in range(n)], gpus, tp=tp, pp=pp, cp=cp, order=order)


Oracle = Callable[[tuple[str, ...], int], GroupRun]


def faulty_oracle(
    faulty: Collection[str], fires: Callable[[str, int], bool] | None = None
) -> Oracle:
    """Groups holding a faulty machine deviate; ``fires(machine, run)`` makes it intermittent."""
    def run(nodes: tuple[str, ...], counter: int) -> GroupRun:
        bad = sorted(m for m in nodes if m in faulty and (fires is None or fires(m, counter)))
        steps = HEALTHY if not bad else ("h0", "bad:" + ",".join(bad), "x")
        return GroupRun(nodes, "ok", steps)
    return run


def faulty_alike(faulty: Collection[str]) -> Oracle:
    """Every group holding one of ``faulty`` gives the same wrong fingerprints."""
    def run(nodes: tuple[str, ...], _counter: int) -> GroupRun:
        return GroupRun(nodes, "ok", ("h0", "alike", "x") if set(nodes) & set(faulty)
                        else HEALTHY)
    return run


def nan_oracle(faulty: Collection[str]) -> Oracle:
    """Groups holding a faulty machine go NaN at step 1."""
    def run(nodes: tuple[str, ...], _counter: int) -> GroupRun:
        return GroupRun(nodes, "ok", ("h0", "nan", "nan") if set(nodes) & set(faulty)
                        else HEALTHY)
    return run


def simulate(
    p: ReplayPlan, oracle: Oracle, repeat: int = 1, max_rounds: int = 8
) -> tuple[Verdict, int]:
    rounds = []
    counter = 0
    while True:
        decision = decide(p, rounds, max_rounds=max_rounds)
        if isinstance(decision, Verdict):
            return decision, len(rounds)
        # no machine in two jobs of a round, but a control job (no suspects) mirrors one
        tests = [g for i, g in enumerate(decision.groups)
                 if not decision.suspects or decision.suspects[i]]
        placed = [m for g in tests for m in g]
        assert len(placed) == len(set(placed)), decision
        runs = []
        for _ in range(repeat):
            runs.append([oracle(g, counter) for g in decision.groups])
            counter += 1
        rounds.append(judge_round(decision.kind, runs, reference_of(rounds),
                                  decision.suspects or None))


# (machines, gpus, tp, pp, cp, order, dp): shapes a replay can meet
SHAPES = [
    (8, 2, 1, 2, 1, "tp-cp-ep-dp-pp", None),     # the integration cluster
    (16, 8, 8, 2, 1, "tp-cp-ep-dp-pp", 2),       # the 4×4 grid: 16 machines, TP=8, DP=8, PP=2
    (16, 8, 8, 2, 1, "tp-cp-ep-dp-pp", None),
    (12, 1, 1, 3, 1, "tp-cp-ep-dp-pp", None),
    (12, 2, 2, 3, 1, "tp-cp-ep-pp-dp", None),
    (24, 8, 4, 2, 1, "tp-cp-ep-dp-pp", None),    # two DP replicas per machine
    (24, 8, 4, 2, 1, "tp-cp-ep-dp-pp", 4),
    (32, 8, 8, 4, 1, "tp-cp-ep-dp-pp", None),
    (18, 2, 1, 1, 1, "tp-cp-ep-dp-pp", 4),       # PP = 1
    (20, 4, 4, 1, 1, "tp-cp-ep-dp-pp", 1),       # PP = 1: one machine per job
    (16, 8, 16, 2, 1, "tp-cp-ep-dp-pp", None),   # TP spans two machines
    (16, 4, 2, 2, 2, "tp-cp-ep-dp-pp", None),    # CP across a machine
    (27, 1, 1, 3, 1, "tp-cp-ep-pp-dp", 3),
    (36, 8, 8, 2, 1, "tp-cp-ep-dp-pp", 3),
]


def _plan(shape: tuple[int, int, int, int, int, str, int | None]) -> tuple[Topology, ReplayPlan]:
    n, gpus, tp, pp, cp, order, dp = shape
    t = topo(n, gpus, tp=tp, pp=pp, cp=cp, order=order)
    return t, plan(shape_of(t, dp))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_groups_are_complete_jobs_keeping_each_machine_on_its_stage(shape: tuple) -> None:  # type: ignore[type-arg]
    t, p = _plan(shape)
    s = p.shape
    role = s.class_of()
    every = sorted(t.machines)
    for rnd in [p.round1] + ([p.round2] if p.round2 else []):
        assert sorted(m for g in rnd for m in g) == every  # a partition: one job per machine
        for g in rnd:
            assert tuple(role[m] for m in g) == s.slot_classes  # each slot keeps its role
            stages = [stage_of_machine(t, m) for m in g]
            assert len(stages) == s.slots
    if p.round2:
        for h, v in itertools.product(p.round1, p.round2):
            assert len(set(h) & set(v)) <= 1


def test_worked_example_of_the_reference() -> None:
    t = topo(16, 8, tp=8, pp=2)
    p = plan(shape_of(t, 2))
    m = [f"m{i:02d}" for i in range(16)]
    assert [sorted(g) for g in p.round1] == [
        sorted([m[0], m[1], m[8], m[9]]), sorted([m[2], m[3], m[10], m[11]]),
        sorted([m[4], m[5], m[12], m[13]]), sorted([m[6], m[7], m[14], m[15]])]
    assert p.shape.dp == 2 and p.grid and p.can_vote
    assert p.round2 is not None
    for v in p.round2:
        assert sum(stage_of_machine(t, x) == 0 for x in v) == 2


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_single_fault_is_found_exactly(shape: tuple) -> None:  # type: ignore[type-arg]
    t, p = _plan(shape)
    assert p.can_vote
    for bad in t.machines:
        verdict, rounds = simulate(p, faulty_oracle({bad}))
        assert verdict.verdict == "found", (bad, verdict)
        assert verdict.faulty == (bad,)
        worst = p.rounds_single_fault()
        assert worst is not None and rounds <= worst, (bad, rounds)
        if p.grid or p.shape.slots == 1:
            assert rounds == worst
    if p.shape.slots == 1:
        assert p.rounds_single_fault() == 1  # a job of one machine names it at once
    elif p.grid:
        assert p.rounds_single_fault() == 2


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_no_fault_is_none_after_one_round(shape: tuple) -> None:  # type: ignore[type-arg]
    _, p = _plan(shape)
    verdict, rounds = simulate(p, faulty_oracle(set()))
    assert (verdict.verdict, rounds, verdict.faulty) == ("none", 1, ())


SMALL = [s for s in SHAPES if s[0] <= 24]


@pytest.mark.parametrize("shape", SMALL, ids=str)
def test_every_pair_of_faults_is_found_by_a_third_round_at_most(shape: tuple) -> None:  # type: ignore[type-arg]
    t, p = _plan(shape)
    third = 0
    for pair in itertools.combinations(t.machines, 2):
        verdict, rounds = simulate(p, faulty_oracle(set(pair)))
        if p.shape.n_groups < 4 and verdict.verdict == "ambiguous":
            continue  # 2 of 3 groups deviant: no majority, reported as such
        assert verdict.verdict == "found", (pair, verdict)
        assert set(verdict.faulty) == set(pair)
        assert rounds <= 3, (pair, rounds)
        third += rounds == 3
        # the third round's cleared candidates are reported
        assert not set(verdict.cleared) & set(pair)
    if shape[:4] == (16, 8, 8, 2) and shape[6] == 2:
        assert third == 72  # reference §2.3: 72 of 120 pairs differ in both row and column


def test_adaptive_round_two_when_no_grid_exists() -> None:
    t = topo(9, 1, pp=3)  # 3 groups of 3 slots: g = slots, a grid exists
    assert plan(shape_of(t)).grid
    t = topo(8, 1, pp=4)  # 2 rows of 4 stages: no vote, no grid
    p = plan(shape_of(t))
    assert not p.grid and not p.can_vote
    t = topo(12, 1, pp=4)  # 3 groups of 4 slots: vote, but no grid
    p = plan(shape_of(t))
    assert p.can_vote and not p.grid
    for bad in t.machines:
        verdict, rounds = simulate(p, nan_oracle({bad}))
        assert verdict.faulty == (bad,)
        assert rounds <= (p.rounds_single_fault("nan") or 0) <= 3  # fillers: 2 of 4 suspects
        # a finite value: one more round, a control job with a machine off its stage
        verdict, rounds = simulate(p, faulty_oracle({bad}))
        assert verdict.faulty == (bad,) and rounds <= (p.rounds_single_fault() or 0) <= 5


def test_two_groups_cannot_vote_but_nan_speaks_for_itself() -> None:
    p = plan(shape_of(topo(4, 2, tp=2, pp=2)))  # examples/local.yaml
    assert len(p.round1) == 2 and not p.can_vote
    verdict, _ = simulate(p, faulty_oracle({"m00"}))
    assert verdict.verdict == "ambiguous"

    def nan(nodes: tuple[str, ...], _c: int) -> GroupRun:
        return GroupRun(nodes, "ok", ("h0", "nan") if "m01" in nodes else ("h0", "h1"))
    verdict, rounds = simulate(p, nan)
    assert (verdict.verdict, verdict.faulty, rounds) == ("found", ("m01",), 2)


def test_a_fault_that_fires_once_is_not_reproduced_never_healthy() -> None:
    _, p = _plan(SHAPES[0])
    once = faulty_oracle({"m02"}, fires=lambda _m, run: run == 0)
    verdict, rounds = simulate(p, once)
    assert (verdict.verdict, rounds) == ("not_reproduced", 2)
    assert "m02" in verdict.candidates or "m02" in verdict.cleared
    # with --repeat 2 the first round already sees it once and not again
    verdict, rounds = simulate(p, once, repeat=2)
    assert (verdict.verdict, rounds) == ("not_reproduced", 1)
    assert "m02" in verdict.candidates
    # a fault firing in every run is confirmed by the repeats
    verdict, rounds = simulate(p, faulty_oracle({"m02"}), repeat=2)
    assert (verdict.verdict, verdict.faulty, rounds) == ("found", ("m02",), 2)


def test_a_group_that_does_not_finish_is_incomplete_not_sdc() -> None:
    _, p = _plan(SHAPES[0])

    def broken(nodes: tuple[str, ...], _c: int) -> GroupRun:
        if "m01" in nodes:
            return GroupRun(nodes, "timeout", error="killed after 60s")
        return GroupRun(nodes, "ok", HEALTHY)
    verdict, rounds = simulate(p, broken)
    assert (verdict.verdict, verdict.faulty, rounds) == ("incomplete", (), 1)
    assert "did not finish" in verdict.reason


def test_judge_majority_plurality_and_reference() -> None:
    def runs(*values: tuple[str, ...]) -> list[list[GroupRun]]:
        return [[GroupRun((f"n{i}",), "ok", v) for i, v in enumerate(values)]]
    j = judge_round("horizontal", runs(("a",), ("a",), ("b",), ("c",)))
    assert [g.status for g in j.groups] == ["clean", "clean", "deviant", "deviant"]
    j = judge_round("horizontal", runs(("a",), ("a",), ("b",), ("b",)))
    assert [g.status for g in j.groups] == ["undecided"] * 4
    j = judge_round("confirm", runs(("b",), ("b",)), reference=("a",))
    assert [g.status for g in j.groups] == ["deviant", "deviant"]
    j = judge_round("horizontal", runs(("a", "inf"), ("a", "x"), ("a", "x")))
    assert [g.status for g in j.groups] == ["deviant", "clean", "clean"]
    assert j.groups[0].fingerprint == "inf@1" and j.groups[0].first_deviant_step == 1
    j = judge_round("horizontal", runs(("a", "b"), ("a",), ("a", "b")))
    assert j.groups[1].status == "deviant"  # a missing step is a deviation


def test_dp_must_split_the_rows() -> None:
    t = topo(8, 2, pp=2)
    with pytest.raises(UsageError, match="one of 2, 4, 8"):
        shape_of(t, 3)
    assert shape_of(t, 4).k == 2


def test_dp_is_never_silently_another_one() -> None:
    """6 machines of 4 GPUs, PP=3, pipeline before DP: --dp 6 built a DP'=8 job and ran
    it as if it were the 6 asked for."""
    t = topo(6, 4, pp=3, order="tp-cp-ep-pp-dp")
    with pytest.raises(UsageError, match="DP'=8, not 6"):
        shape_of(t, 6)


def test_split_jobs_uses_each_filler_once_and_keeps_roles() -> None:
    s = shape_of(topo(16, 8, tp=8, pp=2), 2)
    suspects = ["m04", "m05", "m12", "m13"]
    good = [f"m{i:02d}" for i in range(4, 16) if i not in (4, 5, 12, 13)]
    jobs, left = split_jobs(s, suspects, good)
    used = [m for _, g in jobs for m in g if m not in suspects]
    assert len(used) == len(set(used))
    role = s.class_of()
    for mine, g in jobs:
        assert mine and set(mine) <= set(g) and tuple(role[m] for m in g) == s.slot_classes
    assert sorted([m for mine, _ in jobs for m in mine] + left) == suspects
    # stage 0 has 2 fillers (m06, m07): two jobs of two suspects, one of each stage
    assert [len(mine) for mine, _ in jobs] == [2, 2] and not left


def test_machines_holding_parts_of_two_stages_are_refused_loudly() -> None:
    from brctl.analysis.topology import TopologyError

    with pytest.raises(TopologyError, match="m01 hosts positions"):
        shape_of(topo(12, 4, tp=2, pp=3, order="tp-cp-ep-pp-dp"))


# -- issue 15: honest round bounds, several suspects per confirm job, NaN drop-outs --------


def test_few_machines_per_position_still_name_every_fault() -> None:
    """48 machines tp8 pp16: 3 machines per stage, 16 per group. Confirm rounds tested one
    suspect per job, so m45 was never tested within 8 rounds (ambiguous)."""
    t = topo(48, 8, tp=8, pp=16)
    p = plan(shape_of(t))
    assert (len(p.round1), p.shape.slots, p.grid) == (3, 16, False)
    nan_bound, bound = p.rounds_single_fault("nan"), p.rounds_single_fault()
    assert nan_bound is not None and nan_bound <= 1 + math.ceil(math.log(16, 3))
    # a finite fault needs one more round: its cross-role control job (3 machines a stage)
    assert bound is not None and bound <= nan_bound + 2
    assert p.default_max_rounds() == bound + 2
    for bad in t.machines:
        verdict, rounds = simulate(p, nan_oracle({bad}), max_rounds=p.default_max_rounds())
        assert (verdict.verdict, verdict.faulty) == ("found", (bad,)), bad
        assert rounds <= nan_bound
        verdict, rounds = simulate(p, faulty_oracle({bad}), max_rounds=p.default_max_rounds())
        assert (verdict.verdict, verdict.faulty) == ("found", (bad,)), bad
        assert rounds <= bound


def documented_rounds(p: ReplayPlan) -> int:
    """The single-fault round bound as README, ``brctl replay --help`` and benchmarks state it.

    g groups per round, S positions per group (the suspects of a deviant group): one
    machine, 1 round; with a grid (each position has at least as many machines as a group
    has positions) 2 rounds; otherwise at most 1 + ceil(log_g S). With only 3 groups a lone
    candidate is confirmed beside a control job and the confirm jobs split two ways: 3 rounds
    with a grid, 2 + ceil(log2 S) without.
    """
    g, s = len(p.round1), p.shape.slots
    if len(p.shape.machines) == 1:
        return 1
    if g == 3:
        return 3 if p.grid else 2 + math.ceil(math.log2(s) - 1e-9)
    return 2 if p.grid else 1 + math.ceil(math.log(s, g) - 1e-9)


def test_the_documented_round_bound_holds_for_every_shape_up_to_64_machines() -> None:
    """The docs said 2 rounds with a grid, about 1 + log_g S otherwise; with exactly 3
    groups 9 machines pp3 (a grid) take 3, 48 machines tp8 pp16 take 6 (formula 4)."""
    seen: set[tuple[int, int, int, bool]] = set()
    checked = 0
    for n in range(1, 65):
        for tp, pp, cp in itertools.product((1, 2, 8), range(1, 17), (1, 2)):
            try:
                p = plan(shape_of(topo(n, 8, tp=tp, pp=pp, cp=cp)))
            except (UsageError, TopologyError):
                continue
            key = (len(p.shape.machines), len(p.round1), p.shape.slots, p.grid)
            if not p.can_vote or key in seen:
                continue
            seen.add(key)
            bound = p.rounds_single_fault() or p.rounds_single_fault("nan")
            assert bound is not None and bound <= documented_rounds(p), (n, tp, pp, cp, bound)
            checked += 1
    assert checked > 150
    assert documented_rounds(plan(shape_of(topo(9, 8, pp=3)))) == 3
    assert documented_rounds(plan(shape_of(topo(48, 8, tp=8, pp=16)))) == 6


def test_round_bound_is_about_one_plus_log_g_of_the_suspects() -> None:
    """128 machines tp8 pp16 cp2 needed 12 rounds; g = 4 jobs cut 32 suspects to 1 in 3."""
    t = topo(128, 8, tp=8, pp=16, cp=2)
    p = plan(shape_of(t))
    g, s = len(p.round1), p.shape.slots
    assert not p.grid and not p.thin
    assert p.rounds_single_fault() == 1 + math.ceil(math.log(s, g)) == 4
    for bad in t.machines[::5]:
        verdict, rounds = simulate(p, faulty_oracle({bad}), max_rounds=p.default_max_rounds())
        assert verdict.faulty == (bad,) and rounds <= 4


def test_groups_gone_nan_never_make_the_healthy_group_the_suspect() -> None:
    """2 of 3 groups go NaN before the last step: the healthy group used to be undecided
    (and listed as the only candidates)."""
    def runs(*values: tuple[str, ...]) -> list[list[GroupRun]]:
        return [[GroupRun((f"n{i}",), "ok", v) for i, v in enumerate(values)]]
    j = judge_round("horizontal", runs(("a", "nan", "x"), ("a", "inf", "y"), ("a", "b", "c")))
    assert [g.status for g in j.groups] == ["deviant", "deviant", "clean"]
    assert j.expected == ("a", "b", "c")

    p = plan(shape_of(topo(9, 1, pp=3)))  # 3 groups of 3

    def two_nan(nodes: tuple[str, ...], _c: int) -> GroupRun:
        if "m00" in nodes or "m01" in nodes:
            return GroupRun(nodes, "ok", ("h0", "nan", "nan"))
        return GroupRun(nodes, "ok", HEALTHY)
    verdict, _ = simulate(p, two_nan)
    assert not {"m02", "m05", "m08"} & set(verdict.faulty + verdict.candidates), verdict


def test_three_groups_confirm_a_lone_intersection_with_a_control_job() -> None:
    """With 3 groups a 2-1 vote can be two machines corrupting alike out-voting the healthy
    group; the lone intersection is replayed beside a control job (its own job with it
    swapped for a machine of the group the vote called deviant) before it is found."""
    t = topo(6, 1)
    p = plan(shape_of(t, 2))  # 3 groups of 2 machines of the one position
    assert p.thin and p.grid and p.shape.k == 2
    for bad in t.machines:
        verdict, rounds = simulate(p, faulty_oracle({bad}))
        assert (verdict.verdict, verdict.faulty, rounds) == ("found", (bad,), 3)
    assert p.rounds_single_fault() == 3

    # m00 (H0) and m02 (H1) corrupt alike and out-vote the healthy H2 = (m04, m05); the
    # control job, made with a machine of H2, deviates too: the vote is suspect.
    verdict, rounds = simulate(p, faulty_alike({"m00", "m02"}))
    assert verdict.verdict != "found" and not verdict.faulty, verdict


# 3-group plans: one and two machines of each position per job, with and without a grid
THIN = [(9, 1, 1, 3, None), (6, 4, 1, 2, None), (3, 1, 1, 1, None), (15, 8, 8, 5, None),
        (6, 1, 1, 1, 2), (12, 1, 1, 2, 2), (18, 1, 1, 3, 2)]


def _thin(shape: tuple[int, int, int, int, int | None]) -> tuple[Topology, ReplayPlan]:
    n, gpus, tp, pp, dp = shape
    t = topo(n, gpus, tp=tp, pp=pp)
    p = plan(shape_of(t, dp))
    assert p.thin
    return t, p


@pytest.mark.parametrize("shape", THIN, ids=str)
def test_two_machines_corrupting_alike_never_get_a_healthy_machine_found(
        shape: tuple[int, int, int, int, int | None]) -> None:
    """With 3 groups, two machines corrupting alike out-vote the healthy group. The
    control job's stand-in used to be any machine the vote called healthy, so when it
    was one of the pair every fingerprint mirrored a single fault in the lone candidate
    and a healthy machine was found (14 of 36 pairs on 9 machines pp3). Now the stand-in
    comes from the group the vote called deviant, which is healthy either way."""
    t, p = _thin(shape)
    for a, b in itertools.combinations(t.machines, 2):
        verdict, _ = simulate(p, faulty_alike({a, b}), max_rounds=p.default_max_rounds())
        assert set(verdict.faulty) <= {a, b}, (a, b, verdict)


@pytest.mark.parametrize("shape", THIN, ids=str)
def test_one_fault_with_three_groups(shape: tuple[int, int, int, int, int | None]) -> None:
    """Found, never ambiguous. With two machines of each position a job's other machine of
    the suspect's position stands in for it in the control job. With one, that position's
    two other machines corrupting alike would give the very same fingerprints in every job
    of one machine per position, so the control job moves one of the suspect's own job's
    machines of another position into its slot (it was ambiguous before: 80 small shapes,
    e.g. 15 machines tp8 pp5, 48 machines tp8 pp16). NaN speaks for itself.
    The one exception: three machines that each hold the whole model (one role): one odd
    one out and two alike are the same three fingerprints, and nothing else can run."""
    t, p = _thin(shape)
    whole = len(p.shape.classes) == 1 and p.shape.k == 1
    for bad in t.machines:
        verdict, rounds = simulate(p, faulty_oracle({bad}), max_rounds=p.default_max_rounds())
        if whole:
            assert verdict.verdict == "ambiguous" and verdict.candidates[0] == bad, verdict
            assert "alike" in verdict.reason and not verdict.faulty
        else:
            assert (verdict.verdict, verdict.faulty) == ("found", (bad,)), verdict
            assert rounds <= (p.rounds_single_fault() or 0)
        verdict, _ = simulate(p, nan_oracle({bad}), max_rounds=p.default_max_rounds())
        assert (verdict.verdict, verdict.faulty) == ("found", (bad,)), verdict
    assert (p.rounds_single_fault() is None) == whole


def test_default_dp_is_one_the_replay_job_can_build() -> None:
    """3 machines × 4 GPUs, PP=3, pp-dp order: one row per role is 4 GPUs that PP=3
    cannot split; the default failed with an error about a 4-GPU "job" the user never
    wrote. The default now takes the next size that builds, and an explicit --dp that
    cannot be built says so."""
    s = shape_of(topo(6, 4, pp=3, order="tp-cp-ep-pp-dp"))
    assert (s.k, s.dp) == (3, 4)  # 3 machines of 4 GPUs: PP=3 × DP'=4
    with pytest.raises(UsageError, match="--dp"):
        shape_of(topo(3, 4, pp=3, order="tp-cp-ep-pp-dp"), 1)


def test_the_control_job_of_one_machine_per_position_moves_a_machine_off_its_stage() -> None:
    """9 machines pp3, 3 groups of (stage 0, 1, 2): m03 alone deviates, and its stage's two
    other machines (m04, m05) corrupting alike would look the same in every job of one
    machine per stage. The control job has none of the three: a machine of another stage,
    one that no reading of the rounds can blame, runs stage 1."""
    t = topo(9, 1, pp=3)
    p = plan(shape_of(t))
    asked: list[tuple[str, ...]] = []

    def oracle(nodes: tuple[str, ...], counter: int) -> GroupRun:
        asked.append(nodes)
        return faulty_oracle({"m03"})(nodes, counter)
    verdict, _ = simulate(p, oracle, max_rounds=p.default_max_rounds())
    assert (verdict.verdict, verdict.faulty) == ("found", ("m03",)), verdict
    stage = {m: i // 3 for i, m in enumerate(t.machines)}
    control = asked[-1]  # the last round: the control job alone
    assert not {"m03", "m04", "m05"} & set(control), control
    assert [stage[m] for m in control] != [0, 1, 2]  # one machine holds another stage's slot
    # the pair that reading stands for is never found, nor is m03
    verdict, _ = simulate(p, faulty_alike({"m04", "m05"}), max_rounds=p.default_max_rounds())
    assert set(verdict.faulty) <= {"m04", "m05"}, verdict
