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
ranks and pids are public: the files are written as ``stacks_save`` writes py-spy's,
through ``safe_write.Tree`` (``DIR`` reached by trusted links only, every directory
below it by fd without following a link, every file created new: a name already
there, link or file, is refused, never written through or replaced).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from brctl.operations import safe_write
from brctl.operations.stacks.types import Collection


def save_recorder(root: Path, collections: Sequence[Collection]) -> None:
    """Write each round's recorder files (the collections were taken ``raw``).

    Raises:
        InputError: the directory cannot be written, a link sits where a directory goes, or
            a file of this save is there already.
    """
    tree = safe_write.Tree(root, "--save")
    try:
        for i, col in enumerate(collections):
            base = "" if i == 0 else f"round-{i + 1}/"
            for name, nc in col.nodes.items():
                rows = [(rank, rec) for rank, rec in sorted(nc.recorder.items())
                        if rec.channel != "none" or rec.pid in nc.fr_raw]
                for rank, rec in rows:  # no socket, no row: the py-spy files say all there is
                    raw = nc.fr_raw.get(rec.pid)
                    stem = f"{base}{name}/{rank}-{rec.pid}"  # an inventory name; checked ints
                    if raw is not None:
                        tree.write_new(f"{stem}.fr.json", raw["dump"])
                    meta = {"clock_ns": raw["clock_ns"] if raw else None,
                            "table": raw["table"] if raw else None,
                            "channel": rec.channel, "state": rec.state,
                            "proc_state": rec.proc_state, "table_answered": rec.table,
                            "traceback": rec.traceback, "error": rec.error,
                            "wchan": rec.wchan}
                    tree.write_new(f"{stem}.fr-meta.json", json.dumps(meta) + "\n")
    finally:
        tree.close()
