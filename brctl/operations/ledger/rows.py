"""The daemon's rows as read back from the state database: every row is untrusted.

A row may have been written by an older or newer brctl, by hand, or damaged on
disk: a ``payload`` or ``detail`` that is not JSON or not an object, a time that
is not a number. Decoding one never raises: it gives ``None`` (or an ``Action``
marked ``damaged``) and a ``Damaged`` naming the table, the row's key and what is
wrong, which the reporting commands print and count (exit 3), and the daemon
turns into an abandoned plan with a page (a plan nobody can read cannot be
resumed). ``DaemonState`` (``operations.ledger.state``) collects them.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Damaged:
    """A row that does not decode: ``table``, its key (or id), and why."""

    table: str
    key: str
    why: str

    def __str__(self) -> str:
        return f"{self.table} row {self.key}: {self.why}"

    def to_json(self) -> dict[str, str]:
        """``{table, key, why}``."""
        return {"table": self.table, "key": self.key, "why": self.why}


@dataclass(frozen=True)
class Action:
    """One row of the action log; ``damaged`` says why its record cannot be read
    (then ``payload`` is empty and only its key and state are to be trusted)."""

    id: int
    key: str
    kind: str
    node: Optional[str]
    payload: dict[str, Any]
    state: str
    reason: str
    created: float
    finished: Optional[float]
    damaged: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """``{id, key, kind, node, payload, state, reason, created, finished}``."""
        return {"id": self.id, "key": self.key, "kind": self.kind, "node": self.node,
                "payload": self.payload, "state": self.state, "reason": self.reason,
                "created": self.created, "finished": self.finished}


@dataclass(frozen=True)
class Eviction:
    """A quarantine record; open while ``released`` is None."""

    node: str
    job: str
    reason: str
    source: str
    at: float
    released: Optional[float]
    operator: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """``{node, job, reason, source, operator, at, released}``."""
        return {"node": self.node, "job": self.job, "reason": self.reason, "source": self.source,
                "operator": self.operator, "at": self.at, "released": self.released}


@dataclass(frozen=True)
class Lease:
    """A lease taken: its fencing generation, and whose expired or dead lease it replaced."""

    generation: int
    took_over: Optional[str] = None  # "<owner>: <why it was dead>", or None


def storable(value: str) -> str:
    """``value`` as SQLite can store it: a lone surrogate (how Python decodes a file name
    that is not UTF-8, e.g. a job's step name relayed by a node) is written as ``\\udcff``
    instead of failing the transaction, and with it the daemon, at every restart."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class BadRow(ValueError):
    """One column of a row is not what brctl writes there (message: the column, why)."""


def loads(text: object, column: str, want: type = dict) -> Any:
    """``text`` decoded as JSON of type ``want`` (``dict`` or ``list``); ``BadRow`` else."""
    if not isinstance(text, (str, bytes)):
        raise BadRow(f"{column} is {type(text).__name__}, not JSON text")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadRow(f"{column} is not JSON ({type(exc).__name__})") from None
    if not isinstance(value, want):
        raise BadRow(f"{column} is a JSON {type(value).__name__}, not an "
                     f"{'object' if want is dict else 'array'}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def number(value: object, column: str, *, null: bool = False) -> Any:
    """A finite ``REAL`` column (None allowed with ``null``); ``BadRow`` else."""
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRow(f"{column} is {value!r}, not a number")
    return float(value)


def text(value: object, column: str, *, null: bool = False) -> Any:
    """A ``TEXT`` column (None allowed with ``null``); ``BadRow`` else."""
    if value is None and null:
        return None
    if not isinstance(value, str):
        raise BadRow(f"{column} is {type(value).__name__}, not text")
    return value


def row_key(row: sqlite3.Row, column: str = "key") -> str:
    """How a report names ``row``: its key when it is text, else its id."""
    names = row.keys()  # ``in row`` would look among the values
    key = row[column] if column in names else None
    return key if isinstance(key, str) else f"id {row['id'] if 'id' in names else '?'}"


def action(row: sqlite3.Row) -> Action:
    """A ``daemon_actions`` row; ``BadRow`` when even its key, kind or state is unreadable.

    A payload, reason or time that does not decode makes the action ``damaged``
    (its payload empty): the daemon abandons such a plan, reports skip it.
    """
    key = text(row["key"], "key")
    kind, state = text(row["kind"], "kind"), text(row["state"], "state")
    bad: list[str] = []

    def col(decode: Any, column: str, default: Any, **kw: Any) -> Any:
        try:
            return decode(row[column], column, **kw)
        except BadRow as exc:  # only this column is lost; the others still tell
            bad.append(str(exc))
            return default

    payload = col(loads, "payload", {})
    reason = col(text, "reason", "")
    created = col(number, "created", 0.0)
    finished = col(number, "finished", None, null=True)
    node = col(text, "node", None, null=True)
    damaged = "; ".join(bad) or None
    return Action(int(row["id"]), key, kind, node, payload, state, reason, created, finished,
                  damaged)


def event(row: sqlite3.Row) -> dict[str, Any]:
    """A ``daemon_events`` row as ``{id, at, kind, nodes, detail}``; ``BadRow`` else."""
    nodes = loads(row["nodes"], "nodes", list)
    if not all(isinstance(n, str) for n in nodes):
        raise BadRow("nodes holds something other than machine names")
    return {"id": int(row["id"]), "at": number(row["at"], "at"), "kind": text(row["kind"], "kind"),
            "nodes": nodes, "detail": loads(row["detail"], "detail")}


def eviction(r: sqlite3.Row) -> Eviction:
    """An ``evictions`` row; ``BadRow`` when a column is not what brctl writes."""
    return Eviction(text(r["node"], "node"), text(r["job"], "job"), text(r["reason"], "reason"),
                    text(r["source"], "source"), number(r["at"], "at"),
                    number(r["released"], "released", null=True),
                    text(r["operator"], "operator", null=True))


class Reader:
    """Decodes rows as they are read and keeps those that did not decode (``skipped``)."""

    def __init__(self) -> None:
        self._damaged: dict[tuple[str, str], Damaged] = {}

    def damaged(self, table: str, key: str, why: object) -> None:
        """Keep ``table``'s row ``key`` as one that did not decode (once)."""
        self._damaged.setdefault((table, key), Damaged(table, key, str(why)))

    def skipped(self) -> list[Damaged]:
        """The rows that did not decode, in the order they were met."""
        return list(self._damaged.values())

    def obj(self, raw: object, table: str, key: str, column: str) -> Optional[dict[str, Any]]:
        """``raw`` as a JSON object, or None (kept as damaged)."""
        try:
            return dict(loads(raw, column))
        except BadRow as exc:
            self.damaged(table, key, exc)
            return None

    def action(self, row: sqlite3.Row, damaged_too: bool) -> Optional[Action]:
        """``action(row)``; None when it does not decode (or is damaged, unless
        ``damaged_too``: the daemon needs those, to abandon them)."""
        try:
            act = action(row)
        except (BadRow, TypeError, ValueError) as exc:
            self.damaged("daemon_actions", row_key(row), exc)
            return None
        if act.damaged:
            self.damaged("daemon_actions", act.key, act.damaged)
            if not damaged_too:
                return None
        return act

    def event(self, row: sqlite3.Row) -> Optional[dict[str, Any]]:
        """``event(row)``, or None (kept as damaged)."""
        try:
            return event(row)
        except (BadRow, TypeError, ValueError) as exc:
            self.damaged("daemon_events", f"id {row['id']}", exc)
            return None

    def eviction(self, row: sqlite3.Row, closed_at: Optional[float] = None) -> Optional[Eviction]:
        """``eviction(row)``, or None (kept as damaged); with ``closed_at`` (the daemon's
        decisions) a damaged row whose node reads is ``closed(row, closed_at)`` instead."""
        try:
            return eviction(row)
        except (BadRow, TypeError, ValueError) as exc:
            self.damaged("evictions", row_key(row, "node"), exc)
            return None if closed_at is None else closed(row, closed_at)


def closed(row: sqlite3.Row, at: float) -> Optional[Eviction]:
    """A damaged ``evictions`` row as a decision must take it (fail closed): when its node
    reads, a quarantine that is open unless its release reads, at ``at`` (the newest it
    can be: it counts in every cap window) unless its time reads; None when no node."""
    node = row["node"]
    if not isinstance(node, str):
        return None

    def kept(read: Callable[..., Any], column: str, default: Any, **null: bool) -> Any:
        try:
            return read(row[column], column, **null)
        except BadRow:
            return default
    return Eviction(node, kept(text, "job", "?"), kept(text, "reason", "damaged record"),
                    kept(text, "source", "damaged"), kept(number, "at", at),
                    kept(number, "released", None, null=True),
                    kept(text, "operator", None, null=True))


def at_or(value: object, at: float) -> float:
    """An ``evictions.at`` value, or ``at`` (the newest it can be) when it does not read."""
    try:
        return float(number(value, "at"))
    except BadRow:
        return at
