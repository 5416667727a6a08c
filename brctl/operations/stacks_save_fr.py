"""``brctl stacks --save``: the flight-recorder half of the saved layout.

Beside py-spy's ``DIR/<node>/<rank>-<pid>.json`` (``stacks_save``), each rank read
through its socket gets ``<rank>-<pid>.fr.json``, the recorder's JSON exactly as
the rank answered (``fr_trace_json``), and (for every rank with a socket) ``<rank>-<pid>.fr-meta.json``: the
machine's clock when it was read (``clock_ns``: ages are taken against it), brctl's
group table as the job served it (``table``, or null) and how the rank was read
(``channel``, ``state``, ``proc_state``, ``table_answered``, ``traceback``, ``error``,
``wchan``). ``recorder.summarise(dump, table, clock_ns)`` of the two gives the very
summary the probe sent. Later rounds go under ``DIR/round-K/`` as there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from brctl.core.errors import InputError
from brctl.operations.stacks_types import Collection


def save_recorder(root: Path, collections: Sequence[Collection]) -> None:
    """Write each round's recorder files (the collections were taken ``raw``).

    Raises:
        InputError: the directory cannot be written.
    """
    try:
        for i, col in enumerate(collections):
            base = root if i == 0 else root / f"round-{i + 1}"
            for name, nc in col.nodes.items():
                for rank, rec in sorted(nc.recorder.items()):
                    raw = nc.fr_raw.get(rec.pid)
                    if raw is None and rec.channel == "none":
                        continue  # no socket: the py-spy files say all there is
                    ndir = base / name  # an inventory name; rank and pid are checked ints
                    ndir.mkdir(parents=True, exist_ok=True)
                    stem = f"{rank}-{rec.pid}"
                    if raw is not None:
                        (ndir / f"{stem}.fr.json").write_text(raw["dump"])
                    meta = {"clock_ns": raw["clock_ns"] if raw else None,
                            "table": raw["table"] if raw else None,
                            "channel": rec.channel, "state": rec.state,
                            "proc_state": rec.proc_state, "table_answered": rec.table,
                            "traceback": rec.traceback, "error": rec.error, "wchan": rec.wchan}
                    (ndir / f"{stem}.fr-meta.json").write_text(json.dumps(meta) + "\n")
    except OSError as exc:
        raise InputError(f"--save {root}: {exc.strerror or exc}") from None
