"""Operation of ``brctl simulate``: read the mix, run the scenario (and its sweep).

The simulation itself is pure (``analysis.daemon.simulate``); this reads a mix file or the
job's recorded incidents (``--mix history``) and turns a ``--sweep`` into one scenario per value.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.daemon.simulate import (
    DAY,
    RESOLUTIONS,
    SIGNALS,
    IncidentKind,
    PastIncident,
    Scenario,
    Summary,
    byterobust_mix,
    escalations,
    history_mix,
    with_setting,
)
from brctl.analysis.daemon.simulate import simulate as run_scenario
from brctl.config.daemon import DaemonSection
from brctl.core.errors import ExitCode, InputError, UsageError
from brctl.operations.ledger.state import DONE, DaemonState
from brctl.state import Store


def history(store: Store, job: str, machines: int) -> tuple[IncidentKind, ...]:
    """``--mix history``: the incidents the daemon handled for ``job`` (its action log).

    Each plan carried out to the end (``done``; not a follow-up after a replay) is one
    incident, resolved by its decision, except that crash plans with no new step between
    them are one incident resolved by the last (``escalations``); the days covered are those of the recorded
    ETTR intervals and plans. ``machines``: the job's machine count.

    Raises:
        InputError: nothing usable is recorded for ``job`` (the database is named).
    """
    state = DaemonState(store, job)
    plans = [a for a in state.actions([DONE], limit=-1)  # -1: SQLite for no limit
             if a.kind == "plan" and not a.payload.get("follows")]
    past = [PastIncident(str((a.payload.get("incident") or {}).get("kind", "")),
                         str((a.payload.get("plan") or {}).get("decision", "")), a.created)
            for a in plans]
    intervals = state.intervals()
    # a crash that came back before a new step is one incident climbing the ladder
    past = escalations(past, [iv.end for iv in intervals if iv.productive])
    times = [t for iv in intervals for t in (iv.start, iv.end)] + [a.created for a in plans]
    try:
        return history_mix(past, machines, max(times) - min(times) if times else 0.0)
    except ValueError as exc:
        raise InputError(f"simulate --mix history: job {job!r} in {store.path}: {exc}; "
                         "cannot simulate from nothing",
                         hint="run brctl daemon for the job first, or use --mix byterobust "
                              "or a mix file") from None


def load_mix(name: str) -> tuple[IncidentKind, ...]:
    """``byterobust`` (built in) or a YAML file: ``kinds: [{name, rate, signal, resolution}]``.

    ``rate`` is incidents per machine-day; ``signal`` what the daemon sees (gpu_fault,
    crash, hang); ``resolution`` the action that truly fixes it (evict, reattempt,
    rollback, replay).

    Raises:
        InputError: unreadable or malformed file (file and key named).
    """
    if name == "byterobust":
        return byterobust_mix()
    from brctl.load.inventory import parse_yaml, utf8_text

    try:
        raw = Path(name).read_bytes()
    except OSError as exc:
        raise InputError(f"mix {name}: cannot read: {exc.strerror}", file=name,
                         hint="--mix byterobust, or a YAML file with kinds:") from None
    data = parse_yaml(utf8_text(raw, name), name)
    kinds = data.get("kinds") if isinstance(data, dict) else None
    if not isinstance(kinds, list) or not kinds:
        raise InputError(f"mix {name}: expected kinds: a non-empty list", file=name, key="kinds")
    return tuple(_kind(entry, name, i) for i, entry in enumerate(kinds))


MAX_RATE = 1000.0  # incidents per machine-day: past this nothing trains, and the draws never end


def _kind(entry: Any, path: str, i: int) -> IncidentKind:
    key = f"kinds[{i}]"
    if not isinstance(entry, dict):
        raise InputError(f"mix {path}: {key}: expected a mapping {{name, rate, signal, resolution}}",
                         file=path, key=key)
    unknown = sorted(set(entry) - {"name", "rate", "signal", "resolution"})
    if unknown:
        raise InputError(f"mix {path}: {key}: unknown key(s) {', '.join(map(str, unknown))}",
                         file=path, key=key)
    rate = entry.get("rate")
    # YAML reads .inf, .nan and 1e400 as floats: a rate is finite and in range where it enters
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
            or not 0 <= rate <= MAX_RATE:  # NaN fails too
        raise InputError(f"mix {path}: {key}.rate: expected a finite number of incidents per "
                         f"machine-day from 0 to {MAX_RATE:g}, got {rate!r}",
                         file=path, key=f"{key}.rate")
    signal, resolution = entry.get("signal"), entry.get("resolution")
    if signal not in SIGNALS:
        raise InputError(f"mix {path}: {key}.signal: got {signal!r}, expected one of "
                         f"{', '.join(SIGNALS)}", file=path, key=f"{key}.signal")
    if resolution not in RESOLUTIONS:
        raise InputError(f"mix {path}: {key}.resolution: got {resolution!r}, expected one of "
                         f"{', '.join(RESOLUTIONS)}", file=path, key=f"{key}.resolution")
    return IncidentKind(str(entry.get("name", f"kind{i}")), float(rate), signal, resolution)


def parse_setting(text: str, flag: str) -> tuple[str, list[float]]:
    """``key=a,b,c`` → (key, [a, b, c]).

    Raises:
        UsageError: not that form, or a value that is not a number.
    """
    key, sep, values = text.partition("=")
    try:
        numbers = [float(v) for v in values.split(",")] if sep and values else []
    except ValueError:
        numbers = []
    if not key or not numbers:
        raise UsageError(f"{flag} {text!r}: expected KEY=NUMBER[,NUMBER...], e.g. standby.size=2,4,8")
    for spelled, number in zip(values.split(","), numbers):
        if not math.isfinite(number):  # float() reads nan, inf and 1e400
            raise UsageError(f"{flag} {key.strip()}: {spelled.strip()!r} is not a finite number")
    return key.strip(), numbers


@dataclass(frozen=True)
class SimulateReport:
    """One row per sweep value (one row without a sweep)."""

    scenario: Scenario
    mix_name: str
    seed: int
    sweep_key: Optional[str]
    rows: tuple[tuple[Optional[float], Summary], ...]
    seconds: float

    @property
    def exit_code(self) -> ExitCode:
        """Always OK: a simulation has no findings, whatever ETTR it shows."""
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """The ``brctl.simulate/1`` body."""
        sc = self.scenario
        return {
            "mix": self.mix_name, "machines": sc.machines, "days": sc.days,
            "ckpt_interval": sc.ckpt_interval, "standby": sc.standby, "seed": self.seed,
            "window": sc.window,
            "kinds": [{"name": k.name, "rate": k.rate, "signal": k.signal,
                       "resolution": k.resolution} for k in sc.mix],
            "durations": dict(vars(sc.durations)), "sweep": self.sweep_key,
            "rows": [{"value": value, **summary.to_json()} for value, summary in self.rows],
            "seconds": self.seconds}


def simulate(*, mix_name: str, machines: int, standby: int, days: float, ckpt_interval: float,
             daemon: Optional[DaemonSection], runs: int, seed: int, window: float = DAY,
             settings: Sequence[tuple[str, float]] = (),
             sweep: Optional[tuple[str, list[float]]] = None,
             history_of: Optional[tuple[Store, str, int]] = None) -> SimulateReport:
    """Run the scenario with ``settings`` applied, once per sweep value.

    Args:
        mix_name: ``byterobust``, ``history`` or a mix file (``load_mix``).
        history_of: for ``history``: the state database, the job and its machine count.
        daemon: the inventory's ``daemon:`` settings (None: the defaults).

    Raises:
        UsageError: an unknown setting or a value it refuses.
        InputError: a bad mix file, or no history recorded.
    """
    started = time.monotonic()
    mix = history(*history_of) if mix_name == "history" and history_of else load_mix(mix_name)
    scenario = Scenario(machines, days, ckpt_interval, standby, mix,
                        daemon=daemon or DaemonSection(), window=window)
    try:
        for key, value in settings:
            scenario = with_setting(scenario, key, value)
        cases = ([(None, scenario)] if sweep is None else
                 [(v, with_setting(scenario, sweep[0], v)) for v in sweep[1]])
    except ValueError as exc:
        raise UsageError(f"simulate: {exc}") from None
    rows = tuple((value, run_scenario(sc, runs, seed)) for value, sc in cases)
    return SimulateReport(scenario, mix_name, seed, sweep[0] if sweep else None, rows,
                          time.monotonic() - started)


def write_page(path: Path, text: str) -> None:
    """``brctl simulate -o``: the page written in one rename (as ``brctl report`` does).

    Raises:
        InputError: the directory or file cannot be written.
    """
    from brctl.operations.report import write_atomic

    write_atomic(path, text)
