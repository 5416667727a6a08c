"""The step executor: carries out a recorded plan, step by step, at most once.

A plan (``analysis.daemon.plan``) is a list of steps with fixed targets. For each
step, in order:

1. already ``done`` → skip it (a resumed plan);
2. left as ``intent`` by a daemon that died → ``RESUME[kind]``: run it again
   (idempotent), check its effect first (done, or run again), or mark it
   ``unknown``: the plan is abandoned and a human paged, never run twice;
3. else write its intent, fenced by the lease generation, run it, and write its
   outcome, fenced too.

A step runs only when every step before it succeeded: a failure stops the plan,
the rest is recorded ``skipped``, the plan ``failed``, and a human is paged. The
outcome the loop gets back is what actually happened (the escalation ladder reads
only plans that finished ``done``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from brctl.analysis.daemon.plan import RESUME, STEP_KINDS, PlanRecord, Step
from brctl.analysis.daemon.policy import ReplayOutcome
from brctl.analysis.inventory import Inventory
from brctl.core.errors import BrctlError
from brctl.operations.daemon.hooks import Hooks
from brctl.operations.jobadapter import HookRun, JobAdapter
from brctl.operations.ledger.state import (
    ABANDONED,
    DONE,
    FAILED,
    INTENT,
    UNKNOWN,
    DaemonState,
    StaleTarget,
)

_DETAIL_KEEP = 2000


class Recorder(Protocol):
    """Where the executor reports: the loop's event log and notifier."""

    def event(self, kind: str, nodes: Sequence[str], detail: dict[str, Any]) -> int:
        """Record an event."""
        ...

    def notify(self, kind: str, state: str, node: Optional[str], reason: str,
               detail: Mapping[str, Any]) -> None:
        """Page (best effort, never raises)."""
        ...


@dataclass(frozen=True)
class PlanOutcome:
    """How a plan ended: done | failed | abandoned, why, and whether a restart was begun."""

    state: str
    why: str = ""
    restarted: bool = False


def hook_detail(run: Optional[HookRun], what: str) -> str:
    """A hook's one-line result; raises ``BrctlError`` when it failed."""
    if run is None:
        return f"no {what} configured"
    if not run.ok:
        code = "timed out" if run.exit_code is None else f"exited {run.exit_code}"
        raise BrctlError(f"{what} {' '.join(run.argv)} {code}: {run.output.strip()[-300:]}")
    return f"{what} ok ({run.seconds:.1f}s)"


def _nodes_of(step: Step) -> list[str]:
    return [n for n in str(step.args.get("nodes", "")).split(",") if n]


