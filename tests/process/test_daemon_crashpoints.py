"""The crash-point harness: every step kind × every boundary, a crash, a new daemon.

For each step kind a plan holds (evict, stop, restore, swap, apply, rollback,
replay, restart) and each boundary (before its intent is recorded, after the
intent and before the action, after the action and before it is marked done),
the first daemon dies right there (``Killed``: nothing after it runs, nothing is
cleaned up, its database connection is dropped). Its lease names a process that
is gone, so a new daemon takes over at once (the clock does not move) and
re-decides the plan. Then the invariants:

- no hook ran twice for one plan and step, except a step idempotent by
  construction that was interrupted after its action (it runs again and
  converges); the opaque hooks (evict_command, stop_command, restart_command)
  count themselves in a file, the scripted ones in ``Script.calls``;
- the plan ended ``done`` with the planned membership and version, or it was
  ``abandoned`` with a page (a step that cannot be checked was interrupted);
- the history is complete: every step of the plan has a final state, nothing is
  left as intent;
- the new daemon took over within its first poll.

The crash is injected by the test (a ``DaemonState`` subclass), never by a switch
in the production code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest

from brctl.analysis.daemon.plan import RESUME, STEP_KINDS, Holder
from brctl.analysis.daemon.policy import Finding
from brctl.operations.daemon.lease import this_holder
from brctl.operations.daemon.loop import Daemon
from brctl.operations.jobadapter import JobAdapter, Notifier
from brctl.operations.ledger.state import DONE, FINAL, DaemonState
from brctl.state import Store
from tests.process.test_daemon_loop import Clock, Killed, Script, inventory, tick

BOUNDARIES = ("before_intent", "after_intent", "after_action")
# the plan that holds each kind of step, and that step's id in it
WHERE = {"evict": ("gpu_fault", "evict/n3"), "stop": ("gpu_fault", "stop"),
         "restore": ("gpu_fault", "restore/s1"), "swap": ("gpu_fault", "swap"),
         "apply": ("gpu_fault", "apply"), "restart": ("gpu_fault", "restart"),
         "rollback": ("rollback", "rollback"), "replay": ("replay", "replay")}
OPAQUE = {"evict": "evict", "stop": "stop", "restart": "restart"}  # hooks.jsonl tag


class CrashingState(DaemonState):
    """Dies once at ``boundary`` of the step whose key ends with ``/<step>``."""

    def __init__(self, store: Store, job: str, step: str, boundary: str) -> None:
        super().__init__(store, job)
        self.step, self.boundary, self.fired = step, boundary, False

    def _ours(self, key: str) -> bool:
        return not self.fired and key.endswith("/" + self.step) and "/after-replay/" not in key

    def intend(self, key: str, *args: Any, **kwargs: Any) -> Any:
        if self._ours(key) and self.boundary == "before_intent":
            self.fired = True
            raise Killed()
        action = super().intend(key, *args, **kwargs)
        if self._ours(key) and self.boundary == "after_intent":
            self.fired = True
            raise Killed()
        return action

    def finish(self, key: str, state: str, *args: Any, **kwargs: Any) -> None:
        if self._ours(key) and self.boundary == "after_action" and state == DONE:
            self.fired = True
            raise Killed()
        super().finish(key, state, *args, **kwargs)


def dead_holder() -> Holder:
    """The lease holder the killed daemon leaves behind: a process that is gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = this_holder(child.pid)
    child.kill()
    child.wait()
    assert holder is not None
    return holder


def daemon(tmp_path: Path, script: Script, clock: Clock, state: DaemonState, owner: str,
           holder: Optional[Holder] = None) -> Daemon:
    inv = inventory(tmp_path, max_restarts_without_progress=5, stop=True)
    return Daemon(inv, state, script, JobAdapter(inv, 30), owner=owner, clock=clock,
                  notifier=Notifier("llm", None, inv.daemon.notify_command),
                  event_log=tmp_path / "events.jsonl", holder=holder)


