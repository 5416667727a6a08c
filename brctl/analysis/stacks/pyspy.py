"""Stacks from the node: py-spy's raw JSON, or the probe's reduced frame table.

Two forms reach the controller, and both become the same ``Stack`` (the main
thread's frames, outermost first, normalised by ``diagnostics.pyspy_frames``):

- ``parse_dump``: py-spy's own ``dump --json`` text, as ``--save`` keeps it;
- ``frame_table`` + ``packed_ints`` + ``packed_stacks``: what the stacks probe
  ships by default (``pyspy_frames.PACKED``), one frame table per machine
  (``name<TAB>file<TAB>line`` lines) and per rank the frames it shares with the
  previous rank's stack (``prefix``) and indices into the table, all packed as
  integers in a few strings. The probe's answer comes from a node and is
  hostile: every row, count and index is checked (in bulk: bounds over whole
  lists, not a Python step per field), and anything else is a
  ``PySpyFormatError`` naming where. A stack is rebuilt from the one before it,
  so the frames held are bounded too (``packed_stacks``): none deeper than
  ``MAX_DEPTH`` and, over the machine, a number linear in its answer, else an
  answer of a few MB would make the controller hold frames quadratic in it.

Frames are interned: identical stacks from many ranks share their frame objects,
which keeps 10⁵ ranks cheap to hold and compare.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from operator import add, itemgetter
from typing import Any

from brctl.analysis.stacks.tree import Frame, Stack
from brctl.diagnostics.pyspy_frames import MAX_DEPTH, NATIVE, PySpyFormatError, main_frames

_LITTLE = sys.byteorder == "little"

__all__ = ["MAX_DEPTH", "NATIVE", "FrameCache", "PySpyFormatError", "frame_table", "packed_ints",
           "packed_stacks", "parse_dump"]

# The frames a machine's stacks may hold beyond the indices it shipped: per rank,
# and spare for a few full-depth stacks (py-spy's stacks of a training loop are
# 40-250 frames; a rank whose stack equals the one before it shares that tuple
# and costs none). Past that, the answer is refused, not held.
FRAMES_PER_RANK = 256
FRAMES_SPARE = 16 * MAX_DEPTH


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


FrameCache = dict[str, Any]
"""Frame tables already read: each row's text → its ``Frame``, and each whole
table's text, behind a newline (no row holds one) → its frames."""


def frame_table(text: Any, known: FrameCache) -> tuple[Frame, ...]:
    """A machine's frame table (``name<TAB>file<TAB>line`` lines) as interned frames.

    ``known`` holds the tables and rows already read: machines running the same
    code ship the same table, one dictionary lookup of its text; a new table's
    row seen on an earlier machine is one lookup too, with no Python-level step
    per row, so 16,384 machines cost little more than one.

    Raises:
        PySpyFormatError: not a text of such rows (says which row).
    """
    if type(text) is not str:
        raise PySpyFormatError("frames: expected the frame table's text")
    whole = "\n" + text
    done: tuple[Frame, ...] | None = known.get(whole)
    if done is not None:
        return done
    rows = text.split("\n") if text else []
    out: list[Frame | None] = list(map(known.get, rows))
    if None in out:
        for i, row in enumerate(rows):
            if out[i] is None:
                out[i] = known[row] = _row(row, i)
    known[whole] = table = tuple(out)
    return table  # type: ignore[return-value]  # every None was replaced above


def _row(row: str, i: int) -> Frame:
    name, tab, rest = row.partition("\t")
    file, tab2, line = rest.partition("\t")
    if not (tab and tab2 and line.isascii() and line.isdigit()):
        raise PySpyFormatError(f"frames row {i}: expected name<TAB>file<TAB>line, not {row!r:.60}")
    return Frame(name, file, int(line))


def packed_ints(text: Any, code: str, what: str) -> array[int]:
    """A packed field: big-endian binary integers of ``array`` type ``code``, in hex.

    Raises:
        PySpyFormatError: not such a text (names ``what``).
    """
    out = array(code)
    try:
        if type(text) is not str:
            raise ValueError
        out.frombytes(bytes.fromhex(text))  # C-level: no Python step per number
    except ValueError:  # not hex, or not a whole number of integers
        raise PySpyFormatError(f"{what}: expected hex of {out.itemsize}-byte integers") from None
    if _LITTLE:
        out.byteswap()
    return out


