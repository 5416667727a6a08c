"""``/metrics`` counters that count (issue 35, item 9).

``brctl_daemon_actions_total`` counted rows per current state over the newest 1,000
rows: a step leaving ``intent`` made that series fall, and row 1,001 made an old
``done`` vanish, so ``increase()``/``rate()`` alerts reported actions that never
happened. Every counter is monotonic over the job's whole history (transitions into
each final state); the states in flight are a gauge.
"""

from __future__ import annotations

from pathlib import Path

from brctl.operations.daemon.metrics import DaemonView, _Collector
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store


def _scrape(state: DaemonState) -> dict[str, dict[tuple[str, ...], float]]:
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in _Collector(state, DaemonView).collect():
        for s in family.samples:
            key = tuple(v for k, v in sorted(s.labels.items()) if k != "job")
            out.setdefault(s.name, {})[key] = s.value
    return out


def _monotonic(before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]) -> None:
    for key, value in before.items():
        assert after.get(key, 0.0) >= value, (key, value, after.get(key))


def test_actions_counter_never_decreases_and_in_flight_is_a_gauge(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    state.intend("p/evict/n1", "evict", "n1", {}, "ecc", 1.0)
    first = _scrape(state)
    assert first.get("brctl_daemon_actions_in_flight", {}) == {("evict", "intent"): 1.0}
    assert ("evict", "intent") not in first.get("brctl_daemon_actions_total", {})
    state.finish("p/evict/n1", "done", 2.0)
    second = _scrape(state)
    _monotonic(first.get("brctl_daemon_actions_total", {}), second["brctl_daemon_actions_total"])
    assert second["brctl_daemon_actions_total"][("evict", "done")] == 1.0
    assert second.get("brctl_daemon_actions_in_flight", {}).get(("evict", "intent"), 0.0) == 0.0
    store.close()


def test_the_counter_spans_the_whole_history_not_the_newest_thousand_rows(tmp_path: Path) -> None:
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    with store.transaction() as db:  # 1,000 old restarts, done
        db.executemany("INSERT INTO daemon_actions(job, key, kind, node, payload, state, reason,"
                       " created, finished) VALUES('llm', ?, 'restart', NULL, '{}', 'done', '',"
                       " ?, ?)", [(f"p{i}/restart", float(i), float(i)) for i in range(1000)])
    before = _scrape(state)["brctl_daemon_actions_total"]
    assert before[("restart", "done")] == 1000.0
    for i in range(5):
        state.skip(f"q{i}/evict/n1", "evict", "n1", {}, "no standby", 2000.0 + i)
    after = _scrape(state)["brctl_daemon_actions_total"]
    _monotonic(before, after)
    assert after[("restart", "done")] == 1000.0 and after[("evict", "skipped")] == 5.0
    store.close()


def test_a_final_row_is_never_finished_again_so_its_count_holds(tmp_path: Path) -> None:
    """trust-core #12: finish() updated any row (``WHERE key = ?``): a second finish of a
    final row (done -> unknown on a later reconciliation) made ``done`` fall."""
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    state.intend("p/evict/n1", "evict", "n1", {"args": {}}, "ecc", 1.0)
    assert state.finish("p/evict/n1", "done", 2.0, "drained", {"ran": True}) is True
    before = _scrape(state)
    assert state.finish("p/evict/n1", "unknown", 3.0, "again", {"ran": False}) is False
    after = _scrape(state)
    _monotonic(before["brctl_daemon_actions_total"], after["brctl_daemon_actions_total"])
    assert after["brctl_daemon_actions_total"].get(("evict", "unknown"), 0.0) == 0.0
    rec = state.action("p/evict/n1")
    assert rec is not None and (rec.state, rec.reason, rec.payload) == ("done", "drained",
                                                                        {"ran": True})
    assert state.finish("nobody", "done", 4.0) is False
