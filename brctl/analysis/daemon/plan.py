"""A daemon plan as steps with fixed targets, and the rules of resuming one (pure).

The loop decides a ``Plan`` (``analysis.daemon.policy.plan_for``); ``steps_for`` turns it
into the steps the executor carries out, each with its targets fixed when the plan
is written: evict these machines, restore that machine's shards onto this standby,
swap A→B in the membership, switch to version V (sha256), restart on exactly this
machine list. Each step runs only when every step before it succeeded.

A daemon restarted after ``kill -9`` may find a step written as intent and never
finished: it may have run, partly or wholly. ``RESUME`` says what a resumed daemon
does with each kind:

- ``rerun``: idempotent by construction (the same verified backup onto the same
  standby; a switch to a fixed version; a replay of the stopped job), run again.
- ``check``: the step's effect can be read back (the recorded membership, the job's
  recorded version): done if it shows, else run it again.
- ``unknown``: an opaque hook (``evict_command``, ``stop_command``,
  ``restart_command``): it may have run, so it is never run twice; the plan is
  abandoned and a human paged.

Resuming is a re-decision (``resume_refusal``): a plan older than
``daemon.max_plan_age``, or based on a membership or quarantine that changed since
(a standby of its quarantined too), is abandoned with a page instead. While a plan
runs, the swap and the restart re-check their targets in the transaction that
records them (operations.ledger.state: ``StaleTarget``). ``PlanRecord`` is the plan
as recorded; one that cannot be read is abandoned, never a ``KeyError``.

``holder_dead`` proves a lease holder dead from facts about its process (same host,
same boot, same PID namespace, and its pid gone or started at another time), so a
restarted daemon takes over at once instead of waiting for the lease to expire.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, get_args

from brctl.analysis.daemon.policy import Plan, swap_members
from brctl.analysis.diagnose.decide import Decision

StepKind = Literal["evict", "stop", "restore", "swap", "apply", "rollback", "replay", "restart"]
STEP_KINDS: tuple[StepKind, ...] = ("evict", "stop", "restore", "swap", "apply", "rollback",
                                    "replay", "restart")
Resume = Literal["rerun", "check", "unknown"]

RESUME: Mapping[StepKind, Resume] = {
    "evict": "unknown",  # evict_command told the scheduler, or not: nobody can say
    "stop": "unknown",  # stop_command is opaque
    "restore": "rerun",  # the same verified backup onto the same standby converges
    "swap": "check",  # the recorded membership shows it
    "apply": "rerun",  # a switch to version V by sha256 leaves machines already on V alone
    "rollback": "check",  # the job's recorded version shows it; else switch to=V again
    "replay": "rerun",  # a measurement on the stopped job, recorded with its verdict
    "restart": "unknown",  # restart_command is opaque: never twice
}


@dataclass(frozen=True)
class Step:
    """One step of a plan; ``id`` is unique in the plan, ``args`` its fixed targets."""

    id: str
    kind: StepKind
    node: Optional[str] = None
    args: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """``{id, kind, node, args}``."""
        return {"id": self.id, "kind": self.kind, "node": self.node, "args": dict(self.args)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Step:
        """The inverse of ``to_json``."""
        kind = str(doc["kind"])
        if kind not in STEP_KINDS:
            raise ValueError(f"unknown step kind {kind!r}")
        node = doc.get("node")
        return cls(str(doc["id"]), kind, None if node is None else str(node),
                   {str(k): str(v) for k, v in dict(doc.get("args") or {}).items()})


@dataclass(frozen=True)
class Release:
    """The job's code: its recorded version and the targets a plan may switch to.

    Attributes:
        version: the job's recorded version (None: never updated through brctl).
        pending: (version, sha256) of a pending lazy release, or None.
        current: (version, sha256) of the recorded version, or None.
        previous: (version, sha256) a rollback goes back to, or None (no earlier release).
    """

    version: Optional[str] = None
    pending: Optional[tuple[str, str]] = None
    current: Optional[tuple[str, str]] = None
    previous: Optional[tuple[str, str]] = None


def steps_for(plan: Plan, *, members: Sequence[str], replacements: Mapping[str, str],
              release: Release, stop: bool, already_evicted: Iterable[str] = ()) -> tuple[Step, ...]:
    """The steps of ``plan`` with their targets fixed now.

    Args:
        plan: what was decided.
        members: the job's machines when the plan is written (rank order).
        replacements: evicted machine → the checked standby that takes its place.
        release: the job's code now (the version a rollback or an apply switches to).
        stop: run ``stop_command`` before touching the job (configured, and not a
            follow-up plan of a job already stopped).
        already_evicted: machines a human evicted by hand (no evict step of ours).
    """
    done_by_hand = set(already_evicted)
    after = swap_members(members, replacements)
    steps = [Step(f"evict/{n}", "evict", n) for n in plan.evict if n not in done_by_hand]
    if stop and (plan.restart or plan.decision == "replay"):
        steps.append(Step("stop", "stop", None, {"nodes": ",".join(members)}))
    for evicted, spare in replacements.items():
        steps.append(Step(f"restore/{spare}", "restore", spare, {"evicted": evicted, "standby": spare}))
    if replacements:
        steps.append(Step("swap", "swap", None, {"before": ",".join(members), "after": ",".join(after)}))
    version = release.version or ""
    if plan.decision == "rollback":
        version, sha256 = release.previous or ("", "")
        steps.append(Step("rollback", "rollback", None, {"version": version, "sha256": sha256}))
    elif plan.restart:
        # a restart is when lazy updates land; standbys catch up to the job's release
        version, sha256 = release.pending or release.current or ("", "")
        steps.append(Step("apply", "apply", None, {"version": version, "sha256": sha256}))
    if plan.decision == "replay":
        steps.append(Step("replay", "replay", None, {"nodes": ",".join(members)}))
    if plan.restart:
        steps.append(Step("restart", "restart", None, {"nodes": ",".join(after), "version": version}))
    return tuple(steps)


@dataclass(frozen=True)
class PlanRecord:
    """A plan as the action log holds it (the payload of its ``plan`` row): what was decided
    about which incident, on which machines, with which standbys, as which steps.

    Attributes:
        plan: the decision, the machines it evicts, why, whether it restarts the job.
        steps: its steps with their targets fixed (``steps_for``).
        members: the job's machines when it was written (rank order).
        replacements: evicted machine → the checked standby taking its place.
        incident: the incident's JSON (kind, nodes, reason); None for none.
        symptom: the diagnose playbook that classified a crash ("" otherwise).
        source: daemon | hand (a ``brctl evict`` the daemon finishes).
        by: the operators of the hand evictions it finishes.
        follows: the plan whose replay verdict this one carries out, or None.
    """

    plan: Plan
    steps: tuple[Step, ...]
    members: tuple[str, ...]
    replacements: Mapping[str, str] = field(default_factory=dict)
    incident: Optional[Mapping[str, Any]] = None
    symptom: str = ""
    source: str = "daemon"
    by: tuple[str, ...] = ()
    follows: Optional[str] = None

    @property
    def incident_kind(self) -> str:
        """The incident's kind ("" when none is recorded)."""
        return str((self.incident or {}).get("kind", ""))

    def expected_members(self, swapped: bool) -> list[str]:
        """The job's machines the plan expects to find: before its swap, or after it."""
        before = list(self.members)
        return swap_members(before, dict(self.replacements)) if swapped else before

    def to_json(self) -> dict[str, Any]:
        """``{incident, symptom, source, by, plan, members, replacements, steps[, follows]}``."""
        doc: dict[str, Any] = {
            "incident": dict(self.incident) if self.incident is not None else None,
            "symptom": self.symptom, "source": self.source, "by": list(self.by),
            "plan": self.plan.to_json(), "members": list(self.members),
            "replacements": dict(self.replacements), "steps": [s.to_json() for s in self.steps]}
        if self.follows is not None:
            doc["follows"] = self.follows
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> PlanRecord:
        """The inverse of ``to_json``.

        Raises:
            ValueError: the record is malformed (a key missing or of the wrong type), e.g.
                written by a damaged database or another brctl; the caller abandons it.
        """
        try:
            plan = doc["plan"]
            decision, reason, restart = plan["decision"], plan["reason"], plan["restart"]
            if decision not in _literals(Decision) or not isinstance(reason, str) \
                    or not isinstance(restart, bool):
                raise ValueError("plan.decision, plan.reason or plan.restart is out of shape")
            incident = doc.get("incident")
            if incident is not None and not isinstance(incident, Mapping):
                raise ValueError("incident is not an object")
            follows = doc.get("follows")
            return cls(
                Plan(decision, _names(plan.get("evict", [])), reason, restart),
                tuple(Step.from_json(s) for s in _list(doc["steps"])), _names(doc["members"]),
                {str(k): str(v) for k, v in dict(doc.get("replacements") or {}).items()},
                incident, str(doc.get("symptom") or ""), str(doc.get("source") or "daemon"),
                _names(doc.get("by") or []), None if follows is None else str(follows))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed plan record: {type(exc).__name__}: {exc}") from None


