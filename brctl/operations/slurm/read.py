"""What Slurm's client commands print about jobs and machines, read the same way across
releases, every field checked before use.

Slurm's JSON changed shape over its data parsers (SchedMD's ``src/plugins/data_parser``):

- 22.05 (``openapi/v0.0.38``): ``job_state`` a string, numbers plain (``array_task_id``
  may be null), a machine's ``state`` a lower-case string beside a ``state_flags`` list;
- 23.02 (``v0.0.39``): a number that may be unset is ``{set, infinite, number}``
  (``array_job_id``, ``array_task_id``); a machine's ``state`` a list (``["IDLE", "DRAIN"]``);
  ``job_state`` still a string;
- 23.11-25.05 (``v0.0.40``-``v0.0.43``): ``job_state`` a list too: the base state and its
  flags (``["PENDING", "REQUEUE_HOLD"]``), read as ``job_state_string()`` reads them (a flag
  such as COMPLETING wins over the base state, as in squeue's text output).

An entry that cannot be read is exactly that: exit 3 naming the entry, the field and the
data parser, never skipped (a job skipped is a job "Slurm has no", and a job that is gone is
a different verdict). 22.05's text form (its ``--json`` ignores ``-j``/``-u``, so a lookup
there is ``squeue -O`` with fields no user can fill) is read here too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from brctl.core.errors import IncompleteError

RUNNING = "RUNNING"
# States in which the job holds (or will hold) machines; the rest are over.
ACTIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                    "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                    "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# job_state_string()'s order: the first of these flags present names the state, else the base
_JOB_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED",
                   "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED",
                   "RESV_DEL_HOLD", "SIGNALING")
_JOB_BASES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED",
                        "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                        "OUT_OF_MEMORY"})
_NODE_BASES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE",
                         "INVALID"})
_STATE_WORD = re.compile(r"[A-Z][A-Z_]{0,39}")
# 22.05's lookup: every field one Slurm fills (no job name, comment or path), '|' after each
TEXT_FIELDS = ("JobID", "State", "NodeList", "RestartCnt", "UserName", "ReqNodes", "Reason")
TEXT_FORMAT = ",".join(f"{f}:0|" for f in TEXT_FIELDS)


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it."""

    job_id: str
    name: str
    state: str
    reason: str
    nodes: tuple[str, ...]  # machine order; only while RUNNING (never a stale list)
    restarts: int
    user: str
    required: str = ""  # ReqNodeList as Slurm prints it (a folded set)
    excluded: str = ""  # ExcNodeList
    nodelist: str = ""  # the allocation as Slurm prints it (a finished job's last one, too)

    @property
    def running(self) -> bool:
        """RUNNING: the job's processes are on its machines."""
        return self.state == RUNNING

    @property
    def waiting(self) -> bool:
        """Queued or between runs (PENDING after a requeue, CONFIGURING, …): not running, not over."""
        return self.state in ACTIVE and self.state != RUNNING

    def describe(self) -> str:
        """``Slurm job 42 (RUNNING, 1 restart)`` for ``brctl nodes`` and messages."""
        extra = f", {self.restarts} restart{'s' if self.restarts != 1 else ''}" if self.restarts else ""
        why = f": {self.reason}" if self.reason and self.reason != "None" and not self.running else ""
        return f"Slurm job {self.job_id} ({self.state}{why}{extra})"


@dataclass(frozen=True)
class SlurmNode:
    """One machine as ``sinfo --json`` reports it."""

    name: str
    address: str
    gpus: int
    state: str  # idle, allocated, mixed, down, …
    flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, …
    partitions: tuple[str, ...]
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining: the scheduler places nothing new there."""
        return "DRAIN" in self.flags

    @property
    def idle(self) -> bool:
        """Idle, responding, not drained and reserved for nobody: free to take into a job."""
        return self.state == "idle" and not self.flags

    @property
    def idle_reserved(self) -> bool:
        """Idle and responding, reserved (a reservation's pool) but not drained."""
        return self.state == "idle" and set(self.flags) <= {"RESERVED", "MAINTENANCE"}


_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def parser_of(doc: Mapping[str, Any]) -> str:
    """The data parser a document names (``v0.0.40``; ``openapi/v0.0.38`` on 22.05)."""
    meta = doc.get("meta")
    for key in ("plugin", "plugins"):  # 23.02 says "plugins"
        plugin = meta.get(key) if isinstance(meta, dict) else None
        for field in ("data_parser", "type"):
            value = plugin.get(field) if isinstance(plugin, dict) else None
            if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_./-]{1,40}", value):
                return value.removeprefix("data_parser/")
    return "an unnamed data parser"


class Unreadable(IncompleteError):
    """A field of Slurm's answer brctl cannot read (exit 3: no verdict on that job)."""


