"""``brctl stacks --save`` / ``--from``: write and read a collection on disk.

The layout: ``DIR/<node>/<rank>-<pid>.json`` (py-spy's JSON as it printed it),
``<rank>-<pid>.error`` and ``DIR/job.json`` (the topology and per-node outcome; later
rounds under ``DIR/round-K/``). Collecting and analysing are in
``brctl/operations/stacks/ops.py``.

A rank read through its socket also has ``<rank>-<pid>.fr.json`` (its flight
recorder's JSON as it answered) and ``<rank>-<pid>.fr-meta.json`` (the machine's
clock at the read, brctl's group table, how it was read), written by
``stacks_save_fr``. ``load`` reduces them with the node's own
``recorder.summarise``, so ``--from`` gives the summary the probe sent; a file
out of shape is that rank's error (``unread``), never the run's.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from brctl.analysis.topology import TopologyError
from brctl.core.errors import InputError
from brctl.diagnostics.recorder import summarise
from brctl.operations import safe_write
from brctl.operations.stacks.ops import Collection, JobShape, NodeCollection, RankDump
from brctl.operations.stacks.types import RankRead

MAX_FR_FILE = 64 << 20  # bytes of one saved recorder dump read back (2,000 entries: ~1 MB)

SAVE_SCHEMA = "brctl.stacks-save/1"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _round_dir(root: Path, index: int) -> Path:
    return root if index == 0 else root / f"round-{index + 1}"


def save(root: Path, collections: Sequence[Collection], shape: JobShape) -> None:
    """Write the collections in the ``--save`` layout (no environment values but ranks).

    The collections must have been taken ``raw``: the layout keeps py-spy's JSON.

    Raises:
        InputError: the directory cannot be written.
    """
    if any(r.output is None and r.stack is not None
           for col in collections for nc in col.nodes.values() for r in nc.ranks):
        raise ValueError("stacks.save needs py-spy's raw JSON: collect with raw=True")
    tree = safe_write.Tree(root, "--save")  # by fd, new files only: DIR may be shared
    try:
        rounds = []
        for i, col in enumerate(collections):
            base = _round_dir(root, i)
            nodes: dict[str, Any] = {}
            for name, nc in col.nodes.items():
                nodes[name] = {"state": nc.state, "error": nc.error, "workers": nc.workers,
                               "ranks": [{"rank": r.rank, "pid": r.pid, "local_rank": r.local_rank,
                                          "world_size": r.world_size} for r in nc.ranks]}
                if not nc.ranks:
                    continue
                ndir = os.path.relpath(base / name, root)
                for r in nc.ranks:
                    if r.output is not None:
                        tree.write_new(f"{ndir}/{r.rank}-{r.pid}.json", r.output)
                    else:
                        tree.write_new(f"{ndir}/{r.rank}-{r.pid}.error", (r.error or "") + "\n")
            rounds.append({"dir": os.path.relpath(base, root), "started": col.started,
                           "seconds": round(col.seconds, 3), "nodes": nodes})
        job = {"schema": SAVE_SCHEMA, "machines": list(shape.machines), "gpus": list(shape.gpus),
               "tp": shape.tp, "pp": shape.pp, "cp": shape.cp, "ep": shape.ep,
               "order": shape.order, "rounds": rounds}
        tree.write_new("job.json", json.dumps(job, indent=2) + "\n")
    finally:
        tree.close()


def _need(data: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected an object")
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InputError(f"{where}: key {key!r} must be a {kind.__name__}")
    return value


def _items(data: dict[str, Any], key: str, kind: type, where: str) -> list[Any]:
    """``data[key]``: a list whose every item is a ``kind`` (a hand-edited file says where not)."""
    values: list[Any] = _need(data, key, list, where)
    for i, value in enumerate(values):
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(f"{where}: {key}[{i}] must be a {kind.__name__}, not {value!r:.40}")
    return values


def _number(data: dict[str, Any], key: str, where: str) -> float:
    """An optional number (0 when absent)."""
    value = data.get(key) or 0
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InputError(f"{where}: key {key!r} must be a number")
    return float(value)


def _read_json(path: Path) -> Any:
    """A saved recorder file, size-capped (a hand-placed file is hostile too): opened
    without following a link and without blocking, and only a regular file is read (a
    FIFO planted under the name would hang ``--from``, /dev/zero feed it 64 MiB)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = fh.read(MAX_FR_FILE + 1)
    if len(data) > MAX_FR_FILE:
        raise ValueError(f"larger than {MAX_FR_FILE >> 20} MiB")
    return json.loads(data)


