"""``brctl daemon run``: the unattended detect → diagnose → act loop.

One ``Daemon`` holds one persistent transport (through its ``Hooks``), the state
database and the job adapter. Each poll:

1. renews the job's lease (a second daemon for the job refuses, exit 4);
2. sweeps health on the job's current machines (confident hardware faults and
   training-process liveness) and reads the tails of the job's logs (the step);
3. records the poll interval as productive (a new step) or not, for ETTR;
4. ``analysis.daemon.detect`` → an incident (gpu_fault, crash, hang, fail_slow);
5. analyses it (stacks for a hang or fail-slow, the diagnose ladder for a crash),
   ``plan_for`` → a plan, checks the safety caps (``refusal``);
6. writes the plan and then each step as ``intent`` before doing it (evict →
   stop → restore checkpoint shards onto the standby → apply pending updates →
   swap membership → roll back → restart), marking each ``done``/``failed``.
   A replay decision stops the job, runs ``brctl replay`` on its current machines
   and records the verdict; the follow-up (evict what it proved faulty and swap
   standbys in, or reattempt and page a human with the evidence) is a plan of its
   own under the same caps and the same action log.

A restart after ``kill -9`` first finishes every plan left as ``intent`` (steps
already ``done`` are skipped, the standby chosen is in the plan, a replay's
verdict is read back from its step), so nothing is evicted, swapped or replayed
twice; the restarts-without-progress count and the crash escalation ladder are
read back from the database too. ``--dry-run`` records the decisions only. A refusal
(caps, restarts without progress, no checked standby) is recorded, notified,
and stops further actions: the daemon keeps observing and exits 4.

The analyses and remote actions are behind ``Hooks`` so the loop is tested with
scripted ones; ``operations.daemon_hooks.LiveHooks`` wires the real operations (health,
stacks, diagnose, ckpt, update) in one place.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

from brctl.analysis.daemon import (
    Decision,
    Finding,
    Incident,
    Observation,
    Plan,
    Progress,
    ReplayOutcome,
    detect,
    job_step,
    last_step,
    observe,
    pick_standbys,
    plan_after_replay,
    plan_for,
    refusal,
    swap_members,
)
from brctl.analysis.ettr import ratio
from brctl.analysis.inventory import Inventory
from brctl.core.errors import BrctlError, ExitCode
from brctl.core.transport import Node, Transport
from brctl.operations.daemon_hooks import Hooks, LiveHooks
from brctl.operations.daemon_state import DONE, FAILED, REFUSED, DaemonState
from brctl.operations.jobadapter import HookRun, JobAdapter, Notifier
from brctl.state import Store

FAIL_SLOW_ROUNDS = 3  # stack rounds for fail-slow (brctl stacks --rounds), one poll apart


@dataclass
class PollResult:
    """One poll, for the caller's progress output."""

    at: float
    step: Optional[int]
    moved: bool
    incident: Optional[Incident] = None
    plan: Optional[Plan] = None
    refused: Optional[str] = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        """``{at, step, moved, incident, plan, refused, dry_run}``."""
        return {"at": self.at, "step": self.step, "moved": self.moved,
                "incident": self.incident.to_json() if self.incident else None,
                "plan": self.plan.to_json() if self.plan else None,
                "refused": self.refused, "dry_run": self.dry_run}


