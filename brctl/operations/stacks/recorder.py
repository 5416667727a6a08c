"""The recorder half of a stacks probe answer: each rank's channel, state and summary.

A node's answer is hostile input: ``recorder_fields`` checks every row's shape.
A row without an integer rank, or more rows than ranks a machine can hold, is
the machine's error (``RecorderAnswerError``); a row whose other fields are out
of shape is that rank's error (state ``unread``, the fields dropped). The
summaries stay as they came: the collective analysis decodes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from brctl.analysis.collective_analysis import CollectiveAnalysis
from brctl.operations.stacks.types import Collection, RankRead

CHANNELS = frozenset({"brctl-socket", "torch-socket", "none"})
STATES = frozenset({"read", "unread", "unresponsive"})
MAX_ROWS = 1 << 14  # rows one machine may send (its ranks: 8-72 on real machines)
MAX_TEXT = 600
_PID = re.compile(r"[0-9]{1,10}")  # ASCII: str.isdigit takes '²', which int() refuses


class RecorderAnswerError(ValueError):
    """The ``recorder`` fields of an answer are not the probe's (says where)."""


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if type(value) is str else None


def _row(i: int, row: Any) -> RankRead:
    if type(row) is not dict or type(rank := row.get("rank")) is not int or rank < 0:
        raise RecorderAnswerError(f"recorder[{i}]: expected an object with a rank")
    pid, channel, state = row.get("pid"), row.get("channel"), row.get("state")
    summary = row.get("summary")
    bad = [name for name, ok in (
        ("pid", type(pid) is int and pid >= 0), ("channel", channel in CHANNELS),
        ("state", state in STATES), ("proc_state", type(row.get("proc_state")) is str),
        ("traceback", type(row.get("traceback")) is bool),
        ("table", type(row.get("table")) is bool),
        ("summary", summary is None or type(summary) is dict),
        ("error", row.get("error") is None or type(row.get("error")) is str),
        ("wchan", row.get("wchan") is None or type(row.get("wchan")) is str)) if not ok]
    if bad:
        return RankRead(rank, pid if type(pid) is int else 0, "none", "unread",
                          error=f"a malformed recorder row ({', '.join(bad)} out of shape)")
    return RankRead(rank, int(pid or 0), str(channel), str(state), str(row["proc_state"])[:4],
                      row["traceback"],
                      row["table"], _text(row.get("error")), summary, _text(row.get("wchan")))


def recorder_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """``NodeCollection``'s recorder fields from a probe answer (empty: a probe that was
    not asked, or an older one)."""
    rows = doc.get("recorder")
    if rows is None:
        return {}
    if type(rows) is not list or len(rows) > MAX_ROWS:
        raise RecorderAnswerError(f"recorder: expected a list of at most {MAX_ROWS} rows")
    records: dict[int, RankRead] = {}
    for i, row in enumerate(rows):
        rec = _row(i, row)
        # one RANK in two processes is the rank screen's to judge (its packed rows say so)
        records.setdefault(rec.rank, rec)
    unread, errors = doc.get("unread", 0), doc.get("socket_errors", [])
    if type(unread) is not int or unread < 0:
        raise RecorderAnswerError("unread: expected a count")
    if type(errors) is not list or len(errors) > 64 or any(type(e) is not str for e in errors):
        raise RecorderAnswerError("socket_errors: expected at most 64 strings")
    out: dict[str, Any] = {"recorder": records, "unread": unread,
                           "socket_errors": tuple(e[:MAX_TEXT] for e in errors)}
    raw = doc.get("fr_raw")
    if raw is not None:
        if type(raw) is not dict or not all(type(k) is str and _PID.fullmatch(k) and _raw_ok(v)
                                            for k, v in raw.items()):
            raise RecorderAnswerError("fr_raw: expected pid → {dump: the recorder's JSON text, "
                                      "clock_ns, table}")
        out["fr_raw"] = {int(k): v for k, v in raw.items()}
    return out


def _raw_ok(v: Any) -> bool:
    return (type(v) is dict and type(v.get("dump")) is str and type(v.get("clock_ns")) is int
            and (v.get("table") is None or type(v.get("table")) is dict))


def rank_reads(col: Collection, coll: CollectiveAnalysis | None = None,
               summary_errors: Mapping[int, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per rank (a string key, as JSON has), how it was read in this round: its machine,
    pid, ``channel``, ``state``, ``proc_state``, whether brctl's table and the traceback
    answered, the socket's error, why py-spy gave no stack (``stack_error``), where the
    kernel holds it (``wchan``), and what its recorder says per group (``collectives``:
    ``coll.rank_json``), or why its summary was refused (``summary_error``)."""
    out: dict[str, dict[str, Any]] = {}
    for node, nc in col.nodes.items():
        if not nc.recorder:
            continue
        stack_errors = {rd.rank: rd.error for rd in nc.ranks}
        for rank, rec in sorted(nc.recorder.items()):
            out.setdefault(str(rank), {
                "node": node, "pid": rec.pid, "channel": rec.channel, "state": rec.state,
                "proc_state": rec.proc_state, "table": rec.table, "traceback": rec.traceback,
                "error": rec.error, "stack_error": stack_errors.get(rank), "wchan": rec.wchan,
                "collectives": coll.rank_json(rank) if coll is not None else None,
                "summary_error": (summary_errors or {}).get(rank)})
    return out
