"""Flight-recorder summaries from the nodes → typed per-rank records, checked.

A rank's summary (``diagnostics.recorder.summarise``, made on its machine) comes
from a node and is hostile: ``decode_summary`` checks every field's type, every
count against its cap (groups, members, recent collectives, tensors, text
lengths) and every rank against the world, and raises ``CollectiveFormatError``
naming where, which is that rank's error, never the run's. Nesting is fixed by
the shape (no field is free-form), so depth is bounded by the checks
themselves. The work is linear in the summary's size.

The analysis of the records (the wavefront, the wait-for graph, mismatches,
stragglers) is in ``wavefront.py`` and ``stragglers.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from brctl.diagnostics.recorder import (
    MAX_DIMS,
    MAX_GROUPS,
    MAX_NAME,
    MAX_RECENT,
    MAX_TENSORS,
    SUMMARY_VERSION,
    unpack_recent,
)

Recent = tuple[int, int, int]  # (seq, enqueued_ns, started_ns; 0: not started or unknown)


class CollectiveFormatError(ValueError):
    """A rank's recorder summary that is not brctl's (says where)."""


class Pending(NamedTuple):
    """The oldest collective a rank enqueued in a group and has not completed."""

    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    enqueued_ns: int  # on the clock of the rank's machine
    started_ns: int | None  # NCCL with timing: when the GPU began it


class GroupRecord(NamedTuple):
    """One rank's view of one process group (matched across ranks by ``name``)."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None  # the members, where the job's table or pg_config says
    last_enqueued: int  # -1: unknown (a wrapped buffer without this group's entries)
    last_completed: int
    pending: Pending | None
    recent: tuple[Recent, ...]  # the last collectives, oldest first
    ops: tuple[str, ...]  # the op of each of ``recent``

    def op_at(self, seq: int) -> str | None:
        """The op this rank ran at ``seq``, where its recent window holds it."""
        if self.pending is not None and self.pending.seq == seq:
            return self.pending.op
        for (s, _, _), op in zip(self.recent, self.ops):
            if s == seq:
                return op
        return None


class RankRecord(NamedTuple):
    """What one rank's flight recorder says, with the clock it was read on."""

    rank: int
    clock_ns: int  # its machine's time.time_ns() when the dump was taken
    version: str
    backend: str  # gloo | nccl | ""
    wrapped: bool
    step: int | None
    groups: Mapping[str, GroupRecord]


def _fail(where: str, what: str) -> CollectiveFormatError:
    return CollectiveFormatError(f"{where}: {what}")


INT64 = (1 << 63) - 1  # the recorder's integers are int64 in torch; beyond is a lie


def _int(value: Any, where: str, low: int = -INT64) -> int:
    """An integer within [low, int64]: a 400-digit clock would overflow float arithmetic
    later (ages, lateness) and end the whole run, not this rank."""
    if type(value) is not int or not low <= value <= INT64:
        raise _fail(where, f"expected an integer from {low} to 2**63-1")
    return value


def _str(value: Any, where: str) -> str:
    if type(value) is not str or len(value) > MAX_NAME:
        raise _fail(where, f"expected a string of at most {MAX_NAME} characters")
    return value


def _pending(p: Any, where: str) -> Pending | None:
    if p is None:
        return None
    if type(p) is not dict:
        raise _fail(where, "expected an object or null")
    sizes = p.get("sizes")
    if type(sizes) is not list or len(sizes) > MAX_TENSORS or any(
            type(s) is not list or len(s) > MAX_DIMS or any(type(d) is not int for d in s)
            for s in sizes):
        raise _fail(where + ".sizes", f"expected at most {MAX_TENSORS} shapes of integers")
    dtypes = p.get("dtypes")
    if type(dtypes) is not list or len(dtypes) > MAX_TENSORS:
        raise _fail(where + ".dtypes", f"expected at most {MAX_TENSORS} strings")
    started = p.get("started_ns")
    return Pending(_int(p.get("seq"), where + ".seq", 0), _str(p.get("op"), where + ".op"),
                   tuple(tuple(s) for s in sizes),
                   tuple(_str(d, where + ".dtypes") for d in dtypes),
                   _int(p.get("enqueued_ns"), where + ".enqueued_ns"),
                   None if started is None else _int(started, where + ".started_ns"))