@dataclass
class DaemonReport:
    """What a run did: polls, handled incidents, refusals, the ETTR it recorded."""

    job: str
    iterations: int = 0
    handled: list[PollResult] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    ettr: Optional[float] = None
    stopped_by: str = ""

    @property
    def exit_code(self) -> ExitCode:
        """0 when stopped by SIGTERM/SIGINT (systemctl stop is a normal end), else 4 when
        anything was refused, else 1 when incidents were handled, else 0."""
        if self.stopped_by == "signal":
            return ExitCode.OK
        if self.refusals:
            return ExitCode.REFUSED
        return ExitCode.FINDINGS if self.handled else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.daemon/1``."""
        return {"job": self.job, "iterations": self.iterations,
                "incidents": [p.to_json() for p in self.handled], "refusals": self.refusals,
                "resumed": self.resumed, "members": self.members, "ettr": self.ettr,
                "stopped_by": self.stopped_by}


class Daemon:
    """The loop for one job (see the module docstring)."""

    def __init__(self, inv: Inventory, state: DaemonState, hooks: Hooks, adapter: JobAdapter, *,
                 notifier: Optional[Notifier] = None, owner: str, dry_run: bool = False,
                 event_log: Optional[Path] = None, clock: Callable[[], float] = time.time,
                 on_event: Optional[Callable[[dict[str, Any]], None]] = None) -> None:
        """Args: see the attributes; ``on_event`` sees every recorded event (stderr lines)."""
        assert inv.job is not None
        self.inv = inv
        self.job = inv.job
        self.cfg = inv.daemon
        self.state = state
        self.hooks = hooks
        self.adapter = adapter
        self.notifier = notifier
        self.owner = owner
        self.dry_run = dry_run
        self.event_log = event_log
        self.clock = clock
        self.on_event = on_event
        self.progress = Progress.start(clock())
        self.last_poll: Optional[float] = None
        self.last_signature: Optional[tuple[str, tuple[str, ...]]] = None
        self.crash_history: list[Decision] = []  # decisions on crashes since the last new step
        self.restarts_without_progress = 0
        self.halted: Optional[str] = None
        self.health_status: dict[str, str] = {}
        self.report = DaemonReport(job=self.job.name)

    # recording ----------------------------------------------------------------
    def _event(self, kind: str, nodes: Sequence[str], detail: dict[str, Any]) -> int:
        at = self.clock()
        event_id = self.state.event(kind, nodes, detail, at)
        doc = {"id": event_id, "at": at, "job": self.job.name, "kind": kind, "nodes": list(nodes),
               "detail": detail}
        if self.event_log is not None:
            self.event_log.parent.mkdir(parents=True, exist_ok=True)
            with self.event_log.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(doc, default=str) + "\n")
        if self.on_event is not None:
            self.on_event(doc)
        return event_id

    def _notify(self, kind: str, state: str, node: Optional[str], reason: str,
                detail: Mapping[str, Any]) -> None:
        if self.notifier is None:
            return
        errors = self.notifier.send(kind, state, node, reason, detail)
        if errors:
            self._event("notify_failed", [node] if node else [], {"errors": errors})

    # lifecycle ------------------------------------------------------------------
    def members(self) -> list[str]:
        """The job's machines now (after swaps)."""
        return self.state.members(self.job.nodes)

    def start(self) -> None:
        """Take the lease, finish interrupted plans, self-check unchecked standbys.

        Raises:
            RefusedError: another daemon holds the job's lease.
        """
        now = self.clock()
        self.state.acquire_lease(self.owner, now, self.cfg.lease_ttl)
        self.last_poll = now  # ETTR counts from here: finishing a plan is not training time
        # The caps and the escalation ladder survive a kill -9: read them back.
        since = self.state.last_progress()
        self.restarts_without_progress = self.state.restarts_since(since)
        self.crash_history = cast(list[Decision], self.state.crash_decisions_since(since))
        self._event("daemon_start", [], {"owner": self.owner, "dry_run": self.dry_run,
                                         "members": self.members()})
        if not self.dry_run:
            for action in self.state.unfinished():
                current = self.state.action(action.key)  # a parent plan may have finished it
                if action.kind == "plan" and current is not None and current.state == "intent":
                    self._event("resume", [], {"plan": action.key})
                    self.report.resumed.append(action.key)
                    self._execute(action.key, action.payload)
        self._check_pool()

    def _check_pool(self) -> None:
        checks = self.state.checks()
        quarantined = self.state.quarantined()
        members = set(self.members())
        todo = [self.inv.node(n) for n in self.inv.standby
                if n not in checks and n not in quarantined and n not in members]
        if not todo:
            return
        results = self.hooks.check(todo)
        for name, (outcome, detail) in results.items():
            self.state.mark_checked(name, outcome == "checked", detail, self.clock(), outcome)
        self._event("standby_check", list(results), {
            n: {"ok": outcome == "checked", "outcome": outcome, "detail": d}
            for n, (outcome, d) in results.items()})

    def stop(self) -> None:
        """Give the lease back (clean exit)."""
        self._event("daemon_stop", [], {"stopped_by": self.report.stopped_by})
        self.state.release_lease(self.owner)

    # one poll -------------------------------------------------------------------
    def poll(self) -> PollResult:
        """Observe once, and handle what is found."""
        now = self.clock()
        self.state.acquire_lease(self.owner, now, self.cfg.lease_ttl)
        members = self.members()
        nodes = [self.inv.node(n) for n in members]
        health = self.hooks.health(nodes)
        self.health_status = dict(health.status)
        tails = self.hooks.log_tails(nodes)
        step = job_step({n: last_step(t, self.cfg.progress_regex) for n, t in tails.items()})
        running = health.running
        status = self.adapter.running(members)
        if status is not None:
            running = status
        now = self.clock()
        self.progress, moved = observe(self.progress, step, now, self.cfg.fail_slow_window)
        if self.last_poll is not None:
            self.state.add_interval(self.last_poll, now, moved)
        self.last_poll = now
        if moved:
            self.restarts_without_progress = 0
            self.crash_history.clear()
        obs = Observation(now, health.evict, health.unanswered, step, running, health.stopped_on)
        result = PollResult(now, step, moved, dry_run=self.dry_run)
        incident = detect(obs, self.progress, self.cfg, members)
        signature = (incident.kind, incident.nodes) if incident else None
        if incident is not None and signature != self.last_signature:
            result.incident = incident
            self._handle(incident, nodes, result)
            self.report.handled.append(result)
        self.last_signature = signature if incident is not None else None
        restarted = result.plan is not None and (result.plan.restart or result.plan.decision == "replay")
        if restarted and not result.refused and not self.dry_run:
            self.last_signature = None  # a restarted job starts a fresh story (a replay ends in one)
        self.state.save_status(self.status_doc(step, running), now)
        self.report.iterations += 1
        return result

    def status_doc(self, step: Optional[int], running: Optional[bool]) -> dict[str, Any]:
        """The summary ``brctl daemon status`` shows."""
        intervals = self.state.intervals()
        return {"owner": self.owner, "step": step, "running": running,
                "members": self.members(), "halted": self.halted, "dry_run": self.dry_run,
                "health": self.health_status,
                "restarts_without_progress": self.restarts_without_progress,
                "ettr": ratio(intervals), "poll_interval": self.cfg.poll_interval}

    # deciding -------------------------------------------------------------------
    def _analyse(self, incident: Incident, nodes: Sequence[Node]) -> Finding:
        if incident.kind == "crash":
            finding = self.hooks.diagnose(nodes)
            return _escalate(finding, self.crash_history)
        if incident.kind == "hang":
            return self.hooks.stacks(nodes, 1)
        if incident.kind == "fail_slow":  # a slow rank shows over rounds, not in one dump
            return self.hooks.stacks(nodes, FAIL_SLOW_ROUNDS)
        return Finding()

    def _handle(self, incident: Incident, nodes: Sequence[Node], result: PollResult) -> None:
        event_id = self._event(incident.kind, incident.nodes, {"reason": incident.reason})
        finding = self._analyse(incident, nodes)
        if incident.kind != "gpu_fault":
            self._event("analysis", finding.faulty, {"decision": finding.decision,
                                                     "reason": finding.reason})
        plan = plan_for(incident, finding)
        result.plan = plan
        if incident.kind == "crash":
            self.crash_history.append(plan.decision)
        members = [n.name for n in nodes]
        self._event("decision", plan.evict, {"plan": plan.to_json(), "incident": event_id,
                                             "dry_run": self.dry_run})
        why, replacements = self._authorize(plan, members)
        if why is not None:
            self._refuse(f"{self.job.name}/refused/{event_id}", plan, why, result)
            return
        key = f"{self.job.name}/plan/{event_id}"
        payload = {"plan": plan.to_json(), "members": members, "replacements": replacements,
                   "incident": incident.to_json()}
        if self.dry_run:
            self.state.intend(key, "plan", None, payload, plan.reason, self.clock())
            self.state.finish(key, "dry-run", self.clock())
            return
        self.state.intend(key, "plan", None, payload, plan.reason, self.clock())
        self._execute(key, payload)

    def _authorize(self, plan: Plan, members: Sequence[str]) -> tuple[Optional[str], dict[str, str]]:
        """(why the caps refuse ``plan`` or None, evicted machine → checked standby)."""
        why = self.halted or refusal(
            plan, now=self.clock(), eviction_times=[e.at for e in self.state.eviction_history()],
            job_size=len(members), restarts_without_progress=self.restarts_without_progress,
            cfg=self.cfg)
        replacements: dict[str, str] = {}
        if why is None and plan.evict:
            spares = pick_standbys(self.inv.standby, in_use=members, count=len(plan.evict),
                                   checked=[n for n, (ok, _, _) in self.state.checks().items() if ok],
                                   quarantined=self.state.quarantined())
            replacements = dict(zip(plan.evict, spares))
            if len(spares) < len(plan.evict) and plan.restart:
                missing = [n for n in plan.evict if n not in replacements]
                why = (f"no checked standby for {', '.join(missing)} "
                       "(run brctl standby check, or add machines to standby:)")
        return why, replacements

    def _refuse(self, key: str, plan: Plan, why: str, result: Optional[PollResult]) -> None:
        if result is not None:
            result.refused = why
        self.report.refusals.append(why)
        self.state.intend(key, "plan", None, {"plan": plan.to_json()}, why, self.clock())
        self.state.finish(key, REFUSED, self.clock())
        self._event("refused", plan.evict, {"reason": why, "plan": plan.to_json()})
        self._notify("refused", REFUSED, None, why, {"plan": plan.to_json()})
        if self.halted is None:
            self.halted = why
            self._event("halted", [], {"reason": "a refusal stops further actions until a "
                                                 "human restarts the daemon: " + why})

    # acting -----------------------------------------------------------------------
    def _step(self, key: str, kind: str, node: Optional[str], reason: str,
              work: Callable[[], str]) -> bool:
        """Run one idempotent step under ``key`` unless it is already done; True if it succeeded."""
        action = self.state.intend(key, kind, node, {}, reason, self.clock())
        if action.state == DONE:
            return True
        try:
            detail = work()
            ok = True
        except BrctlError as exc:
            detail, ok = exc.message, False
        self.state.finish(key, DONE if ok else FAILED, self.clock(), f"{reason}: {detail}"[:2000])
        self._event(f"action_{kind}", [node] if node else [],
                    {"key": key, "ok": ok, "detail": detail})
        self._notify(kind, DONE if ok else FAILED, node, reason, {"key": key, "detail": detail})
        return ok

    def _hook(self, run: Optional[HookRun], what: str) -> str:
        if run is None:
            return f"no {what} configured"
        if not run.ok:
            raise BrctlError(f"{what} {' '.join(run.argv)} exited {run.exit_code}: "
                             f"{run.output.strip()[-300:]}")
        return f"{what} ok ({run.seconds:.1f}s)"

    def _execute(self, key: str, payload: Mapping[str, Any]) -> None:
        """Carry out a recorded plan; every step is skipped when already done."""
        plan = payload["plan"]
        before: list[str] = list(payload["members"])
        replacements: dict[str, str] = dict(payload["replacements"])
        reason = str(plan["reason"])
        after = swap_members(before, replacements)
        for node in plan["evict"]:
            self._step(f"{key}/evict/{node}", "evict", node, reason,
                       _bind(self._evict, before, node, reason))
        stop = plan["restart"] or plan["decision"] == "replay"
        if stop and self.job.stop_command is not None and not payload.get("follows"):
            self._step(f"{key}/stop", "stop", None, reason,
                       lambda: self._hook(self.adapter.stop(before), "stop_command"))
        for evicted, spare in replacements.items():
            self._step(f"{key}/restore/{spare}", "restore", spare, f"shards of {evicted}",
                       _bind(self.hooks.restore, self.inv.node(evicted), self.inv.node(spare),
                             [self.inv.node(n) for n in after]))
        if replacements:
            self._step(f"{key}/swap", "swap", None, reason,
                       lambda: self._swap(after, replacements))
        after_nodes = [self.inv.node(n) for n in after]
        if plan["decision"] == "rollback":
            self._step(f"{key}/rollback", "rollback", None, reason,
                       lambda: self.hooks.rollback(after_nodes))
        elif plan["restart"]:
            # a restart is when lazy updates land; standbys catch up to the job's release
            self._step(f"{key}/apply", "apply", None, "pending updates before the restart",
                       lambda: self.hooks.apply_updates(after_nodes))
        if plan["decision"] == "replay":
            self._after_replay(key, payload, self._replay(key, before, reason))
        if plan["decision"] == "notify":  # e.g. fail-slow with nobody to blame: a human looks
            self._notify(str(payload["incident"]["kind"]), "needs-attention", None, reason, {})
        if plan["restart"]:
            recorded = self.state.action(f"{key}/restart")
            restarted = self._step(f"{key}/restart", "restart", None, reason,
                                   lambda: self._hook(self.adapter.restart(after), "restart_command"))
            if recorded is None or recorded.state != DONE:  # a resumed, done restart is counted
                self.restarts_without_progress += 1
            # Keep the last step: the old log lines are still there after a restart,
            # and only a different step is progress of the new run.
            self.progress = Progress.start(self.clock(), self.progress.step)
            if not restarted:
                self._event("restart_failed", [], {"plan": key})
        self.state.finish(key, DONE, self.clock())

    def _replay(self, key: str, members: Sequence[str], reason: str) -> ReplayOutcome:
        """Replay the stopped job once per plan; a resumed plan reads the verdict back."""
        step = f"{key}/replay"
        action = self.state.intend(step, "replay", None, {}, reason, self.clock())
        if action.state == DONE and action.payload.get("verdict"):
            return ReplayOutcome.from_json(action.payload)
        try:
            outcome = self.hooks.replay([self.inv.node(n) for n in members])
        except BrctlError as exc:
            outcome = ReplayOutcome("incomplete", (), (), f"replay failed: {exc.message}")
        self.state.finish(step, DONE, self.clock(), f"replay {outcome.verdict}: {outcome.reason}"[:2000],
                          payload=outcome.to_json())
        self._event("action_replay", list(outcome.faulty or outcome.candidates),
                    {"key": step, "ok": outcome.verdict != "incomplete", **outcome.to_json()})
        return outcome

    def _after_replay(self, key: str, payload: Mapping[str, Any], outcome: ReplayOutcome) -> None:
        """Carry out what the replay's verdict calls for, as its own recorded plan."""
        sub = f"{key}/after-replay"
        existing = self.state.action(sub)
        if existing is not None:  # decided before a kill -9: the same standbys, no new decision
            if existing.state == "intent":
                self._execute(sub, existing.payload)
            return
        follow = plan_after_replay(outcome)
        members = list(payload["members"])
        self._event("decision", follow.evict, {"plan": follow.to_json(), "replay": outcome.to_json(),
                                               "dry_run": self.dry_run})
        if outcome.verdict != "found":  # nobody proven: a human looks at the evidence
            self._notify("replay", outcome.verdict, None, follow.reason,
                         {"replay": outcome.to_json(), "job": self.job.name})
        why, replacements = self._authorize(follow, members)
        if why is not None:
            self._refuse(f"{sub}/refused", follow, why, None)
            return
        doc = {"plan": follow.to_json(), "members": members, "replacements": replacements,
               "incident": payload["incident"], "follows": key}
        action = self.state.intend(sub, "plan", None, doc, follow.reason, self.clock())
        self._execute(sub, action.payload)

    def _evict(self, members: Sequence[str], node: str, reason: str) -> str:
        fresh = self.state.quarantine(node, reason, "daemon", self.clock())
        detail = self._hook(self.adapter.evict(members, node, reason), "evict_command")
        return detail if fresh else f"already quarantined; {detail}"

    def _swap(self, after: list[str], replacements: Mapping[str, str]) -> str:
        self.state.set_members(after)
        for spare in replacements.values():
            self.state.mark_checked(spare, False, "in the job since a swap", self.clock())
        return ", ".join(f"{a} -> {b}" for a, b in replacements.items())

    # the loop -----------------------------------------------------------------------
    def run(self, *, stop: threading.Event, max_iterations: Optional[int] = None,
            until_step: Optional[int] = None, duration: Optional[float] = None,
            on_poll: Optional[Callable[[PollResult], None]] = None) -> DaemonReport:
        """Poll until ``stop`` is set (SIGTERM), or a limit is reached; returns the report."""
        began = self.clock()
        self.start()
        try:
            while True:
                started = self.clock()
                result = self.poll()
                if on_poll is not None:
                    on_poll(result)
                why = self._done(stop, max_iterations, until_step, duration, began, result)
                if why:
                    self.report.stopped_by = why
                    break
                left = self.cfg.poll_interval - (self.clock() - started)
                if left > 0 and stop.wait(left):
                    self.report.stopped_by = "signal"
                    break
        finally:
            self.report.members = self.members()
            self.report.ettr = ratio(self.state.intervals())
            self.stop()
        return self.report

    def _done(self, stop: threading.Event, max_iterations: Optional[int],
              until_step: Optional[int], duration: Optional[float], began: float,
              result: PollResult) -> Optional[str]:
        if stop.is_set():
            return "signal"
        if max_iterations is not None and self.report.iterations >= max_iterations:
            return "max-iterations"
        if until_step is not None and result.step is not None and result.step >= until_step \
                and result.incident is None:
            return "until-step"
        if duration is not None and self.clock() - began >= duration:
            return "duration"
        return None


