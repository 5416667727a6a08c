"""The controller's side of ``brctl.diagnostics.srun_task``: the payload out, the records back.

Pure: bytes in, dataclasses out, so the framing is tested without a cluster. A
record is accepted only from the srun task its node was given (``--label`` ranks
with ``--distribution=arbitrary``: rank i is the i-th node of ``--nodelist``), whole
(length and sha256 match), once, bounded in size and naming its own node; anything
else leaves that node without an answer, and says why.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from brctl.core.capture import kept_bytes, not_utf8

_LABELLED = re.compile(rb"^ *(\d+): ?(.*)$", re.S)
NOISE_KEEP = 2048  # bytes of a task's stray output kept to say what went wrong


def payload(stdins: Mapping[str, Optional[bytes]]) -> bytes:
    """The broadcast stdin: each distinct stdin once, and which node gets which."""
    distinct: dict[bytes, int] = {}
    nodes: dict[str, int] = {}
    for node, data in stdins.items():
        nodes[node] = -1 if data is None else distinct.setdefault(data, len(distinct))
    doc = {"stdins": [base64.b64encode(d).decode() for d in distinct], "nodes": nodes}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


@dataclass(frozen=True)
class Stream:
    """One stream as a record kept it, in ``RunResult``'s terms."""

    text: str  # the kept bytes decoded, the cut marked
    cut_total: Optional[int]  # its byte count when it was cut (``RunResult.stdout_total``)
    exact: Optional[bytes]  # the kept bytes where they are not UTF-8 (``RunResult.stdout_bytes``)


@dataclass(frozen=True)
class Answer:
    """One node's answer as its record says: exit code, kept output, node-side seconds."""

    exit_code: int
    stdout: Stream
    stderr: Stream
    seconds: float


@dataclass
class _Task:
    node: str
    lines: list[bytes]
    size: int = 0
    begun: Optional[tuple[int, str]] = None
    answer: Optional[Answer] = None
    garbled: Optional[str] = None
    noise: bytes = b""


class Frames:
    """Reads one srun's labelled output; ``answers`` and ``why_not`` per node.

    Args:
        nonce: the run's marker (tells records from stray lines; not a secret).
        nodes: the node of each rank, in ``--nodelist`` order.
        keep: the nodes' ``output_keep`` (bounds what a record may hold).
    """

    def __init__(self, nonce: str, nodes: Sequence[str], keep: int) -> None:
        self.nodes = tuple(nodes)
        self._prefix = f"@brctl {nonce} ".encode()
        self._tasks = [_Task(n, []) for n in nodes]
        self._keep = keep
        self._limit = 4 * keep * 4 // 3 + 65536  # 2 streams × head and tail, base64, some JSON

    def line(self, raw: bytes) -> Optional[str]:
        """Take one line of srun's stdout; returns the node whose answer it completed."""
        found = _LABELLED.match(raw.rstrip(b"\r\n"))
        if found is None:
            return None  # srun's own words: not from any task
        rank = int(found.group(1))
        if rank >= len(self._tasks):
            return None
        task, text = self._tasks[rank], found.group(2)
        if task.answer is not None or task.garbled is not None:
            if task.answer is not None and text.strip():
                task.answer, task.garbled = None, "output after its record"
            return None
        if not text.startswith(self._prefix):
            if len(task.noise) < NOISE_KEEP:
                task.noise += text[:NOISE_KEEP - len(task.noise)] + b"\n"
            return None
        return self._frame(task, text[len(self._prefix):])

    def _frame(self, task: _Task, body: bytes) -> Optional[str]:
        if task.begun is None:
            head = body.split()
            if len(head) != 3 or head[0] != b"begin" or not head[1].isdigit():
                task.garbled = "a record that does not begin as one"
                return None
            task.begun = (int(head[1]), head[2].decode(errors="replace"))
            if task.begun[0] > self._limit:
                task.garbled = f"a record of {task.begun[0]} bytes (at most {self._limit})"
            return None
        if body != b"end":
            task.size += len(body)
            if task.size > self._limit * 4 // 3 + 4:
                task.garbled = f"a record larger than {self._limit} bytes"
                task.lines = []
            else:
                task.lines.append(body)
            return None
        task.answer, task.garbled = _decode(task.node, b"".join(task.lines), *task.begun, self._keep)
        task.lines = []
        return task.node if task.answer is not None else None

    def answers(self) -> dict[str, Answer]:
        """Every node that answered in full."""
        return {t.node: t.answer for t in self._tasks if t.answer is not None}

    def why_not(self, node: str) -> str:
        """Why ``node`` has no answer (a garbled record, stray output, or nothing at all)."""
        for task in self._tasks:
            if task.node == node:
                if task.garbled:
                    return f"its answer was unusable: {task.garbled}"
                if task.begun is not None:
                    return "its answer stopped midway"
                if task.noise:
                    return "no answer; it printed: " + task.noise.decode(errors="replace").strip()[-300:]
        return "no answer"


def _decode(node: str, text: bytes, length: int, digest: str,
            keep: int) -> tuple[Optional[Answer], Optional[str]]:
    try:
        body = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None, "a record that is not base64"
    if len(body) != length or hashlib.sha256(body).hexdigest() != digest:
        return None, "a record cut or changed on the way (length or sha256 differs)"
    try:
        doc = json.loads(body)
        said = doc["node"]
        if said != node:
            return None, f"a record that says it is from {str(said)[:64]!r}"
        if doc.get("error"):
            return None, f"the node could not read its request: {str(doc['error'])[:300]}"
        code, seconds = doc["exit"], doc["seconds"]
        if not isinstance(code, int) or not isinstance(seconds, (int, float)):
            raise TypeError("exit or seconds")
        return Answer(code, _stream(doc["out"], keep), _stream(doc["err"], keep), float(seconds)), None
    # RecursionError: JSON nested past the parser's depth; OverflowError: seconds too large
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError, OverflowError) as exc:
        return None, f"a record that does not hold an answer ({exc})"


def _stream(parts: object, keep: int) -> Stream:
    if not isinstance(parts, list) or len(parts) != 3 or type(parts[2]) is not int:
        raise TypeError("stream parts")
    if not 0 <= parts[2] < 1 << 63:  # it becomes RunResult.stdout_total, in every JSON document
        raise ValueError(f"an impossible byte count {str(parts[2])[:24]}")
    head, tail = base64.b64decode(parts[0]), base64.b64decode(parts[1])
    if len(head) > keep or len(tail) > keep:
        raise ValueError("more output than the node was told to keep")
    total = max(parts[2], len(head) + len(tail))  # a node saying fewer bytes than it sent is wrong
    data = kept_bytes(head, tail, total, keep)
    return Stream(data.decode(errors="replace"), total if total > len(head) + len(tail) else None,
                  not_utf8(data))