def _literals(tp: Any) -> set[Any]:
    """The values of a ``Literal`` type, or of a union of them."""
    args = get_args(tp)
    return set().union(*(_literals(a) if get_args(a) else {a} for a in args))


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(n) for n in _list(value))


def expected_members(record: PlanRecord, swapped: bool) -> list[str]:
    """The job's machines ``record`` expects to find: before its swap, or after it."""
    return record.expected_members(swapped)


def resume_refusal(doc: PlanRecord, *, written: float, now: float, max_age: float,
                   members: Sequence[str], swapped: Optional[bool], quarantined: Iterable[str],
                   restart_pending: bool, restarts_without_progress: int,
                   max_restarts: int) -> Optional[str]:
    """Why an unfinished plan must be abandoned rather than resumed, or None.

    Args:
        doc: the plan as recorded (``PlanRecord``).
        written: when it was written.
        now: the time now.
        max_age: ``daemon.max_plan_age``.
        members: the job's machines now.
        swapped: the plan's swap step is recorded done (None: it was interrupted, so
            either list may hold; the swap step checks which).
        quarantined: machines with an open quarantine record now.
        restart_pending: the plan's restart is still to run.
        restarts_without_progress: restarts since the job's last new step.
        max_restarts: ``daemon.max_restarts_without_progress``.
    """
    age = now - written
    if age > max_age:
        return (f"written {_age(age)} ago, older than daemon.max_plan_age ({_age(max_age)}): "
                "what it was based on is stale; a human decides")
    expected = [expected_members(doc, s) for s in ((False, True) if swapped is None else (swapped,))]
    if list(members) not in expected:
        return (f"the job's machines changed since it was written (now {','.join(members)}, "
                f"expected {' or '.join(','.join(e) for e in expected)})")
    out = set(quarantined)
    released = [n for n in doc.plan.evict if n not in out]
    if released:
        return f"{', '.join(released)} left quarantine since it was written"
    spares = [n for n in doc.replacements.values() if n in out]
    if spares:
        return f"standby {', '.join(spares)} was quarantined since it was written"
    if restart_pending and restarts_without_progress >= max_restarts:
        return (f"{restarts_without_progress} restarts without a new step "
                f"(max_restarts_without_progress {max_restarts})")
    return None


