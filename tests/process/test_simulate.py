"""brctl simulate: the daemon's own policy on a synthetic clock, checked against the papers."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from brctl import schemas
from brctl.analysis.daemon import policy
from brctl.analysis.daemon.simulate import (
    BYTEROBUST_SHARES,
    DAY,
    Durations,
    IncidentKind,
    PastIncident,
    Scenario,
    byterobust_mix,
    history_mix,
    run,
    simulate,
    with_setting,
)
from brctl.config.daemon import DaemonSection

LOOSE_CAPS = DaemonSection(poll_interval=1.0, max_evictions_per_hour=10**6, max_evict_fraction=1.0)


def test_hardware_only_matches_the_analytic_ettr() -> None:
    """HPCA'25-style model (Kokolis et al., "Revisiting Reliability in Large-Scale Machine
    Learning Research Clusters", HPCA 2025): failures at a constant rate λ while the job
    runs, a fixed downtime D per failure (detection + swap + restart) and a checkpoint
    every T of running; the work since the last checkpoint is lost. Renewal-reward over
    one cycle (X ~ Exp(λ) of running, then D down): kept work is X - (X mod T), whose
    mean is T / (e^{λT} - 1), so

        ETTR = [T / (e^{λT} - 1)] / (1/λ + D)   ≈ 1 - λ (D + T/2) for small λT.

    Detection waits for the next 1 s poll after a uniformly placed failure: 0.5 s on average.
    """
    machines, per_machine_day, interval = 1200, 4 / 1200, 3600.0
    durations = Durations(swap=300.0, restart=600.0)
    sc = Scenario(machines, 90, interval, standby=64,  # never short: every swap is the same D
                  mix=(IncidentKind("hw", per_machine_day, "gpu_fault", "evict"),),
                  daemon=LOOSE_CAPS, durations=durations)
    lam = machines * per_machine_day / 86400
    down = 0.5 + durations.swap + durations.restart
    expected = (interval / math.expm1(lam * interval)) / (1 / lam + down)
    got = simulate(sc, runs=20, seed=1).ettr
    assert got == pytest.approx(expected, rel=0.01)
    # and not by accident: the first-order form is visibly different at this λT
    assert abs((1 - lam * (down + interval / 2)) - expected) > 0.005


def test_byterobust_mix_resolves_in_the_papers_shares() -> None:
    sc = Scenario(1200, 90, 1800.0, standby=16, mix=byterobust_mix())  # never short: no pages
    summary = simulate(sc, runs=5, seed=7)
    total_share = sum(BYTEROBUST_SHARES.values())
    resolved = {k: sum(r.resolved_by[k] for r in summary.runs) for k in BYTEROBUST_SHARES}
    incidents = sum(r.incidents for r in summary.runs)
    assert incidents > 1500 and sum(resolved.values()) == incidents
    for kind, share in BYTEROBUST_SHARES.items():
        assert resolved[kind] / incidents == pytest.approx(share / total_share, abs=0.03), kind
    assert summary.mean("pages") == 0


def test_same_seed_same_answer() -> None:
    sc = Scenario(300, 30, 1800.0, standby=2, mix=byterobust_mix())
    assert run(sc, 5) == run(sc, 5)
    assert run(sc, 5) != run(sc, 6)


def test_a_policy_change_in_analysis_changes_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator has no copy of the ladder: without the rollback rung, code bugs loop
    on reattempts until the restarts-without-progress cap pages a human."""
    sc = Scenario(1200, 30, 1800.0, standby=8, mix=byterobust_mix())
    before = run(sc, 3)
    assert before.resolved_by["rollback"] > 0 and before.pages == 0
    monkeypatch.setattr(policy, "next_rung", lambda previous: None)
    after = run(sc, 3)
    assert after.resolved_by["rollback"] == 0
    assert after.cap_refusals > 0 and after.pages == after.cap_refusals
    assert after.ettr < before.ettr


def test_caps_refuse_and_page() -> None:
    tight = DaemonSection(max_evictions_per_hour=0)
    sc = Scenario(1200, 10, 1800.0, standby=8, daemon=tight,
                  mix=(IncidentKind("hw", 0.002, "gpu_fault", "evict"),))
    result = run(sc, 1)
    assert result.incidents > 0 and result.cap_refusals == result.incidents == result.pages
    assert result.lost["human"] == pytest.approx(result.incidents * Durations().human)


def test_a_bigger_pool_means_fewer_exhaustions() -> None:
    sc = Scenario(1200, 90, 1800.0, standby=0, mix=byterobust_mix())
    exhausted = [run(with_setting(sc, "standby.size", n), 2).standby_exhausted for n in (0, 4, 16)]
    assert exhausted[0] > exhausted[1] > exhausted[2]
    slower = with_setting(sc, "daemon.poll", 60)
    assert run(slower, 2).lost["detection"] > run(sc, 2).lost["detection"]
    with pytest.raises(ValueError, match="unknown setting"):
        with_setting(sc, "daemon.nope", 1)