def _escalate(finding: Finding, history: Sequence[Decision]) -> Finding:
    """ByteRobust's ladder when diagnose has no stronger verdict.

    A crash again after a reattempt (no new step in between) → roll back the last
    code update; again after the rollback → replay. Diagnose's own evict or
    rollback verdicts stand.
    """
    if finding.decision not in (None, "reattempt"):
        return finding
    if "rollback" in history:
        return Finding("replay", (), "crashed again after a rollback: look for silent data "
                       "corruption (" + (finding.reason or "no fault found") + ")")
    if "reattempt" in history:
        return Finding("rollback", (), "crashed again after a reattempt: roll the last code "
                       "update back (" + (finding.reason or "no fault found") + ")")
    return Finding("reattempt", (), finding.reason or "no fault found: reattempt")


def _bind(fn: Callable[..., str], *args: Any) -> Callable[[], str]:
    """``fn`` with its arguments bound now (a loop variable in a lambda binds late)."""
    return lambda: fn(*args)


@dataclass(frozen=True)
class RunOptions:
    """``brctl daemon run`` options."""

    dry_run: bool = False
    max_iterations: Optional[int] = None
    until_step: Optional[int] = None
    duration: Optional[float] = None
    metrics: bool = True


def serve(inv: Inventory, transport: Transport, state_dir: Path, opts: RunOptions, *,
          timeout_scale: float = 1.0, stop: Optional[threading.Event] = None,
          on_event: Optional[Callable[[dict[str, Any]], None]] = None,
          on_poll: Optional[Callable[[PollResult], None]] = None,
          warn: Callable[[str], None] = lambda _m: None,
          environ: Optional[Mapping[str, str]] = None) -> DaemonReport:
    """Build the daemon for ``inv``'s job and run it until a limit or SIGTERM.

    Raises:
        UsageError: the inventory has no job, or no restart_command (without --dry-run).
        RefusedError: another daemon holds the job's lease.
    """
    from brctl.core.errors import UsageError
    from brctl.operations.daemon_state import owner_id

    if inv.job is None:
        raise UsageError(f"daemon: {inv.source} has no job: section",
                         hint="the daemon watches one job; see inventory.example.yaml")
    if inv.job.restart_command is None and not opts.dry_run:
        raise UsageError(f"daemon: {inv.source}: job.restart_command is not set",
                         hint="the daemon restarts the job through it; or use --dry-run")
    stop = stop or threading.Event()
    store = Store(state_dir)
    metrics = None
    try:
        state = DaemonState(store, inv.job.name)
        cfg = inv.daemon
        log = Path(cfg.event_log).expanduser() if cfg.event_log else state_dir / "daemon-events.jsonl"
        notifier = Notifier(inv.job.name, cfg.notify_webhook, cfg.notify_command)
        daemon = Daemon(inv, state, LiveHooks(inv, transport, store, state_dir, timeout_scale, environ),
                        JobAdapter(inv, cfg.command_timeout * timeout_scale), notifier=notifier,
                        owner=owner_id(), dry_run=opts.dry_run, event_log=log, on_event=on_event)
        if opts.metrics and cfg.metrics_port:
            from brctl.operations.daemon_metrics import MetricsServer

            def pool() -> int:
                checked = {n for n, (ok, _, _) in state.checks().items() if ok}
                return len(pick_standbys(inv.standby, checked=checked, count=len(inv.standby),
                                         quarantined=state.quarantined(), in_use=daemon.members()))

            try:
                metrics = MetricsServer(state, cfg.metrics_address, cfg.metrics_port,
                                        lambda: daemon.health_status, pool)
            except OSError as exc:
                warn(f"/metrics not served on {cfg.metrics_address}:{cfg.metrics_port}: "
                     f"{exc.strerror or exc}; the loop runs without it")
        return daemon.run(stop=stop, max_iterations=opts.max_iterations,
                          until_step=opts.until_step, duration=opts.duration, on_poll=on_poll)
    finally:
        if metrics is not None:
            metrics.close()
        store.close()


