"""The daemon's pure core: progress, symptoms, plans, safety caps, standby picks.

Everything here is a function of typed data and an explicit ``now`` (no clock, no
I/O), so the loop's decisions are exhaustively unit-testable:

- ``last_step``: the step a log tail shows (``daemon.progress_regex``).
- ``Progress`` / ``observe``: when the step last moved and recent per-step times.
- ``detect``: an observation → the incident to handle (GPU fault, crash, hang,
  fail-slow), most urgent first, as in ByteRobust: a confident real-time signal
  evicts at once; a stop goes to the diagnose ladder; a stall to stack analysis.
- ``plan_for``: an incident plus what the analysis found → the plan
  (evict, reattempt, rollback, replay, or only notify).
- ``refusal``: the safety caps (evictions per hour, job fraction, restarts
  without progress) → the reason to refuse, or None; ``shortfall``: no checked
  standby left for a machine the plan evicts → the reason to refuse, or None.
- ``plan_after_replay``: a replay's verdict → the follow-up plan (evict the
  machines it proved faulty, or reattempt and page a human with the evidence).
- ``standby_outcome``: a pool machine's health + self-check stages → checked,
  failed or untested (every stage skipped is not a clean bill).
- ``pick_standbys``: checked, not quarantined, not in use, in pool order.
- ``recorded_membership``: the job's machines per the state database vs the
  inventory → which list holds now, and the warning that says why.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Optional, get_args

from brctl.analysis.diagnose.decide import Decision, next_rung
from brctl.analysis.replay.groups import VerdictName
from brctl.config.daemon import DaemonSection

IncidentKind = Literal["gpu_fault", "hand_evict", "crash", "hang", "fail_slow"]
HOUR = 3600.0


def last_step(text: str, regex: str) -> Optional[int]:
    """The step of the last line of ``text`` that ``regex`` matches (group 1), or None.

    The last match wins, not the largest: after a restart from a checkpoint the
    job counts up again from an earlier step, and that is progress.
    """
    pattern = re.compile(regex)
    for line in reversed(text.splitlines()):
        match = pattern.search(line)
        if match is None:
            continue
        try:
            return int(match.group(1))
        except (TypeError, ValueError):
            continue
    return None


def job_step(steps: Mapping[str, Optional[int]]) -> Optional[int]:
    """The job's step from per-node log steps: the largest any node reports.

    Ranks print on different machines (Megatron's last stage prints the loss); a
    node that prints nothing says nothing about progress.
    """
    seen = [s for s in steps.values() if s is not None]
    return max(seen) if seen else None


@dataclass(frozen=True)
class Progress:
    """What the daemon knows about the job's progress.

    Attributes:
        step: the last step seen (None: none since the job was (re)started).
        moved_at: when ``step`` last changed, or when the job was (re)started.
        step_times: recent seconds per step, oldest first (for fail-slow).
        started_at: when the job was last (re)started by the daemon (or first seen).
        moved_since_start: a new step was seen since ``started_at`` (until then the
            longer ``startup_grace`` applies).
    """

    step: Optional[int]
    moved_at: float
    started_at: float
    step_times: tuple[float, ...] = ()
    moved_since_start: bool = False

    @classmethod
    def start(cls, now: float, step: Optional[int] = None) -> Progress:
        """Fresh tracking from ``now`` (daemon start or a restart of the job)."""
        return cls(step=step, moved_at=now, started_at=now)


def observe(progress: Progress, step: Optional[int], now: float, window: int) -> tuple[Progress, bool]:
    """Fold one poll's step into ``progress``; also say whether the job moved.

    Per-step time is measured between polls: (now - moved_at) / steps advanced;
    a backwards step (a restart from a checkpoint) is progress but no sample. The
    first step ever seen only sets the baseline.
    """
    if step is None or step == progress.step:
        return progress, False
    if progress.step is None:
        # The first step the daemon ever sees is a baseline, not progress: the log may
        # hold lines of a run that is gone (the daemon itself just restarted).
        return replace(progress, step=step, moved_at=now), False
    times = progress.step_times
    if progress.step is not None and step > progress.step:
        per_step = (now - progress.moved_at) / (step - progress.step)
        times = (*times, per_step)[-window:]
    return replace(progress, step=step, moved_at=now, step_times=times, moved_since_start=True), True


def fail_slow(progress: Progress, cfg: DaemonSection) -> Optional[str]:
    """Why the last step time counts as fail-slow, or None.

    The newest sample is compared with the median of the ones before it, so one
    slow step stands out against a healthy history (needs ``fail_slow_min_samples``).
    """
    times = progress.step_times
    if len(times) <= cfg.fail_slow_min_samples:
        return None
    last, history = times[-1], times[:-1]
    median = statistics.median(history)
    if median > 0 and last > cfg.fail_slow_factor * median:
        return (f"step time {last:.2f}s is {last / median:.1f}x the recent median "
                f"{median:.2f}s (fail_slow_factor {cfg.fail_slow_factor:g})")
    return None


@dataclass(frozen=True)
class Observation:
    """One poll: health verdicts, the job's step and whether it is running.

    Attributes:
        now: the poll time.
        evict_candidates: machine → confident hardware reason (from the health sweep).
        unanswered: machines that gave no health verdict (never evicted on that alone).
        step: the job's step from its logs (None: no step line found).
        running: True/False from the status command or the process scan; None unknown.
        stopped_on: machines where the training processes are gone (crash evidence).
        quarantined: machines with an open quarantine record → who put them there
            ("hand: <operator>: <reason>" for ``brctl evict``, "daemon" for a plan's).
    """

    now: float
    evict_candidates: Mapping[str, str] = field(default_factory=dict)
    unanswered: tuple[str, ...] = ()
    step: Optional[int] = None
    running: Optional[bool] = None
    stopped_on: tuple[str, ...] = ()
    quarantined: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Incident:
    """Something the loop must handle."""

    kind: IncidentKind
    nodes: tuple[str, ...]
    reason: str

    def to_json(self) -> dict[str, object]:
        """``{kind, nodes, reason}``."""
        return {"kind": self.kind, "nodes": list(self.nodes), "reason": self.reason}


def detect(obs: Observation, progress: Progress, cfg: DaemonSection,
           members: Sequence[str]) -> Optional[Incident]:
    """The most urgent incident in ``obs``, or None when the job looks fine.

    Order: a confident GPU/hardware fault on a job machine (evict at once, even if
    the job still runs), then a job machine evicted by hand (``brctl evict``: swap a
    standby in), then a stopped job (crash → diagnose), then a stall (hang → stacks),
    then fail-slow. A machine already quarantined by a plan of the daemon's is not
    a new fault: that plan, or the human it paged, owns it.
    """
    faulty = tuple(n for n in members if n in obs.evict_candidates and n not in obs.quarantined)
    if faulty:
        reasons = "; ".join(f"{n}: {obs.evict_candidates[n]}" for n in faulty)
        return Incident("gpu_fault", faulty, reasons)
    by_hand = tuple(n for n in members if obs.quarantined.get(n, "").startswith("hand"))
    if by_hand:
        reasons = "; ".join(f"{n}: evicted by {obs.quarantined[n]}" for n in by_hand)
        return Incident("hand_evict", by_hand, reasons)
    # The job gets its start-up grace before a missing process counts as a crash.
    settled = obs.now - progress.started_at >= min(cfg.poll_interval, cfg.startup_grace)
    if obs.running is False and settled:
        where = ", ".join(obs.stopped_on) or "the status command"
        return Incident("crash", tuple(obs.stopped_on), f"training processes gone ({where})")
    limit = cfg.stall_after if progress.moved_since_start else max(cfg.startup_grace, cfg.stall_after)
    idle = obs.now - progress.moved_at
    if idle > limit:
        what = f"no new step for {idle:.0f}s" if progress.moved_since_start else (
            f"no new step for {idle:.0f}s since the (re)start")
        return Incident("hang", (), f"{what} (stall_after {limit:g}s; last step {progress.step})")
    slow = fail_slow(progress, cfg)
    if slow:
        return Incident("fail_slow", (), slow)
    return None


@dataclass(frozen=True)
class Finding:
    """What the analysis of an incident said (stacks for hangs, diagnose for crashes).

    Attributes:
        decision: diagnose's decision (evict | reattempt | rollback | replay), or
            None when no analysis ran or it found nothing.
        faulty: machines the analysis blames.
        reason: its one-line reason.
        symptom: the playbook diagnose matched ("" for stacks or no analysis).
    """

    decision: Optional[Decision] = None
    faulty: tuple[str, ...] = ()
    reason: str = ""
    symptom: str = ""


@dataclass(frozen=True)
class Plan:
    """What the loop will do about an incident."""

    decision: Decision
    evict: tuple[str, ...]
    reason: str
    restart: bool

    def to_json(self) -> dict[str, object]:
        """``{decision, evict, reason, restart}``."""
        return {"decision": self.decision, "evict": list(self.evict), "reason": self.reason,
                "restart": self.restart}


def plan_for(incident: Incident, finding: Finding, previous: Optional[str] = None) -> Plan:
    """The playbook: incident + analysis → plan (ByteRobust's evict/reattempt/rollback/replay).

    - GPU fault: evict the machines at once (no analysis needed), restart.
    - Hand eviction (``brctl evict`` of a job machine): finish it, swap and restart.
    - Crash: follow diagnose's decision; evict its faulty machines when it says evict.
      When diagnose has no stronger verdict than reattempt, the escalation ladder
      (``diagnose_decide.next_rung``) climbs from ``previous``: the decision of the
      last crash plan carried out since the job's last new step.
    - Hang: evict the machines stack analysis blames; nothing blamed → reattempt.
    - Fail-slow: evict the blamed group; nothing blamed → only notify (a slow job
      still trains; a restart would cost more than it saves).
    """
    if incident.kind in ("gpu_fault", "hand_evict"):
        return Plan("evict", incident.nodes, incident.reason, restart=True)
    if incident.kind == "crash":
        decision = finding.decision or "reattempt"
        if decision == "reattempt" and next_rung(previous) is not None:
            rung = next_rung(previous)
            assert rung is not None
            return Plan(rung, (), f"crashed again after a {previous}: "
                        + ("roll the last code update back" if rung == "rollback"
                           else "look for silent data corruption")
                        + f" ({finding.reason or 'no fault found'})",
                        restart=rung == "rollback")
        if decision == "evict" and finding.faulty:
            return Plan("evict", finding.faulty, finding.reason or incident.reason, restart=True)
        if decision == "evict":  # evict with nobody to evict: try again
            decision = "reattempt"
        return Plan(decision, (), finding.reason or incident.reason,
                    restart=decision in ("reattempt", "rollback"))
    if finding.faulty:
        return Plan("evict", finding.faulty, finding.reason or incident.reason, restart=True)
    if incident.kind == "hang":
        return Plan("reattempt", (), finding.reason or incident.reason, restart=True)
    return Plan("notify", (), finding.reason or incident.reason, restart=False)


@dataclass(frozen=True)
class ReplayOutcome:
    """What ``brctl replay`` answered, as the daemon records it in its action log.

    Attributes:
        verdict: found | none | ambiguous | not_reproduced | incomplete.
        faulty: machines proven to corrupt data (``found`` only).
        candidates: machines still suspected but not resolved.
        reason: replay's one sentence for the operator.
    """

    verdict: VerdictName
    faulty: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        """``{verdict, faulty, candidates, reason}``."""
        return {"verdict": self.verdict, "faulty": list(self.faulty),
                "candidates": list(self.candidates), "reason": self.reason}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> ReplayOutcome:
        """The inverse of ``to_json`` (a resumed plan reads the recorded verdict back)."""
        faulty = doc.get("faulty") or []
        candidates = doc.get("candidates") or []
        assert isinstance(faulty, list) and isinstance(candidates, list)
        return cls(_verdict(doc.get("verdict")), tuple(str(n) for n in faulty),
                   tuple(str(n) for n in candidates), str(doc.get("reason", "")))


def _verdict(value: object) -> VerdictName:
    """A recorded verdict read back; one this version does not know is no verdict."""
    return next((v for v in get_args(VerdictName) if v == value), "incomplete")


def plan_after_replay(outcome: ReplayOutcome) -> Plan:
    """The plan that follows a replay (ByteRobust: replay proves SDC machines, then evict).

    ``found`` with machines → evict them and restart on standbys. Anything else
    (none, not_reproduced, ambiguous, incomplete) proves nobody: reattempt, and the
    caller pages a human with the evidence; the restarts-without-progress cap stops
    the loop when reattempts keep failing.
    """
    if outcome.verdict == "found" and outcome.faulty:
        return Plan("evict", outcome.faulty,
                    f"replay found silent data corruption on {', '.join(outcome.faulty)}: "
                    f"{outcome.reason}", restart=True)
    suspects = f" (still suspected: {', '.join(outcome.candidates)})" if outcome.candidates else ""
    return Plan("reattempt", (), f"replay {outcome.verdict}: {outcome.reason}{suspects}",
                restart=True)


def refusal(plan: Plan, *, now: float, eviction_times: Iterable[float], job_size: int,
            restarts_without_progress: int, cfg: DaemonSection) -> Optional[str]:
    """Why the safety caps forbid ``plan``, or None when it may go ahead.

    Args:
        plan: the plan to check.
        now: the current time.
        eviction_times: when earlier evictions happened (any age; older ones are ignored).
        job_size: the job's machine count (for the fraction cap).
        restarts_without_progress: restarts the daemon made since the last new step.
        cfg: the caps.
    """
    times = list(eviction_times)
    if plan.evict:
        last_hour = sum(1 for t in times if now - t < HOUR)
        if last_hour + len(plan.evict) > cfg.max_evictions_per_hour:
            return (f"eviction cap: {last_hour} in the last hour + {len(plan.evict)} would "
                    f"exceed max_evictions_per_hour {cfg.max_evictions_per_hour}")
        window = cfg.replenish_window * HOUR
        recent = sum(1 for t in times if now - t < window)
        fraction = (recent + len(plan.evict)) / max(job_size, 1)
        if fraction > cfg.max_evict_fraction:
            return (f"eviction cap: {recent + len(plan.evict)} of {job_size} machines "
                    f"({fraction:.0%}) in {cfg.replenish_window:g}h would exceed "
                    f"max_evict_fraction {cfg.max_evict_fraction:g}")
    if plan.restart and restarts_without_progress >= cfg.max_restarts_without_progress:
        return (f"{restarts_without_progress} restarts without a new step "
                f"(max_restarts_without_progress {cfg.max_restarts_without_progress}): "
                "a human must look")
    return None


def shortfall(plan: Plan, spares: Sequence[str]) -> Optional[str]:
    """Why ``plan`` may not go ahead for want of checked standbys, or None.

    ``spares``: what ``pick_standbys`` found for ``plan.evict``, in order. A plan that
    restarts the job one machine short is refused (the daemon halts and pages): a
    smaller job would change its parallel layout behind the owner's back.
    """
    missing = plan.evict[len(spares):]
    if not missing or not plan.restart:
        return None
    return (f"no checked standby for {', '.join(missing)} (run brctl standby check, or add "
            "machines to standby:)")


StandbyOutcome = Literal["checked", "failed", "untested"]


def standby_outcome(health_ok: bool, health_detail: str,
                    stages: Sequence[tuple[str, str, Sequence[str]]]) -> tuple[StandbyOutcome, str]:
    """Judge one pool machine's self-check.

    Args:
        health_ok: the health sweep answered with no failed check.
        health_detail: what the sweep said (the failed checks, or why no answer).
        stages: (stage, status, evidence) per diagnose stage run on the machine;
            status is pass | warn | fail | skip | error.

    Returns:
        (outcome, detail): ``checked`` only when health passed and every stage that
        could run passed; ``failed`` on a failed health check or a stage that failed
        or could not run its probe; ``untested`` when health passed but every stage
        was skipped (no dcgmi, no torch): nothing proved the machine good.
    """
    if not health_ok:
        return "failed", health_detail
    bad = [f"{name}: {status}: {'; '.join(evidence) or 'no detail'}"
           for name, status, evidence in stages if status in ("fail", "error")]
    if bad:
        return "failed", "; ".join(bad)
    skipped = [f"{name} skipped ({'; '.join(evidence) or 'no reason'})"
               for name, status, evidence in stages if status == "skip"]
    ran = [f"{name} {status}" for name, status, _ in stages if status in ("pass", "warn")]
    if stages and not ran:
        return "untested", "health ok, but no diagnose stage could run: " + "; ".join(skipped)
    if not stages:
        return "checked", "health ok (no self-check stages: daemon.standby_stages is empty)"
    return "checked", "; ".join(["health ok", *ran, *skipped])


def pick_standbys(pool: Sequence[str], *, checked: Iterable[str], quarantined: Iterable[str],
                  in_use: Iterable[str], count: int) -> list[str]:
    """Up to ``count`` replacements: checked, never quarantined, not already in the job."""
    ok = set(checked)
    bad = set(quarantined) | set(in_use)
    return [n for n in pool if n in ok and n not in bad][:count]


def swap_members(members: Sequence[str], replacements: Mapping[str, str]) -> list[str]:
    """The job's machine list with each evicted machine replaced in place (rank order kept)."""
    return [replacements.get(n, n) for n in members]


def recorded_membership(job: str, listed: Sequence[str], recorded: Optional[Sequence[str]],
                        known: Iterable[str]) -> tuple[list[str], Optional[str]]:
    """The job's machines now, and a warning when they are not the inventory's ``job.nodes``.

    The daemon records the job's machines after each swap; the inventory file is
    not rewritten. The recorded list wins while it differs, unless it names a
    machine the inventory no longer has (then the inventory wins, and says so).

    Args:
        job: the job's name (for the message).
        listed: ``job.nodes`` as the inventory lists them.
        recorded: the state database's list, or None when the daemon recorded none.
        known: every machine in the inventory.
    """
    if recorded is None or list(recorded) == list(listed):
        return list(listed), None
    missing = [n for n in recorded if n not in set(known)]
    if missing:
        return list(listed), (f"job {job}: the state database lists machines the inventory no "
                              f"longer has ({', '.join(missing)}); using the inventory's job.nodes")
    if len(recorded) == len(listed):
        swaps = [(old, new) for old, new in zip(listed, recorded) if old != new]
        what = ", ".join(f"{new} in for {old}" for old, new in swaps)
        still = ", ".join(old for old, _ in swaps)
        return list(recorded), (f"job {job}: the daemon swapped {what} (state DB); the inventory "
                                f"still lists {still}")
    return list(recorded), (f"job {job}: the state DB lists {len(recorded)} machines "
                            f"({', '.join(recorded)}); the inventory's job.nodes lists {len(listed)}")