def test_cli_json_fits_its_schema(brctl: Any, state_dir: Path) -> None:
    r = brctl("--json", "simulate", "--machines", "200", "--standby", "2", "--days", "10",
              "--runs", "3", "--sweep", "standby.size=0,4", "--set", "durations.restart=300")
    assert r.exit_code == 0, r.stderr
    doc = r.json
    jsonschema.validate(doc, schemas.get("brctl.simulate/1"))
    assert [row["value"] for row in doc["rows"]] == [0, 4]
    assert doc["durations"]["restart"] == 300 and doc["rows"][0]["runs"] == 3
    table = brctl("simulate", "--machines", "200", "--standby", "2", "--days", "5")
    assert table.exit_code == 0 and "ETTR" in table.stdout and "lost_work" in table.stdout


def test_cli_mix_file_and_bad_inputs(brctl: Any, state_dir: Path, tmp_path: Path) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text("kinds:\n  - {name: xid, rate: 0.01, signal: gpu_fault, resolution: evict}\n")
    ok = brctl("--json", "simulate", "--mix", str(mix), "--machines", "50", "--standby", "1",
               "--days", "5")
    assert ok.exit_code == 0 and ok.json["kinds"][0]["name"] == "xid"
    mix.write_text("kinds:\n  - {name: xid, rate: 0.01, signal: smoke, resolution: evict}\n")
    bad = brctl("simulate", "--mix", str(mix), "--machines", "50", "--standby", "1")
    assert bad.exit_code == 2 and "kinds[0].signal" in bad.stderr and "Traceback" not in bad.stderr
    for args, what in ((["--sweep", "daemon.nope=1"], "unknown setting"),
                       (["--sweep", "standby.size"], "KEY=NUMBER"),
                       (["--mix", str(tmp_path / "missing.yaml")], "cannot read"),
                       (["--ckpt-interval", "0"], "--ckpt-interval"),
                       (["-o", str(tmp_path / "no" / "such" / "x.html")], "cannot write in")):
        r = brctl("simulate", "--machines", "50", "--standby", "1", *args)
        assert r.exit_code == 2 and what in r.stderr, (args, r.stderr)
        assert "report:" not in r.stderr  # simulate's page is not brctl report's


def test_replace_keeps_scenarios_frozen() -> None:
    sc = Scenario(10, 1, 60.0, 0, byterobust_mix())
    assert replace(sc, standby=3).standby == 3 and sc.standby == 0


def test_help_names_every_setting(brctl: Any) -> None:
    from brctl.analysis.daemon.simulate import SWEEP_KEYS

    text = " ".join(brctl("simulate", "--help").stdout.split())
    for key in SWEEP_KEYS:
        assert key.split(".")[-1] in text, key


def test_history_mix_rates_per_machine_day_and_the_decision_taken() -> None:
    past = [PastIncident("gpu_fault", "evict")] * 3 + [PastIncident("crash", "reattempt")] * 2 + [
        PastIncident("crash", "rollback"), PastIncident("hand_evict", "evict"),
        PastIncident("fail_slow", "notify")]  # a notify did not stop the job: left out
    mix = {k.name: k for k in history_mix(past, machines=10, covered_seconds=2 * DAY)}
    assert set(mix) == {"gpu-fault-evict", "crash-reattempt", "crash-rollback", "hand-evict-evict"}
    assert mix["gpu-fault-evict"].rate == pytest.approx(3 / 20)  # 3 / (10 machines x 2 days)
    assert mix["crash-reattempt"].rate == pytest.approx(2 / 20)
    assert (mix["crash-rollback"].signal, mix["crash-rollback"].resolution) == ("crash", "rollback")
    assert (mix["hand-evict-evict"].signal, mix["hand-evict-evict"].resolution) == ("gpu_fault",
                                                                                    "evict")
    with pytest.raises(ValueError, match="no eviction, crash or hang"):
        history_mix([PastIncident("fail_slow", "notify")], 10, DAY)
    with pytest.raises(ValueError, match="cover no time"):
        history_mix(past, 10, 0.0)