@dataclass(frozen=True)
class StatusReport:
    """``brctl daemon status``: the lease, the last poll, recent events and actions."""

    job: str
    lease: Optional[dict[str, Any]]
    last_poll: Optional[float]
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    quarantined: list[dict[str, Any]]
    now: float

    @property
    def alive(self) -> bool:
        """A daemon holds an unexpired lease."""
        return self.lease is not None and float(self.lease["expires"]) > self.now

    @property
    def exit_code(self) -> ExitCode:
        """1 when no daemon watches the job, else 0."""
        return ExitCode.OK if self.alive else ExitCode.FINDINGS

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.daemon-status/1``."""
        return {"job": self.job, "running": self.alive, "lease": self.lease,
                "last_poll": self.last_poll, "summary": self.summary, "events": self.events,
                "actions": self.actions, "quarantined": self.quarantined}


def status(inv: Inventory, state_dir: Path, *, events: int = 20) -> StatusReport:
    """Read the daemon's records for ``inv``'s job (no machine is contacted)."""
    from brctl.core.errors import UsageError

    if inv.job is None:
        raise UsageError(f"daemon status: {inv.source} has no job: section")
    store = Store(state_dir)
    try:
        state = DaemonState(store, inv.job.name)
        last = state.status()
        return StatusReport(
            inv.job.name, state.lease(), last[0] if last else None, last[1] if last else {},
            state.events(events), [a.to_json() for a in state.actions(limit=events)],
            [q.to_json() for q in state.quarantined().values()], time.time())
    finally:
        store.close()
