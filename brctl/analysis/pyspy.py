"""Stacks from the node: py-spy's raw JSON, or the probe's reduced frame table.

Two forms reach the controller, and both become the same ``Stack`` (the main
thread's frames, outermost first, normalised by ``diagnostics.pyspy_frames``):

- ``parse_dump``: py-spy's own ``dump --json`` text, as ``--save`` keeps it;
- ``frame_table`` + ``reduced_stack``: what the stacks probe ships by default,
  one frame table per machine (``name<TAB>file<TAB>line`` lines) and per rank
  the frames it shares with the previous rank's stack (``prefix``) and indices
  into the table. The probe's answer comes from a node and is hostile: every
  row and index is checked, and anything else is a ``PySpyFormatError`` naming
  where.

Frames are interned: identical stacks from many ranks share their frame objects,
which keeps 10⁵ ranks cheap to hold and compare.
"""

from __future__ import annotations

from typing import Any

from brctl.analysis.stacks import Frame, Stack
from brctl.diagnostics.pyspy_frames import NATIVE, PySpyFormatError, main_frames

__all__ = ["NATIVE", "PySpyFormatError", "frame_table", "parse_dump", "reduced_stack"]


def parse_dump(text: str, pid: int, intern: dict[Frame, Frame] | None = None) -> Stack:
    """The main thread's stack from py-spy's JSON, outermost frame first.

    Args:
        text: py-spy's stdout for ``dump --json --pid PID``.
        pid: the dumped process (its main thread has this OS thread id).
        intern: a shared table so equal frames become one object (optional).

    Raises:
        PySpyFormatError: not a JSON list of threads with frames.
    """
    table = intern if intern is not None else {}
    out = []
    for row in main_frames(text, pid):
        frame = Frame(*row)
        out.append(table.setdefault(frame, frame))
    return tuple(out)


def frame_table(text: Any, known: dict[str, Frame]) -> list[Frame]:
    """A machine's frame table (``name<TAB>file<TAB>line`` lines) as interned frames.

    ``known`` maps rows already read to their frame: a row seen on an earlier
    machine is one dictionary lookup, with no Python-level step per row, so
    16,384 machines running the same code cost little more than one.

    Raises:
        PySpyFormatError: not a text of such rows (says which row).
    """
    if type(text) is not str:
        raise PySpyFormatError("frames: expected the frame table's text")
    if not text:
        return []
    rows = text.split("\n")
    out: list[Frame | None] = list(map(known.get, rows))
    if None in out:
        for i, row in enumerate(rows):
            if out[i] is None:
                out[i] = known[row] = _row(row, i)
    return out  # type: ignore[return-value]  # every None was replaced above


def _row(row: str, i: int) -> Frame:
    name, tab, rest = row.partition("\t")
    file, tab2, line = rest.partition("\t")
    if not (tab and tab2 and line.isascii() and line.isdigit()):
        raise PySpyFormatError(f"frames row {i}: expected name<TAB>file<TAB>line, not {row!r:.60}")
    return Frame(name, file, int(line))


def reduced_stack(prefix: Any, indices: Any, table: list[Frame], previous: Stack) -> Stack:
    """One rank's stack: ``prefix`` frames of the previous stack, then ``indices`` into the table.

    Raises:
        PySpyFormatError: a prefix longer than the previous stack, or indices that
            are not integers within the table.
    """
    if type(prefix) is not int or not 0 <= prefix <= len(previous):
        raise PySpyFormatError(f"prefix must be an integer from 0 to {len(previous)}")
    if type(indices) is not list:
        raise PySpyFormatError("stack: expected a list of frame indices")
    try:
        if indices and min(indices) < 0:
            raise IndexError
        rest = tuple(map(table.__getitem__, indices))  # a non-integer is a TypeError
    except (IndexError, TypeError):
        raise PySpyFormatError(
            f"stack: indices must be integers from 0 to {len(table) - 1}") from None
    return previous[:prefix] + rest if prefix else rest