def test_cli_history_from_what_the_daemon_recorded(brctl: Any, state_dir: Path,
                                                   tmp_path: Path) -> None:
    """The real daemon loop records a GPU fault (evict) and a hang (reattempt) in a real
    SQLite database; ``--mix history`` reads them back as the mix."""
    from brctl.operations.ledger.state import DaemonState
    from tests.process.test_daemon_loop import Clock, Script, make, tick

    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes: [{name: 'n[1-4]', connection: local, gpus: 2}]\n"
                   "standby: [{name: 's[1-2]', connection: local, gpus: 2}]\n"
                   "job: {name: llm, nodes: 'n[1-4]', tp: 2, pp: 2, restart_command: ['true']}\n")
    empty = brctl("-i", str(inv), "simulate", "--mix", "history")
    assert empty.exit_code == 2 and "'llm'" in empty.stderr and "no eviction" in empty.stderr
    assert "Traceback" not in empty.stderr

    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)  # its database is $BRCTL_STATE's
    assert store.path.parent == state_dir
    daemon.start()
    tick(daemon, clock, script, dt=60)
    script.evict = {"n3": "xid 79: fell off the bus"}
    tick(daemon, clock, script, dt=60)  # evict n3, swap s1 in, restart
    script.evict = {}
    for _ in range(3):
        tick(daemon, clock, script, dt=60)
    tick(daemon, clock, script, steps=0, dt=60)  # no step for > stall_after: a hang, nobody blamed
    for _ in range(3):
        tick(daemon, clock, script, dt=60)
    intervals = DaemonState(store, "llm").intervals()
    covered = intervals[-1].end - intervals[0].start
    store.close()

    r = brctl("-i", str(inv), "--json", "simulate", "--mix", "history", "--days", "2",
              "--machines", "4", "--standby", "2")
    assert r.exit_code == 0, r.stderr
    jsonschema.validate(r.json, schemas.get("brctl.simulate/1"))
    kinds = {k["name"]: k for k in r.json["kinds"]}
    assert set(kinds) == {"gpu-fault-evict", "hang-reattempt"}, kinds
    assert kinds["hang-reattempt"]["signal"] == "hang"
    for kind in kinds.values():  # one each / (4 machines x the days recorded)
        assert kind["rate"] == pytest.approx(1 / (4 * covered / DAY))
    assert r.json["mix"] == "history"


def test_no_standby_is_the_daemons_refusal_and_a_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real daemon refuses a plan that restarts one machine short (``shortfall``),
    halts and pages; the simulator does what it does (no invented requeue)."""
    sc = Scenario(1200, 30, 1800.0, standby=0, daemon=LOOSE_CAPS,
                  mix=(IncidentKind("hw", 0.002, "gpu_fault", "evict"),))
    result = run(sc, 1)
    assert result.incidents > 0
    assert result.pages == result.cap_refusals == result.standby_exhausted == result.incidents
    assert result.resolved_by["human"] == result.incidents and result.resolved_by["evict"] == 0
    assert result.lost["no_standby"] == pytest.approx(result.incidents * Durations().human)
    # the rule is the daemon's: without it, the plan goes ahead with nobody swapped in
    monkeypatch.setattr(policy, "shortfall", lambda plan, spares: None)
    lenient = run(sc, 1)
    assert lenient.pages == 0 and lenient.resolved_by["evict"] == lenient.incidents


def test_shortfall_names_the_machines_left_without_a_standby() -> None:
    plan = policy.Plan("evict", ("n1", "n2"), "xid", restart=True)
    assert policy.shortfall(plan, ["s1", "s2"]) is None
    why = policy.shortfall(plan, ["s1"])
    assert why is not None and why.startswith("no checked standby for n2")
    assert policy.shortfall(replace(plan, restart=False), []) is None


def test_the_windowed_ettr_series_is_each_windows_productive_share() -> None:
    from brctl.analysis.daemon.simulate import series

    # two full days and half a third: 12 h, 24 h and 6 h productive
    assert series({0: 12 * 3600.0, 1: DAY, 2: 6 * 3600.0}, DAY, 2.5 * DAY) == (0.5, 1.0, 0.5)
    assert series({}, DAY, DAY) == (0.0,)
    sc = Scenario(1200, 10, 1800.0, standby=16, mix=byterobust_mix(), window=DAY / 4)
    result = run(sc, 3)
    assert len(result.series) == 40 and min(result.series) < 1.0 == max(result.series)
    # the windows add up to the run: their mean is the ETTR of the horizon's training
    assert sum(result.series) * sc.window == pytest.approx(result.productive)
    quiet = replace(sc, mix=(IncidentKind("hw", 0.0, "gpu_fault", "evict"),))
    assert set(run(quiet, 3).series) == {1.0}
    summary = simulate(sc, runs=2, seed=3)
    assert summary.series() == tuple((a + b) / 2 for a, b in
                                     zip(summary.runs[0].series, summary.runs[1].series))
    assert summary.to_json()["ettr_series"] == list(summary.series())


def test_cli_machines_alone_needs_no_inventory(brctl: Any, state_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``--machines N`` with no inventory anywhere runs with no standby pool and the
    daemon's default settings (it used to exit 2 for want of an inventory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BRCTL_INVENTORY", raising=False)
    r = brctl("--json", "simulate", "--machines", "100", "--days", "3")
    assert r.exit_code == 0, r.stderr
    assert r.json["standby"] == 0 and r.json["machines"] == 100
    table = brctl("simulate", "--machines", "100", "--days", "3")
    assert table.exit_code == 0 and "resolved by" in table.stdout and "reattempt" in table.stdout
    # an inventory named but missing is still its error, not a silent pool of 0
    missing = brctl("-i", str(tmp_path / "nope.yaml"), "simulate", "--machines", "100")
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def test_history_counts_an_escalation_as_one_incident(tmp_path: Path) -> None:
    """The real loop: a crash (reattempt) that comes back before a new step (rollback)
    is one incident resolved by the rollback; a crash after progress is a new one."""
    from brctl.operations.simulate import history
    from tests.process.test_daemon_loop import Clock, Script, inventory, make, tick

    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock,
                         inv=inventory(tmp_path, max_restarts_without_progress=5))
    daemon.start()
    tick(daemon, clock, script)
    for _ in range(2):  # reattempt, then (no step in between) rollback
        script.running = False
        tick(daemon, clock, script, steps=0, dt=2)
    script.running = True
    for _ in range(3):
        tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # after progress: a new incident, reattempted
    script.running = True
    for _ in range(3):
        tick(daemon, clock, script)
    decisions = [h.plan.decision for h in daemon.report.handled if h.plan]  # type: ignore[union-attr]
    assert decisions == ["reattempt", "rollback", "reattempt"], decisions
    kinds = {k.name: k for k in history(store, "llm", 4)}
    store.close()
    assert set(kinds) == {"crash-rollback", "crash-reattempt"}
    assert kinds["crash-rollback"].rate == pytest.approx(kinds["crash-reattempt"].rate)


def test_escalations_merge_a_crash_climbing_the_ladder_until_a_step() -> None:
    from brctl.analysis.daemon.simulate import escalations

    plans = [PastIncident("crash", "reattempt", 10), PastIncident("crash", "rollback", 20),
             PastIncident("crash", "reattempt", 40), PastIncident("gpu_fault", "evict", 50),
             PastIncident("crash", "reattempt", 60)]
    merged = escalations(plans, moved_at=[30])  # a step between 20 and 40
    assert [(p.decision, p.at) for p in merged] == [("rollback", 20), ("reattempt", 40),
                                                    ("evict", 50), ("reattempt", 60)]


def test_startup_grace_delays_finding_a_hang_that_recurs_after_a_restart() -> None:
    """A hang nothing fixes short of a rollback comes back after each reattempt before
    a new step: the daemon's detect then waits max(startup_grace, stall_after)."""
    sc = Scenario(1200, 30, 1800.0, standby=8,
                  mix=(IncidentKind("stuck", 0.0005, "hang", "rollback"),))
    detection = [run(with_setting(sc, "daemon.startup_grace", grace), 4).lost["detection"]
                 for grace in (60, 600, 1800)]
    assert detection[0] < detection[1] < detection[2]


