"""The daemon's tables in the state database, and the operations on them.

Shared by ``brctl daemon``, ``evict``/``unevict``, ``standby`` and ``ettr``:

- ``daemon_events``: what the loop saw (incidents, decisions, refusals), in order.
- ``daemon_actions``: the action log. Each step of a plan is written as
  ``intent`` under an idempotency key BEFORE it is carried out, then marked
  ``done``/``failed``/``refused``. A daemon restarted after ``kill -9`` finds
  the unfinished ``intent`` rows and finishes them (each step is idempotent:
  re-running it converges) and skips ``done`` ones, so a machine is never
  evicted twice and a standby never swapped in twice.
- ``daemon_lease``: one holder per job; a second daemon refuses (exit 4) until
  the holder's lease expires.
- ``evictions``: quarantine records (a machine with an open record never becomes a
  standby and never rejoins the job); ``unevict`` closes the record.
- ``standby_checks``: the last self-check of each pool machine.
- ``job_members``: the job's machines in rank order, after swaps.
- ``ettr_intervals``: productive / unproductive time.
- ``daemon_status``: the last poll, for ``brctl daemon status``.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from brctl.analysis.ettr import Interval
from brctl.core.errors import RefusedError
from brctl.state import Component, Store

COMPONENT = Component("daemon", [
    """
    CREATE TABLE daemon_events (
      id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, at REAL NOT NULL,
      kind TEXT NOT NULL, nodes TEXT NOT NULL, detail TEXT NOT NULL);
    CREATE INDEX daemon_events_job ON daemon_events(job, at);
    CREATE TABLE daemon_actions (
      id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, key TEXT NOT NULL UNIQUE,
      kind TEXT NOT NULL, node TEXT, payload TEXT NOT NULL, state TEXT NOT NULL,
      reason TEXT NOT NULL, created REAL NOT NULL, finished REAL);
    CREATE INDEX daemon_actions_job ON daemon_actions(job, state);
    CREATE TABLE daemon_lease (
      job TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL, acquired REAL NOT NULL);
    CREATE TABLE evictions (
      id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, job TEXT NOT NULL,
      reason TEXT NOT NULL, source TEXT NOT NULL, at REAL NOT NULL, released REAL);
    CREATE UNIQUE INDEX evictions_open ON evictions(node) WHERE released IS NULL;
    CREATE TABLE standby_checks (
      node TEXT PRIMARY KEY, ok INTEGER NOT NULL, at REAL NOT NULL, detail TEXT NOT NULL);
    CREATE TABLE job_members (
      job TEXT NOT NULL, position INTEGER NOT NULL, node TEXT NOT NULL,
      PRIMARY KEY (job, position));
    CREATE TABLE ettr_intervals (
      job TEXT NOT NULL, start REAL NOT NULL, end REAL NOT NULL, productive INTEGER NOT NULL);
    CREATE INDEX ettr_intervals_job ON ettr_intervals(job, start);
    CREATE TABLE daemon_status (
      job TEXT PRIMARY KEY, at REAL NOT NULL, doc TEXT NOT NULL)
    """,
    # checked | failed | untested (every self-check stage skipped); NULL on older rows.
    "ALTER TABLE standby_checks ADD COLUMN outcome TEXT",
])

INTENT, DONE, FAILED, REFUSED = "intent", "done", "failed", "refused"


def owner_id() -> str:
    """This process as a lease owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Action:
    """One row of the action log."""

    id: int
    key: str
    kind: str
    node: Optional[str]
    payload: dict[str, Any]
    state: str
    reason: str
    created: float
    finished: Optional[float]

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

    def to_json(self) -> dict[str, Any]:
        """``{node, job, reason, source, at, released}``."""
        return {"node": self.node, "job": self.job, "reason": self.reason, "source": self.source,
                "at": self.at, "released": self.released}


def _action(row: sqlite3.Row) -> Action:
    return Action(row["id"], row["key"], row["kind"], row["node"], json.loads(row["payload"]),
                  row["state"], row["reason"], row["created"], row["finished"])


