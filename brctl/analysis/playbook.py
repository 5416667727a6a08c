"""Playbooks: failure symptom → ordered stop-time stages → decision, as typed data.

A playbook (``playbooks/*.yaml``) names a symptom, the evidence that reveals it
(``match``: regexes on log lines, on the exception line that ends a Python
traceback, launcher exit codes, kernel Xid numbers), the stages of the ladder to run
and the decision rules. ``parse_playbook`` validates one document loudly (file and
key path, exit 2); ``classify`` picks the playbook that explains the evidence of a
failed job. Pure: files are read by ``brctl.load.playbooks``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

from brctl.core.schema import SchemaError, from_mapping, positive, regex
from brctl.core.schema import field as sfield

StageName = Literal["eud", "alltoall", "allgather"]
STAGES: tuple[StageName, ...] = ("eud", "alltoall", "allgather")  # the ladder, in order
Action = Literal["diagnose", "evict", "rollback"]
MAX_HITS_PER_NODE = 3  # evidence lines kept per node: enough to show, small enough to print

# torchrun/torch.distributed prefix every line of a worker with "[rankN]:" or "[defaultN]:".
_RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)\d+\]:\s?")
_TRACEBACK = "Traceback (most recent call last):"


def _levels(value: str) -> str:
    if value not in ("1", "2", "3", "4", "eud", "cpu_eud", "quick", "short", "medium", "long",
                     "xlong"):
        raise ValueError(f"got {value!r}, expected a dcgmi diag level: 1-4, eud or cpu_eud")
    return value


@dataclass(frozen=True)
class Matcher:
    """One piece of evidence a playbook looks for; exactly one key is set."""

    log: Optional[str] = sfield(None, check=regex)  # regex searched in every log line
    exception: Optional[str] = sfield(None, check=regex)  # regex on a traceback's last line
    exit_code: Optional[list[int]] = None  # launcher exit codes (torchrun's "exitcode")
    xid: Optional[list[int]] = None  # NVIDIA kernel Xid numbers

    def describe(self) -> str:
        """A short label, e.g. ``log /illegal memory access/``."""
        if self.log is not None:
            return f"log /{self.log}/"
        if self.exception is not None:
            return f"exception /{self.exception}/"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        return f"xid {self.xid}"


@dataclass(frozen=True)
class Stage:
    """One stage of the ladder with its parameters (None: the inventory's ``diagnose:``)."""

    name: StageName
    level: Optional[str] = sfield(None, check=_levels)  # eud: dcgmi diag -r LEVEL
    timeout: Optional[float] = sfield(None, check=positive)  # seconds for the whole stage


@dataclass(frozen=True)
class DecisionRules:
    """The decision rules of a playbook."""

    # diagnose: run the stages; evict: the evidence is a confident hardware signal, evict
    # the machines that show it; rollback: the evidence is a bug in user code, never evict.
    on_match: Action = "diagnose"
    # What to do when every stage passes: reattempt (transient), or rollback when the
    # likeliest cause of this symptom is a code or configuration change (e.g. OOM).
    on_clean: Literal["reattempt", "rollback"] = "reattempt"


@dataclass(frozen=True)
class Playbook:
    """A validated playbook."""

    name: str
    symptom: str
    description: str = ""
    priority: int = 50  # the highest-priority matching playbook explains the failure
    fallback: bool = False  # used when no playbook matches (exactly one should say so)
    match: list[Matcher] = sfield(factory=list)
    unless: list[Matcher] = sfield(factory=list)  # evidence on a node that vetoes its match
    stages: list[Stage] = sfield(factory=lambda: [Stage(s) for s in STAGES])
    decision: DecisionRules = sfield(factory=DecisionRules)


def parse_playbook(data: Any, source: str) -> Playbook:
    """Validate one playbook document.

    Raises:
        SchemaError: naming ``source`` and the key path (an unknown key, a bad regex, a
            matcher with no or two keys, a stage listed twice).
    """
    book = from_mapping(Playbook, data, source)
    for key, matchers in (("match", book.match), ("unless", book.unless)):
        for i, m in enumerate(matchers):
            set_keys = [k for k in ("log", "exception", "exit_code", "xid") if getattr(m, k) is not None]
            if len(set_keys) != 1:
                raise SchemaError(source, f"{key}[{i}]",
                                  f"a matcher needs exactly one of log, exception, exit_code, xid "
                                  f"(got {', '.join(set_keys) or 'none'})")
    names = [s.name for s in book.stages]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SchemaError(source, f"stages[{i}].name", f"stage {name!r} is listed twice")
    for i, st in enumerate(book.stages):
        if st.level is not None and st.name != "eud":
            raise SchemaError(source, f"stages[{i}].level", "only the eud stage has a level")
    if not book.match and not book.fallback:
        raise SchemaError(source, "match", "a playbook needs matchers (or fallback: true)")
    return book


@dataclass(frozen=True)
class NodeEvidence:
    """What one machine says about the failure (from the evidence probe or ``--logs``)."""

    node: str
    lines: tuple[str, ...] = ()  # tails of the job's logs
    exit_codes: tuple[int, ...] = ()
    xids: tuple[int, ...] = ()
    xid_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hit:
    """A matcher that fired on a node, with the line that shows it."""

    node: str
    matcher: str
    text: str

    def to_json(self) -> dict[str, str]:
        """JSON form."""
        return {"node": self.node, "matcher": self.matcher, "text": self.text}


@dataclass(frozen=True)
class Classification:
    """The playbook that explains the failure and the machines whose evidence shows it."""

    playbook: Playbook
    nodes: tuple[str, ...]
    hits: tuple[Hit, ...]
    forced: bool = False


def exception_lines(lines: Sequence[str]) -> list[str]:
    """The final ``Type: message`` line of every Python traceback in ``lines``."""
    out: list[str] = []
    inside = False
    for raw in lines:
        line = _RANK_PREFIX.sub("", raw)
        if line.strip() == _TRACEBACK:
            inside = True
            continue
        if inside and line and not line[0].isspace():
            out.append(line.strip())
            inside = False
    return out


def _hits(m: Matcher, ev: NodeEvidence, excs: Sequence[str]) -> Iterable[str]:
    if m.log is not None:
        rx = re.compile(m.log)
        return (ln.strip() for ln in ev.lines if rx.search(ln))
    if m.exception is not None:
        rx = re.compile(m.exception)
        return (e for e in excs if rx.search(e))
    if m.exit_code is not None:
        codes = set(m.exit_code)
        return (f"exit code {c}" for c in ev.exit_codes if c in codes)
    wanted = set(m.xid or ())
    return (ln.strip() for x, ln in zip(ev.xids, ev.xid_lines) if x in wanted)


def match_node(book: Playbook, ev: NodeEvidence) -> list[Hit]:
    """The hits of ``book`` on one machine (empty when nothing matches or ``unless`` vetoes)."""
    excs = exception_lines(ev.lines)
    if any(next(iter(_hits(m, ev, excs)), None) is not None for m in book.unless):
        return []
    hits: list[Hit] = []
    for m in book.match:
        for text in _hits(m, ev, excs):
            hits.append(Hit(ev.node, m.describe(), text[:300]))
            if len(hits) >= MAX_HITS_PER_NODE:
                return hits
    return hits


UNKNOWN = Playbook(name="unknown", symptom="unknown failure (no playbook matched)", fallback=True)


def classify(
    evidence: Mapping[str, NodeEvidence],
    playbooks: Sequence[Playbook],
    forced: str | None = None,
) -> Classification:
    """Pick the playbook that explains the evidence.

    The highest ``priority`` among matching playbooks wins (ties: the earlier one);
    no match → the ``fallback`` playbook (or a built-in "unknown" running every stage).

    Args:
        evidence: per machine, in machine order.
        playbooks: the loaded playbooks, in load order.
        forced: a playbook name chosen by the caller (``--symptom``); its hits are
            still computed so the machines that show it are known.

    Raises:
        InputError: ``forced`` names no loaded playbook.
    """
    if forced is not None:
        chosen = [b for b in playbooks if b.name == forced]
        if not chosen:
            from brctl.core.errors import InputError

            raise InputError(f"--symptom {forced}: no such playbook",
                             hint=f"known: {', '.join(b.name for b in playbooks)}")
        return _classified(chosen[0], evidence, forced=True)
    best: Classification | None = None
    for book in playbooks:
        if book.fallback:
            continue
        found = _classified(book, evidence)
        if found.nodes and (best is None or book.priority > best.playbook.priority):
            best = found
    if best is not None:
        return best
    fallback = next((b for b in playbooks if b.fallback), UNKNOWN)
    return Classification(fallback, (), ())


def _classified(book: Playbook, evidence: Mapping[str, NodeEvidence],
                forced: bool = False) -> Classification:
    hits: list[Hit] = []
    nodes: list[str] = []
    for name, ev in evidence.items():
        found = match_node(book, ev)
        if found:
            nodes.append(name)
            hits.extend(found)
    return Classification(book, tuple(nodes), tuple(hits), forced)
