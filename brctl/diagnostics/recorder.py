"""A rank's flight-recorder dump → the small summary the collective analysis reads.

Node-side; standard library only, Python 3.9. The probe reduces each rank's
``fr_trace_json`` answer with ``summarise`` before shipping it, and the
controller reduces saved raw dumps (``--from DIR``) with the very same function,
so both paths give identical evidence.

PyTorch's dump (``torch._C._distributed_c10d._dump_fr_trace_json``) is a JSON
object: ``version`` (``"2.10"`` on 2.13), ``pg_config``, ``pg_status`` (per
process-group id: last enqueued / started / completed collective, as strings),
and ``entries`` sorted by ``record_id``, one per collective (``process_group``
``[name, desc]``, ``collective_seq_id``, ``profiling_name`` ``gloo:all_reduce``,
``time_created_ns``, sizes, dtypes, ``state``, ``retired`` …). What differs by
backend and version, and is handled here:

- gloo: ``state`` never leaves ``scheduled``, ``retired`` is the only completion
  signal, ``pg_config`` is empty (the members come from brctl's table), p2p ops
  are not recorded; ``retired`` lags a finished collective, so the newest entry
  of a healthy job is usually still "pending" (in flight is not stuck: the
  analysis ages it);
- NCCL: ``state`` becomes ``started`` / ``completed``, and
  ``time_discovered_started_ns`` says when the GPU began (arrival on the GPU's
  clock, where timing is on); ``pg_config`` names the members;
- older recorders: ``seq_id`` before ``collective_seq_id``, no ``is_p2p`` or
  ``retired`` (then ``state == "completed"`` is completion);
- a wrapped ring buffer (``TORCH_FR_BUFFER_SIZE``): the first ``record_id`` is
  past 0, so a group without entries is unknown (-1), not idle (0).

``pg_status`` is keyed by the process's own pg id, which means nothing on
another rank; groups are matched across ranks on the name in ``process_group``
(assigned in creation order across the whole job).

The summary (``SUMMARY_VERSION``), per rank::

    {"v": 1, "clock_ns": int, "version": str, "backend": "gloo"|"nccl"|"",
     "wrapped": bool, "step": int|null,
     "groups": {NAME: {"desc": str, "ranks": [int, ...]|null,
                       "last_enqueued": int, "last_completed": int,
                       "pending": {"seq", "op", "sizes", "dtypes", "enqueued_ns",
                                   "started_ns"}|null,
                       "recent": BASE64, "ops": [[op, count], ...]}}}

``recent`` is the group's last ``k`` collectives, oldest first, packed: base64
of little-endian int64 triples (seq, enqueued_ns, started_ns; 0 = not started
or unknown). As JSON lists it cost ~60 numbers and 20 lists per group, and at
131,072 ranks their parsing (and the garbage collector walking them) was most
of the controller's time; one string per group decodes in C (``pack_recent``,
``unpack_recent``). ``ops`` are their ops as runs in the same order (a tie in a
two-rank group is broken by what the group's other instances ran at that
sequence number).

``clock_ns`` is the recording machine's ``time.time_ns()`` when the dump was
taken, read in the same answer: ages are differences on one clock, so
machines' clocks never meet. brctl's group table (served by ``brctl.job``'s
handler) is ``{"v": 1, "rank": int, "groups": {NAME: {"desc": str, "ranks":
[int, ...]}}, "step": int|null}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array
from typing import Any

SUMMARY_VERSION = 1
DEFAULT_RECENT = 20  # collectives per group kept for the arrival analysis
MAX_RECENT = 64
MAX_GROUPS = 512  # groups one rank may report (Megatron: ~10; MoE jobs a few dozen)
MAX_ENTRIES = 1 << 20  # entries one dump may hold (TORCH_FR_BUFFER_SIZE: 2,000 by default)
MAX_NAME = 128  # characters of a group name, description, op or dtype
MAX_TENSORS = 16  # tensors per collective kept in sizes / dtypes
MAX_DIMS = 8
MAX_RANKS = 1 << 20  # members of one group in a table
# Members shipped per group: every rank of a group would ship the same list, so a
# data-parallel group of 2,048 (or the world) would cost megabytes per rank; past this
# the controller takes the members from the layout and the group's name and description.
MAX_SHIPPED_MEMBERS = 256
INT64 = (1 << 63) - 1  # torch's recorder fields are int64: a larger one is not its


class RecorderFormatError(ValueError):
    """A dump or table that is not the flight recorder's (says where)."""


