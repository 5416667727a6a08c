"""The lease while a daemon starts: heartbeat and fencing cover resuming a plan.

A daemon that starts resumes unfinished plans (a restore of any length) and self-checks
the standby pool (minutes) before its first poll. The heartbeat renews the lease
through that, and a lease lost meanwhile ends the run like one lost later (a
``lease_lost`` event, exit 4). Plus ``holder_dead``'s cases: who may be taken over.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from brctl.analysis.daemon.plan import Holder, holder_dead
from brctl.core.errors import RefusedError
from brctl.core.transport import Node
from brctl.operations.daemon.loop import Daemon
from brctl.operations.jobadapter import JobAdapter, Notifier
from brctl.operations.ledger.state import DONE, DaemonState
from brctl.state import Store
from tests.kits.waiting import wait_for
from tests.process.test_daemon_crashpoints import CrashingState, dead_holder, provoke
from tests.process.test_daemon_loop import Clock, Killed, Script, hooks_log, inventory, tick

TTL = 1.0  # seconds of wall time per lease (a heartbeat every TTL / 4)


def daemon(tmp_path: Path, script: Script, clock: Clock, state: DaemonState, owner: str,
           holder: Optional[Holder] = None, **kw: Any) -> Daemon:
    inv = inventory(tmp_path, lease_ttl=TTL, max_restarts_without_progress=5)
    return Daemon(inv, state, script, JobAdapter(inv, 30), owner=owner, clock=clock,
                  notifier=Notifier("llm", None, inv.daemon.notify_command),
                  event_log=tmp_path / "events.jsonl", holder=holder, **kw)


def killed_before_restore(tmp_path: Path, script: Script, clock: Clock) -> None:
    """A first daemon dies (kill -9) after evicting n3, before its restore onto s1."""
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", "restore/s1",
                                                          "before_intent"), "first", dead_holder())
    with pytest.raises(Killed):
        provoke("gpu_fault", first, clock, script)
    store.close()
    script.evict = {}


def events(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def test_the_heartbeat_renews_the_lease_while_a_resumed_plan_runs(tmp_path: Path) -> None:
    """The restore of the resumed plan takes 5 TTLs: the lease is renewed meanwhile, so a
    daemon started then is refused and the restore runs once."""
    script, clock = Script(), Clock()
    killed_before_restore(tmp_path, script, clock)
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    intruder: list[str] = []

    def slow_restore(evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        script.calls.append(("restore", (evicted.name, standby.name)))
        clock.now += 5 * TTL  # far past the TTL the lease was taken with
        # a beat or two of the heartbeat renews it past the clock's new now
        wait_for(lambda: (lease := state.lease()) is not None and lease["expires"] > clock.now,
                 "the heartbeat to renew the lease", every=TTL / 10)
        other = daemon(tmp_path, Script(), clock, DaemonState(Store(tmp_path / "state"), "llm"),
                       "intruder", dead=lambda _holder: None)  # alive, as far as it can tell
        try:
            other.start()
            intruder.append("took over")
        except RefusedError as exc:
            intruder.append(exc.message)
        return "restored"

    script.restore = slow_restore  # type: ignore[method-assign]
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()
    assert len(intruder) == 1 and "leased by second" in intruder[0], intruder
    assert [c for c in script.calls if c[0] == "restore"] == [("restore", ("n3", "s1"))]
    plan = next(a for a in state.actions() if a.kind == "plan")
    assert plan.state == DONE and second.members() == ["n1", "n2", "s1", "n4"]
    assert [e[:2] for e in hooks_log(tmp_path)] == [["evict", "n3"], ["restart", "n1,n2,s1,n4"]]
    assert second.heartbeat is not None
    second.heartbeat.stop()
    store.close()


def test_a_lease_lost_while_resuming_is_a_lease_lost_exit_4(tmp_path: Path) -> None:
    """Another daemon takes the lease over while the resumed plan's restore runs: the
    run stops before the next step with a lease_lost event and exit 4, not an escape."""
    script, clock = Script(), Clock()
    killed_before_restore(tmp_path, script, clock)
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")

    def restore_then_lose(evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        script.calls.append(("restore", (evicted.name, standby.name)))
        state.acquire_lease("thief", None, clock.now, TTL, lambda _holder: "presumed dead")
        return "restored"

    script.restore = restore_then_lose  # type: ignore[method-assign]
    second = daemon(tmp_path, script, clock, state, "second")
    report = second.run(stop=threading.Event(), max_iterations=3)
    assert report.lease_lost and "thief" in report.lease_lost
    assert int(report.exit_code) == 4 and report.stopped_by == "lease-lost"
    assert report.iterations == 0  # it never polled
    assert "lease_lost" in [e["kind"] for e in events(tmp_path)]
    assert [e[:2] for e in hooks_log(tmp_path)] == [["evict", "n3"]]  # no swap, no restart
    lease = state.lease()
    assert lease is not None and lease["owner"] == "thief"  # not released by the loser
    store.close()


def test_a_refused_start_under_run_records_nothing_and_releases_nothing(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    live = daemon(tmp_path, script, clock, DaemonState(store, "llm"), "live")
    live.start()
    other = daemon(tmp_path, script, clock, DaemonState(store, "llm"), "other",
                   dead=lambda _holder: None)
    with pytest.raises(RefusedError, match="leased by live"):
        other.run(stop=threading.Event(), max_iterations=1)
    lease = DaemonState(store, "llm").lease()
    assert lease is not None and lease["owner"] == "live"
    assert "daemon_stop" not in [e["kind"] for e in events(tmp_path)]
    assert live.heartbeat is not None
    live.heartbeat.stop()
    store.close()


HERE = Holder("ctl1", "boot-a", 4026531836, 100, 5000)


@pytest.mark.parametrize(("holder", "start_now", "dead"), [
    (HERE, 5000, None),  # the very process, still running
    (HERE, None, "is gone"),  # its pid is free
    (HERE, 7000, "another process"),  # pid reused: another start time
    (Holder("ctl1", "boot-b", 4026531836, 100, 5000), 5000, "rebooted"),  # another boot id
    (Holder("ctl1", "boot-a", 4026532999, 100, 5000), None, None),  # another PID namespace
    (Holder("ctl2", "boot-a", 4026531836, 100, 5000), None, None),  # another host
    (None, None, None),  # nothing recorded: nothing proven
])
def test_holder_dead(holder: Optional[Holder], start_now: Optional[int],
                     dead: Optional[str]) -> None:
    why = holder_dead(holder, HERE, start_now)
    assert (why is None) == (dead is None) and (dead is None or dead in (why or "")), why


def test_a_membership_write_of_a_lost_generation_is_refused(tmp_path: Path) -> None:
    from brctl.operations.ledger.state import LeaseLost

    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    old = state.acquire_lease("first", None, 0.0, TTL, lambda _h: None).generation
    state.acquire_lease("second", None, 10.0, TTL, lambda _h: None)  # expired: taken over
    with pytest.raises(LeaseLost, match="second"):
        state.set_members(["n1", "s1", "n3", "n4"], old)
    assert state.members(["n1", "n2", "n3", "n4"]) == ["n1", "n2", "n3", "n4"]
    store.close()


def test_a_full_disk_under_the_event_log_does_not_stop_a_plan(tmp_path: Path,
                                                              capsys: Any) -> None:
    """The event log cannot be appended to (here: its path is a directory, as ENOSPC
    would fail it): the database keeps the events and the plan runs to its end."""
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    inv = inventory(tmp_path)
    (tmp_path / "events-dir").mkdir()
    live = Daemon(inv, DaemonState(store, "llm"), script, JobAdapter(inv, 30), owner="me",
                  clock=clock, event_log=tmp_path / "events-dir")
    live.start()
    tick(live, clock, script)
    script.evict = {"n3": "ecc"}
    tick(live, clock, script)
    assert live.members() == ["n1", "n2", "s1", "n4"]
    assert [e[0] for e in hooks_log(tmp_path)] == ["evict", "restart"]
    assert "event log" in capsys.readouterr().err
    assert live.heartbeat is not None
    live.heartbeat.stop()
    store.close()


def test_a_standby_check_that_outlasts_the_lease_marks_nothing(tmp_path: Path) -> None:
    """The pool's self-check at start-up takes minutes (dcgmi diag): a daemon that lost
    its lease meanwhile records none of its verdicts and ends with lease_lost, exit 4."""
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    check = script.check

    def check_then_lose(nodes: Sequence[Node]) -> dict[str, tuple[str, str]]:
        state.acquire_lease("thief", None, clock.now, TTL, lambda _holder: "presumed dead")
        return check(nodes)

    script.check = check_then_lose  # type: ignore[method-assign]
    first = daemon(tmp_path, script, clock, state, "first")
    report = first.run(stop=threading.Event(), max_iterations=1)
    assert report.lease_lost and int(report.exit_code) == 4
    assert state.checks() == {}
    store.close()


def test_a_poll_that_outlasts_the_lease_records_no_time_and_no_status(tmp_path: Path) -> None:
    """A poll's health sweep and log tails take their time: a daemon deposed meanwhile
    records neither its ETTR interval (the successor counts that time: it would count
    twice) nor its status summary (``brctl daemon status`` would show the wrong daemon)."""
    from brctl.operations.ledger.state import LeaseLost

    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    first = daemon(tmp_path, script, clock, state, "first")
    first.start()
    tick(first, clock, script)
    intervals, status = state.intervals(), state.status()
    health = script.health

    def health_then_lose(nodes: Sequence[Node]) -> Any:
        state.acquire_lease("thief", None, clock.now, TTL, lambda _holder: "presumed dead")
        return health(nodes)

    script.health = health_then_lose  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match="thief"):
        tick(first, clock, script)
    assert state.intervals() == intervals and state.status() == status
    assert first.heartbeat is not None
    first.heartbeat.stop()
    store.close()
