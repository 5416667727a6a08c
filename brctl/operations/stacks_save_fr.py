"""``brctl stacks --save``: the flight-recorder half of the saved layout.

Beside py-spy's ``DIR/<node>/<rank>-<pid>.json`` (``stacks_save``), each rank read
through its socket gets ``<rank>-<pid>.fr.json``, the recorder's JSON exactly as
the rank answered (``fr_trace_json``), and (for every rank with a socket)
``<rank>-<pid>.fr-meta.json``: the machine's clock when it was read (``clock_ns``:
ages are taken against it), brctl's group table as the job served it (``table``,
or null) and how the rank was read (``channel``, ``state``, ``proc_state``,
``table_answered``, ``traceback``, ``error``, ``wchan``).
``recorder.summarise(dump, table, clock_ns)`` of the two gives the very summary the
probe sent. Later rounds go under ``DIR/round-K/`` as there.

``DIR`` may be a shared directory the job's user can write (``/tmp/dumps``), and
ranks and pids are public: every directory below ``DIR`` is reached by fd without
following a link (``safefs.make_dirs``), and every file is created anew
(``O_CREAT|O_EXCL|O_NOFOLLOW``; a name already there, link or file, is unlinked
first, never written through).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from pathlib import Path

from brctl.core.errors import InputError
from brctl.diagnostics.safefs import make_dirs, open_file
from brctl.operations.stacks_types import Collection


def _write_new(dir_fd: int, name: str, text: str) -> None:
    try:
        fd = open_file(dir_fd, name, os.O_WRONLY | os.O_CREAT, 0o644)
    except FileExistsError:
        os.unlink(name, dir_fd=dir_fd)  # an earlier save's file, or a planted link: unlinked
        fd = open_file(dir_fd, name, os.O_WRONLY | os.O_CREAT, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def save_recorder(root: Path, collections: Sequence[Collection]) -> None:
    """Write each round's recorder files (the collections were taken ``raw``).

    Raises:
        InputError: the directory cannot be written, or a link sits where a directory goes.
    """
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"--save {root}: {exc.strerror or exc}") from None
    try:
        for i, col in enumerate(collections):
            base = "" if i == 0 else f"round-{i + 1}/"
            for name, nc in col.nodes.items():
                rows = [(rank, rec) for rank, rec in sorted(nc.recorder.items())
                        if rec.channel != "none" or rec.pid in nc.fr_raw]
                if not rows:
                    continue  # no socket: the py-spy files say all there is
                ndir = make_dirs(top, f"{base}{name}", 0o755)  # an inventory name
                try:
                    for rank, rec in rows:
                        raw = nc.fr_raw.get(rec.pid)
                        stem = f"{rank}-{rec.pid}"  # checked ints
                        if raw is not None:
                            _write_new(ndir, f"{stem}.fr.json", raw["dump"])
                        meta = {"clock_ns": raw["clock_ns"] if raw else None,
                                "table": raw["table"] if raw else None,
                                "channel": rec.channel, "state": rec.state,
                                "proc_state": rec.proc_state, "table_answered": rec.table,
                                "traceback": rec.traceback, "error": rec.error,
                                "wchan": rec.wchan}
                        _write_new(ndir, f"{stem}.fr-meta.json", json.dumps(meta) + "\n")
                finally:
                    os.close(ndir)
    except OSError as exc:
        why = "a link where a directory goes" if exc.errno == errno.ELOOP else (
            exc.strerror or str(exc))
        raise InputError(f"--save {root}: {why}") from None
    finally:
        os.close(top)