def _load_recorder(stem: Path, rank: int, pid: int) -> RankRead | None:
    """A rank's saved recorder (``.fr-meta.json`` + ``.fr.json``) as the probe's row, or None."""
    meta_path = stem.parent / f"{stem.name}.fr-meta.json"
    if not meta_path.exists():
        return None
    try:
        meta = _read_json(meta_path)
        if type(meta) is not dict:
            raise ValueError("expected an object")
        channel, state = meta.get("channel"), meta.get("state")
        if channel not in ("brctl-socket", "torch-socket", "none") or \
                state not in ("read", "unread", "unresponsive"):
            raise ValueError("channel/state out of shape")
        row = RankRead(rank, pid, channel, state, str(meta.get("proc_state") or "")[:4],
                       meta.get("traceback") is True, meta.get("table_answered") is True,
                       meta["error"][:600] if type(meta.get("error")) is str else None, None,
                       meta["wchan"][:600] if type(meta.get("wchan")) is str else None)
        dump_path = stem.parent / f"{stem.name}.fr.json"
        if not dump_path.exists():
            return row
        clock = meta.get("clock_ns")
        if type(clock) is not int:
            raise ValueError("clock_ns: expected an integer")
        return row._replace(summary=summarise(_read_json(dump_path), meta.get("table"), clock))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: JSON, RecorderFormatError
        why = exc.strerror if isinstance(exc, OSError) else "nested too deep" if isinstance(
            exc, RecursionError) else str(exc)
        return RankRead(rank, pid, "none", "unread", error=f"{stem.name}.fr: {why}"[:600])


def _load_node(base: Path, name: str, info: dict[str, Any], where: str) -> NodeCollection:
    if not isinstance(info, dict):
        raise InputError(f"{where}: expected an object")
    ranks = []
    recorder: dict[int, RankRead] = {}
    for j, r in enumerate(_items(info, "ranks", dict, where) if "ranks" in info else []):
        rank = _need(r, "rank", int, f"{where}.ranks[{j}]")
        pid = _need(r, "pid", int, f"{where}.ranks[{j}]")
        stem = base / name / f"{rank}-{pid}"
        try:
            if stem.with_suffix(".json").exists():
                output, error = stem.with_suffix(".json").read_text(), None
            else:
                output, error = None, stem.with_suffix(".error").read_text().strip()
        except OSError as exc:
            raise InputError(f"{stem}.json/.error: {exc.strerror}",
                             hint="every rank listed in job.json needs its dump or .error") from None
        ranks.append(RankDump(rank, pid, output, error, _int_or_none(r.get("local_rank")),
                              _int_or_none(r.get("world_size"))))
        if (read := _load_recorder(stem, rank, pid)) is not None:
            recorder.setdefault(rank, read)
    state = info.get("state") if isinstance(info.get("state"), str) else "ok"
    error = info.get("error")
    return NodeCollection(name, str(state), error if isinstance(error, str) else None,
                          tuple(ranks), int(_number(info, "workers", where)), recorder=recorder)


def load(root: Path) -> tuple[list[Collection], JobShape]:
    """Read a ``--save`` directory back.

    Raises:
        InputError: a missing or malformed ``job.json`` or dump file (names which and what).
    """
    path = root / "job.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"--from {root}: cannot read job.json: {exc.strerror}",
                         hint="point --from at a directory written by brctl stacks --save") from None
    except ValueError as exc:
        raise InputError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SAVE_SCHEMA:
        raise InputError(f"{path}: expected \"schema\": \"{SAVE_SCHEMA}\"")
    shape = JobShape(tuple(_items(data, "machines", str, str(path))),
                     tuple(_items(data, "gpus", int, str(path))),
                     _need(data, "tp", int, str(path)), _need(data, "pp", int, str(path)),
                     _need(data, "cp", int, str(path)), _need(data, "ep", int, str(path)),
                     _need(data, "order", str, str(path)))
    try:
        shape.topology()  # a shape the job could not have had is the file's error, said here
    except TopologyError as exc:
        raise InputError(f"{path}: {exc}", hint=exc.hint) from None
    collections = []
    for i, rnd in enumerate(_items(data, "rounds", dict, str(path))):
        where = f"{path}: rounds[{i}]"
        base = root / (_need(rnd, "dir", str, where) if "dir" in rnd else ".")
        nodes = {name: _load_node(base, name, info, f"{where}.nodes.{name}")
                 for name, info in _need(rnd, "nodes", dict, where).items()}
        collections.append(Collection(nodes, _number(rnd, "started", where),
                                      _number(rnd, "seconds", where)))
    if not collections:
        raise InputError(f"{path}: no rounds recorded")
    return collections, shape