def test_the_9600_gpu_byterobust_job_with_fast_paths_is_near_the_papers_97() -> None:
    """benchmarks/simulate.py's paper check, pinned: 1,200 x 8 GPUs, 3 months, the
    ByteRobust mix, 1-minute checkpoints, 2-minute restarts, 1-minute swaps and diagnosis,
    the daemon's default detection (poll 10 s, stall_after 300 s) → 97.6 % (paper: 97 %)."""
    fast = Scenario(1200, 90, 60.0, 8, byterobust_mix(),
                    durations=Durations(restart=120.0, swap=60.0, diagnose=60.0))
    assert simulate(fast, runs=3, seed=0).ettr == pytest.approx(0.976, abs=0.01)


@pytest.mark.parametrize("resolution, failed, restarts, rung_time", [
    ("rollback", 1, 2, "rollback"),  # a code bug: the reattempt fails, the rollback fixes it
    ("replay", 2, 3, "replay"),  # silent corruption: reattempt, rollback, then replay finds it
])
def test_each_kind_climbs_the_ladder_to_its_rung(resolution: str, failed: int, restarts: int,
                                                 rung_time: str) -> None:
    kind = IncidentKind("k", 0.0005, "crash", resolution)  # type: ignore[arg-type]
    durations = Durations()
    sc = Scenario(1200, 30, 1800.0, standby=16, mix=(kind,), durations=durations)
    r = run(sc, 2)
    n = r.incidents
    assert n > 5 and r.resolved_by[resolution] == n and r.pages == 0
    assert r.lost["failed_attempt"] == pytest.approx(n * failed * durations.recur)
    assert r.lost["restart"] == pytest.approx(n * restarts * durations.restart)
    assert r.lost[rung_time] == pytest.approx(n * getattr(durations, rung_time))
    assert r.lost["analysis"] == pytest.approx(n * (failed + 1) * durations.diagnose)
