"""Compare-and-set on a plan's targets: a hand eviction after the plan was written wins.

A plan fixes its standbys and its restart's machine list when it is written; a
``brctl evict`` issued while it runs (a restore or a code switch takes minutes)
must not be overridden: the swap refuses a standby quarantined (or no longer
checked) since, and the restart's intent refuses a machine quarantined since, in the
transaction that writes it. The plan is abandoned and a human paged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from brctl.analysis.daemon.plan import PlanRecord, resume_refusal
from brctl.analysis.daemon.policy import Plan
from brctl.core.transport import Node
from brctl.operations.evict import evict
from brctl.operations.ledger.audit import Audit
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store
from tests.process.test_daemon_loop import Clock, Script, hooks_log, inventory, make, tick


def hand_evict(tmp_path: Path, node: str, at: float) -> None:
    """``brctl evict NODE --force`` from another process (its own connection)."""
    inv = inventory(tmp_path)
    store = Store(tmp_path / "state")
    try:
        audit = Audit.of(inv, DaemonState(store, "llm"), tmp_path / "state", "alice")
        evict(inv, node, "flaky, by hand", dry_run=False, force=True, timeout=30, audit=audit,
              now=at)
    finally:
        store.close()


def abandoned(store: Store) -> str:
    plan = [a for a in DaemonState(store, "llm").actions() if a.kind == "plan"][-1]
    assert plan.state == "abandoned", plan
    return plan.reason


def test_a_standby_evicted_by_hand_between_admit_and_swap_is_not_swapped_in(
        tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    restore = script.restore

    def restore_meanwhile_evicted(evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        hand_evict(tmp_path, standby.name, clock.now)  # s1 looked bad to a human
        return restore(evicted, standby, members)

    script.restore = restore_meanwhile_evicted  # type: ignore[method-assign]
    daemon.start()
    tick(daemon, clock, script)
    script.evict = {"n3": "ecc: 2 volatile uncorrectable errors"}
    tick(daemon, clock, script)
    why = abandoned(store)
    assert "s1" in why and "quarantined" in why
    assert daemon.members() == ["n1", "n2", "n3", "n4"]  # s1 never joined the job
    assert [e[:2] for e in hooks_log(tmp_path)] == [["evict", "n3"], ["evict", "s1"]]  # no restart
    assert '"plan", "abandoned"' in (tmp_path / "notify.jsonl").read_text()
    assert daemon.halted
    store.close()


def test_a_job_machine_evicted_by_hand_while_a_reattempt_runs_is_not_restarted_on(
        tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    apply = script.apply_updates

    def apply_meanwhile_evicted(nodes: Sequence[Node], version: str, sha256: str) -> str:
        hand_evict(tmp_path, "n2", clock.now)
        return apply(nodes, version, sha256)

    script.apply_updates = apply_meanwhile_evicted  # type: ignore[method-assign]
    daemon.start()
    tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # a crash: reattempt (apply, restart)
    assert daemon.report.handled[-1].plan.decision == "reattempt"  # type: ignore[union-attr]
    why = abandoned(store)
    assert "step restart" in why and "n2 (hand: alice)" in why
    assert [e[0] for e in hooks_log(tmp_path)] == ["evict"]  # the hand one; no restart
    plan = [a for a in DaemonState(store, "llm").actions() if a.kind == "plan"][-1]
    assert DaemonState(store, "llm").action(f"{plan.key}/restart").state == "skipped"  # type: ignore[union-attr]
    store.close()


def test_resuming_refuses_a_plan_whose_standby_was_quarantined_since() -> None:
    doc = PlanRecord(Plan("evict", ("n3",), "n3: ecc", restart=True), (),
                     ("n1", "n2", "n3", "n4"), {"n3": "s1"})
    common = dict(written=0.0, now=1.0, max_age=600.0, members=["n1", "n2", "n3", "n4"],
                  swapped=False, restart_pending=True, restarts_without_progress=0,
                  max_restarts=3)
    assert resume_refusal(doc, quarantined=["n3"], **common) is None  # type: ignore[arg-type]
    why = resume_refusal(doc, quarantined=["n3", "s1"], **common)  # type: ignore[arg-type]
    assert why is not None and "standby s1" in why


class Killed(BaseException):
    """kill -9 of the brctl evict process."""


def killed_hand_evict(tmp_path: Path, node: str, at: float, monkeypatch: Any) -> None:
    """``brctl evict NODE`` killed after its record, before the scheduler is told."""
    from brctl.operations.jobadapter import JobAdapter

    def killed(*_a: Any, **_k: Any) -> None:
        raise Killed()

    with monkeypatch.context() as m:
        m.setattr(JobAdapter, "evict", killed)
        try:
            hand_evict(tmp_path, node, at)
        except Killed:
            return
    raise AssertionError("the evict was not killed")


def hand_action(store: Store) -> Any:
    return next(a for a in DaemonState(store, "llm").actions() if "/hand-evict/" in a.key)


def test_a_killed_hand_eviction_with_an_opaque_hook_is_flagged_and_paged(
        tmp_path: Path, monkeypatch: Any) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    tick(daemon, clock, script)
    killed_hand_evict(tmp_path, "s2", clock.now, monkeypatch)
    assert hand_action(store).state == "intent"
    tick(daemon, clock, script)  # younger than its hook's timeout: maybe still running
    assert hand_action(store).state == "intent"
    tick(daemon, clock, script, dt=100)
    rec = hand_action(store)
    assert rec.state == "unknown" and "tell it by hand" in rec.reason and "alice" in rec.reason
    assert hooks_log(tmp_path) == []  # an opaque evict_command is never run twice
    assert '"evict", "unknown", "s2"' in (tmp_path / "notify.jsonl").read_text()
    tick(daemon, clock, script, dt=100)
    finished = [e["detail"]["state"] for e in DaemonState(store, "llm").events(500)
                if e["kind"] == "hand_evict_finished"]
    assert finished == ["unknown"]  # once: a later poll leaves it be
    store.close()


def test_a_killed_hand_eviction_is_drained_where_the_scheduler_shows_it(
        tmp_path: Path, monkeypatch: Any) -> None:
    from brctl.analysis.inventory import Inventory
    from brctl.operations.daemon.loop import Daemon
    from brctl.operations.jobadapter import JobAdapter

    drained: set[str] = set()

    class Drains(JobAdapter):  # what Slurm's built-in hooks read back
        def __init__(self, inv: Inventory) -> None:
            super().__init__(inv, 30)

        def evicted(self, node: str) -> bool:
            return node in drained

        def evict(self, members: Sequence[str], node: str, reason: str) -> Any:
            drained.add(node)
            return super().evict(members, node, reason)

    script, clock = Script(), Clock()
    inv = inventory(tmp_path)
    store = Store(tmp_path / "state")
    daemon = Daemon(inv, DaemonState(store, "llm"), script, Drains(inv), owner="me", clock=clock)
    daemon.start()
    tick(daemon, clock, script)
    killed_hand_evict(tmp_path, "s2", clock.now, monkeypatch)
    tick(daemon, clock, script, dt=100)
    tick(daemon, clock, script)
    assert hand_action(store).state == "done" and drained == {"s2"}
    assert [e[:2] for e in hooks_log(tmp_path)] == [["evict", "s2"]]  # once, by the daemon
    store.close()


def test_a_hand_eviction_with_no_daemon_says_what_remains(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    store = Store(tmp_path / "state")
    try:
        audit = Audit.of(inv, DaemonState(store, "llm"), tmp_path / "state", "alice")
        report = evict(inv, "n2", "flaky", dry_run=False, force=False, timeout=30, audit=audit,
                       now=1_000_000.0)
    finally:
        store.close()
    (n2,) = report.machines
    assert n2.remains is not None and "no daemon holds the job's lease" in n2.remains
    assert "brctl daemon run" in n2.remains