def hooks_log(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "hooks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def provoke(plan: str, first: Daemon, clock: Clock, script: Script) -> None:
    """Run the first daemon into the plan (it dies somewhere inside)."""
    first.start()
    tick(first, clock, script)
    if plan == "gpu_fault":
        script.evict = {"n3": "ecc: 2 volatile uncorrectable errors"}
        tick(first, clock, script)
    else:
        script.diagnose_finding = Finding(plan, (), f"the ladder says {plan}")  # type: ignore[arg-type]
        script.running = False
        tick(first, clock, script, steps=0, dt=2)


def test_every_step_kind_is_in_the_harness() -> None:
    assert set(WHERE) == set(STEP_KINDS)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("kind", sorted(WHERE))
def test_crash_at_every_step_and_boundary(tmp_path: Path, kind: str, boundary: str) -> None:
    plan_kind, step_id = WHERE[kind]
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", step_id, boundary), "first",
                   dead_holder())
    with pytest.raises(Killed):
        provoke(plan_kind, first, clock, script)
    store.close()  # kill -9: nothing cleaned up, the lease left to a dead process

    script.evict, script.running = {}, True
    store2 = Store(tmp_path / "state")
    state = DaemonState(store2, "llm")
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()  # at once: the clock has not moved, the holder is provably dead
    took = [json.loads(line)["detail"] for line in (tmp_path / "events.jsonl").read_text()
            .splitlines() if json.loads(line)["kind"] == "daemon_start"][-1]["took_over"]
    assert took and "is gone" in took
    for _ in range(3):
        tick(second, clock, script)

    plans = [a for a in state.actions() if a.kind == "plan"]
    plan = plans[0]
    assert plan.state in (DONE, "abandoned"), plan
    # nothing left unfinished, every step of every plan has a final state
    assert state.unfinished() == []
    for p in plans:
        for step in p.payload["steps"]:
            row = state.action(f"{p.key}/{step['id']}")
            assert row is not None and row.state in FINAL, (p.key, step, row)
    # no hook ran twice for one plan and step
    opaque = Counter(e[0] for e in hooks_log(tmp_path))
    scripted = Counter(c[0] for c in script.calls if c[0] in ("restore", "apply", "rollback",
                                                               "replay"))
    interrupted_after_action = boundary == "after_action"
    for hook, count in scripted.items():
        again = RESUME[hook] == "rerun" and hook == kind and interrupted_after_action  # type: ignore[index]
        per_plan = 1 + (hook == "apply" and plan_kind == "replay")  # the follow-up plan's own
        assert count <= per_plan + again, (hook, count, script.calls)
    for hook in ("evict", "stop", "restart"):
        per_plan = 1 + (hook == "restart" and plan_kind == "replay")
        assert opaque[hook] <= per_plan, (hook, hooks_log(tmp_path))
    notes = (tmp_path / "notify.jsonl").read_text() if (tmp_path / "notify.jsonl").exists() else ""
    if RESUME[kind] == "unknown" and boundary != "before_intent":  # type: ignore[index]
        assert plan.state == "abandoned" and '"plan", "abandoned"' in notes
        assert second.halted  # a human decides what comes next
        return
    assert plan.state == DONE, (plan, [a.to_json() for a in state.actions()])
    if plan_kind == "gpu_fault":
        assert second.members() == ["n1", "n2", "s1", "n4"]
        assert list(state.quarantined()) == ["n3"]
        assert [e[:2] for e in hooks_log(tmp_path)] == [["evict", "n3"], ["stop", "n1,n2,n3,n4"],
                                                        ["restart", "n1,n2,s1,n4"]]
    if plan_kind == "rollback":
        assert script.version == "v2"  # exactly one step back, never two
        assert opaque["restart"] == 1
    if plan_kind == "replay":
        assert [a.state for a in plans] == [DONE, DONE]  # the replay and its follow-up
        assert opaque["restart"] == 1


def test_a_two_day_old_half_done_plan_is_abandoned_with_a_page(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", "restore/s1", "after_intent"),
                   "first", dead_holder())
    with pytest.raises(Killed):
        provoke("gpu_fault", first, clock, script)
    store.close()
    clock.now += 2 * 86400  # a human fixed things by hand meanwhile
    script.evict = {}
    state = DaemonState(Store(tmp_path / "state"), "llm")
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()
    plan = next(a for a in state.actions() if a.kind == "plan")
    assert plan.state == "abandoned" and "2 days" in plan.reason and "max_plan_age" in plan.reason
    assert second.members() == ["n1", "n2", "n3", "n4"]  # nothing swapped, nothing restarted
    assert [e[0] for e in hooks_log(tmp_path)] == ["evict", "stop"]
    assert not any(c[0] == "restore" for c in script.calls)  # killed before it, not run since
    assert '"plan", "abandoned"' in (tmp_path / "notify.jsonl").read_text()
    assert state.action(f"{plan.key}/restore/s1").state == "unknown"  # type: ignore[union-attr]
    assert state.action(f"{plan.key}/restart").state == "skipped"  # type: ignore[union-attr]


def test_a_plan_whose_membership_changed_is_abandoned(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", "restore/s1", "before_intent"),
                   "first", dead_holder())
    with pytest.raises(Killed):
        provoke("gpu_fault", first, clock, script)
    store.close()
    state = DaemonState(Store(tmp_path / "state"), "llm")
    state.set_members(["n1", "n2", "s2", "n4"])  # a human swapped by hand
    script.evict = {}
    second = daemon(tmp_path, script, clock, state, "second")
    second.start()
    plan = next(a for a in state.actions() if a.kind == "plan")
    assert plan.state == "abandoned" and "machines changed" in plan.reason
    assert second.members() == ["n1", "n2", "s2", "n4"]