def pack_recent(rows: list[tuple[int, int, int]]) -> str:
    """(seq, enqueued_ns, started_ns or 0) rows as base64 of little-endian int64s.

    Raises:
        RecorderFormatError: a value outside int64.
    """
    try:
        flat = array("q", [v for row in rows for v in row])
    except OverflowError:
        raise RecorderFormatError("recent: a value outside int64") from None
    if sys.byteorder == "big":
        flat.byteswap()
    return base64.b64encode(flat.tobytes()).decode("ascii")


def unpack_recent(text: Any, limit: int = MAX_RECENT) -> list[tuple[int, int, int]]:
    """The rows of ``pack_recent`` (at most ``limit``), checked in bulk.

    Raises:
        ValueError: not base64 of whole (seq, enqueued, started) int64 triples.
    """
    if type(text) is not str or len(text) > 4 * (24 * limit + 2) // 3 + 4:
        raise ValueError(f"expected base64 of at most {limit} int64 triples")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    if len(raw) % 24:
        raise ValueError("not whole int64 triples")
    flat = array("q")
    flat.frombytes(raw)
    if sys.byteorder == "big":
        flat.byteswap()
    return list(zip(flat[0::3], flat[1::3], flat[2::3]))


def _int(value: Any, where: str) -> int:
    """An integer field; the JSON dump writes some as strings (``pg_status``)."""
    if type(value) is int and -INT64 <= value <= INT64:
        return value
    if type(value) is str and value.lstrip("-").isdigit() and len(value) < 19:
        return int(value)
    raise RecorderFormatError(f"{where}: expected an int64, not {value!r:.40}")


def _text(value: Any, where: str) -> str:
    if type(value) is not str:
        raise RecorderFormatError(f"{where}: expected a string, not {value!r:.40}")
    return value[:MAX_NAME]


def _sizes(value: Any, where: str) -> list[list[int]]:
    if value is None:
        return []
    if type(value) is not list:
        raise RecorderFormatError(f"{where}: expected a list of shapes")
    out = []
    for shape in value[:MAX_TENSORS]:
        if type(shape) is not list or any(type(d) is not int for d in shape):
            raise RecorderFormatError(f"{where}: a shape must be a list of integers")
        out.append(shape[:MAX_DIMS])
    return out