class Executor:
    """Runs plans for one job under one lease generation."""

    def __init__(self, inv: Inventory, state: DaemonState, hooks: Hooks, adapter: JobAdapter,
                 record: Recorder, generation: Callable[[], Optional[int]],
                 clock: Callable[[], float],
                 after_replay: Callable[[str, PlanRecord, ReplayOutcome], None]) -> None:
        """Args: the job's inventory and records, the hooks, where to report, the lease
        generation to fence with, the clock, and the loop's follow-up of a replay verdict."""
        assert inv.job is not None
        self.inv, self.state, self.hooks, self.adapter = inv, state, hooks, adapter
        self.record, self.generation, self.clock = record, generation, clock
        self.after_replay = after_replay

    def run(self, key: str, doc: PlanRecord) -> PlanOutcome:
        """Carry out the plan recorded under ``key`` (new or resumed)."""
        steps = list(doc.steps)
        reason = doc.plan.reason
        restarted = False
        for i, step in enumerate(steps):
            skey = f"{key}/{step.id}"
            self.state.fence(self.generation())
            rec = self.state.action(skey)
            if rec is not None and rec.damaged:  # what it did cannot be read: a human decides
                return self._close(key, steps[i + 1:], ABANDONED, f"step {step.id}: daemon_"
                                   f"actions row {skey}: {rec.damaged}", restarted)
            if rec is not None and rec.state == DONE:
                if step.kind == "replay":
                    self.after_replay(key, doc, ReplayOutcome.from_json(rec.payload))
                continue
            if rec is not None and rec.state != INTENT:
                return self._close(key, steps[i + 1:], FAILED,
                                   f"step {step.id} was {rec.state}: {rec.reason}", restarted)
            if rec is not None:  # left as intent by a daemon that died: it may have run
                resumed = self._resume(step, doc)
                if resumed == UNKNOWN:
                    why = (f"step {step.id} ({step.kind}) was interrupted after it began; "
                           f"whether it took effect cannot be checked, so it is not run again")
                    self._finish(skey, step, UNKNOWN, why)
                    return self._close(key, steps[i + 1:], ABANDONED, why, restarted)
                if resumed == DONE:
                    self._finish(skey, step, DONE, "found done when the plan was resumed")
                    continue
            try:
                if rec is None:  # a restart lands on no machine quarantined since (brctl evict)
                    self.state.intend(skey, step.kind, step.node, {"args": dict(step.args)},
                                      reason, self.clock(), self.generation(),
                                      _nodes_of(step) if step.kind == "restart" else ())
                ok, detail, payload = self._carry_out(step, doc, reason)
            except StaleTarget as exc:  # what the plan was based on changed: a human decides
                return self._close(key, steps[i:], ABANDONED, f"step {step.id}: {exc.message}",
                                   restarted)
            restarted = restarted or step.kind == "restart"
            self._finish(skey, step, DONE if ok else FAILED, detail, payload)
            self.record.notify(step.kind, DONE if ok else FAILED, step.node, reason,
                               {"key": skey, "detail": detail})
            if not ok:
                return self._close(key, steps[i + 1:], FAILED, f"step {step.id} failed: {detail}",
                                   restarted)
            if step.kind == "replay":
                self.after_replay(key, doc, ReplayOutcome.from_json(payload or {}))
        if doc.plan.decision == "notify":  # e.g. fail-slow with nobody to blame
            self.record.notify(doc.incident_kind or "incident", "needs-attention", None, reason, {})
        self.state.finish(key, DONE, self.clock(), generation=self.generation())
        return PlanOutcome(DONE, "", restarted)

    def _finish(self, skey: str, step: Step, outcome: str, detail: str,
                payload: Optional[dict[str, Any]] = None) -> None:
        self.state.finish(skey, outcome, self.clock(), detail[:_DETAIL_KEEP], payload,
                          self.generation())
        self.record.event(f"action_{step.kind}", [step.node] if step.node else [],
                          {"key": skey, "ok": outcome == DONE, "state": outcome, "detail": detail,
                           **(payload or {})})

    def abandon(self, key: str, doc: Optional[PlanRecord], why: str) -> PlanOutcome:
        """Abandon a recorded plan without running anything: steps left as intent become
        ``unknown`` (they may have run), steps never begun ``skipped``; a page. A record
        that cannot be read (``doc`` None) has its steps found by their keys."""
        rest: list[Step] = []
        if doc is None:
            for row in self.state.unfinished():
                if row.key.startswith(key + "/") and row.kind in STEP_KINDS:
                    self.state.finish(row.key, UNKNOWN, self.clock(),
                                      f"interrupted; not resumed: {why}"[:_DETAIL_KEEP],
                                      generation=self.generation())
        for step in doc.steps if doc is not None else ():
            rec = self.state.action(f"{key}/{step.id}")
            if rec is None:
                rest.append(step)
            elif rec.state == INTENT:
                self._finish(f"{key}/{step.id}", step, UNKNOWN, f"interrupted; not resumed: {why}")
        return self._close(key, rest, ABANDONED, why, False)

    def _close(self, key: str, rest: Sequence[Step], outcome: str, why: str,
               restarted: bool) -> PlanOutcome:
        """End the plan short of its last step: the rest skipped, the plan recorded, a page."""
        for step in rest:
            self.state.skip(f"{key}/{step.id}", step.kind, step.node, {"args": dict(step.args)},
                            f"not run: {why}"[:_DETAIL_KEEP], self.clock(), self.generation())
        self.state.finish(key, outcome, self.clock(), why[:_DETAIL_KEEP], generation=self.generation())
        self.record.event(f"plan_{outcome}", [], {"plan": key, "reason": why,
                                                  "skipped": [s.id for s in rest]})
        self.record.notify("plan", outcome, None, why, {"plan": key,
                                                        "skipped": [s.id for s in rest]})
        return PlanOutcome(outcome, why, restarted)

    def finish_hand_evictions(self, members: Sequence[str]) -> None:
        """Finish the hand evictions a killed ``brctl evict`` left as intent: quarantined, the
        scheduler maybe not told. Where the scheduler shows its drain (Slurm's built-in
        hooks), a drain missing is done now (draining is idempotent); an opaque
        evict_command may have run, so it is not run again: the eviction is marked
        ``unknown`` and a human paged to tell the scheduler. One still running (younger
        than its hooks' timeouts) is left to its own process."""
        now = self.clock()
        for rec in self.state.unfinished():
            if rec.kind != "evict" or rec.payload.get("by") != "hand":
                continue
            nodes = [e.node for e in self.state.eviction_history(self.clock())
                     if e.source == "hand" and e.at == rec.created] or [rec.node or ""]
            if now - rec.created < self.adapter.timeout * (len(nodes) + 1):
                continue
            told = {n: self.adapter.evicted(n) for n in nodes}
            hooks = {n: self.adapter.evict(members, n, rec.reason) for n, t in told.items()
                     if t is False}
            failed = [n for n, run in hooks.items() if run is not None and not run.ok]
            unknown = [n for n, t in told.items() if t is None]
            state = FAILED if failed else UNKNOWN if unknown else DONE
            why = (f"a brctl evict by {rec.payload.get('operator') or 'someone'} was interrupted: "
                   + (f"evict_command failed for {', '.join(failed)}" if failed else
                      f"whether the scheduler was told about {', '.join(unknown)} cannot be "
                      "checked: tell it by hand" if unknown else "the scheduler's drain is done"))
            self.state.finish(rec.key, state, now, why, generation=self.generation())
            self.record.event("hand_evict_finished", nodes, {"key": rec.key, "state": state,
                                                             "reason": why, "ran": sorted(hooks)})
            if state != DONE:
                self.record.notify("evict", state, ",".join(nodes), why, {"key": rec.key})

    # resuming -------------------------------------------------------------------------
    def _resume(self, step: Step, doc: PlanRecord) -> str:
        """What to do with a step a dead daemon left as intent: INTENT (run it again),
        DONE (its effect shows) or UNKNOWN."""
        policy = RESUME[step.kind]
        if policy == "unknown":
            return self._scheduler_says(step, doc)
        if policy == "rerun":
            return INTENT
        if step.kind == "swap":
            now = self.state.members(self.inv.job.nodes if self.inv.job else ())
            if now == doc.expected_members(swapped=True):
                return DONE
            return INTENT if now == doc.expected_members(swapped=False) else UNKNOWN
        if step.kind == "rollback":
            version = step.args.get("version", "")
            return DONE if version and self.hooks.release().version == version else INTENT
        return UNKNOWN

    def _scheduler_says(self, step: Step, doc: PlanRecord) -> str:
        """An opaque step's effect as the scheduler shows it, where the built-in hooks can
        read it back (Slurm): a drain shows → DONE, none → INTENT (draining is idempotent);
        the job pinned to the plan's machines → DONE, else UNKNOWN (never restart twice)."""
        if step.kind == "evict" and step.node is not None:
            drained = self.adapter.evicted(step.node)
            return UNKNOWN if drained is None else (DONE if drained else INTENT)
        if step.kind == "restart":
            pinned = self.adapter.restarted_on(str(step.args.get("nodes", "")).split(","))
            return DONE if pinned else UNKNOWN
        return UNKNOWN

    # the steps ------------------------------------------------------------------------
    def _carry_out(self, step: Step, doc: PlanRecord, reason: str
                   ) -> tuple[bool, str, Optional[dict[str, Any]]]:
        """Run one step: (ok, detail, payload kept with it)."""
        try:
            if step.kind == "replay":
                return self._replay(step)
            return True, self._action(step, doc, reason), None
        except StaleTarget:
            raise
        except BrctlError as exc:
            return False, exc.message, None

    def _nodes(self, names: str) -> list[Any]:
        return [self.inv.node(n) for n in names.split(",") if n]

    def _action(self, step: Step, doc: PlanRecord, reason: str) -> str:
        a = step.args
        members = list(doc.members)
        after = doc.expected_members(swapped=True)
        if step.kind == "evict":
            assert step.node is not None
            return hook_detail(self.adapter.evict(members, step.node, reason), "evict_command")
        if step.kind == "stop":
            return hook_detail(self.adapter.stop(a["nodes"].split(",")), "stop_command")
        if step.kind == "restore":
            return self.hooks.restore(self.inv.node(a["evicted"]), self.inv.node(a["standby"]),
                                      [self.inv.node(n) for n in after])
        if step.kind == "swap":
            before, new = a["before"].split(","), a["after"].split(",")
            spares = [n for n in new if n not in set(before)]
            assert self.inv.job is not None
            if not self.state.swap_members(before, new, self.inv.job.nodes, spares, self.clock(),
                                           self.generation()):
                raise BrctlError("the job's machines changed since the plan was written: "
                                 "no swap (compare-and-set failed)")
            return ", ".join(f"{x} -> {y}" for x, y in zip(before, new) if x != y)
        if step.kind == "apply":
            return self.hooks.apply_updates(self._nodes(",".join(after)), a.get("version", ""),
                                            a.get("sha256", ""))
        if step.kind == "rollback":
            if not a.get("version"):
                raise BrctlError("no earlier release recorded to roll back to: the job keeps "
                                 "its code, and is not restarted on it")
            return self.hooks.rollback(self._nodes(",".join(after)), a["version"], a["sha256"])
        if step.kind == "restart":
            return hook_detail(self.adapter.restart(a["nodes"].split(","), a.get("version", ""),
                                                    reason), "restart_command")
        raise BrctlError(f"step {step.id}: unknown kind {step.kind}")

    def _replay(self, step: Step) -> tuple[bool, str, dict[str, Any]]:
        """Replay the stopped job once; its verdict is kept with the step (a resumed plan
        reads it back). A replay that ran and proved nothing is still a done step."""
        try:
            outcome = self.hooks.replay(self._nodes(step.args["nodes"]))
        except BrctlError as exc:
            outcome = ReplayOutcome("incomplete", (), (), f"replay failed: {exc.message}")
        return True, f"replay {outcome.verdict}: {outcome.reason}", outcome.to_json()
