"""py-spy's JSON → the main thread's frames, normalised, and a machine's frame table.

Node-side; standard library only. The stacks probe reduces every dump with it
before shipping, and the controller reads saved raw dumps (``--save``) through
the very same functions, so both paths give identical stacks.

``py-spy dump --json`` prints a list of thread objects: ``pid, thread_id,
thread_name, os_thread_id, active, owns_gil, frames[...]``, frames innermost
first. The training thread is the main thread: on Linux its OS thread id equals
the pid; ``thread_name`` is null when the program never imported ``threading``,
so the name is only a fallback. A frame is normalised to ``(name, file, line)``:
the short filename (else the path, else the module), and an unsymbolised native
frame (``--native``, named by an address that ASLR moves in every process)
becomes ``<native>`` so ranks stuck alike still look alike. Control characters
(a tab or newline in a file name) become U+FFFD: they mean nothing in a frame,
and the table's rows could not hold them.

The reduced form the probe ships per machine (``PACKED``): ``frames``, the table
of distinct frames as one text, a ``name<TAB>file<TAB>line`` row per line (one
string decodes far faster than a list per frame, and equal rows are looked up
whole), and its ranks packed as big-endian binary integers in three hex strings
(``pack``): ``ranks`` (rank, pid, local rank, world size: four int32 per rank),
``stacks`` (two int32 per rank: ``prefix``, how many outermost frames the stack
shares with the stack shipped just before it, and how many frame indices follow,
-1 for no stack) and ``indices`` (all ranks' indices into the table, outermost
first: uint16, or uint32 when the table has more than 65,536 rows; the width
follows from the counts). A handful of JSON values per machine instead of ~20
per rank, decoded by ``bytes.fromhex`` and ``array`` without a Python step per
number (16,384 machines' answers were 3.3 s of the controller's CPU as ~20 JSON
values per rank, checked one by one).
The ranks of one machine share nearly all their frames (the training loop down
to the collective they wait in), so a machine ships each frame once and each
rank little more than where it differs, instead of py-spy's ~200 bytes per frame
per rank.
"""

from __future__ import annotations

import json
import re
import sys
from array import array
from typing import Any

NATIVE = "<native>"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

RawFrame = tuple[str, str, int]  # (function, file, line)

# The two shapes of a stacks probe answer; the controller refuses any other (an
# answer of another brctl version, or not the probe's at all).
PACKED = "brctl.stacks-probe/2"  # reduced frames, ranks packed (the default)
RAW = "brctl.stacks-probe-raw/2"  # py-spy's JSON per rank, as printed (``--save``)

# The most frames a stack may have. py-spy itself refuses a thread deeper than
# 4,096 Python frames ("Max frame recursion depth reached", src/stack_trace.rs);
# twice that leaves room for native frames. The probe refuses a deeper dump
# (that rank's error), and the controller refuses an answer claiming one: a
# stack is rebuilt from the one before it, so an unbounded depth would let a
# small answer make the controller hold frames quadratic in its size.
MAX_DEPTH = 8192


class PySpyFormatError(ValueError):
    """The text is not py-spy's JSON (says what was expected)."""


def main_thread(threads: list[Any], pid: int) -> dict[str, Any]:
    """The dumped process's main thread among py-spy's thread objects."""
    dicts = [t for t in threads if isinstance(t, dict)]
    if not dicts:
        raise PySpyFormatError("no thread objects in the dump")
    for t in dicts:
        if t.get("os_thread_id") == pid:
            return t
    for t in dicts:
        if t.get("thread_name") == "MainThread":
            return t
    return dicts[-1]  # py-spy's JSON keeps the interpreter's order: main thread last