def test_a_live_holder_is_not_taken_over(tmp_path: Path) -> None:
    from brctl.core.errors import RefusedError

    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, DaemonState(store, "llm"), "first")  # this process
    first.start()
    second = daemon(tmp_path, script, clock, DaemonState(store, "llm"), "second")
    with pytest.raises(RefusedError, match="leased by first"):
        second.start()
    clock.now += 61  # expired: a holder that stopped renewing is taken over
    second.start()
    from brctl.operations.ledger.state import LeaseLost
    with pytest.raises(LeaseLost):
        tick(first, clock, script)  # the first one finds out at its next poll


def race(tmp_path: Path, inv: Any, pair: tuple[str, str], at: float) -> list[str]:
    """Evict both machines of ``pair`` by hand at once, each over its own connection."""
    import threading

    from brctl.core.errors import RefusedError
    from brctl.operations.evict import evict
    from brctl.operations.ledger.audit import Audit

    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def one(node: str) -> None:
        store = Store(tmp_path / "state")  # a connection of its own, as a process has
        try:
            state = DaemonState(store, "llm")
            barrier.wait()
            audit = Audit.of(inv, state, tmp_path / "state", "op")
            evict(inv, node, "flaky", dry_run=False, force=False, timeout=30, audit=audit, now=at)
            outcomes.append("evicted")
        except RefusedError:
            outcomes.append("refused")
        finally:
            store.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_two_concurrent_evictions_at_the_cap_one_passes(tmp_path: Path) -> None:
    """Caps are checked and recorded in one BEGIN IMMEDIATE transaction: of two hand
    evictions racing for the last slot under the hourly cap, exactly one passes."""
    inv = inventory(tmp_path, max_evictions_per_hour=1, max_evict_fraction=1.0)
    Store(tmp_path / "state").close()
    for trial in range(5):
        pair = (f"n{1 + trial % 2}", f"n{3 + trial % 2}") if trial < 2 else ("s1", "s2")
        at = 1_000_000.0 + trial * 25 * 3600  # past both cap windows of the trial before
        outcomes = race(tmp_path, inv, pair, at)
        assert sorted(outcomes) == ["evicted", "refused"], (trial, outcomes)
        store = Store(tmp_path / "state")
        state = DaemonState(store, "llm")
        for node in list(state.quarantined()):
            state.release(node, at)
        store.close()


def test_a_daemon_that_lost_its_lease_stops_before_its_next_step_and_exits_4(
        tmp_path: Path) -> None:
    import threading

    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, DaemonState(store, "llm"), "first")
    stop = threading.Event()

    def on_poll(_: object) -> None:
        script.step += 1
        if first.report.iterations == 1:  # another daemon takes over (say, after a long pause)
            clock.now += 3600
            daemon(tmp_path, script, clock, DaemonState(store, "llm"), "second").start()
            script.evict = {"n2": "ecc"}  # an incident the first daemon must not act on

    report = first.run(stop=stop, on_poll=on_poll, max_iterations=5)
    assert report.lease_lost and "lost the lease" in report.lease_lost
    assert int(report.exit_code) == 4 and report.stopped_by == "lease-lost"
    assert hooks_log(tmp_path) == [] and report.iterations == 1
    lease = DaemonState(store, "llm").lease()
    assert lease is not None and lease["owner"] == "second"  # not released by the loser


class IntentLog(DaemonState):
    """Records every key written as intent."""

    def __init__(self, store: Store, job: str) -> None:
        super().__init__(store, job)
        self.intents: list[str] = []

    def intend(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.intents.append(key)
        return super().intend(key, *args, **kwargs)


def test_a_step_that_will_not_run_is_written_skipped_in_one_transaction(tmp_path: Path) -> None:
    """A plan stopped short records the rest as skipped without an intent first: a kill
    between the two used to leave a restart that never ran looking begun (unknown)."""
    from brctl.core.errors import BrctlError

    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    state = IntentLog(store, "llm")

    def failing(*_a: Any) -> str:
        raise BrctlError("ckpt restore n3 -> s1: no space left on device")

    script.restore = failing  # type: ignore[method-assign]
    first = daemon(tmp_path, script, clock, state, "first")
    provoke("gpu_fault", first, clock, script)
    plan = next(a for a in state.actions() if a.kind == "plan")
    assert plan.state == "failed"
    for step in ("swap", "apply", "restart"):
        row = state.action(f"{plan.key}/{step}")
        assert row is not None and row.state == "skipped" and "not run" in row.reason, row
        assert f"{plan.key}/{step}" not in state.intents
    # skip() of a step written as intent (its action never began) ends it; a final one stays
    state.intend("llm/x/a", "swap", None, {}, "r", 1.0)
    state.skip("llm/x/a", "swap", None, {}, "not run: stale", 2.0)
    state.skip(f"{plan.key}/evict/n3", "evict", "n3", {}, "not run", 2.0)
    assert state.action("llm/x/a").state == "skipped"  # type: ignore[union-attr]
    assert state.action(f"{plan.key}/evict/n3").state == DONE  # type: ignore[union-attr]
    store.close()