def _dtypes(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if type(value) is not list:
        raise RecorderFormatError(f"{where}: expected a list of dtypes")
    return [_text(d, where) for d in value[:MAX_TENSORS]]


def _ranks(value: Any) -> list[int] | None:
    """A member list from a table (a list) or ``pg_config`` (a string ``"[0, 1]"``)."""
    if type(value) is str:
        if len(value) > 16 * MAX_RANKS:
            return None
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if type(value) is not list or not value or len(value) > MAX_RANKS:
        return None
    if any(type(r) is not int or r < 0 for r in value):
        return None
    return list(value)


class _Entry:
    """One recorded collective, its fields checked."""

    __slots__ = (
        "backend",
        "desc",
        "done",
        "dtypes",
        "enqueued",
        "name",
        "op",
        "pg_id",
        "seq",
        "sizes",
        "started",
    )

    def __init__(self, e: Any, i: int) -> None:
        where = f"entries[{i}]"
        if type(e) is not dict:
            raise RecorderFormatError(f"{where}: expected an object")
        pg = e.get("process_group")
        if type(pg) is list and len(pg) == 2:
            self.name, self.desc = _text(pg[0], where + ".process_group"), _text(pg[1], where)
        else:  # recorders before process_group named it by pg_id only
            self.name, self.desc = str(_int(e.get("pg_id"), where + ".pg_id")), ""
        seq = e.get("collective_seq_id", e.get("seq_id"))
        self.seq = _int(seq, where + ".collective_seq_id")
        prof = _text(e.get("profiling_name"), where + ".profiling_name")
        backend, _, op = prof.rpartition(":")
        self.backend, self.op = backend, op
        self.enqueued = _int(e.get("time_created_ns"), where + ".time_created_ns")
        started = e.get("time_discovered_started_ns")
        self.started = started if type(started) is int and started > 0 else None
        state, retired = e.get("state"), e.get("retired")
        self.done = retired is True or state == "completed"
        self.sizes = _sizes(e.get("input_sizes"), where + ".input_sizes")
        self.dtypes = _dtypes(e.get("input_dtypes"), where + ".input_dtypes")
        pg_id = e.get("pg_id")
        self.pg_id = str(pg_id) if type(pg_id) in (int, str) else None


def _status(dump: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """pg id → (last enqueued, last completed) from ``pg_status`` (wider than a wrapped buffer)."""
    raw = dump.get("pg_status")
    if raw is None:
        return {}
    if type(raw) is not dict or len(raw) > MAX_GROUPS:
        raise RecorderFormatError("pg_status: expected an object of at most "
                                  f"{MAX_GROUPS} groups")
    out = {}
    for pg, st in raw.items():
        if type(st) is not dict:
            raise RecorderFormatError(f"pg_status.{pg:.40}: expected an object")
        out[str(pg)] = (_int(st.get("last_enqueued_collective", -1), f"pg_status.{pg:.40}"),
                        _int(st.get("last_completed_collective", -1), f"pg_status.{pg:.40}"))
    return out


def _table_groups(table: Any) -> dict[str, tuple[str, list[int] | None]]:
    """name → (desc, members) from brctl's table; a table out of shape counts as none."""
    groups = table.get("groups") if type(table) is dict else None
    if type(groups) is not dict or len(groups) > MAX_GROUPS:
        return {}
    out = {}
    for name, g in groups.items():
        if type(name) is str and type(g) is dict:
            desc = g.get("desc")
            out[name[:MAX_NAME]] = (desc[:MAX_NAME] if type(desc) is str else "",
                                    _ranks(g.get("ranks")))
    return out


def _config_groups(dump: dict[str, Any]) -> dict[str, tuple[str, list[int] | None]]:
    """name → (desc, members) from ``pg_config`` (NCCL fills it; gloo leaves one empty row)."""
    raw = dump.get("pg_config")
    if type(raw) is not dict or len(raw) > MAX_GROUPS:
        return {}
    out = {}
    for name, g in raw.items():
        if type(name) is str and name and type(g) is dict:
            desc = g.get("desc")
            out[name[:MAX_NAME]] = (desc[:MAX_NAME] if type(desc) is str else "",
                                    _ranks(g.get("ranks")))
    return out


def _runs(ops: list[str]) -> list[list[Any]]:
    """``[op, count]`` runs: a training loop repeats one or two ops, so this is a few pairs."""
    out: list[list[Any]] = []
    for op in ops:
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return out


def summarise(dump: Any, table: Any, clock_ns: int, k: int = DEFAULT_RECENT) -> dict[str, Any]:
    """The summary of one rank's dump (see the module docstring for its shape).

    Args:
        dump: the parsed ``fr_trace_json`` answer.
        table: brctl's group table from the job's handler, or None (a job that
            serves none; a table out of shape counts as none: it is a hint).
        clock_ns: this machine's ``time.time_ns()`` when the dump was taken.
        k: collectives per group kept in ``recent`` (at most ``MAX_RECENT``).

    Raises:
        RecorderFormatError: the dump is not a flight-recorder dump (says where).
    """
    if type(dump) is not dict:
        raise RecorderFormatError("the dump is not a JSON object")
    if type(clock_ns) is not int or not 0 <= clock_ns <= INT64:
        raise RecorderFormatError("clock_ns must be an int64")
    k = max(0, min(int(k), MAX_RECENT))
    raw = dump.get("entries")
    if raw is None:
        raw = []
    if type(raw) is not list or len(raw) > MAX_ENTRIES:
        raise RecorderFormatError(f"entries: expected a list of at most {MAX_ENTRIES} entries")
    version = dump.get("version")
    first_id = raw[0].get("record_id") if raw and type(raw[0]) is dict else None
    wrapped = type(first_id) is int and first_id > 0
    entries: dict[str, list[_Entry]] = {}
    descs: dict[str, str] = {}
    pg_names: dict[str, str] = {}
    backend = ""
    for i, e in enumerate(raw):
        if type(e) is dict and e.get("is_p2p") is True:
            continue  # p2p has its own sequence (and gloo records none)
        entry = _Entry(e, i)
        if entry.name not in entries and len(entries) >= MAX_GROUPS:
            raise RecorderFormatError(f"entries: more than {MAX_GROUPS} process groups")
        entries.setdefault(entry.name, []).append(entry)
        descs.setdefault(entry.name, entry.desc)
        if entry.pg_id is not None:
            pg_names.setdefault(entry.pg_id, entry.name)
        backend = backend or entry.backend
    status = _status(dump)
    pg_ids: dict[str, list[str]] = {}
    for pg, n in pg_names.items():
        pg_ids.setdefault(n, []).append(pg)
    known = _config_groups(dump)
    known.update({n: g for n, g in _table_groups(table).items() if g[1] is not None or n not in known})
    groups: dict[str, Any] = {}
    for name in list(entries) + [n for n in known if n not in entries]:
        rows = sorted(entries.get(name, ()), key=lambda en: en.seq)
        desc, members = known.get(name, ("", None))
        unknown = -1 if wrapped else 0  # a wrapped buffer lost what came before its first entry
        enq = rows[-1].seq if rows else unknown
        done = max((en.seq for en in rows if en.done),
                   default=rows[0].seq - 1 if rows and wrapped else unknown)
        for pg in pg_ids.get(name, ()):
            if pg in status:
                enq, done = max(enq, status[pg][0]), max(done, status[pg][1])
        # collectives of one group complete in order: a retired later one means the
        # earlier ones finished too (gloo retires lazily)
        pending = next((en for en in rows if en.seq > done and not en.done), None)
        recent = rows[-k:] if k else []
        if members is not None and (len(members) > MAX_SHIPPED_MEMBERS or name == "0"):
            members = None  # the world (group "0") or a large group: the layout says
        groups[name] = {
            "desc": descs.get(name) or desc,
            "ranks": members,
            "last_enqueued": enq,
            "last_completed": done,
            "pending": None if pending is None else {
                "seq": pending.seq, "op": pending.op, "sizes": pending.sizes,
                "dtypes": pending.dtypes, "enqueued_ns": pending.enqueued,
                "started_ns": pending.started},
            "recent": pack_recent([(en.seq, en.enqueued, en.started or 0) for en in recent]),
            "ops": _runs([en.op for en in recent]),
        }
    step = table.get("step") if type(table) is dict else None
    return {"v": SUMMARY_VERSION, "clock_ns": clock_ns,
            "version": version[:MAX_NAME] if type(version) is str else "",
            "backend": backend if backend in ("gloo", "nccl") else "",
            "wrapped": wrapped, "step": step if type(step) is int else None, "groups": groups}
