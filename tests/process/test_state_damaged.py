"""A damaged state database (issue 35, item 8): never exit 70, never a crash loop.

Rows are untrusted: one that does not decode is named (table, key) and skipped by
the reporting commands (exit 3), and the daemon abandons that plan with a page; a
``sqlite3.DatabaseError`` (a damaged page) is exit 2 naming the database and how to
recover, which the shipped unit does not restart on.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from brctl.operations.ledger.state import DaemonState
from brctl.state import DB_NAME, Store
from tests.process.test_daemon_cli import write_inv
from tests.process.test_daemon_crashpoints import CrashingState, daemon, dead_holder, provoke
from tests.process.test_daemon_loop import Clock, Killed, Script


def _records(state_dir: Path) -> None:
    store = Store(state_dir)
    state = DaemonState(store, "llm")
    state.add_interval(0, 3000, True)
    state.add_interval(3000, 3600, False)
    state.event("gpu_fault", ["n3"], {"reason": "ecc"}, 3000)
    state.event("decision", ["n3"], {"reason": "evict n3"}, 3010)
    state.intend("plan-1", "plan", None, {"plan": {}}, "evict n3", 3010)
    state.intend("plan-1/evict/n3", "evict", "n3", {"args": {}}, "evict n3", 3020)
    store.close()


def _damage_rows(state_dir: Path) -> None:
    db = sqlite3.connect(state_dir / DB_NAME)
    db.execute("UPDATE daemon_actions SET payload = 'not json{' WHERE key = 'plan-1/evict/n3'")
    db.execute("UPDATE daemon_events SET detail = '[1, 2]' WHERE kind = 'decision'")
    db.execute("UPDATE daemon_status SET doc = 'x'")
    db.commit()
    db.close()


@pytest.mark.parametrize("command", [["daemon", "status"], ["ettr"], ["report", "-o", "r.html"]])
def test_rows_that_do_not_decode_are_named_and_skipped_exit_3(
        brctl: Any, tmp_path: Path, state_dir: Path, command: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    inv = write_inv(tmp_path)
    _records(state_dir)
    _damage_rows(state_dir)
    res = brctl("-i", inv, *command)
    assert res.exit_code == 3, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert "skipped daemon_events row id 2: detail is a JSON list, not an object" in res.stderr
    if command != ["ettr"]:  # ettr reads no action payload
        assert "daemon_actions row plan-1/evict/n3: payload is not JSON" in res.stderr
    doc = brctl("-i", inv, "--json", *command)
    assert doc.exit_code == 3 and {(d["table"], d["key"]) for d in doc.json["skipped_rows"]} >= {
        ("daemon_events", "id 2")}


def test_a_good_database_skips_nothing(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    _records(state_dir)
    res = brctl("-i", inv, "--json", "ettr")
    assert res.exit_code == 0 and res.json["skipped_rows"] == []


def _damage_page(state_dir: Path, table: str) -> None:
    """Overwrite the first page of ``table``'s b-tree: 'database disk image is malformed'."""
    db = sqlite3.connect(state_dir / DB_NAME)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(state_dir / DB_NAME, "r+b") as fh:
        fh.seek((root - 1) * size)
        fh.write(b"\xa5" * size)


@pytest.mark.parametrize("command", [["daemon", "status"], ["ettr"],
                                     ["daemon", "run", "--dry-run", "--max-iterations", "1"]])
def test_a_damaged_page_is_exit_2_naming_the_database_and_the_way_out(
        brctl: Any, tmp_path: Path, state_dir: Path, command: list[str]) -> None:
    inv = write_inv(tmp_path)
    _records(state_dir)
    _damage_page(state_dir, "daemon_events")
    res = brctl("-i", inv, *command)
    assert res.exit_code == 2, res.stdout + res.stderr
    assert f"state database {state_dir / DB_NAME}: database disk image is malformed" in res.stderr
    assert "move it aside" in res.stderr and "Traceback" not in res.stderr