def packed_stacks(heads: array[int], indices: Any, table: Sequence[Frame]
                  ) -> list[Stack | None]:
    """Each rank's stack from ``heads`` (``prefix, count`` per rank; count -1: no stack).

    A stack is ``prefix`` frames of the stack before it, then ``count`` frames
    taken from ``indices`` (hex of uint16 into ``table``, uint32 when the text
    is twice as long as that needs) in turn.

    Raises:
        PySpyFormatError: an index outside the table, counts that do not add up
            to the indices, a prefix longer than the stack before it, a stack
            deeper than ``MAX_DEPTH``, or stacks holding more frames than
            ``FRAMES_PER_RANK`` per rank and ``FRAMES_SPARE`` beyond the indices.
    """
    prefixes, counts = heads[::2], heads[1::2]
    if heads and min(heads) < 0:  # a -1 count (no stack) is the only negative allowed
        if min(counts) < -1:
            raise PySpyFormatError("stacks: a frame count below -1")
        if min(prefixes) < 0:
            raise PySpyFormatError("stacks: a prefix below 0")
    total = sum(counts) + counts.count(-1)  # the -1s (no stack) take nothing
    if type(indices) is not str or len(indices) not in (4 * total, 8 * total):
        raise PySpyFormatError(f"indices: expected hex of the stacks' {total} frame indices")
    # Bounds before a frame is held, each checked only when a cheaper one may not hold:
    # with every prefix within the stack before it (checked below, before that rank's
    # stack is built), no stack is deeper than all the indices together, so the n
    # ranks hold at most n times that, and at most the sum of their prefixes and counts.
    if total > MAX_DEPTH and max(map(add, prefixes, counts)) > MAX_DEPTH:
        raise PySpyFormatError(f"stacks: a stack deeper than {MAX_DEPTH} frames")
    n = len(counts)
    most = total + FRAMES_PER_RANK * n + FRAMES_SPARE
    if (n * total > most and sum(prefixes) + total > most
            and (built := _frames_built(prefixes, counts)) > most):
        raise PySpyFormatError(
            f"stacks: {built} frames held, more than {most} ({FRAMES_PER_RANK} a rank and "
            f"{FRAMES_SPARE} beyond the {total} shipped)")
    flat = packed_ints(indices, "H" if len(indices) == 4 * total else "I", "indices")
    try:  # unsigned, so only an index past the table is out of bounds: an IndexError
        # itemgetter looks them all up in C; a slice of the tuple is then a rank's stack
        frames = itemgetter(*flat)(table) if total > 1 else tuple(table[i] for i in flat)
    except IndexError:
        raise PySpyFormatError(f"indices must be from 0 to {len(table) - 1}") from None
    out: list[Stack | None] = []
    previous: Stack = ()
    at = 0
    for prefix, count in zip(prefixes, counts):
        if count < 0:
            if prefix:
                raise PySpyFormatError(f"stacks[{len(out)}]: a prefix without a stack")
            out.append(None)
            continue
        if prefix > len(previous):
            raise PySpyFormatError(
                f"stacks[{len(out)}]: prefix must be from 0 to {len(previous)}")
        if count or prefix != len(previous):  # else the very stack before it, shared
            end = at + count
            previous = previous[:prefix] + frames[at:end] if prefix else frames[at:end]
            at = end
        out.append(previous)
    return out


def _frames_built(prefixes: array[int], counts: array[int]) -> int:
    """The frames ``packed_stacks`` would hold: a new tuple per rank, except a rank
    whose stack is the one before it (no new frames, the whole prefix), which shares it.

    Ranks that ``packed_stacks`` then refuses count as if valid: it stops at the
    first, having held no more than this counted up to there.
    """
    built = depth = 0
    for prefix, count in zip(prefixes, counts):
        if count >= 0 and (count or prefix != depth):
            depth = prefix + count
            built += depth
    return built