def normalise(raw: Any) -> RawFrame:
    """One py-spy frame object as ``(name, file, line)``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise PySpyFormatError("frame without a name")
    file = str(raw.get("short_filename") or raw.get("filename") or raw.get("module") or "")
    line = raw.get("line")
    name = NATIVE if _ADDRESS.fullmatch(raw["name"]) else raw["name"]
    return (_CONTROL.sub("\ufffd", name), _CONTROL.sub("\ufffd", file),
            line if isinstance(line, int) and not isinstance(line, bool) else 0)


def main_frames(text: str, pid: int) -> list[RawFrame]:
    """The main thread's normalised frames, outermost first.

    Args:
        text: py-spy's stdout for ``dump --json --pid PID``.
        pid: the dumped process (its main thread has this OS thread id).

    Raises:
        PySpyFormatError: not a JSON list of threads with frames.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PySpyFormatError(f"not JSON: {exc}") from None
    if not isinstance(data, list):
        raise PySpyFormatError("expected a JSON list of threads")
    frames = main_thread(data, pid).get("frames")
    if not isinstance(frames, list):
        raise PySpyFormatError("thread without a frames list")
    if len(frames) > MAX_DEPTH:
        raise PySpyFormatError(f"{len(frames)} frames: more than {MAX_DEPTH}")
    return [normalise(raw) for raw in reversed(frames)]  # py-spy lists innermost first


class FrameTable:
    """A machine's distinct frames, in first-seen order; stacks ship as indices into it."""

    def __init__(self) -> None:
        self.rows: list[RawFrame] = []
        self._ids: dict[RawFrame, int] = {}
        self._last: list[int] = []

    def delta(self, frames: list[RawFrame]) -> tuple[int, list[int]]:
        """``frames`` as (frames shared with the previous call's stack, the rest as indices)."""
        ids = self.indices(frames)
        prefix = 0
        for mine, theirs in zip(ids, self._last):
            if mine != theirs:
                break
            prefix += 1
        self._last = ids
        return prefix, ids[prefix:]

    def text(self) -> str:
        """The table as shipped: ``name<TAB>file<TAB>line`` rows, one per line."""
        return "\n".join(f"{name}\t{file}\t{line}" for name, file, line in self.rows)

    def indices(self, frames: list[RawFrame]) -> list[int]:
        """``frames`` as row indices (new frames are appended to the table)."""
        out = []
        for frame in frames:
            i = self._ids.get(frame)
            if i is None:
                i = self._ids[frame] = len(self.rows)
                self.rows.append(frame)
            out.append(i)
        return out


def _int32(value: int | None) -> int:
    return value if value is not None and 0 <= value < _INT32 else -1


def pack(procs: list[dict[str, Any]], stacks: dict[int, list[RawFrame] | str]) -> dict[str, Any]:
    """A machine's processes and their stacks as the ``PACKED`` answer's fields.

    Args:
        procs: the probe's process rows (``pid, role, rank, local_rank, world_size``).
        stacks: pid → the main thread's frames, or why there are none; a rank
            missing here was not dumped (another machine's, or no py-spy).

    Returns:
        ``workers`` (a count), ``ranks``, ``stacks``, ``indices`` (packed
        integers, see the module), ``errors`` (``[position, why]`` per rank that
        has a reason instead of a stack) and ``frames`` (the table's text). An
        unknown, negative or out-of-range (past int32) rank, local rank or world
        size is -1 (which the controller reports: no job has such a rank).
    """
    table = FrameTable()
    ranks: list[int] = []
    heads: list[int] = []
    indices: list[int] = []
    errors: list[list[Any]] = []
    workers = 0
    for p in procs:
        if p["role"] == "worker":
            workers += 1
        if p["role"] != "rank":
            continue
        local, size = p["local_rank"], p["world_size"]
        got = stacks.get(p["pid"])
        if isinstance(got, str):
            errors.append([len(heads) // 2, got])
        ranks += [_int32(p["rank"]), p["pid"], _int32(local), _int32(size)]
        if isinstance(got, list):
            prefix, rest = table.delta(got)
            heads += [prefix, len(rest)]
            indices += rest
        else:
            heads += [0, -1]
    wide = len(table.rows) > 1 << 16
    return {"workers": workers, "ranks": hex_ints("i", ranks), "stacks": hex_ints("i", heads),
            "indices": hex_ints("I" if wide else "H", indices), "errors": errors,
            "frames": table.text()}


_INT32 = 1 << 31


def hex_ints(code: str, values: list[int]) -> str:
    """``values`` as big-endian binary integers of ``array`` type ``code``, in hex."""
    packed = array(code, values)
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes().hex()