class DaemonState:
    """The daemon's records for one job in an open ``Store`` (migrated on construction)."""

    def __init__(self, store: Store, job: str) -> None:
        """Args: store: the open state database; job: the job's name (records are per job)."""
        self.store = store
        self.job = job
        store.migrate(COMPONENT)

    # events -----------------------------------------------------------------
    def event(self, kind: str, nodes: Sequence[str], detail: dict[str, Any], at: float) -> int:
        """Record an event; returns its id."""
        with self.store.transaction() as db:
            cur = db.execute(
                "INSERT INTO daemon_events(job, at, kind, nodes, detail) VALUES(?, ?, ?, ?, ?)",
                (self.job, at, kind, json.dumps(list(nodes)), json.dumps(detail, default=str)))
            return int(cur.lastrowid or 0)

    def events(self, limit: int = 50, since: float = 0.0) -> list[dict[str, Any]]:
        """The newest ``limit`` events (oldest first)."""
        rows = self.store.query(
            "SELECT * FROM daemon_events WHERE job = ? AND at >= ? ORDER BY id DESC LIMIT ?",
            (self.job, since, limit))
        return [{"id": r["id"], "at": r["at"], "kind": r["kind"], "nodes": json.loads(r["nodes"]),
                 "detail": json.loads(r["detail"])} for r in reversed(rows)]

    def event_counts(self) -> dict[str, int]:
        """Events by kind (for /metrics)."""
        rows = self.store.query("SELECT kind, COUNT(*) AS n FROM daemon_events WHERE job = ? "
                                "GROUP BY kind", (self.job,))
        return {r["kind"]: int(r["n"]) for r in rows}

    # the action log ---------------------------------------------------------
    def intend(self, key: str, kind: str, node: Optional[str], payload: dict[str, Any],
               reason: str, at: float) -> Action:
        """Write an ``intent`` under ``key``; if the key exists, return the existing row as is.

        The caller carries the step out only when the returned action is not ``done``.
        """
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO daemon_actions(job, key, kind, node, payload, state, reason,"
                " created) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                (self.job, key, kind, node, json.dumps(payload), INTENT, reason, at))
            row = db.execute("SELECT * FROM daemon_actions WHERE key = ?", (key,)).fetchone()
        return _action(row)

    def finish(self, key: str, state: str, at: float, reason: Optional[str] = None,
               payload: Optional[dict[str, Any]] = None) -> None:
        """Mark an action ``done``/``failed``/``refused`` (and keep its result in ``payload``)."""
        with self.store.transaction() as db:
            if payload is not None:
                db.execute("UPDATE daemon_actions SET payload = ? WHERE key = ?",
                           (json.dumps(payload, default=str), key))
            if reason is None:
                db.execute("UPDATE daemon_actions SET state = ?, finished = ? WHERE key = ?",
                           (state, at, key))
            else:
                db.execute("UPDATE daemon_actions SET state = ?, finished = ?, reason = ? "
                           "WHERE key = ?", (state, at, reason, key))

    def actions(self, states: Iterable[str] = (), limit: int = 1000) -> list[Action]:
        """Actions of this job, oldest first (all states when ``states`` is empty)."""
        wanted = list(states)
        sql = "SELECT * FROM daemon_actions WHERE job = ?"
        params: list[object] = [self.job]
        if wanted:
            sql += f" AND state IN ({','.join('?' * len(wanted))})"
            params += wanted
        rows = self.store.query(sql + " ORDER BY id DESC LIMIT ?", [*params, limit])
        return [_action(r) for r in reversed(rows)]

    def action(self, key: str) -> Optional[Action]:
        """The action recorded under ``key``, or None."""
        rows = self.store.query("SELECT * FROM daemon_actions WHERE key = ?", (key,))
        return _action(rows[0]) if rows else None

    def last_progress(self) -> float:
        """When the job last made progress (end of the newest productive interval), or 0."""
        rows = self.store.query("SELECT MAX(end) AS t FROM ettr_intervals WHERE job = ? "
                                "AND productive = 1", (self.job,))
        return float(rows[0]["t"] or 0.0) if rows else 0.0

    def restarts_since(self, since: float) -> int:
        """Restarts carried out (done or failed) since ``since``: the no-progress count."""
        rows = self.store.query("SELECT COUNT(*) AS n FROM daemon_actions WHERE job = ? AND "
                                "kind = 'restart' AND state IN (?, ?) AND created > ?",
                                (self.job, DONE, FAILED, since))
        return int(rows[0]["n"])

    def crash_decisions_since(self, since: float) -> list[str]:
        """Decisions of the plans made for crashes since ``since``, oldest first.

        The escalation ladder (reattempt → rollback → replay) reads this back after a
        restart of the daemon, so a ``kill -9`` does not reset it. Follow-up plans
        (after a replay) are not crash decisions of their own.
        """
        rows = self.store.query("SELECT payload FROM daemon_actions WHERE job = ? AND "
                                "kind = 'plan' AND created > ? ORDER BY id", (self.job, since))
        out = []
        for row in rows:
            doc = json.loads(row["payload"])
            if (doc.get("incident") or {}).get("kind") == "crash" and not doc.get("follows"):
                out.append(str(doc["plan"]["decision"]))
        return out

    def unfinished(self) -> list[Action]:
        """Steps written as intent and never finished (a crash or kill -9 in between)."""
        return self.actions([INTENT])

    # lease ------------------------------------------------------------------
    def acquire_lease(self, owner: str, now: float, ttl: float) -> None:
        """Take or renew the job's lease.

        Raises:
            RefusedError: another owner holds an unexpired lease (exit 4).
        """
        with self.store.transaction() as db:
            row = db.execute("SELECT owner, expires FROM daemon_lease WHERE job = ?",
                             (self.job,)).fetchone()
            if row is not None and row["owner"] != owner and row["expires"] > now:
                raise RefusedError(
                    f"daemon: job {self.job!r} is leased by {row['owner']} for another "
                    f"{row['expires'] - now:.0f}s",
                    hint="one daemon per job; if that daemon is dead, wait for daemon.lease_ttl")
            db.execute(
                "INSERT INTO daemon_lease(job, owner, expires, acquired) VALUES(?, ?, ?, ?) "
                "ON CONFLICT(job) DO UPDATE SET owner = excluded.owner, expires = excluded.expires,"
                " acquired = CASE WHEN daemon_lease.owner = excluded.owner"
                " THEN daemon_lease.acquired ELSE excluded.acquired END",
                (self.job, owner, now + ttl, now))

    def release_lease(self, owner: str) -> None:
        """Give the lease up (clean exit)."""
        with self.store.transaction() as db:
            db.execute("DELETE FROM daemon_lease WHERE job = ? AND owner = ?", (self.job, owner))

    def lease(self) -> Optional[dict[str, Any]]:
        """``{owner, expires, acquired}`` or None."""
        rows = self.store.query("SELECT * FROM daemon_lease WHERE job = ?", (self.job,))
        return dict(rows[0]) if rows else None

    # quarantine -------------------------------------------------------------
    def quarantine(self, node: str, reason: str, source: str, at: float) -> bool:
        """Open an eviction record; False when the machine was already quarantined."""
        with self.store.transaction() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO evictions(node, job, reason, source, at) VALUES(?, ?, ?, ?, ?)",
                (node, self.job, reason, source, at))
            return cur.rowcount == 1

    def release(self, node: str, at: float) -> bool:
        """Close the machine's open record; False when it had none."""
        with self.store.transaction() as db:
            cur = db.execute("UPDATE evictions SET released = ? WHERE node = ? AND released IS NULL",
                             (at, node))
            return cur.rowcount == 1

    def quarantined(self) -> dict[str, Eviction]:
        """Open records, any job (a bad machine is bad for every job)."""
        rows = self.store.query("SELECT * FROM evictions WHERE released IS NULL ORDER BY at")
        return {r["node"]: Eviction(r["node"], r["job"], r["reason"], r["source"], r["at"],
                                    r["released"]) for r in rows}

    def eviction_history(self) -> list[Eviction]:
        """Every eviction record, oldest first (caps and failure-rate history)."""
        rows = self.store.query("SELECT * FROM evictions ORDER BY at")
        return [Eviction(r["node"], r["job"], r["reason"], r["source"], r["at"], r["released"])
                for r in rows]

    # standby pool -------------------------------------------------------------
    def mark_checked(self, node: str, ok: bool, detail: str, at: float,
                     outcome: Optional[str] = None) -> None:
        """Record a self-check of a pool machine (``outcome``: checked | failed | untested)."""
        outcome = outcome or ("checked" if ok else "failed")
        with self.store.transaction() as db:
            db.execute("INSERT INTO standby_checks(node, ok, at, detail, outcome) "
                       "VALUES(?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET ok = excluded.ok,"
                       " at = excluded.at, detail = excluded.detail, outcome = excluded.outcome",
                       (node, int(ok), at, detail, outcome))

    def outcomes(self) -> dict[str, str]:
        """node → checked | failed | untested of its last self-check."""
        return {r["node"]: r["outcome"] or ("checked" if r["ok"] else "failed")
                for r in self.store.query("SELECT node, ok, outcome FROM standby_checks")}

    def checks(self) -> dict[str, tuple[bool, float, str]]:
        """node → (ok, when, detail) of its last self-check."""
        return {r["node"]: (bool(r["ok"]), r["at"], r["detail"])
                for r in self.store.query("SELECT * FROM standby_checks")}

    # membership ---------------------------------------------------------------
    def members(self, default: Sequence[str]) -> list[str]:
        """The job's machines in rank order (the inventory's until the first swap)."""
        rows = self.store.query("SELECT node FROM job_members WHERE job = ? ORDER BY position",
                                (self.job,))
        return [r["node"] for r in rows] if rows else list(default)

    def set_members(self, nodes: Sequence[str]) -> None:
        """Replace the job's machine list."""
        with self.store.transaction() as db:
            db.execute("DELETE FROM job_members WHERE job = ?", (self.job,))
            db.executemany("INSERT INTO job_members(job, position, node) VALUES(?, ?, ?)",
                           [(self.job, i, n) for i, n in enumerate(nodes)])

    # ETTR -------------------------------------------------------------------
    def add_interval(self, start: float, end: float, productive: bool) -> None:
        """Record observed time; extends the previous interval when it continues it."""
        if end <= start:
            return
        with self.store.transaction() as db:
            row = db.execute("SELECT rowid, end, productive FROM ettr_intervals WHERE job = ? "
                             "ORDER BY start DESC LIMIT 1", (self.job,)).fetchone()
            if row is not None and abs(row["end"] - start) < 1e-6 and bool(row["productive"]) == productive:
                db.execute("UPDATE ettr_intervals SET end = ? WHERE rowid = ?", (end, row["rowid"]))
            else:
                db.execute("INSERT INTO ettr_intervals(job, start, end, productive) "
                           "VALUES(?, ?, ?, ?)", (self.job, start, end, int(productive)))

    def intervals(self, since: float = 0.0) -> list[Interval]:
        """Recorded intervals ending after ``since``, oldest first."""
        rows = self.store.query("SELECT start, end, productive FROM ettr_intervals "
                                "WHERE job = ? AND end > ? ORDER BY start", (self.job, since))
        return [Interval(r["start"], r["end"], bool(r["productive"])) for r in rows]

    # status -------------------------------------------------------------------
    def save_status(self, doc: dict[str, Any], at: float) -> None:
        """Keep the last poll's summary for ``brctl daemon status``."""
        with self.store.transaction() as db:
            db.execute("INSERT INTO daemon_status(job, at, doc) VALUES(?, ?, ?) "
                       "ON CONFLICT(job) DO UPDATE SET at = excluded.at, doc = excluded.doc",
                       (self.job, at, json.dumps(doc, default=str)))

    def status(self) -> Optional[tuple[float, dict[str, Any]]]:
        """(when, summary) of the last poll, or None."""
        rows = self.store.query("SELECT at, doc FROM daemon_status WHERE job = ?", (self.job,))
        return (rows[0]["at"], json.loads(rows[0]["doc"])) if rows else None


