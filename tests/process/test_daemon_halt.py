"""A halt outlives the daemon: an abandoned plan's incident is a human's until they re-arm.

A plan abandoned because its restart may have run (kill -9 mid-hook) halts the
daemon. systemd restarts a daemon after kill -9 or an OOM kill; that restart is
no human decision, so the new daemon starts halted: the job, still down, is not
planned again and no stop or restart hook runs, until ``brctl daemon rearm``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from brctl.operations.daemon.loop import status
from brctl.operations.evict import rearm
from brctl.operations.ledger.audit import Audit
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store
from tests.process.test_daemon_crashpoints import CrashingState, daemon, dead_holder, provoke
from tests.process.test_daemon_loop import Clock, Killed, Script, inventory, tick


def opaque(tmp_path: Path) -> list[str]:
    path = tmp_path / "hooks.jsonl"
    return [json.loads(line)[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_an_abandoned_plans_halt_survives_two_restarts_until_rearm(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    store = Store(tmp_path / "state")
    first = daemon(tmp_path, script, clock, CrashingState(store, "llm", "restart", "after_intent"),
                   "first", dead_holder())
    with pytest.raises(Killed):  # kill -9 as restart_command begins
        provoke("gpu_fault", first, clock, script)
    store.close()
    script.evict, script.running = {}, False  # the restart never happened: the job is down
    before = opaque(tmp_path)
    assert before == ["evict", "stop"]

    store2 = Store(tmp_path / "state")
    second = daemon(tmp_path, script, clock, DaemonState(store2, "llm"), "second", dead_holder())
    second.start()  # the restart may have run: abandoned, halted, paged
    assert second.halted and "abandoned" in second.halted
    tick(second, clock, script, steps=0, dt=2)  # the job is down: refused, no hook
    store2.close()  # kill -9 again (an OOM kill): systemd restarts it

    store3 = Store(tmp_path / "state")
    third = daemon(tmp_path, script, clock, DaemonState(store3, "llm"), "third")
    third.start()
    assert third.halted and "abandoned" in third.halted  # read back, not forgotten
    for _ in range(3):
        tick(third, clock, script, steps=0, dt=2)
    assert opaque(tmp_path) == before  # no stop, no restart behind the human's back
    report = status(inventory(tmp_path), tmp_path / "state")
    assert "abandoned" in str(report.summary["halted"])

    # the human dealt with it and lifts the halt: the daemon acts again at its next poll
    inv = inventory(tmp_path, max_restarts_without_progress=5, stop=True)
    state = DaemonState(store3, "llm")
    lifted = rearm(Audit.of(inv, state, tmp_path / "state", "alice"), "restarted it by hand",
                   now=clock.now)
    assert lifted.was and "abandoned" in lifted.was
    assert state.halt() is None
    tick(third, clock, script, steps=0, dt=2)
    assert third.halted is None and opaque(tmp_path)[len(before):] == ["stop", "restart"]
    rearmed = [e for e in state.events(500) if e["kind"] == "rearmed"]
    assert rearmed[0]["detail"]["operator"] == "alice"
    assert rearm(Audit.of(inv, state, tmp_path / "state", "bob"), "again").was is None
    store3.close()


def test_daemon_rearm_through_the_cli(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    import yaml

    inv = inventory(tmp_path)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 2}],
        "job": {"name": "llm", "nodes": "n[1-4]"}, "daemon": {"metrics_port": 0}}))
    assert inv.job is not None
    store = Store(state_dir)
    DaemonState(store, "llm").event("halted", [], {"why": "a plan was abandoned: x"}, 1.0)
    store.close()
    res = brctl("-i", path, "--json", "daemon", "rearm", "--reason", "fixed", "--by", "carol")
    assert res.exit_code == 0, res.stderr
    assert res.json["rearmed"] and res.json["was"] == "a plan was abandoned: x"
    assert res.json["operator"] == "carol"
    again = brctl("-i", path, "daemon", "rearm", "--reason", "fixed")
    assert again.exit_code == 0 and "not halted" in again.stdout
    assert brctl("-i", path, "daemon", "rearm", "--reason", " ").exit_code == 2


def test_rearm_starts_the_restart_count_again(tmp_path: Path) -> None:
    """The cap on restarts without progress halted the daemon; the human fixed the job
    and re-armed: the next crash is restarted again, not refused on the old count."""
    from tests.process.test_daemon_loop import hooks_log, make

    script, clock = Script(), Clock()
    inv = inventory(tmp_path, max_restarts_without_progress=2)
    daemon, store = make(tmp_path, script, clock, inv=inv)
    daemon.start()
    tick(daemon, clock, script)
    for _ in range(3):  # crash after crash without a new step: two restarts, then the cap
        script.running = False
        tick(daemon, clock, script, steps=0, dt=2)
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart"]
    assert daemon.halted and "restarts without a new step" in daemon.halted
    # halted, a new incident (a hang now) is paged and left alone: no ladder on the machines
    analysed = [c for c in script.calls if c[0] in ("diagnose", "stacks", "replay")]
    script.running = True
    for _ in range(8):
        tick(daemon, clock, script, steps=0, dt=2)
    assert [c for c in script.calls if c[0] in ("diagnose", "stacks", "replay")] == analysed
    assert any("the daemon is halted" in r for r in daemon.report.refusals[-1:])
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart"]
    state = DaemonState(store, "llm")
    assert rearm(Audit.of(inv, state, tmp_path / "state", "alice"), "fixed the data loader",
                 now=clock.now).was
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)
    assert daemon.halted is None
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart", "restart"]
    # and a daemon started afresh after the rearm counts from it too (records, not memory)
    daemon2, _ = make(tmp_path, script, clock, inv=inv, owner="again")
    daemon2._refresh_counters()
    assert daemon2.restarts_without_progress == 1
    store.close()
