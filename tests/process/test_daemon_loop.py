"""The daemon loop with scripted hooks, a real state database and real hook commands.

The job adapter's commands are real processes (python writing to a file), so the
tests see exactly which argv the scheduler would have received and how often.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.daemon.plan import Release
from brctl.analysis.daemon.policy import Finding, ReplayOutcome
from brctl.analysis.diagnose.decide import PastConclusion
from brctl.analysis.inventory import Inventory, from_document
from brctl.core.errors import RefusedError
from brctl.core.transport import Node
from brctl.operations.daemon.hooks import HealthView
from brctl.operations.daemon.loop import Daemon
from brctl.operations.jobadapter import JobAdapter, Notifier
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store

RECORD = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"


class Killed(BaseException):
    """Stands in for kill -9: nothing after it runs, nothing is cleaned up."""


@dataclass
class Script:
    """Scripted machines: faults, log steps, liveness; records what the hooks were asked."""

    step: int = 0
    running: bool = True
    evict: dict[str, str] = field(default_factory=dict)
    diagnose_finding: Finding = field(default_factory=Finding)
    stacks_finding: Finding = field(default_factory=Finding)
    replay_outcome: ReplayOutcome = field(
        default_factory=lambda: ReplayOutcome("none", (), (), "every group matched the reference"))
    calls: list[tuple[str, Any]] = field(default_factory=list)
    kill_on: str = ""
    versions: list[str] = field(default_factory=lambda: ["v1", "v2", "v3"])
    version: str = "v3"

    def health(self, nodes: Sequence[Node]) -> HealthView:
        return HealthView({n.name: r for n, r in ((n, self.evict.get(n.name)) for n in nodes) if r},
                          (), self.running, () if self.running else tuple(n.name for n in nodes),
                          {n.name: "fail" if n.name in self.evict else "ok" for n in nodes})

    def log_tails(self, nodes: Sequence[Node]) -> dict[str, str]:
        return {nodes[0].name: f"iteration {self.step}\n"}

    def stacks(self, nodes: Sequence[Node], rounds: int, *, arrival_first: bool = False
               ) -> Finding:
        self.calls.append(("stacks", [n.name for n in nodes]))
        return self.stacks_finding

    def diagnose(self, nodes: Sequence[Node], history: Sequence[PastConclusion]) -> Finding:
        self.calls.append(("diagnose", [n.name for n in nodes]))
        return self.diagnose_finding

    def restore(self, evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        self.calls.append(("restore", (evicted.name, standby.name)))
        if self.kill_on == "restore":
            raise Killed()
        return "restored"

    def release(self) -> Release:
        at = self.versions.index(self.version)
        return Release(self.version, None, (self.version, f"sha-{self.version}"),
                       (self.versions[at - 1], f"sha-{self.versions[at - 1]}") if at else None)

    def apply_updates(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        self.calls.append(("apply", [n.name for n in nodes]))
        return "applied"

    def rollback(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        self.calls.append(("rollback", [n.name for n in nodes]))
        self.version = version
        return "rolled back"

    def replay(self, nodes: Sequence[Node]) -> ReplayOutcome:
        self.calls.append(("replay", [n.name for n in nodes]))
        if self.kill_on == "replay":
            raise Killed()
        return self.replay_outcome

    def check(self, nodes: Sequence[Node]) -> dict[str, tuple[str, str]]:
        self.calls.append(("check", [n.name for n in nodes]))
        return {n.name: ("checked", "health ok") for n in nodes}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def inventory(tmp_path: Path, stop: bool = False, **daemon: Any) -> Inventory:
    """The test job; ``stop``: with a stop_command (recorded like the other hooks)."""
    log = tmp_path / "hooks.jsonl"
    py = sys.executable
    doc = {
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 2}],
        "standby": [{"name": "s[1-2]", "connection": "local", "gpus": 2}],
        "job": {"name": "llm", "nodes": "n[1-4]", "tp": 2, "pp": 2,
                "restart_command": [py, "-c", RECORD, str(log), "restart", "{nodes}", "{nnodes}"],
                "evict_command": [py, "-c", RECORD, str(log), "evict", "{node}", "{reason}"]},
        "daemon": {"poll_interval": 1, "stall_after": 5, "startup_grace": 5, "metrics_port": 0,
                   "notify_command": [py, "-c", RECORD, str(tmp_path / "notify.jsonl"),
                                      "{kind}", "{state}", "{node}"], **daemon},
    }
    if stop:
        doc["job"]["stop_command"] = [py, "-c", RECORD, str(log), "stop", "{nodes}"]
    return from_document(doc, "test.yaml")


def hooks_log(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "hooks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def make(tmp_path: Path, script: Script, clock: Clock, inv: Inventory | None = None,
         owner: str = "me", dry_run: bool = False) -> tuple[Daemon, Store]:
    inv = inv or inventory(tmp_path)
    store = Store(tmp_path / "state")
    state = DaemonState(store, "llm")
    assert inv.job is not None
    daemon = Daemon(inv, state, script, JobAdapter(inv, 30), owner=owner, clock=clock,
                    notifier=Notifier("llm", None, inv.daemon.notify_command), dry_run=dry_run,
                    event_log=tmp_path / "events.jsonl")
    return daemon, store


def tick(daemon: Daemon, clock: Clock, script: Script, steps: int = 1, dt: float = 1.0) -> None:
    clock.now += dt
    script.step += steps
    daemon.poll()


def test_gpu_fault_evicts_swaps_checked_standby_restores_and_restarts(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    assert ("check", ["s1", "s2"]) in script.calls  # the pool is self-checked first
    tick(daemon, clock, script)
    script.evict = {"n3": "ecc: 2 volatile uncorrectable errors"}
    tick(daemon, clock, script)
    assert daemon.members() == ["n1", "n2", "s1", "n4"]
    assert ("restore", ("n3", "s1")) in script.calls
    assert ("apply", ["n1", "n2", "s1", "n4"]) in script.calls  # lazy updates land at a restart
    log = hooks_log(tmp_path)
    assert log == [["evict", "n3", "n3: ecc: 2 volatile uncorrectable errors"],
                   ["restart", "n1,n2,s1,n4", "4"]]
    state = DaemonState(store, "llm")
    assert list(state.quarantined()) == ["n3"]
    assert not state.unfinished()
    # the evicted machine is out of the job: its fault is no longer an incident
    tick(daemon, clock, script)
    assert len(hooks_log(tmp_path)) == 2
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "gpu_fault" in kinds and "action_evict" in kinds and "action_restart" in kinds
    notes = (tmp_path / "notify.jsonl").read_text()
    assert '"evict", "done", "n3"' in notes and '"restart", "done", ""' in notes


def test_kill_9_mid_plan_then_restart_finishes_without_double_eviction(tmp_path: Path) -> None:
    script, clock = Script(kill_on="restore"), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    tick(daemon, clock, script)
    script.evict = {"n2": "xid 79: fell off the bus"}
    with pytest.raises(Killed):
        tick(daemon, clock, script)
    store.close()  # the process is gone; its lease stays until it expires
    assert hooks_log(tmp_path) == [["evict", "n2", "n2: xid 79: fell off the bus"]]

    script2 = Script(step=script.step, evict=dict(script.evict))
    clock.now += 1
    second, store2 = make(tmp_path, script2, clock, owner="successor")
    with pytest.raises(RefusedError):
        second.start()  # the dead daemon's lease has not expired yet
    clock.now += 61
    second.start()
    assert second.report.resumed and second.members() == ["n1", "s1", "n3", "n4"]
    assert ("restore", ("n2", "s1")) in script2.calls
    log = hooks_log(tmp_path)
    assert [e[:2] for e in log] == [["evict", "n2"], ["restart", "n1,s1,n3,n4"]]
    tick(second, clock, script2)
    tick(second, clock, script2)
    assert len(hooks_log(tmp_path)) == 2  # nothing evicted or restarted twice
    assert DaemonState(store2, "llm").unfinished() == []


def test_crash_reattempt_then_rollback_then_replay(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, _ = make(tmp_path, script, clock, inv=inventory(tmp_path, max_restarts_without_progress=5))
    daemon.start()
    tick(daemon, clock, script)
    decisions = []
    for _ in range(3):
        script.running = False
        tick(daemon, clock, script, steps=0, dt=2)
        decisions.append(daemon.report.handled[-1].plan.decision)  # type: ignore[union-attr]
    assert decisions == ["reattempt", "rollback", "replay"]
    assert sum(1 for c in script.calls if c[0] == "rollback") == 1
    # the replay ran on the job's machines, proved nobody: a reattempt (third restart)
    assert ("replay", ["n1", "n2", "n3", "n4"]) in script.calls
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart", "restart"]


def crash_until_replay(daemon: Daemon, clock: Clock, script: Script) -> None:
    """Crash three times without progress: reattempt, rollback, then replay."""
    tick(daemon, clock, script)
    for _ in range(3):
        script.running = False
        tick(daemon, clock, script, steps=0, dt=2)


def test_a_diagnose_ladder_that_raises_or_meets_garbage_never_stops_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 12: at a crash the daemon runs the real ladder (LiveHooks.diagnose). n2 answers
    every probe out of shape: that machine's error, the diagnosis goes on. A ladder that
    raises anyway (a bug) is a failed diagnosis with the reason (the traceback only in the
    debug log): the plan is paged with it and the loop keeps polling, crash after crash."""
    import logging

    from brctl.operations import diagnose as ladder
    from brctl.operations.daemon.hooks import LiveHooks
    from brctl.remote.fake import FakeTransport, Reply
    from brctl.remote.probes import probe_call

    def handle(node: Node, argv: Sequence[str], stdin: bytes | None) -> Reply:
        module, _ = probe_call(argv)
        if node.name == "n2":  # nested garbage where the log lines and processes belong
            doc: dict[str, Any] = {"logs": {"/l": [[1, {"x": None}]]}, "processes": "yes",
                                   "exit_code": "0", "status": ["pass"], "port": "29500"}
        elif module == "brctl.diagnostics.evidence":
            doc = {"logs": {"/l": ["[rank0]: Watchdog caught collective operation timeout"]}}
        else:
            doc = {"skipped": "not on this machine"}
        return Reply(stdout=json.dumps({"schema": "brctl.probe/1", **doc}) + "\n")

    script, clock = Script(), Clock()
    inv = inventory(tmp_path, max_restarts_without_progress=5)
    daemon, store = make(tmp_path, script, clock, inv=inv)
    live = LiveHooks(inv, FakeTransport(handle), store, tmp_path)
    script.diagnose = live.diagnose  # type: ignore[method-assign]
    daemon.start()
    tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # the ladder runs; n2's answers are its error

    def broken_ladder(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug deep in the ladder")

    monkeypatch.setattr(ladder, "diagnose", broken_ladder)
    with caplog.at_level(logging.DEBUG, logger="brctl.operations.daemon.hooks"):
        tick(daemon, clock, script, steps=0, dt=2)
        tick(daemon, clock, script, steps=0, dt=2)  # and again: no crash loop
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    reasons = [e["detail"]["reason"] for e in events if e["kind"] == "analysis"]
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("nccl: ") and "diagnose failed" not in reasons[0]
    want = "diagnose failed: internal error: ZeroDivisionError: a bug deep in the ladder"
    assert reasons[1:] == [want, want]
    assert "Traceback" not in json.dumps(events)
    assert "ZeroDivisionError" in caplog.text and "broken_ladder" in caplog.text  # the traceback
    plans = [e["detail"]["plan"] for e in events if e["kind"] == "decision"]
    assert [p["decision"] for p in plans[:3]] == ["reattempt", "rollback", "replay"]  # the ladder
    assert all(p["reason"].endswith(f"({want})") for p in plans[1:3])  # climbed, with the why
    pages = (tmp_path / "notify.jsonl").read_text().splitlines()
    assert len(pages) >= 3  # each plan paged its steps
    assert not DaemonState(store, "llm").unfinished()


def test_replay_found_evicts_the_proven_machine_and_swaps_a_standby(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    script.replay_outcome = ReplayOutcome("found", ("n2",), (), "n2 deviates in both rounds")
    daemon, store = make(tmp_path, script, clock,
                         inv=inventory(tmp_path, max_restarts_without_progress=5))
    daemon.start()
    crash_until_replay(daemon, clock, script)
    assert daemon.members() == ["n1", "s1", "n3", "n4"]
    assert ("restore", ("n2", "s1")) in script.calls
    log = hooks_log(tmp_path)
    assert [e[:2] for e in log] == [["restart", "n1,n2,n3,n4"], ["restart", "n1,n2,n3,n4"],
                                    ["evict", "n2"], ["restart", "n1,s1,n3,n4"]]
    assert "silent data corruption" in log[2][2]
    state = DaemonState(store, "llm")
    assert list(state.quarantined()) == ["n2"] and not state.unfinished()
    replays = [a for a in state.actions() if a.kind == "replay"]
    assert len(replays) == 1 and replays[0].payload["verdict"] == "found"


def test_replay_proving_nobody_pages_with_evidence_and_reattempts(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    script.replay_outcome = ReplayOutcome("ambiguous", (), ("n3", "n4"), "groups disagree")
    daemon, _ = make(tmp_path, script, clock,
                     inv=inventory(tmp_path, max_restarts_without_progress=5))
    daemon.start()
    crash_until_replay(daemon, clock, script)
    notes = [json.loads(line) for line in (tmp_path / "notify.jsonl").read_text().splitlines()]
    assert ["replay", "ambiguous", ""] in notes  # a human gets the evidence
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    decided = [e for e in events if e["kind"] == "decision" and "replay" in e["detail"]]
    assert decided and decided[0]["detail"]["replay"]["candidates"] == ["n3", "n4"]
    assert decided[0]["detail"]["plan"]["decision"] == "reattempt"
    assert daemon.members() == ["n1", "n2", "n3", "n4"]
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart"] * 3


def test_replay_proving_nobody_at_the_restart_cap_halts(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, _ = make(tmp_path, script, clock,
                     inv=inventory(tmp_path, max_restarts_without_progress=2))
    daemon.start()
    crash_until_replay(daemon, clock, script)
    assert any(c[0] == "replay" for c in script.calls)  # the replay itself is no restart
    assert daemon.halted and "a human must look" in daemon.report.refusals[0]
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart"]  # no third one
    assert int(daemon.report.exit_code) == 4


def test_kill_9_after_the_replay_verdict_resumes_without_replaying_or_evicting_twice(
        tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    script.replay_outcome = ReplayOutcome("found", ("n3",), (), "n3 deviates")
    script.kill_on = "restore"
    daemon, store = make(tmp_path, script, clock,
                         inv=inventory(tmp_path, max_restarts_without_progress=5))
    daemon.start()
    with pytest.raises(Killed):
        crash_until_replay(daemon, clock, script)
    store.close()
    assert [e[:2] for e in hooks_log(tmp_path)][-1] == ["evict", "n3"]

    script2 = Script(step=script.step, running=False)
    clock.now += 120  # the dead daemon's lease expires
    second, store2 = make(tmp_path, script2, clock, owner="successor",
                          inv=inventory(tmp_path, max_restarts_without_progress=5))
    second.start()
    assert not any(c[0] == "replay" for c in script2.calls)  # the verdict is read back
    assert ("restore", ("n3", "s1")) in script2.calls
    assert second.members() == ["n1", "n2", "s1", "n4"]
    log = [e[:2] for e in hooks_log(tmp_path)]
    assert log.count(["evict", "n3"]) == 1 and log[-1] == ["restart", "n1,n2,s1,n4"]
    assert DaemonState(store2, "llm").unfinished() == []


def test_kill_9_keeps_the_escalation_ladder_and_the_restart_cap(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    inv = inventory(tmp_path, max_restarts_without_progress=2)
    daemon, store = make(tmp_path, script, clock, inv=inv)
    daemon.start()
    tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # reattempt: restart 1
    store.close()  # kill -9 (no clean stop)

    clock.now += 120
    second, _ = make(tmp_path, script, clock, owner="successor", inv=inv)
    second.start()
    assert second.restarts_without_progress == 1
    tick(second, clock, script, steps=0, dt=2)
    assert second.report.handled[-1].plan.decision == "rollback"  # type: ignore[union-attr]
    tick(second, clock, script, steps=0, dt=2)  # replay: nobody proven, the cap is reached
    assert second.halted and [e[0] for e in hooks_log(tmp_path)] == ["restart", "restart"]


def test_hang_goes_to_stacks_and_evicts_its_group(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    script.stacks_finding = Finding("evict", ("n1", "n2"), "rank 2 stuck in allreduce")
    daemon, _ = make(tmp_path, script, clock, inv=inventory(tmp_path, max_evict_fraction=0.5))
    daemon.start()
    tick(daemon, clock, script)
    for _ in range(6):  # no new step for > stall_after
        tick(daemon, clock, script, steps=0)
    assert any(c[0] == "stacks" for c in script.calls)
    assert daemon.members() == ["s1", "s2", "n3", "n4"]


def test_restarts_without_progress_cap_pages_and_halts(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock, inv=inventory(tmp_path, max_restarts_without_progress=1))
    daemon.start()
    tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # reattempt (1 restart)
    tick(daemon, clock, script, steps=0, dt=2)  # crash again: rollback would be restart 2
    assert daemon.report.refusals and "a human must look" in daemon.report.refusals[0]
    assert int(daemon.report.exit_code) == 4
    assert daemon.halted
    refused = DaemonState(store, "llm").actions(["refused"])
    assert len(refused) == 1
    assert '"refused", "refused"' in (tmp_path / "notify.jsonl").read_text()


def test_eviction_cap_refuses_and_records(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, _ = make(tmp_path, script, clock, inv=inventory(tmp_path, max_evict_fraction=0.25))
    daemon.start()
    tick(daemon, clock, script)
    script.evict = {"n1": "ecc", "n2": "ecc"}
    tick(daemon, clock, script)
    assert daemon.report.refusals and "max_evict_fraction" in daemon.report.refusals[0]
    assert hooks_log(tmp_path) == [] and daemon.members() == ["n1", "n2", "n3", "n4"]


def test_dry_run_decides_without_acting_and_writes_nothing_the_live_daemon_reads(
        tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    live, store = make(tmp_path, script, clock)
    live.start()
    tick(live, clock, script)
    lease = DaemonState(store, "llm").lease()
    before = {t: store.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
              for t in ("daemon_events", "daemon_actions", "ettr_intervals", "evictions")}
    status = DaemonState(store, "llm").status()
    dry, _ = make(tmp_path, script, clock, owner="looker", dry_run=True)
    dry.start()  # no lease taken: the live daemon's stays
    tick(dry, clock, script)
    script.evict = {"n4": "ecc"}
    tick(dry, clock, script)
    tick(dry, clock, script)  # the same incident is decided once
    assert hooks_log(tmp_path) == [] and dry.members() == ["n1", "n2", "n3", "n4"]
    assert len(dry.report.handled) == 1 and dry.report.handled[0].plan is not None
    assert dry.report.handled[0].plan.evict == ("n4",)
    after = {t: store.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in before}
    assert after == before and DaemonState(store, "llm").status() == status
    assert DaemonState(store, "llm").lease() == lease
    dry.stop()
    assert DaemonState(store, "llm").lease() == lease
    tick(live, clock, script)  # the live daemon still holds its generation and acts
    assert live.members() == ["n1", "n2", "n3", "s1"]


def test_no_checked_standby_refuses(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    inv = inventory(tmp_path)
    inv = replace(inv, standby=())
    daemon, _ = make(tmp_path, script, clock, inv=inv)
    daemon.start()
    tick(daemon, clock, script)
    script.evict = {"n1": "ecc"}
    tick(daemon, clock, script)
    assert daemon.report.refusals and "no checked standby" in daemon.report.refusals[0]


def test_ettr_intervals_follow_progress(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    tick(daemon, clock, script)
    for _ in range(6):
        tick(daemon, clock, script)  # productive
    for _ in range(2):
        tick(daemon, clock, script, steps=0)  # stalled
    ivs = DaemonState(store, "llm").intervals()
    assert [(iv.end - iv.start, iv.productive) for iv in ivs] == [
        (1.0, False), (6.0, True), (2.0, False)]  # the first poll only sets the baseline


def test_run_stops_on_signal_and_releases_lease(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    stop = threading.Event()

    def on_poll(_: object) -> None:
        script.step += 1
        if daemon.report.iterations >= 2:
            stop.set()

    report = daemon.run(stop=stop, on_poll=on_poll)
    assert report.stopped_by == "signal" and report.iterations == 2
    assert DaemonState(store, "llm").lease() is None


def test_metrics_collector_reads_the_state(tmp_path: Path) -> None:
    from brctl.operations.daemon.metrics import DaemonView, _Collector

    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    tick(daemon, clock, script)
    script.evict = {"n3": "ecc"}
    tick(daemon, clock, script)
    families = {f.name: f for f in _Collector(DaemonState(store, "llm"), lambda: DaemonView(
        daemon.health_status, 1, daemon.halted, daemon.polled, daemon.progress.step)).collect()}
    assert all(s.labels["job"] == "llm" for f in families.values() for s in f.samples)
    health = {s.labels["node"]: s.value for s in families["brctl_node_health"].samples}
    assert health["n3"] == 0.0 and health["n1"] == 1.0
    events = {s.labels["kind"]: s.value for s in families["brctl_daemon_events"].samples}
    assert events["gpu_fault"] == 1
    actions = {(s.labels["kind"], s.labels["state"]): s.value
               for s in families["brctl_daemon_actions"].samples}
    assert actions[("evict", "done")] == 1
    assert families["brctl_standby_ready"].samples[0].value == 1
    assert {s.labels["window"] for s in families["brctl_ettr"].samples} >= {"all"}
    assert [s.value for s in families["brctl_job_step"].samples] == [script.step]
    assert families["brctl_daemon_last_poll_timestamp_seconds"].samples[0].value == clock.now
    assert [s.value for s in families["brctl_daemon_halted"].samples] == [0.0]
    (build,) = families["brctl_build_info"].samples
    assert build.value == 1 and build.labels["version"]


def test_fail_slow_runs_stack_rounds_and_notifies_when_nobody_is_blamed(tmp_path: Path) -> None:
    script, clock = Script(), Clock()
    daemon, _ = make(tmp_path, script, clock)
    daemon.start()
    for _ in range(8):
        tick(daemon, clock, script)  # 1 s per step
    tick(daemon, clock, script, dt=4)  # 4 s for one step: 4x the median
    assert daemon.report.handled[-1].incident.kind == "fail_slow"  # type: ignore[union-attr]
    assert daemon.report.handled[-1].plan.decision == "notify"  # type: ignore[union-attr]
    assert any(c[0] == "stacks" for c in script.calls) and hooks_log(tmp_path) == []
    assert '"fail_slow", "needs-attention"' in (tmp_path / "notify.jsonl").read_text()


def test_state_db_and_event_log_are_private_whatever_the_umask(tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        (tmp_path / "events.jsonl").write_text("")  # left 0644 by an older brctl
        script, clock = Script(), Clock()
        daemon, _ = make(tmp_path, script, clock)
        daemon.start()
        tick(daemon, clock, script)
    finally:
        os.umask(old)
    for path in (tmp_path / "state" / "brctl.db", tmp_path / "state" / "brctl.db-wal",
                 tmp_path / "events.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


class Scheduler(JobAdapter):
    """A job adapter whose built-in scheduler view is scripted (what Slurm would show)."""

    def __init__(self, inv: Inventory, view: list[Any]) -> None:
        super().__init__(inv, 30)
        self.view = view

    def allocation(self) -> Any:
        return self.view[0]

    def running(self, members: Any) -> Any:  # as SlurmHooks.running: None while it waits
        return None if self.view[0].waiting else self.view[0].running


def test_the_schedulers_allocation_wins_and_its_own_requeues_are_said_once(tmp_path: Path) -> None:
    from brctl.operations.slurm.job import SlurmJob

    script, clock = Script(), Clock()
    inv = inventory(tmp_path)
    store = Store(tmp_path / "state")
    view = [SlurmJob("42", "llm", "RUNNING", "None", ("n1", "n2", "n3", "n4"), 0, "root")]
    daemon = Daemon(inv, DaemonState(store, "llm"), script, Scheduler(inv, view), owner="me",
                    clock=clock, event_log=tmp_path / "events.jsonl")
    daemon.start()
    tick(daemon, clock, script)
    assert daemon.members() == ["n1", "n2", "n3", "n4"]
    # Slurm placed the job elsewhere (someone requeued it by hand onto s1): Slurm wins
    view[0] = SlurmJob("42", "llm", "PENDING", "BeginTime", (), 1, "root")
    tick(daemon, clock, script)
    assert daemon.members() == ["n1", "n2", "n3", "n4"]  # while it waits: the record
    view[0] = SlurmJob("42", "llm", "RUNNING", "None", ("n1", "s1", "n3", "n4"), 1, "root")
    for _ in range(3):
        tick(daemon, clock, script)
    assert daemon.members() == ["n1", "s1", "n3", "n4"]
    assert DaemonState(store, "llm").members([]) == ["n1", "s1", "n3", "n4"]  # the record follows
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("membership_mismatch") == 1 and kinds.count("scheduler_requeue") == 1
    mismatch = next(e for e in events if e["kind"] == "membership_mismatch")
    assert mismatch["detail"]["recorded"] == ["n1", "n2", "n3", "n4"]
    store.close()


def test_a_job_waiting_in_the_schedulers_queue_is_not_a_crash(tmp_path: Path) -> None:
    """After a requeue Slurm holds the job PENDING (BeginTime) for a while: no training
    process anywhere is the wait, not a crash; the daemon restarting it again was a second
    requeue the plan never asked for."""
    from brctl.operations.slurm.job import SlurmJob

    script, clock = Script(), Clock()
    inv = inventory(tmp_path)
    store = Store(tmp_path / "state")
    view = [SlurmJob("42", "llm", "RUNNING", "None", ("n1", "n2", "n3", "n4"), 0, "root")]
    daemon = Daemon(inv, DaemonState(store, "llm"), script, Scheduler(inv, view), owner="me",
                    clock=clock, event_log=tmp_path / "events.jsonl")
    daemon.start()
    tick(daemon, clock, script)
    view[0] = SlurmJob("42", "llm", "PENDING", "BeginTime", (), 1, "root")
    script.running = False  # no process on any machine while it waits
    for _ in range(4):  # longer than the 1 s crash grace, shorter than stall_after
        tick(daemon, clock, script)
    # ... nor a hang however long it waits (here 30 s, stall_after is 5 s): requeueing a
    # job that waits for resources only costs it its place in the queue
    view[0] = SlurmJob("42", "llm", "PENDING", "Resources", (), 1, "root")
    for _ in range(30):
        tick(daemon, clock, script, steps=0)
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "crash" not in kinds and "hang" not in kinds and not hooks_log(tmp_path)
    assert [c for c, _ in script.calls] == ["check"]  # the standby self-check, no diagnose
    assert kinds.count("job_queued") == 2  # BeginTime, then Resources: each wait said once
    # the scheduler says the job is over (FAILED): that is a crash
    view[0] = SlurmJob("42", "llm", "FAILED", "NonZeroExitCode", (), 1, "root")
    tick(daemon, clock, script)
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "crash" in kinds
    store.close()


def test_the_time_a_plan_takes_is_not_training_time(tmp_path: Path) -> None:
    """A GPU fault's plan (evict, restore for 600 s, swap, restart) runs inside one poll.
    The next interval used to start at that poll's start, so when the restarted job
    moved on, the restore's 600 s counted as productive and ETTR overstated."""
    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock)
    daemon.start()
    tick(daemon, clock, script)
    tick(daemon, clock, script)  # 1 s productive
    restore = script.restore

    def slow_restore(evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        clock.now += 600.0
        return restore(evicted, standby, members)
    script.restore = slow_restore  # type: ignore[method-assign]
    script.evict = {"n3": "ecc: 2 volatile uncorrectable errors"}
    tick(daemon, clock, script)  # the fault is seen, the plan runs (600 s)
    script.evict = {}
    for _ in range(3):
        tick(daemon, clock, script)  # training again
    ivs = DaemonState(store, "llm").intervals()
    lost = sum(iv.end - iv.start for iv in ivs if not iv.productive)
    assert lost >= 600.0, ivs
    store.close()


def test_a_failed_rollback_skips_the_restart_pages_and_does_not_feed_the_ladder(
        tmp_path: Path) -> None:
    from brctl.core.errors import BrctlError

    script, clock = Script(), Clock()
    daemon, store = make(tmp_path, script, clock,
                         inv=inventory(tmp_path, max_restarts_without_progress=5))

    def failing_rollback(nodes: Sequence[Node], version: str, sha256: str) -> str:
        script.calls.append(("rollback", [n.name for n in nodes]))
        raise BrctlError("update rollback failed: m2 unreachable")

    script.rollback = failing_rollback  # type: ignore[method-assign]
    daemon.start()
    tick(daemon, clock, script)
    script.running = False
    tick(daemon, clock, script, steps=0, dt=2)  # reattempt: restart 1
    tick(daemon, clock, script, steps=0, dt=2)  # rollback: it fails
    assert daemon.report.handled[-1].plan.decision == "rollback"  # type: ignore[union-attr]
    assert [e[0] for e in hooks_log(tmp_path)] == ["restart"]  # not restarted on the bad code
    state = DaemonState(store, "llm")
    plan = [a for a in state.actions() if a.kind == "plan"][-1]
    assert plan.state == "failed" and "rollback failed" in plan.reason
    assert state.action(f"{plan.key}/restart").state == "skipped"  # type: ignore[union-attr]
    notes = (tmp_path / "notify.jsonl").read_text()
    assert '"rollback", "failed"' in notes and '"plan", "failed"' in notes
    assert [d for d, _, _ in state.crash_history(0.0)] == ["reattempt"]  # what happened
    tick(daemon, clock, script, steps=0, dt=2)  # the next crash climbs from the reattempt
    assert daemon.report.handled[-1].plan.decision == "rollback"  # type: ignore[union-attr]
    assert not any(c[0] == "replay" for c in script.calls)
