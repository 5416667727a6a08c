"""The daemon's tables in the state database, and the operations on them.

Shared by ``brctl daemon``, ``evict``/``unevict``, ``standby`` and ``ettr``:

- ``daemon_events``: what the loop saw (incidents, decisions, refusals), in order;
  the newest ``halted`` not followed by a ``rearmed`` is the daemon's halt (``halt``).
  A plan's payload is an ``analysis.daemon.plan.PlanRecord``.
- ``daemon_actions``: the action log. A plan is admitted (caps checked, its
  evictions quarantined, the plan written) in one transaction; each of its steps
  is written as ``intent`` under ``<plan>/<step>`` BEFORE it is carried out, then
  marked ``done``/``failed``/``skipped``/``unknown``; the plan ends ``done``,
  ``failed``, ``abandoned`` or ``refused``. What a resumed daemon does with a step
  left as intent is ``analysis.daemon.plan.RESUME``.
- ``daemon_lease``: one holder per job, with a generation number that grows at each
  takeover. Every intent and outcome is written in a transaction that first checks
  the writer's generation (fencing): a daemon that lost the lease cannot record,
  so it stops before its next step (``LeaseLost``, exit 4). A second daemon refuses
  (exit 4) while the holder is alive; a holder proven dead is taken over at once.
- ``evictions``: quarantine records (a machine with an open record never becomes a
  standby and never rejoins the job); ``unevict`` closes the record. ``source`` is
  daemon or hand, ``operator`` who evicted by hand.
- ``standby_checks``: the last self-check of each pool machine.
- ``job_members``: the job's machines in rank order, after swaps.
- ``ettr_intervals``: productive / unproductive time.
- ``daemon_status``: the last poll, for ``brctl daemon status``.

Every row read back is untrusted (``operations.ledger.rows``): one that does not
decode is skipped and kept in ``damaged`` (table, key, why) for the reporting
commands to name (exit 3); an action whose record is unreadable comes back
marked ``damaged``, and the daemon abandons that plan with a page.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

from brctl.analysis.daemon.plan import PlanRecord
from brctl.analysis.daemon.policy import StandbyOutcome
from brctl.analysis.diagnose.decide import Decision
from brctl.analysis.ettr import Interval
from brctl.core.errors import RefusedError
from brctl.operations.ledger import rows as rows_
from brctl.operations.ledger.rows import Action, Damaged, Eviction, Lease
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
    # the fencing generation and the holder's process (host, boot id, PID namespace, pid,
    # start time) so a successor can prove it dead; who evicted by hand
    """
    ALTER TABLE daemon_lease ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE daemon_lease ADD COLUMN holder TEXT;
    ALTER TABLE evictions ADD COLUMN operator TEXT
    """,
])

INTENT, DONE, FAILED, REFUSED = "intent", "done", "failed", "refused"
ABANDONED, UNKNOWN, SKIPPED = "abandoned", "unknown", "skipped"
FINAL = (DONE, FAILED, REFUSED, ABANDONED, UNKNOWN, SKIPPED)


class LeaseLost(RefusedError):
    """This daemon's lease generation is no longer the job's: another daemon took over."""


class StaleTarget(RefusedError):
    """A step's target changed since the plan was written (a machine quarantined since,
    a standby no longer checked): nothing was written; the plan is abandoned."""


def owner_id() -> str:
    """This process as a lease owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class DaemonState:
    """The daemon's records for one job in an open ``Store`` (migrated on construction)."""

    def __init__(self, store: Store, job: str) -> None:
        """Args: store: the open state database; job: the job's name (records are per job)."""
        self.store = store
        self.job = job
        self.rows = rows_.Reader()  # decodes what is read back, keeps what did not decode
        store.migrate(COMPONENT)

    def skipped(self) -> list[Damaged]:
        """The rows read so far that did not decode, in the order they were met."""
        return self.rows.skipped()

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
        return [e for r in reversed(rows) if (e := self.rows.event(r)) is not None]

    def halt(self) -> Optional[str]:
        """Why the job's daemon is halted, or None: the newest ``halted`` event unless a
        ``rearmed`` one (``brctl daemon rearm``) came after it. A halt outlives the daemon
        (a kill -9, an OOM kill, a systemd restart): what it halted on is a human's."""
        rows = self.store.query("SELECT kind, detail FROM daemon_events WHERE job = ? AND "
                                "kind IN ('halted', 'rearmed') ORDER BY id DESC LIMIT 1", (self.job,))
        if not rows or rows[0]["kind"] != "halted":
            return None
        detail = self.rows.obj(rows[0]["detail"], "daemon_events", "halted", "detail")
        if detail is None:  # still halted: what halted it is a human's to read
            return "halted (its record does not decode)"
        return str(detail.get("why") or detail.get("reason") or "halted")

    def event_counts(self) -> dict[str, int]:
        """Events by kind (for /metrics)."""
        rows = self.store.query("SELECT kind, COUNT(*) AS n FROM daemon_events WHERE job = ? "
                                "GROUP BY kind", (self.job,))
        return {r["kind"]: int(r["n"]) for r in rows}

    def action_counts(self) -> dict[tuple[str, str], int]:
        """(kind, state) → actions of the job's whole history in that state, every state.

        A row reaches a final state once and keeps it (rows are never removed), so
        the final states' counts only grow: ``/metrics`` counts those; ``intent`` goes
        up and down (a gauge)."""
        rows = self.store.query("SELECT kind, state, COUNT(*) AS n FROM daemon_actions "
                                "WHERE job = ? GROUP BY kind, state", (self.job,))
        return {(str(r["kind"]), str(r["state"])): int(r["n"]) for r in rows}

    # the action log ---------------------------------------------------------
    def _fence(self, db: sqlite3.Connection, generation: Optional[int]) -> None:
        """Raise ``LeaseLost`` unless ``generation`` still holds the job's lease (None: unfenced,
        a hand command)."""
        if generation is None:
            return
        row = db.execute("SELECT owner, generation FROM daemon_lease WHERE job = ?",
                         (self.job,)).fetchone()
        if row is None or int(row["generation"]) != generation:
            who = f"{row['owner'] or 'nobody'} (generation {row['generation']})" if row else "nobody"
            raise LeaseLost(f"daemon: lost the lease of job {self.job!r} (generation {generation}): "
                            f"now held by {who}",
                            hint="another daemon took over; this one stops before its next step")

    def fence(self, generation: Optional[int]) -> None:
        """Raise ``LeaseLost`` unless ``generation`` still holds the job's lease."""
        if generation is not None:
            with self.store.transaction() as db:
                self._fence(db, generation)

    def intend(self, key: str, kind: str, node: Optional[str], payload: dict[str, Any],
               reason: str, at: float, generation: Optional[int] = None,
               unquarantined: Sequence[str] = ()) -> Action:
        """Write an ``intent`` under ``key``; if the key exists, return the existing row as is.

        The caller carries the step out only when the returned action is not ``done``.

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
            StaleTarget: a machine of ``unquarantined`` has an open quarantine record now
                (e.g. ``brctl evict`` since the plan was written; nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            _check_unquarantined(db, unquarantined)
            db.execute(
                "INSERT OR IGNORE INTO daemon_actions(job, key, kind, node, payload, state, reason,"
                " created) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                (self.job, key, kind, node, json.dumps(payload), INTENT, rows_.storable(reason), at))
            row = db.execute("SELECT * FROM daemon_actions WHERE key = ?", (key,)).fetchone()
        try:
            return rows_.action(row)
        except (rows_.BadRow, TypeError, ValueError) as exc:  # a damaged row under this key
            self.rows.damaged("daemon_actions", key, exc)
            raise StaleTarget(f"the record of {key} does not decode: {exc}") from None

    def finish(self, key: str, state: str, at: float, reason: Optional[str] = None,
               payload: Optional[dict[str, Any]] = None, generation: Optional[int] = None) -> bool:
        """Mark an action ``done``/``failed``/``refused``/... (and keep its result in ``payload``).
        Only a row still ``intent`` changes: a final state is never left (that is what keeps
        ``/metrics``' counts of final states monotonic); False, nothing written, when the
        row was already final (or is not there).

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            cur = db.execute(
                "UPDATE daemon_actions SET state = ?, finished = ?, reason = COALESCE(?, reason),"
                " payload = COALESCE(?, payload) WHERE key = ? AND state = ?",
                (state, at, None if reason is None else rows_.storable(reason),
                 None if payload is None else json.dumps(payload, default=str), key, INTENT))
            return cur.rowcount == 1

    def skip(self, key: str, kind: str, node: Optional[str], payload: dict[str, Any],
             reason: str, at: float, generation: Optional[int] = None) -> None:
        """Record a step that will not run as ``skipped``, in one transaction (a kill
        between an intent and its skip would leave a step that never ran looking begun).
        A step already written as intent (its action never started) becomes skipped; a
        final one stays as it is.

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            db.execute(
                "INSERT OR IGNORE INTO daemon_actions(job, key, kind, node, payload, state, reason,"
                " created, finished) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.job, key, kind, node, json.dumps(payload), SKIPPED, rows_.storable(reason), at, at))
            db.execute("UPDATE daemon_actions SET state = ?, finished = ?, reason = ? "
                       "WHERE key = ? AND state = ?", (SKIPPED, at, rows_.storable(reason), key, INTENT))

    def admit(self, key: str, payload: dict[str, Any], reason: str, at: float, *,
              evict: Sequence[str], source: str, operator: Optional[str],
              caps: Callable[[list[float]], Optional[str]],
              generation: Optional[int] = None, kind: str = "plan") -> Optional[str]:
        """Check the caps and record the plan in one ``BEGIN IMMEDIATE`` transaction.

        ``caps`` gets the times of every eviction recorded so far and says why the plan
        is refused, or None. Admitted: the plan is written as intent and ``evict`` is
        quarantined (that is what the eviction caps count), so two daemons or hand
        evictions racing at the cap cannot both pass it. Refused: the plan is written
        as ``refused``. Returns the refusal, or None.

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            times = [rows_.at_or(r["at"], at) for r in db.execute("SELECT at FROM evictions")]
            why = caps(times)
            db.execute(
                "INSERT OR IGNORE INTO daemon_actions(job, key, kind, node, payload, state, reason,"
                " created, finished) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.job, key, kind, evict[0] if kind != "plan" and evict else None,
                 json.dumps(payload, default=str), REFUSED if why else INTENT,
                 rows_.storable(why or reason), at, at if why else None))
            if why is None:
                db.executemany(
                    "INSERT OR IGNORE INTO evictions(node, job, reason, source, at, operator)"
                    " VALUES(?, ?, ?, ?, ?, ?)",
                    [(n, self.job, rows_.storable(reason), source, at, operator) for n in evict])
        return why

    def plan_of(self, key: str) -> Optional[Action]:
        """The plan a step key ``<plan>/<step id>`` belongs to (the longest plan key prefix)."""
        rows = self.store.query("SELECT * FROM daemon_actions WHERE job = ? AND kind = 'plan' "
                                "AND ? LIKE key || '/%' ORDER BY length(key) DESC LIMIT 1",
                                (self.job, key))
        return self.rows.action(rows[0], True) if rows else None

    def actions(self, states: Iterable[str] = (), limit: int = 1000, *,
                damaged_too: bool = False) -> list[Action]:
        """Actions of this job, oldest first (all states when ``states`` is empty); rows
        that do not decode are skipped (kept in ``damaged``) unless ``damaged_too``."""
        wanted = list(states)
        sql = "SELECT * FROM daemon_actions WHERE job = ?"
        params: list[object] = [self.job]
        if wanted:
            sql += f" AND state IN ({','.join('?' * len(wanted))})"
            params += wanted
        rows = self.store.query(sql + " ORDER BY id DESC LIMIT ?", [*params, limit])
        return [a for r in reversed(rows) if (a := self.rows.action(r, damaged_too)) is not None]

    def action(self, key: str) -> Optional[Action]:
        """The action recorded under ``key``, or None (it may be ``damaged``)."""
        rows = self.store.query("SELECT * FROM daemon_actions WHERE key = ?", (key,))
        return self.rows.action(rows[0], True) if rows else None

    def last_progress(self) -> float:
        """When the job last made progress (end of the newest productive interval), or 0."""
        rows = self.store.query("SELECT MAX(end) AS t FROM ettr_intervals WHERE job = ? "
                                "AND productive = 1", (self.job,))
        return float(rows[0]["t"] or 0.0) if rows else 0.0

    def last_rearm(self) -> float:
        """When ``brctl daemon rearm`` last lifted a halt of the job (its event's time), or 0."""
        rows = self.store.query("SELECT MAX(at) AS t FROM daemon_events WHERE job = ? AND "
                                "kind = 'rearmed'", (self.job,))
        return float(rows[0]["t"] or 0.0) if rows else 0.0

    def restarts_since(self, since: float) -> int:
        """Restarts begun since ``since`` (done, failed, or unknown after a kill): the
        no-progress count."""
        rows = self.store.query("SELECT COUNT(*) AS n FROM daemon_actions WHERE job = ? AND "
                                "kind = 'restart' AND state IN (?, ?, ?, ?) AND created > ?",
                                (self.job, DONE, FAILED, UNKNOWN, INTENT, since))
        return int(rows[0]["n"])

    def crash_history(self, since: float) -> list[tuple[Decision, str, float]]:
        """(decision, symptom, when) of the crash plans carried out since ``since``, oldest first.

        Only plans that finished ``done`` count: the escalation ladder is fed what
        actually happened (a failed or abandoned rollback did not roll anything back).
        Read back after a restart, so a ``kill -9`` does not reset the ladder. Follow-up
        plans (after a replay) are not crash decisions of their own.
        """
        rows = self.store.query("SELECT payload, created FROM daemon_actions WHERE job = ? AND "
                                "kind = 'plan' AND state = ? AND created > ? ORDER BY id",
                                (self.job, DONE, since))
        out: list[tuple[Decision, str, float]] = []
        for row in rows:
            try:
                doc = PlanRecord.from_json(rows_.loads(row["payload"], "payload"))
            except ValueError:  # unreadable: not a crash plan the ladder can climb from
                continue
            if doc.incident_kind == "crash" and not doc.follows:
                out.append((doc.plan.decision, doc.symptom, float(row["created"])))
        return out

    def unfinished(self) -> list[Action]:
        """Plans and steps written as intent and never finished (a crash or kill -9 in between)."""
        return self.actions([INTENT], damaged_too=True)

    # lease ------------------------------------------------------------------
    def acquire_lease(self, owner: str, holder: Optional[dict[str, Any]], now: float, ttl: float,
                      dead: Callable[[Optional[dict[str, Any]]], Optional[str]]) -> Lease:
        """Take the job's lease with a new generation.

        Args:
            owner: this daemon (``host:pid``).
            holder: this process's facts, recorded so a successor can prove it dead.
            now: the time now.
            ttl: seconds the lease lasts without renewal.
            dead: the recorded holder's facts → why it is provably dead, or None.

        Raises:
            RefusedError: another daemon holds an unexpired lease and is not proven dead (exit 4).
        """
        with self.store.transaction() as db:
            row = db.execute("SELECT * FROM daemon_lease WHERE job = ?", (self.job,)).fetchone()
            took_over = None
            if row is not None and row["owner"] and row["expires"] > now:
                why = dead(self.rows.obj(row["holder"], "daemon_lease", self.job, "holder")
                           if row["holder"] else None)
                if why is None:
                    raise RefusedError(
                        f"daemon: job {self.job!r} is leased by {row['owner']} for another "
                        f"{row['expires'] - now:.0f}s",
                        hint="one daemon per job; a dead holder on this host is taken over at "
                             "once, one elsewhere when daemon.lease_ttl runs out")
                took_over = f"{row['owner']}: {why}"
            generation = (int(row["generation"]) if row is not None else 0) + 1
            db.execute(
                "INSERT INTO daemon_lease(job, owner, expires, acquired, generation, holder)"
                " VALUES(?, ?, ?, ?, ?, ?) ON CONFLICT(job) DO UPDATE SET owner = excluded.owner,"
                " expires = excluded.expires, acquired = excluded.acquired,"
                " generation = excluded.generation, holder = excluded.holder",
                (self.job, owner, now + ttl, now, generation,
                 json.dumps(holder) if holder is not None else None))
        return Lease(generation, took_over)

    def renew_lease(self, generation: int, now: float, ttl: float) -> bool:
        """Extend the lease of ``generation``; False when it is no longer this job's lease."""
        with self.store.transaction() as db:
            cur = db.execute("UPDATE daemon_lease SET expires = ? WHERE job = ? AND generation = ?",
                             (now + ttl, self.job, generation))
            return cur.rowcount == 1

    def release_lease(self, generation: int) -> None:
        """Give the lease up (clean exit); the generation counter stays."""
        with self.store.transaction() as db:
            db.execute("UPDATE daemon_lease SET owner = '', expires = 0, holder = NULL "
                       "WHERE job = ? AND generation = ?", (self.job, generation))

    def lease(self) -> Optional[dict[str, Any]]:
        """``{owner, expires, acquired, generation, holder}``, or None when nobody holds it."""
        rows = self.store.query("SELECT * FROM daemon_lease WHERE job = ? AND owner != ''",
                                (self.job,))
        if not rows:
            return None
        doc = dict(rows[0])
        doc["holder"] = (self.rows.obj(doc["holder"], "daemon_lease", self.job, "holder")
                         if doc["holder"] else None)
        try:
            doc["expires"] = rows_.number(doc["expires"], "expires")
            doc["acquired"] = rows_.number(doc["acquired"], "acquired")
        except rows_.BadRow as exc:
            self.rows.damaged("daemon_lease", self.job, exc)
            return None
        return doc

    # quarantine -------------------------------------------------------------

    def release(self, node: str, at: float) -> bool:
        """Close the machine's open record; False when it had none."""
        with self.store.transaction() as db:
            cur = db.execute("UPDATE evictions SET released = ? WHERE node = ? AND released IS NULL",
                             (at, node))
            return cur.rowcount == 1

    def quarantined(self, closed_at: Optional[float] = None) -> dict[str, Eviction]:
        """Open records, any job (a bad machine is bad for every job). A damaged row is
        skipped, or with ``closed_at`` (decisions) kept as ``daemon_rows.closed`` says."""
        return {e.node: e for e in self.eviction_history(closed_at) if e.released is None}

    def eviction_history(self, closed_at: Optional[float] = None) -> list[Eviction]:
        """Every eviction record, oldest first (caps and failure-rate history); a damaged
        row as ``quarantined`` says."""
        rows = self.store.query("SELECT * FROM evictions ORDER BY at")
        return [e for r in rows if (e := self.rows.eviction(r, closed_at)) is not None]

    # standby pool -------------------------------------------------------------
    def mark_checked(self, node: str, ok: bool, detail: str, at: float,
                     outcome: Optional[StandbyOutcome] = None, generation: Optional[int] = None) -> None:
        """Record a self-check of a pool machine (``outcome``: checked | failed | untested);
        LeaseLost, nothing written, when ``generation`` no longer holds the job's lease."""
        outcome = outcome or ("checked" if ok else "failed")
        with self.store.transaction() as db:
            self._fence(db, generation)
            db.execute("INSERT INTO standby_checks(node, ok, at, detail, outcome) "
                       "VALUES(?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET ok = excluded.ok,"
                       " at = excluded.at, detail = excluded.detail, outcome = excluded.outcome",
                       (node, int(ok), at, rows_.storable(detail), outcome))

    def outcomes(self) -> dict[str, StandbyOutcome]:
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

    def set_members(self, nodes: Sequence[str], generation: Optional[int] = None) -> None:
        """Replace the job's machine list (fenced by ``generation``, None: a hand command).

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            _write_members(db, self.job, nodes)

    def swap_members(self, before: Sequence[str], after: Sequence[str], default: Sequence[str],
                     spares: Sequence[str], at: float, generation: Optional[int]) -> bool:
        """Compare-and-set the job's machines ``before`` → ``after``, fenced; the spares leave
        the checked pool in the same transaction. False when the list was neither (someone
        else changed it); True when it is ``after`` now.

        Raises:
            LeaseLost: ``generation`` no longer holds the job's lease (nothing written).
            StaleTarget: a spare was quarantined or lost its check since (nothing written).
        """
        with self.store.transaction() as db:
            self._fence(db, generation)
            rows = db.execute("SELECT node FROM job_members WHERE job = ? ORDER BY position",
                              (self.job,)).fetchall()
            now = [r["node"] for r in rows] if rows else list(default)
            if now == list(after):
                return True
            if now != list(before):
                return False
            # compare-and-set on the standbys too: still checked, not quarantined since
            _check_unquarantined(db, spares)
            ok = {r["node"] for r in db.execute("SELECT node FROM standby_checks WHERE ok = 1")}
            if unchecked := [n for n in spares if n not in ok]:
                raise StaleTarget(f"standby {', '.join(unchecked)} is no longer checked: no swap")
            _write_members(db, self.job, after)
            db.executemany(
                "INSERT INTO standby_checks(node, ok, at, detail, outcome) VALUES(?, 0, ?, ?, "
                "'failed') ON CONFLICT(node) DO UPDATE SET ok = 0, at = excluded.at,"
                " detail = excluded.detail, outcome = excluded.outcome",
                [(n, at, "in the job since a swap") for n in spares])
            return True

    # ETTR -------------------------------------------------------------------
    def add_interval(self, start: float, end: float, productive: bool,
                     generation: Optional[int] = None) -> None:
        """Record observed time; extends the previous interval when it continues it.
        LeaseLost, nothing written, when ``generation`` no longer holds the job's lease (a
        deposed daemon's time would be counted twice beside its successor's)."""
        if end <= start:
            return
        with self.store.transaction() as db:
            self._fence(db, generation)
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
    def save_status(self, doc: dict[str, Any], at: float, generation: Optional[int] = None) -> None:
        """Keep the last poll's summary for ``brctl daemon status``; LeaseLost, nothing
        written, when ``generation`` no longer holds the job's lease."""
        with self.store.transaction() as db:
            self._fence(db, generation)
            db.execute("INSERT INTO daemon_status(job, at, doc) VALUES(?, ?, ?) "
                       "ON CONFLICT(job) DO UPDATE SET at = excluded.at, doc = excluded.doc",
                       (self.job, at, json.dumps(doc, default=str)))

    def status(self) -> Optional[tuple[float, dict[str, Any]]]:
        """(when, summary) of the last poll, or None."""
        rows = self.store.query("SELECT at, doc FROM daemon_status WHERE job = ?", (self.job,))
        if not rows:
            return None
        doc = self.rows.obj(rows[0]["doc"], "daemon_status", self.job, "doc")
        try:
            at = float(rows_.number(rows[0]["at"], "at"))
        except rows_.BadRow as exc:
            self.rows.damaged("daemon_status", self.job, exc)
            return None
        return (at, doc) if doc is not None else None


def _check_unquarantined(db: sqlite3.Connection, nodes: Sequence[str]) -> None:
    if not nodes:
        return
    rows = db.execute(f"SELECT node, source, operator FROM evictions WHERE released IS NULL AND "
                      f"node IN ({','.join('?' * len(nodes))}) ORDER BY node", list(nodes))
    bad = [f"{r['node']} ({r['source']}{': ' + r['operator'] if r['operator'] else ''})"
           for r in rows]
    if bad:
        raise StaleTarget(f"{', '.join(bad)} quarantined since the plan was written")


def _write_members(db: sqlite3.Connection, job: str, nodes: Sequence[str]) -> None:
    db.execute("DELETE FROM job_members WHERE job = ?", (job,))
    db.executemany("INSERT INTO job_members(job, position, node) VALUES(?, ?, ?)",
                   [(job, i, n) for i, n in enumerate(nodes)])
