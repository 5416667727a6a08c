"""``brctl daemon run``: the unattended loop, poll → detect → decide → execute.

One ``Daemon`` watches one job under one lease. Each poll:

1. **poll**: renews the lease (a heartbeat thread renews it too while work runs),
   sweeps health on the job's current machines, reads the tails of its logs (the
   step) and records the interval as productive (a new step) or not, for ETTR;
2. **detect**: ``analysis.daemon.policy.detect`` → an incident (a GPU fault, a machine
   evicted by hand, a crash, a hang, fail-slow);
3. **decide**: analyses it (stacks for a hang or fail-slow, the diagnose ladder for
   a crash, fed the crash plans actually carried out), ``plan_for`` → a plan,
   ``analysis.daemon.plan.steps_for`` → its steps with targets fixed now; the
   caps are checked and the plan recorded in one transaction (``admit``);
4. **execute**: ``operations.daemon.steps.Executor`` carries the steps out, each
   recorded before and after, fenced by the lease generation.

A daemon that starts takes the lease (at once from a holder proven dead, see
``operations.daemon.lease``) and re-decides every unfinished plan: too old, or
based on machines or a quarantine that changed → abandoned with a page; else
resumed, step by step, never running an opaque step twice. A refusal (caps,
restarts without progress, no checked standby) or an abandoned plan is recorded,
paged, and stops further actions: the daemon stays up, keeps observing and
reporting (status, /metrics), and exits 4 when stopped. The halt is recorded and
outlives the daemon (kill -9, OOM, a systemd restart) until ``brctl daemon rearm``:
what it halted on is a human's. A ``brctl evict`` killed midway is finished at the
next poll (``Executor.finish_hand_evictions``). A daemon that lost its
lease stops before its next step and exits 4. ``--dry-run`` takes no lease and
writes nothing the live daemon reads: it decides and reports only.

The machines are behind ``Hooks`` (``operations.daemon.hooks``) so the loop is
tested with scripted ones; ``LiveHooks`` wires the real operations, and
``operations.daemon.serve.serve`` the live daemon (notifier, event log, /metrics).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.daemon.plan import Holder, PlanRecord, Release, resume_refusal, steps_for
from brctl.analysis.daemon.policy import (
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
    shortfall,
)
from brctl.analysis.diagnose.decide import Decision, PastConclusion
from brctl.analysis.ettr import ratio
from brctl.analysis.inventory import Inventory
from brctl.core.transport import Node
from brctl.operations.daemon.hooks import Hooks
from brctl.operations.daemon.lease import Heartbeat, proven_dead, this_holder
from brctl.operations.daemon.report import DaemonReport, PollResult
from brctl.operations.daemon.report import StatusReport as StatusReport  # brctl daemon status
from brctl.operations.daemon.report import status as status
from brctl.operations.daemon.steps import Executor, PlanOutcome
from brctl.operations.jobadapter import JobAdapter, Notifier
from brctl.operations.ledger.audit import append_private
from brctl.operations.ledger.state import ABANDONED, DONE, INTENT, DaemonState, LeaseLost

FAIL_SLOW_ROUNDS = 3  # stack rounds for fail-slow (brctl stacks --rounds), one poll apart


class Daemon:
    """The loop for one job (see the module docstring)."""

    def __init__(self, inv: Inventory, state: DaemonState, hooks: Hooks, adapter: JobAdapter, *,
                 notifier: Optional[Notifier] = None, owner: str, dry_run: bool = False,
                 event_log: Optional[Path] = None, clock: Callable[[], float] = time.time,
                 on_event: Optional[Callable[[dict[str, Any]], None]] = None,
                 holder: Optional[Holder] = None,
                 dead: Callable[[Optional[dict[str, Any]]], Optional[str]] = proven_dead) -> None:
        """Args: see the attributes; ``on_event`` sees every recorded event (stderr lines);
        ``holder`` is this process as recorded with the lease (default: this process);
        ``dead`` proves a recorded holder dead (default: ``/proc``)."""
        assert inv.job is not None
        self.inv = inv
        self.job = inv.job
        self.cfg = inv.daemon
        self.state = state
        self.hooks = hooks
        self.adapter = adapter
        self.notifier = notifier
        self.owner = owner
        self.holder = holder if holder is not None else this_holder()
        self.dead = dead
        self.dry_run = dry_run
        self.event_log = event_log
        self.clock = clock
        self.on_event = on_event
        self.generation: Optional[int] = None
        self.heartbeat: Optional[Heartbeat] = None
        self.progress = Progress.start(clock())
        self.last_poll: Optional[float] = None  # the ETTR baseline: the start, then each poll
        self.polled: Optional[float] = None  # when the loop last polled (for /metrics)
        self.last_signature: Optional[tuple[str, tuple[str, ...]]] = None
        self.crash_history: list[tuple[Decision, str, float]] = []  # carried out since the last step
        self.restarts_without_progress = 0
        self.halted: Optional[str] = None
        self.health_status: dict[str, str] = {}
        # The scheduler's view (job.slurm), read once per poll: its allocation wins over
        # the recorded swaps; a mismatch and a requeue the daemon did not ask for are said once.
        self.allocation: Any = None
        self.mismatch_said: Optional[tuple[str, ...]] = None
        self.restarts_seen: Optional[int] = None
        self.queued_said: Optional[str] = None  # the scheduler's wait, said once per wait
        self.report = DaemonReport(job=self.job.name)
        self.executor = Executor(inv, state, hooks, adapter, self, lambda: self.generation, clock,
                                 self._after_replay)

    # recording (the executor's Recorder) ------------------------------------------------
    def event(self, kind: str, nodes: Sequence[str], detail: dict[str, Any]) -> int:
        """Record an event (a dry run only shows it: it writes nowhere the live daemon reads)."""
        at = self.clock()
        event_id = 0 if self.dry_run else self.state.event(kind, nodes, detail, at)
        doc = {"id": event_id, "at": at, "job": self.job.name, "kind": kind, "nodes": list(nodes),
               "detail": detail}
        if self.event_log is not None and not self.dry_run:
            try:
                append_private(self.event_log, json.dumps(doc, default=str) + "\n")
            except OSError as exc:  # disk full: the database holds the event; the plan goes on
                print(f"brctl daemon: event log {self.event_log}: {exc.strerror or exc}",
                      file=sys.stderr)
        if self.on_event is not None:
            self.on_event(doc)
        return event_id

    def notify(self, kind: str, state: str, node: Optional[str], reason: str,
               detail: Mapping[str, Any]) -> None:
        """Page; best effort, never raises into the loop (a failure is an event)."""
        if self.notifier is None or self.dry_run:
            return
        try:
            errors = self.notifier.send(kind, state, node, reason, detail)
        except Exception as exc:  # a notifier bug must not stop a plan midway
            errors = [f"notifier: {type(exc).__name__}"]
        if errors:
            self.event("notify_failed", [node] if node else [], {"errors": errors})

    # lifecycle ------------------------------------------------------------------------
    def members(self) -> list[str]:
        """The job's machines now: the scheduler's running allocation when it has one that
        brctl can address, else the recorded list (after swaps)."""
        recorded = self.state.members(self.job.nodes)
        seen = self.allocation
        if seen is None or not seen.running or not seen.nodes \
                or any(n not in self.inv.nodes for n in seen.nodes):
            return recorded
        return list(seen.nodes)

    def _read_scheduler(self) -> None:
        """Refresh the scheduler's view; say a mismatch with the record, and a requeue the
        daemon did not ask for, once each."""
        self.allocation = seen = self.adapter.allocation()
        if seen is None:
            return
        recorded = self.state.members(self.job.nodes)
        if seen.running and list(seen.nodes) != recorded and tuple(seen.nodes) != self.mismatch_said \
                and all(n in self.inv.nodes for n in seen.nodes):
            self.mismatch_said = tuple(seen.nodes)
            self.event("membership_mismatch", list(seen.nodes), {
                "recorded": recorded, "scheduler": list(seen.nodes), "wins": "scheduler"})
            if not self.dry_run:  # the record follows, so a plan's swap compares like with like
                self.state.set_members(list(seen.nodes), self.generation)
        if self.restarts_seen is not None and seen.restarts > self.restarts_seen:
            why = (f"the scheduler requeued the job ({seen.state}, restart {seen.restarts}) "
                   "without brctl asking")
            self.event("scheduler_requeue", [], {"reason": why, "state": seen.state,
                                                 "restarts": seen.restarts})
            self.notify("scheduler_requeue", seen.state, None, why, {"restarts": seen.restarts})
        self.restarts_seen = seen.restarts

    def _queued(self, now: float) -> bool:
        """Whether the scheduler holds the job in its queue (PENDING after a requeue, waiting
        for resources or its BeginTime). No process anywhere is then a wait, not a crash,
        and no new step not a hang: the stall clock and the start-up grace begin when it
        runs again. Said once per wait."""
        seen = self.allocation
        if seen is None or not seen.waiting:
            self.queued_said = None
            return False
        self.progress = Progress.start(now, self.progress.step)
        why = f"{seen.state} ({seen.reason})" if seen.reason else seen.state
        if self.queued_said != why:
            self.queued_said = why
            self.event("job_queued", [], {
                "reason": f"the scheduler holds the job in its queue: {why}; no process is "
                          "not a crash and no step not a hang until it runs",
                "state": seen.state, "scheduler_reason": seen.reason, "restarts": seen.restarts})
        return True

    def start(self) -> None:
        """Take the lease, re-decide unfinished plans, self-check unchecked standbys.

        Raises:
            RefusedError: another daemon holds the job's lease and is not proven dead.
        """
        now = self.clock()
        took_over = None
        if not self.dry_run:
            lease = self.state.acquire_lease(
                self.owner, self.holder.to_json() if self.holder else None, now,
                self.cfg.lease_ttl, self.dead)
            self.generation, took_over = lease.generation, lease.took_over
            # renewed from now on: resuming a plan or checking the pool outlasts the TTL
            self.heartbeat = Heartbeat(self.state, self.generation, self.cfg.lease_ttl, self.clock)
        self.last_poll = now  # ETTR counts from here: finishing a plan is not training time
        self.halted = self.state.halt()  # a halt survives a restart until brctl daemon rearm
        self._refresh_counters()
        self.event("daemon_start", [], {"owner": self.owner, "dry_run": self.dry_run,
                                        "generation": self.generation, "took_over": took_over,
                                        "members": self.members()})
        if not self.dry_run:
            self._resume_all()
            self._check_pool()

    def _refresh_counters(self) -> None:
        """The restart cap and the escalation ladder, read back from the records (they
        survive a kill -9 and count only what was carried out) since the job last made
        progress, or since a human re-armed the daemon (the halt they lifted was theirs,
        and so is what they did about it: the count starts again)."""
        since = max(self.state.last_progress(), self.state.last_rearm())
        self.restarts_without_progress = self.state.restarts_since(since)
        self.crash_history = self.state.crash_history(since)

    def _resume_all(self) -> None:
        for action in self.state.unfinished():
            current = self.state.action(action.key)  # a parent plan may have finished it
            if action.kind != "plan" or current is None or current.state != INTENT:
                continue
            if current.damaged:  # nobody can say what it would do: a human decides
                self._after_plan(self.executor.abandon(
                    current.key, None, f"not resumed: daemon_actions row {current.key}: "
                                       f"{current.damaged}"))
                continue
            parent = current.payload.get("follows")
            if parent and (p := self.state.action(str(parent))) is not None and p.state == INTENT:
                continue  # the parent resumes its follow-up itself
            self._resume(current.key, current.payload, current.created)

    def _resume(self, key: str, payload: Mapping[str, Any], written: float) -> None:
        """Re-decide an unfinished plan: abandon it with a page, or carry it on."""
        try:
            doc = PlanRecord.from_json(payload)
        except ValueError as exc:  # unreadable: nobody can say what it would do, a human decides
            self._after_plan(self.executor.abandon(key, None, f"not resumed: {exc}"))
            return
        states = {s.id: (a.state if (a := self.state.action(f"{key}/{s.id}")) else None)
                  for s in doc.steps}
        kinds: dict[str, str] = {s.id: s.kind for s in doc.steps}
        why = resume_refusal(
            doc, written=written, now=self.clock(), max_age=self.cfg.max_plan_age,
            members=self.members(), swapped=_swapped(kinds, states),
            quarantined=self.state.quarantined(self.clock()),
            restart_pending=any(kinds[i] == "restart" and st is None for i, st in states.items()),
            restarts_without_progress=self.restarts_without_progress,
            max_restarts=self.cfg.max_restarts_without_progress)
        if self.halted is not None:  # a human owns the job until brctl daemon rearm
            why = f"the daemon is halted: {self.halted}"
        self.event("resume", [], {"plan": key, "abandon": why})
        self.report.resumed.append(key)
        if why is not None:
            self._after_plan(self.executor.abandon(key, doc, f"not resumed: {why}"))
            return
        self._after_plan(self.executor.run(key, doc))

    def _check_pool(self) -> None:
        checks = self.state.checks()
        quarantined = self.state.quarantined(self.clock())
        members = set(self.members())
        todo = [self.inv.node(n) for n in self.inv.standby
                if n not in checks and n not in quarantined and n not in members]
        if not todo:
            return
        results = self.hooks.check(todo)
        for name, (outcome, detail) in results.items():  # minutes passed: fenced, each write
            self.state.mark_checked(name, outcome == "checked", detail, self.clock(), outcome,
                                    generation=self.generation)
        self.event("standby_check", list(results), {
            n: {"ok": outcome == "checked", "outcome": outcome, "detail": d}
            for n, (outcome, d) in results.items()})

    def stop(self) -> None:
        """Give the lease back (clean exit; a lost lease is not ours to give)."""
        self.event("daemon_stop", [], {"stopped_by": self.report.stopped_by})
        if self.generation is not None and not self.report.lease_lost:
            self.state.release_lease(self.generation)

    # poll → detect → decide → execute -------------------------------------------------
    def poll(self) -> PollResult:
        """Observe once, and handle what is found.

        Raises:
            LeaseLost: another daemon took the job's lease over.
        """
        self._keep_lease()
        if self.halted is not None and not self.dry_run:
            self.halted = self.state.halt()  # brctl daemon rearm lifts it
            if self.halted is None:  # re-armed: what it sees now is news again
                self.last_signature = None
                self._refresh_counters()
        self._read_scheduler()
        members = self.members()
        if not self.dry_run:
            self.executor.finish_hand_evictions(members)
        nodes = [self.inv.node(n) for n in members]
        health = self.hooks.health(nodes)
        self.health_status = dict(health.status)
        tails = self.hooks.log_tails(nodes)
        step = job_step({n: last_step(t, self.cfg.progress_regex) for n, t in tails.items()})
        status = self.adapter.running(members)
        now = self.clock()
        self.progress, moved = observe(self.progress, step, now, self.cfg.fail_slow_window)
        if self.last_poll is not None and not self.dry_run:
            self.state.add_interval(self.last_poll, now, moved, generation=self.generation)
        self.last_poll = self.polled = now
        running = None if self._queued(now) else status if status is not None else health.running
        if moved:
            self.restarts_without_progress = 0
            self.crash_history = []
        quarantined = {n: (f"hand: {e.operator or 'someone'}: {e.reason}" if e.source == "hand"
                           else e.source) for n, e in self.state.quarantined(self.clock()).items()}
        obs = Observation(now, health.evict, health.unanswered, step, running, health.stopped_on,
                          quarantined)
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
        if not self.dry_run:
            self.state.save_status(self.status_doc(step, running), now, generation=self.generation)
        self.report.iterations += 1
        return result

    def _keep_lease(self) -> None:
        if self.dry_run or self.generation is None:
            return
        lost = self.heartbeat is not None and self.heartbeat.lost.is_set()
        if lost or not self.state.renew_lease(self.generation, self.clock(), self.cfg.lease_ttl):
            self.state.fence(self.generation)  # raises LeaseLost naming the new holder
            raise LeaseLost(f"daemon: lost the lease of job {self.job.name!r}")

    def status_doc(self, step: Optional[int], running: Optional[bool]) -> dict[str, Any]:
        """The summary ``brctl daemon status`` shows."""
        intervals = self.state.intervals()
        return {"owner": self.owner, "generation": self.generation, "step": step,
                "running": running, "members": self.members(), "halted": self.halted,
                "dry_run": self.dry_run, "health": self.health_status,
                "restarts_without_progress": self.restarts_without_progress,
                "ettr": ratio(intervals), "poll_interval": self.cfg.poll_interval}

    def _analyse(self, incident: Incident, nodes: Sequence[Node]) -> Finding:
        if incident.kind == "crash":
            return self.hooks.diagnose(nodes, [PastConclusion(symptom, decision, at)
                                               for decision, symptom, at in self.crash_history])
        if incident.kind == "hang":
            return self.hooks.stacks(nodes, 1)
        if incident.kind == "fail_slow":  # arrival times first; the stack rounds' vote after
            return self.hooks.stacks(nodes, FAIL_SLOW_ROUNDS, arrival_first=True)
        return Finding()

    def _handle(self, incident: Incident, nodes: Sequence[Node], result: PollResult) -> None:
        event_id = self.event(incident.kind, incident.nodes, {"reason": incident.reason})
        if self.halted is not None:
            # A human owns the job: no diagnose ladder or replay on its machines behind their
            # back (minutes of dcgmi and collectives), no plan; the new incident is paged.
            result.refused = (f"the daemon is halted ({self.halted}): no analysis or action until "
                              "brctl daemon rearm")
            self._refused(result.refused, incident.nodes, {"incident": incident.to_json()})
            return
        finding = self._analyse(incident, nodes)
        if incident.kind not in ("gpu_fault", "hand_evict"):
            self.event("analysis", finding.faulty, {"decision": finding.decision,
                                                    "reason": finding.reason})
        previous = self.crash_history[-1][0] if self.crash_history else None
        plan = plan_for(incident, finding, previous)
        result.plan = plan
        self.event("decision", plan.evict, {"plan": plan.to_json(), "incident": event_id,
                                            "dry_run": self.dry_run})
        by_hand = incident.nodes if incident.kind == "hand_evict" else ()
        doc = {"incident": incident.to_json(), "symptom": finding.symptom,
               "source": "hand" if by_hand else "daemon",
               "by": tuple(sorted({self.state.quarantined(self.clock())[n].operator or "" for n in by_hand}))}
        why = self._admit(f"{self.job.name}/plan/{event_id}", plan, [n.name for n in nodes], doc,
                          stop=True, by_hand=by_hand)
        if why is not None:
            result.refused = why

    def _admit(self, key: str, plan: Plan, members: Sequence[str], extra: Mapping[str, Any], *,
               stop: bool, by_hand: Sequence[str] = ()) -> Optional[str]:
        """Fix the plan's targets, check the caps and record it in one transaction, then
        carry it out; the refusal, or None."""
        spares = pick_standbys(self.inv.standby, in_use=members, count=len(plan.evict),
                               checked=[n for n, (ok, _, _) in self.state.checks().items() if ok],
                               quarantined=self.state.quarantined(self.clock()))
        replacements = dict(zip(plan.evict, spares))
        short = shortfall(plan, spares)
        counted = replace(plan, evict=tuple(n for n in plan.evict if n not in set(by_hand)))

        def caps(eviction_times: list[float]) -> Optional[str]:
            return self.halted or short or refusal(
                counted, now=self.clock(), eviction_times=eviction_times, job_size=len(members),
                restarts_without_progress=self.restarts_without_progress, cfg=self.cfg)

        release = self.hooks.release() if plan.restart or plan.decision == "rollback" else Release()
        steps = steps_for(plan, members=members, replacements=replacements, release=release,
                          stop=stop and self.job.stop_command is not None, already_evicted=by_hand)
        doc = PlanRecord(plan, steps, tuple(members), replacements, **extra)
        if self.dry_run:  # decide and show; record nothing
            why = caps([e.at for e in self.state.eviction_history(self.clock())])
        else:
            why = self.state.admit(key, doc.to_json(), plan.reason, self.clock(), evict=counted.evict,
                                   source="daemon", operator=None, caps=caps,
                                   generation=self.generation)
        if why is not None:
            self._refused(why, plan.evict, {"plan": plan.to_json()})
            return why
        if not self.dry_run:
            self._after_plan(self.executor.run(key, doc))
        return None

    def _refused(self, why: str, nodes: Sequence[str], detail: Mapping[str, Any]) -> None:
        """Record, page and halt on a refusal (``detail``: the plan, or the incident)."""
        self.report.refusals.append(why)
        self.event("refused", nodes, {"reason": why, **detail})
        self.notify("refused", "refused", None, why, detail)
        self._halt(why)

    def _halt(self, why: str) -> None:
        if self.halted is None:
            self.halted = why
            self.event("halted", [], {"why": why, "reason": "further actions stop, across "
                                      "restarts, until a human runs brctl daemon rearm: " + why})

    def _after_plan(self, outcome: PlanOutcome) -> None:
        if self.last_poll is not None:  # the plan's time is repair time, not training time
            end = self.clock()
            self.state.add_interval(self.last_poll, end, False, generation=self.generation)
            self.last_poll = end
        self._refresh_counters()
        if outcome.restarted:
            self.restarts_seen = None  # its own requeue is not news: count from the next poll
            # Keep the last step: the old log lines are still there after a restart,
            # and only a different step is progress of the new run.
            self.progress = Progress.start(self.clock(), self.progress.step)
        if outcome.state == ABANDONED:
            self.report.refusals.append(f"plan abandoned: {outcome.why}")
            self._halt(f"a plan was abandoned: {outcome.why}")

    def _after_replay(self, key: str, doc: PlanRecord, outcome: ReplayOutcome) -> None:
        """What the replay's verdict calls for, as a plan of its own (caps, records)."""
        sub = f"{key}/after-replay"
        existing = self.state.action(sub)
        if existing is not None:  # decided before a kill -9: the same standbys, no new decision
            if existing.state == INTENT:
                self._resume(sub, existing.payload, existing.created)
            return
        follow = plan_after_replay(outcome)
        self.event("decision", follow.evict, {"plan": follow.to_json(), "replay": outcome.to_json(),
                                              "dry_run": self.dry_run})
        if outcome.verdict != "found":  # nobody proven: a human looks at the evidence
            self.notify("replay", outcome.verdict, None, follow.reason,
                        {"replay": outcome.to_json(), "job": self.job.name})
        extra = {"incident": doc.incident, "symptom": doc.symptom, "follows": key}
        self._admit(sub, follow, list(doc.members), extra, stop=False)

    # the loop -------------------------------------------------------------------------
    def run(self, *, stop: threading.Event, max_iterations: Optional[int] = None,
            until_step: Optional[int] = None, duration: Optional[float] = None,
            on_poll: Optional[Callable[[PollResult], None]] = None) -> DaemonReport:
        """Poll until ``stop`` is set (SIGTERM), a limit is reached or the lease is lost.

        Raises:
            RefusedError: another daemon holds the job's lease (at start).
        """
        began = self.clock()
        try:
            self.start()  # inside: a lease lost while resuming a plan is one too
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
        except LeaseLost as exc:  # stop before the next step; the new holder carries on
            self.report.lease_lost = exc.message
            self.report.stopped_by = "lease-lost"
            self.event("lease_lost", [], {"reason": exc.message, "generation": self.generation})
        finally:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            if self.generation is not None or self.dry_run:  # a refused start holds nothing
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


def _swapped(kinds: Mapping[str, str], states: Mapping[str, Optional[str]]) -> Optional[bool]:
    """Whether a plan's swap is recorded done (None: interrupted, it may have happened)."""
    swap = [st for i, st in states.items() if kinds[i] == "swap"]
    if swap and swap[0] == INTENT:
        return None
    return bool(swap) and swap[0] == DONE