def _recent(raw: Any, where: str) -> tuple[Recent, ...]:
    try:
        return tuple(unpack_recent(raw))  # checked in bulk, in C (``recorder.pack_recent``)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _ops(raw: Any, n: int, where: str) -> tuple[str, ...]:
    if type(raw) is not list or len(raw) > MAX_RECENT:
        raise _fail(where, "expected a list of [op, count] runs")
    out: list[str] = []
    for run in raw:
        if not (type(run) is list and len(run) == 2 and type(run[1]) is int
                and 0 < run[1] <= n - len(out)):
            raise _fail(where, f"{str(run)[:60]} is not an [op, count] run within recent")
        out.extend([_str(run[0], where)] * run[1])
    if len(out) != n:
        raise _fail(where, f"the runs cover {len(out)} collectives, recent holds {n}")
    return tuple(out)


def _members(raw: Any, world: int, where: str) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if type(raw) is not list or not raw or len(raw) > world:
        raise _fail(where, f"expected a list of at most {world} ranks, or null")
    if any(type(r) is not int for r in raw) or min(raw) < 0 or max(raw) >= world:
        raise _fail(where, f"members must be ranks of the world (0 to {world - 1})")
    return tuple(raw)


def _group(name: str, g: Any, world: int, where: str) -> GroupRecord:
    if type(g) is not dict:
        raise _fail(where, "expected an object")
    recent = _recent(g.get("recent"), where + ".recent")
    return GroupRecord(name, _str(g.get("desc"), where + ".desc"),
                       _members(g.get("ranks"), world, where + ".ranks"),
                       _int(g.get("last_enqueued"), where + ".last_enqueued", -1),
                       _int(g.get("last_completed"), where + ".last_completed", -1),
                       _pending(g.get("pending"), where + ".pending"), recent,
                       _ops(g.get("ops"), len(recent), where + ".ops"))


def decode_summary(doc: Any, rank: int, world: int) -> RankRecord:
    """One rank's summary as its record.

    Args:
        doc: the summary as the node sent it (parsed JSON).
        rank: the rank it was read from (the dump itself carries none).
        world: the job's world size (members are checked against it).

    Raises:
        CollectiveFormatError: any field out of shape (says which).
    """
    where = f"rank {rank}: collectives"
    if type(doc) is not dict:
        raise _fail(where, "expected an object")
    if doc.get("v") != SUMMARY_VERSION:
        raise _fail(where, f"summary version {doc.get('v')!r:.20} is not this brctl's "
                           f"({SUMMARY_VERSION}); is the node running a probe of another version?")
    groups = doc.get("groups")
    if type(groups) is not dict or len(groups) > MAX_GROUPS:
        raise _fail(where + ".groups", f"expected an object of at most {MAX_GROUPS} groups")
    step, backend = doc.get("step"), doc.get("backend")
    if backend not in ("gloo", "nccl", ""):
        raise _fail(where + ".backend", "expected gloo, nccl or \"\"")
    wrapped = doc.get("wrapped")
    if type(wrapped) is not bool:
        raise _fail(where + ".wrapped", "expected a boolean")
    out = {}
    for name, g in groups.items():
        gw = f"{where}.groups.{name[:40]}"
        out[_str(name, gw)] = _group(name, g, world, gw)
    return RankRecord(rank, _int(doc.get("clock_ns"), where + ".clock_ns", 0),
                      _str(doc.get("version"), where + ".version"), backend, wrapped,
                      None if step is None else _int(step, where + ".step"), out)