def _age(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


@dataclass(frozen=True)
class Holder:
    """A lease holder's process, as recorded with the lease.

    ``pidns`` is the inode of its PID namespace (``/proc/self/ns/pid``): the same pid
    means the same process only inside one namespace. ``start`` is its start time in
    clock ticks since boot (``/proc/<pid>/stat`` field 22): a reused pid has another.
    """

    host: str
    boot_id: str
    pidns: int
    pid: int
    start: int

    def to_json(self) -> dict[str, Any]:
        """``{host, boot_id, pidns, pid, start}``."""
        return {"host": self.host, "boot_id": self.boot_id, "pidns": self.pidns,
                "pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, doc: Optional[Mapping[str, Any]]) -> Optional[Holder]:
        """The holder recorded with a lease, or None when it is missing or malformed."""
        if not doc:
            return None
        try:
            return cls(str(doc["host"]), str(doc["boot_id"]), int(doc["pidns"]), int(doc["pid"]),
                       int(doc["start"]))
        except (KeyError, TypeError, ValueError):
            return None


def holder_dead(holder: Optional[Holder], here: Holder, start_now: Optional[int]) -> Optional[str]:
    """Why ``holder`` is provably dead, or None when it may be alive.

    Args:
        holder: the lease holder as recorded (None: nothing recorded, nothing proven).
        here: this process.
        start_now: the start time of ``holder.pid`` as this process sees it now (None:
            no such pid); only meaningful in the same host, boot and PID namespace.
    """
    if holder is None or holder.host != here.host:
        return None
    if holder.boot_id != here.boot_id:
        return f"{holder.host} rebooted since (boot id {holder.boot_id[:8]}…)"
    if holder.pidns != here.pidns:
        return None
    if start_now is None:
        return f"pid {holder.pid} on {holder.host} is gone"
    if start_now != holder.start:
        return f"pid {holder.pid} on {holder.host} is another process now (started later)"
    return None
