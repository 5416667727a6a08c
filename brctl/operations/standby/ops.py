"""Operations of ``brctl standby`` (``evict``/``unevict``: ``operations.evict``; ``ettr``:
``operations.report``).

They share the daemon's tables (``operations.ledger.state``) and never print:
each returns a dataclass the command renders.

- ``standby_size``: the pool size from the binomial quantile.
- ``standby_check`` / ``standby_list``: self-check the pool, show it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from brctl.analysis.daemon.policy import StandbyOutcome
from brctl.analysis.inventory import Inventory
from brctl.analysis.standby import (
    binomial_quantile,
    daily_rate_from_history,
    window_probability,
)
from brctl.core.errors import ExitCode, UsageError, exit_code_of
from brctl.core.transport import Transport
from brctl.operations import Track, untracked
from brctl.operations.ledger.state import DaemonState
from brctl.remote.probes import ProbeRunner
from brctl.state import Store


@dataclass(frozen=True)
class SizeReport:
    """``brctl standby size``."""

    size: int
    machines: int
    quantile: float
    window_hours: float
    daily_failure_rate: float
    window_probability: float
    source: str  # flag | history
    expected: float

    @property
    def exit_code(self) -> ExitCode:
        """Always 0: a size is an answer, not a finding."""
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """``{size, machines, quantile, window_hours, daily_failure_rate, ...}``."""
        return {"size": self.size, "machines": self.machines, "quantile": self.quantile,
                "window_hours": self.window_hours, "daily_failure_rate": self.daily_failure_rate,
                "window_probability": self.window_probability, "source": self.source,
                "expected_failures": self.expected}


def standby_size(machines: int, quantile: float, window_hours: float,
                 daily_rate: Optional[float], state: Optional[DaemonState],
                 now: Optional[float] = None) -> SizeReport:
    """The pool size: the ``quantile`` of Binomial(machines, p in the window).

    Args:
        machines: machines in the job.
        quantile: e.g. 0.99.
        window_hours: the replenish window.
        daily_rate: per-machine daily failure probability; None reads the history.
        state: the daemon's records (for the history).
        now: the current time.

    Raises:
        UsageError: bad numbers, or no history to estimate from.
    """
    if machines < 1:
        raise UsageError(f"--machines {machines}: expected at least 1")
    if not 0 < quantile < 1:
        raise UsageError(f"--quantile {quantile:g}: expected a probability in (0, 1)")
    if window_hours <= 0:
        raise UsageError(f"--window {window_hours:g}: expected hours greater than 0")
    source = "flag"
    if daily_rate is None:
        history = state.eviction_history() if state is not None else []
        intervals = state.intervals() if state is not None else []
        starts = [e.at for e in history] + [iv.start for iv in intervals]
        at = time.time() if now is None else now
        days = (at - min(starts)) / 86400 if starts else 0.0
        if not history or days <= 0:
            raise UsageError("standby size: no failure history in the state database yet",
                             hint="give --daily-failure-rate P (e.g. 0.002 for 0.2%/machine/day)")
        daily_rate = daily_rate_from_history(len(history), machines, max(days, 1.0))
        source = "history"
    if not 0 <= daily_rate <= 1:
        raise UsageError(f"--daily-failure-rate {daily_rate:g}: expected a probability in [0, 1]")
    p = window_probability(daily_rate, window_hours)
    return SizeReport(binomial_quantile(machines, p, quantile), machines, quantile, window_hours,
                      daily_rate, p, source, machines * p)


# A pool machine's standing: its last self-check's outcome, or why it has none.
Standing = Union[StandbyOutcome, Literal["unchecked", "quarantined", "in-job"]]


@dataclass(frozen=True)
class PoolMachine:
    """One standby machine's standing."""

    node: str
    status: Standing
    detail: str
    checked_at: Optional[float]

    def to_json(self) -> dict[str, Any]:
        """``{node, status, detail, checked_at}``."""
        return {"node": self.node, "status": self.status, "detail": self.detail,
                "checked_at": self.checked_at}