def test_a_file_that_is_not_a_database_says_how_to_recover(
        brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    state_dir.mkdir(mode=0o700)
    (state_dir / DB_NAME).write_bytes(b"\x00garbage" * 1000)
    res = brctl("-i", inv, "daemon", "status")
    assert res.exit_code == 2 and "move it aside" in res.stderr and "Traceback" not in res.stderr


def test_the_daemon_abandons_a_plan_whose_record_does_not_decode_and_pages(
        tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", "restore/s1",
                                                          "after_intent"), "first", dead_holder())
    with pytest.raises(Killed):
        provoke("gpu_fault", first, clock, script)
    store.close()
    db = sqlite3.connect(tmp_path / "state" / DB_NAME)
    (key,) = db.execute("SELECT key FROM daemon_actions WHERE kind = 'plan'").fetchone()
    db.execute("UPDATE daemon_actions SET payload = '[' WHERE key = ?", (key,))
    db.commit()
    db.close()
    script.evict = {}
    state = DaemonState(Store(tmp_path / "state"), "llm")
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()  # today: json.JSONDecodeError, exit 70 at every restart
    plan = state.action(key)
    assert plan is not None and plan.state == "abandoned"
    assert f"daemon_actions row {key}: payload is not JSON" in plan.reason
    assert '"plan", "abandoned"' in (tmp_path / "notify.jsonl").read_text()
    assert state.action(f"{key}/restore/s1").state == "unknown"  # type: ignore[union-attr]
    assert not any(c[0] == "restore" for c in script.calls)


def test_a_database_locked_past_the_busy_timeout_is_exit_3_not_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock held past the busy timeout (an operator's sqlite3 shell, a long cron write)
    is retryable: exit 3, which the unit restarts on, never exit 2, which would stop the
    daemon for good (a damaged page stays exit 2: the tests above)."""
    from brctl.core.errors import ExitCode
    from brctl.state import StateBusy

    monkeypatch.setattr("brctl.state._BUSY_TIMEOUT_MS", 50)
    store = Store(tmp_path)
    holder = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        with pytest.raises(StateBusy) as raised, store.transaction() as db:
            db.execute("CREATE TABLE t (x)")
        assert raised.value.code == ExitCode.INCOMPLETE
        assert str(tmp_path / DB_NAME) in str(raised.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()


def _quarantine_n3(state_dir: Path, damage: str) -> DaemonState:
    store = Store(state_dir)
    state = DaemonState(store, "llm")
    assert state.admit("plan-q", {}, "ecc", 1000.0, evict=["n3"], source="daemon",
                       operator=None, caps=lambda times: None) is None
    db = sqlite3.connect(state_dir / DB_NAME)
    db.execute(f"UPDATE evictions SET {damage} WHERE node = 'n3'")
    db.commit()
    db.close()
    return state


@pytest.mark.parametrize("damage", ["reason = x'00ff'", "at = 'yesterday'", "source = x'01'", "released = 'later'"])
def test_a_damaged_quarantine_row_keeps_the_machine_quarantined_for_decisions(
        state_dir: Path, damage: str) -> None:
    """trust-core #13: a quarantine row that did not decode made the machine look healthy
    (the standby pool could take it back); the daemon's decisions fail closed."""
    state = _quarantine_n3(state_dir, damage)
    assert "n3" in state.quarantined(closed_at=2000.0)
    assert [e.node for e in state.eviction_history(closed_at=2000.0)] == ["n3"]
    assert state.quarantined() == {}  # a report skips it and names it
    assert [(d.table, d.key) for d in state.skipped()] == [("evictions", "n3")]


def test_a_damaged_eviction_row_counts_in_the_caps_at_the_newest_time(state_dir: Path) -> None:
    """An ``at`` that does not read was a crash (float('yesterday')) in admit, and was left
    out of the caps by the history; it counts at the newest it can be: now."""
    state = _quarantine_n3(state_dir, "at = 'yesterday'")
    seen: list[list[float]] = []

    def caps(times: list[float]) -> str | None:
        seen.append(times)
        return "at most 1 eviction per hour" if [t for t in times if t > 5000 - 3600] else None
    why = state.admit("plan-2", {}, "ecc", 5000.0, evict=["n4"], source="daemon",
                      operator=None, caps=caps)
    assert why == "at most 1 eviction per hour" and seen == [[5000.0]]
    assert "n4" not in state.quarantined(closed_at=5000.0)
    assert [e.at for e in state.eviction_history(closed_at=5000.0)] == [5000.0]
