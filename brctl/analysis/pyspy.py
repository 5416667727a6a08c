"""Parse ``py-spy dump --json`` output into the main thread's stack.

py-spy prints a JSON list of thread objects (``py-spy dump --json``):
``pid, thread_id, thread_name, os_thread_id, active, owns_gil, frames[...]``,
frames innermost first, ``is_entry``/``is_shim_entry`` absent before v0.4. The
training thread is the main thread: on Linux its OS thread id equals the pid;
``thread_name`` is null when the program never imported ``threading``, so the
name is only a fallback. Frames are interned: identical stacks from many ranks
share their frame objects, which keeps 10⁵ ranks cheap to hold and compare.
Dumps taken with ``--native`` parse too: an unsymbolised native frame (named by its
address) becomes ``<native>`` in its library, so ranks stuck alike still cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

from brctl.analysis.stacks import Frame, Stack

# A native frame (``py-spy dump --native``) that py-spy could not symbolise is named by its
# address, which ASLR moves in every process: such frames are all one anonymous frame.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
NATIVE = "<native>"


class PySpyFormatError(ValueError):
    """The text is not py-spy's JSON (says what was expected)."""


def _main_thread(threads: list[Any], pid: int) -> dict[str, Any]:
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


def parse_dump(text: str, pid: int, intern: dict[Frame, Frame] | None = None) -> Stack:
    """The main thread's stack, outermost frame first.

    Args:
        text: py-spy's stdout for ``dump --json --pid PID``.
        pid: the dumped process (its main thread has this OS thread id).
        intern: a shared table so equal frames become one object (optional).

    Raises:
        PySpyFormatError: not a JSON list of threads with frames.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PySpyFormatError(f"not JSON: {exc}") from None
    if not isinstance(data, list):
        raise PySpyFormatError("expected a JSON list of threads")
    thread = _main_thread(data, pid)
    frames = thread.get("frames")
    if not isinstance(frames, list):
        raise PySpyFormatError("thread without a frames list")
    table = intern if intern is not None else {}
    out: list[Frame] = []
    for raw in reversed(frames):  # py-spy lists innermost first
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise PySpyFormatError("frame without a name")
        file = raw.get("short_filename") or raw.get("filename") or raw.get("module") or ""
        line = raw.get("line")
        name = NATIVE if _ADDRESS.fullmatch(raw["name"]) else raw["name"]
        frame = Frame(name, str(file), line if isinstance(line, int) else 0)
        out.append(table.setdefault(frame, frame))
    return tuple(out)