class _Entry:
    """One entry of a document, its fields read with the document's name in every error."""

    def __init__(self, entry: Mapping[str, Any], where: str) -> None:
        self.entry = entry
        self.where = where

    def fail(self, field: str, expected: str) -> Unreadable:
        value = self.entry.get(field)
        # a container is named by its type: its repr could be huge, or nested past recursion
        got = repr(value)[:80] if isinstance(value, (str, int, float, bool, type(None))) else \
            f"a JSON {'object' if isinstance(value, dict) else 'array'}"
        return Unreadable(f"{self.where}: field {field!r}: got {got}, expected {expected}",
                          hint="brctl reads Slurm 22.05-25.05 (data parsers v0.0.38-v0.0.43); "
                               "report the Slurm release if it is one of these")

    def text(self, field: str, *, required: bool = False) -> str:
        value = self.entry.get(field)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value):
            raise self.fail(field, "a string")
        return value

    def number(self, field: str, *, required: bool = False) -> Optional[int]:
        """An integer, plain (22.05) or ``{set, infinite, number}`` (23.02+); None: unset."""
        value = self.entry.get(field)
        if value is None and not required:
            return None
        if isinstance(value, dict) and set(value) <= {"set", "infinite", "number"}:
            number, is_set = value.get("number"), value.get("set")
            if isinstance(number, int) and not isinstance(number, bool) and \
                    isinstance(is_set, bool) and isinstance(value.get("infinite", False), bool):
                if is_set and number >= 0:
                    return number
                if not is_set and not required:
                    return None
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise self.fail(field, "a count (a number, or {set, infinite, number})")

    def words(self, field: str) -> list[str]:
        """A list of state words (23.11+'s ``job_state``, 23.02+'s machine ``state``)."""
        value = self.entry.get(field)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(
                isinstance(v, str) and _STATE_WORD.fullmatch(v.upper()) for v in value):
            raise self.fail(field, "a state, or a list of states")
        return [v.upper() for v in value]

    def names(self, field: str) -> tuple[str, ...]:
        value = self.entry.get(field)
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(p for p in value.split(",") if p)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise self.fail(field, "a list of names")


def job_state(words: Sequence[str]) -> Optional[str]:
    """One state word from a list (as ``job_state_string``; 22.05 and 23.02 print that word
    itself), None when it names no state Slurm has."""
    flag = next((f for f in _JOB_FLAG_ORDER if f in words), None)
    if flag is not None:
        return flag
    return next((w for w in words if w in _JOB_BASES), None)


def read_job(raw: Any, where: str) -> SlurmJob:
    """One ``squeue --json`` entry, any data parser.

    Raises:
        Unreadable: a field brctl needs is missing or of another shape (exit 3).
    """
    if not isinstance(raw, dict):
        raise Unreadable(f"{where}: not a JSON object")
    entry = _Entry(raw, where)
    job_id = entry.number("job_id", required=True)
    state = job_state(entry.words("job_state"))
    if state is None:
        raise entry.fail("job_state", "a base state (RUNNING, PENDING, ...)")
    array, task = entry.number("array_job_id"), entry.number("array_task_id")
    shown = f"{array}_{task}" if array and task is not None else str(job_id)
    return SlurmJob(
        job_id=shown, name=entry.text("name"), state=state, reason=entry.text("state_reason"),
        nodes=(), nodelist=entry.text("nodes"), restarts=entry.number("restart_cnt") or 0,
        user=entry.text("user_name"), required=entry.text("required_nodes"),
        excluded=entry.text("excluded_nodes"))


def read_node(raw: Any, where: str) -> SlurmNode:
    """One ``sinfo --json`` machine, any data parser.

    Raises:
        Unreadable: a field brctl needs is missing or of another shape (exit 3).
    """
    if not isinstance(raw, dict):
        raise Unreadable(f"{where}: not a JSON object")
    entry = _Entry(raw, where)
    name = entry.text("name", required=True)
    words = entry.words("state")
    if isinstance(raw.get("state"), str):  # 22.05: a base state beside its flags
        base, flags = words[0], [w.upper() for w in entry.names("state_flags")]
    else:
        base = next((w for w in words if w in _NODE_BASES), "")
        flags = [w for w in words if w != base]
        if not base:
            raise entry.fail("state", "a list with a base state (IDLE, ALLOCATED, ...)")
    return SlurmNode(
        name=name, address=entry.text("address") or name,
        gpus=sum(int(n) for n in _GPU_GRES.findall(entry.text("gres"))),
        state=base.lower(), flags=tuple(flags), partitions=entry.names("partitions"),
        reason=entry.text("reason"))


def read_text_job(line: str, where: str) -> SlurmJob:
    """One line of 22.05's ``squeue -h -O TEXT_FORMAT`` (fields ``|``-terminated).

    Raises:
        Unreadable: not the fields asked for (exit 3).
    """
    parts = line.split("|")
    if len(parts) < len(TEXT_FIELDS) + 1 or parts[-1].strip():
        raise Unreadable(f"{where}: not {len(TEXT_FIELDS)} '|'-ended fields: {line[:120]!r}")
    # Reason is last: were a '|' ever in it, the fields before it still read right
    job_id, state, nodelist, restarts, user, required = (p.strip() for p in parts[:6])
    reason = "|".join(parts[6:-1]).strip()
    if not re.fullmatch(r"\d+(_\d+|\+\d+)?", job_id):
        raise Unreadable(f"{where}: field JobID: got {job_id[:40]!r}, expected a job id")
    if not _STATE_WORD.fullmatch(state):
        raise Unreadable(f"{where}: field State: got {state[:40]!r}, expected a state")
    if not re.fullmatch(r"[0-9]{1,9}", restarts):  # str.isdigit() takes '²', which int() refuses
        raise Unreadable(f"{where}: field RestartCnt: got {restarts[:40]!r}, expected a count")
    return SlurmJob(job_id=job_id, name="", state=state, reason=reason, nodes=(),
                    nodelist=nodelist, restarts=int(restarts), user=user, required=required)
