"""``brctl stacks --from DIR`` reloads saved flight recorders (``.fr.json`` + ``.fr-meta.json``).

The saved directory is made from the real recorded gloo dumps of a skipped collective
(``tests/fixtures/recorder/skip.json``), with py-spy refused on every rank as on a
machine without CAP_SYS_PTRACE; the clock at the read is moved two minutes on (a capture
taken well into the hang: the recorded one was 2.5 s in).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from brctl.operations.stacks import ops as op
from brctl.operations.stacks import save as stacks_save
from tests.unit.test_recorder_analysis import load

REFUSED = "py-spy may not ptrace process {pid}: run brctl's probes as root or give them " \
          "CAP_SYS_PTRACE"


def saved(tmp_path: Path, later_s: int = 120) -> Path:
    doc = load("skip")
    root = tmp_path / "save"
    nodes: dict[str, Any] = {}
    for r in doc["ranks"]:
        rank, pid, node = r["rank"], 100 + r["rank"], f"m{r['rank'] // 2}"
        d = root / node
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{rank}-{pid}.error").write_text(REFUSED.format(pid=pid) + "\n")
        (d / f"{rank}-{pid}.fr.json").write_text(json.dumps(r["dump"]))
        (d / f"{rank}-{pid}.fr-meta.json").write_text(json.dumps({
            "clock_ns": r["clock_ns"] + later_s * 10**9, "table": r["table"],
            "channel": "brctl-socket", "state": "read", "proc_state": "S",
            "table_answered": True, "traceback": True, "error": None, "wchan": None}))
        nodes.setdefault(node, {"state": "ok", "error": None, "ranks": []})["ranks"].append(
            {"rank": rank, "pid": pid})
    (root / "job.json").write_text(json.dumps({
        "schema": stacks_save.SAVE_SCHEMA, "machines": ["m0", "m1"], "gpus": [2, 2], "tp": 2,
        "pp": 1, "cp": 1, "ep": 1, "order": "tp-cp-ep-dp-pp",
        "rounds": [{"dir": ".", "nodes": nodes}]}))
    return root


def test_from_reloads_the_recorder_and_names_the_culprit_without_py_spy(tmp_path: Path) -> None:
    collections, shape = stacks_save.load(saved(tmp_path))
    assert set(collections[0].nodes["m1"].recorder) == {2, 3}
    report = op.analyse(collections, shape)
    a = report.analysis
    assert a.collectives is not None
    assert [c.rank for c in a.collectives.culprits] == [3]
    assert a.evict == ("m1",) and a.unread == ()  # read through the socket: not unread
    assert report.exit_code == 1
    (g,) = [g for g in a.suspects if g.kind != "communicator"]
    assert g.evidence[0].startswith("rank 3 never entered all_reduce #3 of DATA_PARALLEL_GROUP")


def test_a_fifo_or_link_in_place_of_a_saved_dump_is_refused_not_followed(tmp_path: Path) -> None:
    import os

    root = saved(tmp_path)
    (root / "m1" / "3-103.fr.json").unlink()
    os.mkfifo(root / "m1" / "3-103.fr.json")  # would block a plain open() forever
    (root / "m1" / "2-102.fr.json").unlink()
    (root / "m1" / "2-102.fr.json").symlink_to("/dev/zero")
    collections, _ = stacks_save.load(root)
    rec = collections[0].nodes["m1"].recorder
    assert rec[3].state == rec[2].state == "unread"
    assert "regular file" in (rec[3].error or "") and rec[2].error


def test_from_in_flight_capture_evicts_nothing(tmp_path: Path) -> None:
    collections, shape = stacks_save.load(saved(tmp_path, later_s=0))
    report = op.analyse(collections, shape)
    assert report.analysis.evict == () and report.exit_code == 0


def test_a_hostile_saved_dump_is_that_ranks_error(tmp_path: Path) -> None:
    root = saved(tmp_path)
    (root / "m1" / "2-102.fr.json").write_text("[" * 100_000)  # deeply nested: not a dump
    (root / "m0" / "0-100.fr-meta.json").write_text(json.dumps({"channel": 7}))
    collections, shape = stacks_save.load(root)
    rec = collections[0].nodes["m1"].recorder[2]
    assert rec.state == "unread" and rec.error and "2-102.fr" in rec.error
    assert collections[0].nodes["m0"].recorder[0].state == "unread"
    report = op.analyse(collections, shape)
    coll = report.analysis.collectives
    assert coll is not None and [c.rank for c in coll.culprits] == [3]
    # ranks 0 and 2 lost: rank 1 alone says dp #3 hangs, and rank 3's own recorder agrees
    # (its last dp enqueue is two minutes old on its own clock): evicted, the run incomplete
    assert coll.culprits[0].corroborated
    assert report.analysis.evict == ("m1",) and report.exit_code == 3
