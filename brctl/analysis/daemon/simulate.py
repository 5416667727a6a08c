"""A discrete-event simulation of a job under ``brctl daemon``'s own policy (pure).

Incidents arrive as a Poisson process while the job trains (a mix: kinds, rates per
machine-day, the signal each shows and the action that truly fixes it). Each one is
handled by the daemon's decision code, not a copy of it, on a synthetic clock:

- ``daemon.detect`` at each poll finds the incident (a GPU fault at the next health
  sweep, a crash at the next poll after start-up, a hang after ``stall_after``);
- ``daemon.plan_for`` turns it into a plan, climbing ``diagnose_decide.next_rung``
  (reattempt → rollback → replay) when the same crash comes back;
- ``daemon.plan_after_replay`` follows a replay; ``daemon.pick_standbys`` picks the
  swap-in and ``daemon.shortfall`` refuses a plan left without one; ``daemon.refusal``
  applies the caps (evictions per hour, job fraction, restarts without progress). A
  refusal halts the daemon and pages a human, who fixes the job after ``human``.

Time is accounted as productive (steps kept) or lost, by cause: detection, analysis,
swap, no standby (a refusal for want of one, until a human fixes it), rollback,
replay, restart, lost work (since the last checkpoint, which
is taken every ``ckpt_interval`` of running), failed attempts and waiting for a human.
Randomness is one seeded ``random.Random``: the same inputs and seed give the same
answer. No clock, no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Optional

from brctl.analysis.daemon import policy
from brctl.config.daemon import DaemonSection

Signal = Literal["gpu_fault", "crash", "hang"]
Resolution = Literal["evict", "reattempt", "rollback", "replay"]
SIGNALS: tuple[Signal, ...] = ("gpu_fault", "crash", "hang")
RESOLUTIONS: tuple[Resolution, ...] = ("evict", "reattempt", "rollback", "replay")
CAUSES = ("detection", "analysis", "swap", "no_standby", "rollback", "replay", "restart",
          "lost_work", "failed_attempt", "human")
DAY = 86400.0


@dataclass(frozen=True)
class IncidentKind:
    """One kind of incident in a mix.

    Attributes:
        name: what it is called in the output.
        rate: incidents per machine-day.
        signal: what the daemon sees (a confident GPU fault, a crash, a hang).
        resolution: the action that truly fixes it; anything less and it comes back.
    """

    name: str
    rate: float
    signal: Signal
    resolution: Resolution


@dataclass(frozen=True)
class Durations:
    """Seconds each mechanism takes (the daemon's poll and stall timing come from its config).

    ``recur``: how long a restarted job runs before an unfixed fault stops it again
    (unproductive: no step is kept). ``human``: from a page to a human's fix.
    """

    diagnose: float = 300.0
    stacks: float = 60.0
    swap: float = 300.0
    rollback: float = 120.0
    replay: float = 1200.0
    restart: float = 600.0
    recur: float = 300.0
    human: float = 7200.0


DURATION_KEYS = tuple(Durations.__dataclass_fields__)


@dataclass(frozen=True)
class Scenario:
    """Everything one simulation needs."""

    machines: int
    days: float
    ckpt_interval: float
    standby: int
    mix: tuple[IncidentKind, ...]
    daemon: DaemonSection = field(default_factory=DaemonSection)
    durations: Durations = field(default_factory=Durations)
    window: float = DAY  # the windowed ETTR's window (the series' step)


@dataclass(frozen=True)
class RunResult:
    """One run's outcome. ``series``: the ETTR of each ``window`` from the start, in
    order (the last one of a partial window over its own length)."""

    ettr: float
    worst_day_ettr: float
    productive: float
    wall: float
    lost: Mapping[str, float]
    resolved_by: Mapping[str, int]
    incidents: int
    standby_exhausted: int
    cap_refusals: int
    pages: int
    series: tuple[float, ...] = ()

    def to_json(self) -> dict[str, object]:
        """Every field, seconds as numbers."""
        return {"ettr": self.ettr, "worst_day_ettr": self.worst_day_ettr,
                "ettr_series": list(self.series),
                "productive_seconds": self.productive, "wall_seconds": self.wall,
                "lost_seconds": dict(self.lost), "resolved_by": dict(self.resolved_by),
                "incidents": self.incidents, "standby_exhausted": self.standby_exhausted,
                "cap_refusals": self.cap_refusals, "pages": self.pages}


# ByteRobust (SOSP'25), three months of production: incidents resolved by real-time
# eviction 32.52 %, reattempt 22.70 %, rollback 9.20 %, replay 1.23 %. The paper's
# remaining share is handled outside this ladder (e.g. by the job's owner), so the
# four are normalised to 100 %. The total rate is Meta's (a hardware failure every
# 2.78 h on 16,000 GPUs ≈ 0.0043 per 8-GPU machine-day). Evictions split between the
# real-time GPU signal and hangs blamed by stack analysis; reattempts between
# transient crashes and hangs nothing was blamed for.
BYTEROBUST_SHARES: Mapping[Resolution, float] = {
    "evict": 32.52, "reattempt": 22.70, "rollback": 9.20, "replay": 1.23}


def byterobust_mix(total_rate: float = 24 / 2.78 / 2000) -> tuple[IncidentKind, ...]:
    """The paper's resolution shares as a mix, ``total_rate`` incidents per machine-day."""
    total = sum(BYTEROBUST_SHARES.values())
    share = {k: v / total * total_rate for k, v in BYTEROBUST_SHARES.items()}
    return (IncidentKind("gpu-fault", share["evict"] * 0.8, "gpu_fault", "evict"),
            IncidentKind("hang-blamed", share["evict"] * 0.2, "hang", "evict"),
            IncidentKind("transient-crash", share["reattempt"] * 0.8, "crash", "reattempt"),
            IncidentKind("transient-hang", share["reattempt"] * 0.2, "hang", "reattempt"),
            IncidentKind("code-bug", share["rollback"], "crash", "rollback"),
            IncidentKind("silent-corruption", share["replay"], "crash", "replay"))


@dataclass(frozen=True)
class PastIncident:
    """One incident the daemon handled for the job, as its action log recorded it.

    ``kind``: the daemon's incident kind (gpu_fault, hand_evict, crash, hang, fail_slow);
    ``decision``: the decision of the plan it carried out (evict, reattempt, rollback,
    replay, notify).
    """

    kind: str
    decision: str
    at: float = 0.0  # when the plan was decided


def escalations(plans: Sequence[PastIncident], moved_at: Sequence[float]) -> list[PastIncident]:
    """The plans carried out (oldest first) as incidents: a crash plan after another with
    no new step between them (``moved_at``: when the job was seen to move) is the same
    crash climbing the daemon's ladder (reattempt, then rollback, ...), so the run of
    them is one incident, resolved by its last rung."""
    moves = sorted(moved_at)
    out: list[PastIncident] = []
    for plan in sorted(plans, key=lambda p: p.at):
        last = out[-1] if out else None
        if last is not None and last.kind == plan.kind == "crash" \
                and not any(last.at < t <= plan.at for t in moves):
            out[-1] = plan  # the same incident, one rung up
        else:
            out.append(plan)
    return out


# what the simulator's daemon sees for each recorded incident kind: a hand eviction is
# swapped at once like a confident GPU fault; a fail-slow is found by stack analysis
_SIGNAL_OF: Mapping[str, Signal] = {"gpu_fault": "gpu_fault", "hand_evict": "gpu_fault",
                                    "crash": "crash", "hang": "hang", "fail_slow": "hang"}


def history_mix(incidents: Sequence[PastIncident], machines: int,
                covered_seconds: float) -> tuple[IncidentKind, ...]:
    """The recorded incidents as a mix: one kind per (incident kind, decision taken).

    Rate = count / (``machines`` × days covered); the resolution is the decision the
    daemon actually carried out. Incidents that did not stop the job (a ``notify``
    plan) are left out: they cost the simulated job nothing.

    Raises:
        ValueError: nothing that stopped the job is recorded, or no time is covered.
    """
    counts: dict[tuple[Signal, Resolution, str], int] = {}
    for past in incidents:
        signal = _SIGNAL_OF.get(past.kind)
        resolution = next((r for r in RESOLUTIONS if r == past.decision), None)
        if signal is not None and resolution is not None:
            key = (signal, resolution, past.kind)
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise ValueError("no eviction, crash or hang carried out by the daemon is recorded")
    if machines < 1 or covered_seconds <= 0:
        raise ValueError("the records cover no time (brctl daemon records it as it polls)")
    machine_days = machines * covered_seconds / DAY
    return tuple(IncidentKind(f"{kind.replace('_', '-')}-{resolution}", n / machine_days, signal,
                              resolution)
                 for (signal, resolution, kind), n in sorted(counts.items()))


class _Job:
    """The simulated job and what the daemon remembers about it (mutable, one run)."""

    def __init__(self, sc: Scenario, rng: random.Random) -> None:
        self.sc, self.rng = sc, rng
        self.now = 0.0
        self.since_ckpt = 0.0
        self.lost = dict.fromkeys(CAUSES, 0.0)
        self.resolved_by = dict.fromkeys((*RESOLUTIONS, "human"), 0)
        self.evictions: list[float] = []
        self.pool_back: list[float] = []  # when each evicted standby slot comes back
        self.exhausted = self.refusals = self.pages = 0
        self.daily_productive: dict[int, float] = {}
        self.window_productive: dict[int, float] = {}

    def spend(self, cause: str, seconds: float) -> None:
        self.lost[cause] += seconds
        self.now += seconds

    def train(self, seconds: float) -> None:
        """Run the job for ``seconds``; checkpoints every ``ckpt_interval`` of running."""
        self._productive(self.now, seconds, +1.0)
        self.now += seconds
        # steps past the last checkpoint count now and are taken back if the job fails
        self.since_ckpt = (self.since_ckpt + seconds) % self.sc.ckpt_interval

    def _productive(self, start: float, seconds: float, sign: float) -> None:
        """Add (or take back) productive seconds from ``start``, split by day and window."""
        _split(self.daily_productive, DAY, start, seconds, sign)
        _split(self.window_productive, self.sc.window, start, seconds, sign)

    def fail(self) -> None:
        """The job stopped: the work since the last checkpoint is lost."""
        self._productive(self.now - self.since_ckpt, self.since_ckpt, -1.0)
        self.lost["lost_work"] += self.since_ckpt
        self.since_ckpt = 0.0

    def next_poll(self, after: float) -> float:
        poll = self.sc.daemon.poll_interval
        return (math.floor(after / poll) + 1) * poll


def _split(buckets: dict[int, float], width: float, start: float, seconds: float,
           sign: float) -> None:
    """Add ``sign`` x [start, start + seconds) to ``buckets`` of ``width`` seconds."""
    index, end = int(start // width), start + seconds
    while start < end:
        upto = min(end, (index + 1) * width)
        buckets[index] = buckets.get(index, 0.0) + sign * (upto - start)
        start, index = upto, index + 1


def series(productive: Mapping[int, float], width: float, horizon: float) -> tuple[float, ...]:
    """ETTR per ``width`` window of [0, horizon): productive seconds over the window's
    length (the last, partial one over what it covers)."""
    count = max(1, math.ceil(horizon / width - 1e-9))
    return tuple(min(1.0, max(0.0, productive.get(i, 0.0) / (min(horizon, (i + 1) * width)
                                                              - i * width)))
                 for i in range(count))


def _detect(job: _Job, kind: IncidentKind, node: str,
            restarted_at: Optional[float]) -> policy.Incident:
    """Poll with ``daemon.detect`` from the failure on until it reports the incident.

    ``restarted_at``: the daemon restarted the job then and it has made no step since
    (a fault that came back), so ``detect`` applies its start-up grace; None: the job
    was training.

    ``detect`` is shown only the failed machine as the job's members: every other one
    is healthy and unquarantined, so it would skip them (and a 1,200-name scan per poll
    would be most of the run time).
    """
    cfg, failed_at, members = job.sc.daemon, job.now, (node,)
    progress = (policy.Progress.start(restarted_at, step=1) if restarted_at is not None else
                policy.Progress(step=1, moved_at=failed_at,
                                started_at=failed_at - cfg.startup_grace, moved_since_start=True))
    at = job.next_poll(failed_at)
    while True:
        obs = policy.Observation(
            now=at, step=1,
            evict_candidates={node: "XID 79"} if kind.signal == "gpu_fault" else {},
            running=kind.signal != "crash",
            stopped_on=(node,) if kind.signal == "crash" else ())
        incident = policy.detect(obs, progress, cfg, members)
        if incident is not None:
            job.spend("detection", at - failed_at)
            return incident
        at = job.next_poll(at)


def _finding(kind: IncidentKind, incident: policy.Incident, node: str) -> policy.Finding:
    """What diagnose (crash) or stack analysis (hang) finds: the blamed machine when the
    fault is a machine's, else nothing (the ladder decides)."""
    if incident.kind == "gpu_fault":
        return policy.Finding()
    if kind.resolution == "evict":
        return policy.Finding("evict", (node,), f"{kind.name}: {node} faulty")
    return policy.Finding(None, (), f"{kind.name}: nothing found")


def _spares(job: _Job, count: int) -> list[str]:
    """Up to ``count`` ready pool machines via ``pick_standbys`` (an evicted one's slot
    is busy until the replenish window brings a checked machine back)."""
    job.pool_back = [t for t in job.pool_back if t > job.now]
    pool = [f"s{i}" for i in range(job.sc.standby)]
    busy = pool[:len(job.pool_back)]
    return policy.pick_standbys(pool, checked=pool, quarantined=(), in_use=busy, count=count)


def _handle(job: _Job, kind: IncidentKind, node: str) -> None:
    """One incident on ``node`` from detection to the job training again."""
    cfg, d = job.sc.daemon, job.sc.durations
    job.fail()
    previous: Optional[str] = None
    restarted_at: Optional[float] = None
    restarts = 0
    while True:
        incident = _detect(job, kind, node, restarted_at)
        finding = _finding(kind, incident, node)
        if incident.kind == "crash":
            job.spend("analysis", d.diagnose)
        elif incident.kind == "hang":
            job.spend("analysis", d.stacks)
        plan = policy.plan_for(incident, finding, previous)
        fixed_by = plan.decision if plan.decision == kind.resolution else None
        proved_nobody = False
        if plan.decision == "replay":
            job.spend("replay", d.replay)
            outcome = policy.ReplayOutcome("found", (node,)) if kind.resolution == "replay" \
                else policy.ReplayOutcome("none")
            plan = policy.plan_after_replay(outcome)
            proved_nobody = not plan.evict
        spares = _spares(job, len(plan.evict))
        # the daemon's order (operations.daemon.loop._admit): no standby, then the caps
        short = policy.shortfall(plan, spares)
        why = short or policy.refusal(plan, now=job.now, eviction_times=job.evictions,
                                      job_size=job.sc.machines,
                                      restarts_without_progress=restarts, cfg=cfg)
        if why is not None or proved_nobody:
            # refused (no standby, a cap), or a replay that proved nobody: the daemon
            # pages a human, who fixes it by hand
            job.refusals += why is not None
            job.exhausted += short is not None
            job.pages += 1
            job.spend("no_standby" if short else "human", d.human)
            job.resolved_by["human"] += 1
            job.spend("restart", d.restart)
            return
        if plan.evict:
            job.evictions += [job.now] * len(plan.evict)
            job.pool_back += [job.now + cfg.replenish_window * 3600.0] * len(spares)
            job.spend("swap", d.swap)
        if plan.decision == "rollback":
            job.spend("rollback", d.rollback)
        job.spend("restart", d.restart)
        restarts += 1
        if fixed_by is not None:
            job.resolved_by[fixed_by] += 1
            return
        # not fixed: the job comes back and stops again before a new step
        previous, restarted_at = plan.decision, job.now
        job.spend("failed_attempt", d.recur)


def run(sc: Scenario, seed: int) -> RunResult:
    """One simulated job of ``sc.days`` with incidents drawn from ``seed``."""
    rng = random.Random(seed)
    job = _Job(sc, rng)
    horizon = sc.days * DAY
    per_second = [k.rate * sc.machines / DAY for k in sc.mix]
    total = sum(per_second)
    incidents = 0
    while job.now < horizon:
        gap = rng.expovariate(total) if total > 0 else math.inf
        if job.now + gap >= horizon:
            job.train(horizon - job.now)
            break
        job.train(gap)
        kind = rng.choices(sc.mix, weights=per_second)[0]
        incidents += 1
        _handle(job, kind, f"m{rng.randrange(max(sc.machines, 1))}")
    wall = job.now
    productive = sum(job.daily_productive.values())
    days = range(max(1, math.ceil(sc.days)))
    worst = min(job.daily_productive.get(i, 0.0) / DAY for i in days)
    return RunResult(productive / wall if wall else 1.0, min(worst, 1.0), productive, wall,
                     dict(job.lost), dict(job.resolved_by), incidents, job.exhausted,
                     job.refusals, job.pages, series(job.window_productive, sc.window, horizon))


@dataclass(frozen=True)
class Summary:
    """``runs`` runs of one scenario: the mean of each number and ETTR percentiles."""

    runs: tuple[RunResult, ...]

    @property
    def ettr(self) -> float:
        """Mean cumulative ETTR."""
        return sum(r.ettr for r in self.runs) / len(self.runs)

    def percentile(self, q: float) -> float:
        """The ``q`` (0..1) quantile of the runs' ETTR (nearest rank)."""
        values = sorted(r.ettr for r in self.runs)
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def mean(self, attr: str) -> float:
        """Mean of a numeric field over the runs."""
        return sum(float(getattr(r, attr)) for r in self.runs) / len(self.runs)

    def series(self) -> tuple[float, ...]:
        """The mean over the runs of each window's ETTR."""
        return tuple(sum(v) / len(v) for v in zip(*(r.series for r in self.runs)))

    def to_json(self) -> dict[str, object]:
        """Means, ETTR percentiles, the windowed ETTR series and lost seconds by cause
        (means)."""
        n = len(self.runs)
        lost = {c: sum(r.lost[c] for r in self.runs) / n for c in CAUSES}
        resolved = {k: sum(r.resolved_by[k] for r in self.runs) / n
                    for k in self.runs[0].resolved_by}
        return {"runs": n, "ettr": self.ettr, "ettr_p10": self.percentile(0.1),
                "ettr_p50": self.percentile(0.5), "ettr_p90": self.percentile(0.9),
                "worst_day_ettr": self.mean("worst_day_ettr"), "ettr_series": list(self.series()),
                "lost_seconds": lost,
                "resolved_by": resolved, "incidents": self.mean("incidents"),
                "standby_exhausted": self.mean("standby_exhausted"),
                "cap_refusals": self.mean("cap_refusals"), "pages": self.mean("pages")}


def simulate(sc: Scenario, runs: int, seed: int) -> Summary:
    """``runs`` independent runs; run ``i`` uses seed ``seed + i``."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    return Summary(tuple(run(sc, seed + i) for i in range(runs)))


SWEEP_KEYS = ("standby.size", "machines", "ckpt_interval",
              *(f"daemon.{k}" for k in ("poll", "stall_after", "startup_grace",
                                         "max_evictions_per_hour", "max_evict_fraction",
                                         "max_restarts_without_progress", "replenish_window")),
              *(f"durations.{k}" for k in DURATION_KEYS))


def with_setting(sc: Scenario, key: str, value: float) -> Scenario:
    """``sc`` with one setting changed (a ``--sweep`` key, see ``SWEEP_KEYS``).

    Raises:
        ValueError: an unknown key or a value the setting refuses.
    """
    from dataclasses import replace

    if key not in SWEEP_KEYS:
        raise ValueError(f"unknown setting {key!r}; expected one of {', '.join(SWEEP_KEYS)}")
    if key == "standby.size":
        return replace(sc, standby=_count(key, value))
    if key == "machines":
        return replace(sc, machines=_count(key, value))
    if not math.isfinite(value):
        raise ValueError(f"{key} {value:g}: expected a finite number")
    if value <= 0 and key != "daemon.max_restarts_without_progress":
        raise ValueError(f"{key} {value:g}: expected a value greater than 0")
    if key == "ckpt_interval":
        return replace(sc, ckpt_interval=value)
    group, name = key.split(".", 1)
    if group == "durations":
        return replace(sc, durations=replace(sc.durations, **{name: value}))
    name = "poll_interval" if name == "poll" else name
    kind = type(getattr(sc.daemon, name))
    return replace(sc, daemon=replace(sc.daemon, **{name: kind(value)}))


MAX_COUNT = 1_000_000  # machines or standbys: a fleet, not a float's range


def _count(key: str, value: float) -> int:
    if not 0 <= value <= MAX_COUNT or value != int(value):  # NaN and infinities fail too
        raise ValueError(f"{key} {value:g}: expected a whole number from 0 to {MAX_COUNT}")
    return int(value)