@dataclass(frozen=True)
class PoolReport:
    """``brctl standby list|check``."""

    machines: list[PoolMachine]
    exit_code: ExitCode = ExitCode.OK  # standby check: 1 failed, 3 no answer, 4 refused
    would_check: Optional[tuple[str, ...]] = None  # standby check --dry-run: what it would check
    stages: tuple[str, ...] = ()  # ... and with which stages

    @property
    def ready(self) -> list[str]:
        """Machines that can be swapped in now."""
        return [m.node for m in self.machines if m.status == "checked"]

    def to_json(self) -> dict[str, Any]:
        """``{nodes: {...}, ready: [...]}`` (and a dry run's ``would_check``, ``stages``)."""
        doc: dict[str, Any] = {"nodes": {m.node: {k: v for k, v in m.to_json().items()
                                                  if k != "node"} for m in self.machines},
                               "ready": self.ready}
        if self.would_check is not None:
            doc.update(would_check=list(self.would_check), stages=list(self.stages))
        return doc


def standby_list(inv: Inventory, state: DaemonState) -> PoolReport:
    """The pool (inventory ``standby:`` plus released job machines) and each one's standing."""
    checks = state.checks()
    outcomes = state.outcomes()
    quarantined = state.quarantined()
    members = set(state.members(inv.job.nodes)) if inv.job is not None else set()
    pool = list(inv.standby)
    if inv.job is not None:  # evicted-then-released job machines rejoin the pool
        pool += [n for n in inv.job.nodes if n not in members and n not in pool]
    out = []
    for name in pool:
        if name in quarantined:
            q = quarantined[name]
            out.append(PoolMachine(name, "quarantined", q.reason, None))
        elif name in members:
            out.append(PoolMachine(name, "in-job", "swapped into the job", None))
        elif name in checks:
            _, at, detail = checks[name]
            out.append(PoolMachine(name, outcomes[name], detail, at))
        else:
            out.append(PoolMachine(name, "unchecked", "never checked", None))
    return PoolReport(out)


def pool_candidates(report: PoolReport, only: Sequence[str] = ()) -> list[str]:
    """Machines ``standby check`` should check (not quarantined, not in the job)."""
    chosen = set(only)
    return [m.node for m in report.machines if m.status not in ("quarantined", "in-job")
            and (not chosen or m.node in chosen)]


def standby_check(inv: Inventory, transport: Transport, store: Store,
                  select: Optional[str], *, runner: ProbeRunner,
                  timeout_scale: float = 1.0, dry_run: bool = False,
                  track: Track = untracked) -> PoolReport:
    """Self-check the pool machines (health, then EUD and intra-machine all-to-all).

    Each machine is marked checked (health and every stage that could run passed),
    failed, or untested (health passed but every stage was skipped). A dry run
    says which machines it would check, with which stages; it contacts no machine
    and marks nothing.

    Returns:
        The pool after the check, with its exit code (0 all passed, 1 some failed,
        3 some gave no answer or could not be tested).
    """
    from brctl.core import nodeset
    from brctl.operations.standby.selfcheck import check_pool

    state = DaemonState(store, inv.job_key)
    before = standby_list(inv, state)
    only = inv.expand(select) if select else []  # @standby, @rack:r01 … resolve here too
    unknown = [n for n in only if n not in {m.node for m in before.machines}]
    if unknown:
        raise UsageError(f"standby check: not pool machines: {nodeset.fold(unknown)}",
                         hint="see brctl standby list")
    names = pool_candidates(before, only)
    if dry_run:
        return dataclasses.replace(before, would_check=tuple(names),
                                   stages=("health", *inv.daemon.standby_stages))
    if not names:
        return before
    results = check_pool(inv, transport, [inv.node(n) for n in names], store=store,
                         runner=runner, timeout_scale=timeout_scale, track=track)
    now = time.time()
    for name, c in results.items():
        state.mark_checked(name, c.outcome == "checked", c.detail, now, c.outcome)
    code = exit_code_of(
        refused=any(c.refused for c in results.values()),
        incomplete=any(c.outcome == "untested" or not c.answered for c in results.values()),
        findings=any(c.outcome == "failed" for c in results.values()))
    return dataclasses.replace(standby_list(inv, state), exit_code=code)
