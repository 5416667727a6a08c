"""``brctl update``'s tables: releases pushed, each job's version and pending release,
and the history of every push, apply and rollback."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Optional

from brctl.analysis.daemon.plan import Release
from brctl.analysis.update import Event, Pending, rollback_target
from brctl.core.errors import InputError
from brctl.state import Component, Store

COMPONENT = Component("update", [
    """
    CREATE TABLE update_releases (
        version TEXT PRIMARY KEY, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
        source TEXT NOT NULL, pushed_at REAL NOT NULL, pushed_by TEXT NOT NULL);
    CREATE TABLE update_jobs (
        job TEXT PRIMARY KEY, version TEXT, sha256 TEXT,
        pending_version TEXT, pending_sha256 TEXT, pending_since REAL,
        pending_window_s REAL, pending_urgent INTEGER NOT NULL DEFAULT 0);
    CREATE TABLE update_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, at REAL NOT NULL,
        who TEXT NOT NULL, action TEXT NOT NULL, version TEXT NOT NULL,
        sha256 TEXT NOT NULL, from_version TEXT, machines TEXT NOT NULL,
        outcome TEXT NOT NULL, detail TEXT NOT NULL);
    CREATE INDEX update_events_job ON update_events(job, id)
    """,
])


@dataclass(frozen=True)
class JobState:
    """The job's recorded version and pending release."""

    version: Optional[str]
    sha256: Optional[str]
    pending: Optional[Pending]


def job_state(store: Store, job: str) -> JobState:
    """The job's row (empty when it never had an update)."""
    rows = store.query("SELECT * FROM update_jobs WHERE job = ?", (job,))
    if not rows:
        return JobState(None, None, None)
    r = rows[0]
    pending = None
    if r["pending_version"] is not None:
        pending = Pending(r["pending_version"], r["pending_sha256"], r["pending_since"],
                          r["pending_window_s"], bool(r["pending_urgent"]))
    return JobState(r["version"], r["sha256"], pending)


def save_job(store: Store, job: str, state: JobState) -> None:
    """Record the job's version and pending release."""
    with store.transaction() as db:
        write_job(db, job, state)


def write_job(db: sqlite3.Connection, job: str, state: JobState) -> None:
    """Record the job's version and pending release inside the caller's transaction (the
    history row of the switch goes in the same one)."""
    p = state.pending
    db.execute(
        "INSERT INTO update_jobs(job, version, sha256, pending_version, pending_sha256,"
        " pending_since, pending_window_s, pending_urgent) VALUES (?,?,?,?,?,?,?,?)"
        " ON CONFLICT(job) DO UPDATE SET version=excluded.version, sha256=excluded.sha256,"
        " pending_version=excluded.pending_version, pending_sha256=excluded.pending_sha256,"
        " pending_since=excluded.pending_since, pending_window_s=excluded.pending_window_s,"
        " pending_urgent=excluded.pending_urgent",
        (job, state.version, state.sha256, p.version if p else None, p.sha256 if p else None,
         p.since if p else None, p.window_s if p else None, int(p.urgent) if p else 0))


def history(store: Store, job: str, limit: Optional[int] = None) -> list[Event]:
    """The job's push/apply/rollback events, oldest first (the last ``limit`` of them)."""
    store.migrate(COMPONENT)
    sql = "SELECT * FROM update_events WHERE job = ? ORDER BY id DESC"
    params: list[object] = [job]
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = store.query(sql, params)
    return [Event(r["id"], r["at"], r["who"], r["action"], r["version"], r["sha256"],
                  r["from_version"], tuple(json.loads(r["machines"])), r["outcome"],
                  json.loads(r["detail"])) for r in reversed(rows)]


def pushed_release(store: Store, version: str) -> tuple[str, str]:
    """(sha256, source) of a pushed release."""
    rows = store.query("SELECT sha256, source FROM update_releases WHERE version = ?", (version,))
    if not rows:
        raise InputError(f"release {version!r} was never pushed here",
                         hint="brctl update history lists the releases")
    return rows[0]["sha256"], rows[0]["source"]


def release_sha256(store: Store, version: str) -> Optional[str]:
    """The sha256 of a pushed release, or None when ``version`` was never pushed here."""
    store.migrate(COMPONENT)
    rows = store.query("SELECT sha256 FROM update_releases WHERE version = ?", (version,))
    return str(rows[0]["sha256"]) if rows else None


def release_targets(store: Store, job: str) -> Release:
    """The job's release now, as the daemon fixes a plan's targets: its recorded version
    (and sha256), the pending release, and the (version, sha256) a rollback goes back to."""
    store.migrate(COMPONENT)
    state = job_state(store, job)
    target = rollback_target(history(store, job), state.version)
    sha = release_sha256(store, target) if target is not None else None
    return Release(
        state.version,
        (state.pending.version, state.pending.sha256) if state.pending is not None else None,
        (state.version, state.sha256) if state.version and state.sha256 else None,
        (target, sha) if target is not None and sha is not None else None)
