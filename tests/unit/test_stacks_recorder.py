"""The recorder half of a stacks probe answer, read on the controller: hostile rows are
that rank's error, an answer out of shape is the machine's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from brctl.core.transport import NodeState, RunResult
from brctl.diagnostics.pyspy_frames import RAW
from brctl.operations.stacks.ops import read_answers
from brctl.operations.stacks.recorder import RecorderAnswerError, recorder_fields
from brctl.operations.stacks.types import RankRead
from brctl.remote.probes import ProbeResult


def _row(**kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": 0, "pid": 10, "channel": "brctl-socket", "state": "read",
                           "proc_state": "S", "traceback": True, "table": True, "error": None,
                           "summary": {"v": 1}, "wchan": None}
    return {**row, **kw}


def test_rows_become_records() -> None:
    got = recorder_fields({"recorder": [_row(), _row(rank=1, pid=11, state="unread",
                                                     channel="none", summary=None)],
                           "unread": 2, "socket_errors": ["dir refused"]})
    assert got["recorder"][0] == RankRead(0, 10, "brctl-socket", "read", "S", True, True, None,
                                          {"v": 1}, None)
    assert got["recorder"][1].state == "unread"
    assert (got["unread"], got["socket_errors"]) == (2, ("dir refused",))


def test_one_rank_twice_keeps_the_first_row() -> None:
    """Two processes with one RANK (two jobs match): the rank screen judges, from the
    packed rows; the recorder keeps the first process's row."""
    got = recorder_fields({"recorder": [_row(), _row(pid=11, state="unread")]})
    assert got["recorder"][0].pid == 10


def test_a_row_out_of_shape_is_that_ranks_error() -> None:
    got = recorder_fields({"recorder": [_row(state="fine", summary=[1], table="yes")]})
    rec = got["recorder"][0]
    assert (rec.state, rec.summary) == ("unread", None)
    assert "state, table, summary" in str(rec.error)


@pytest.mark.parametrize("doc, where", [
    ({"recorder": {"0": {}}}, "recorder: expected a list"),
    ({"recorder": [{"rank": "0"}]}, "recorder[0]: expected an object with a rank"),
    ({"recorder": [], "unread": -1}, "unread"),
    ({"recorder": [], "socket_errors": [1]}, "socket_errors"),
    ({"recorder": [], "fr_raw": {"x": "{}"}}, "fr_raw"),
    ({"recorder": [], "fr_raw": {"1": {"dump": "{}", "clock_ns": "5"}}}, "fr_raw"),
    ({"recorder": [], "fr_raw": {"\u00b2": {"dump": "", "clock_ns": 0, "table": None}}},
     "fr_raw"),
])
def test_an_answer_out_of_shape_is_the_machines_error(doc: dict[str, Any], where: str) -> None:
    with pytest.raises(RecorderAnswerError, match=where.replace("[", r"\[").replace("]", r"\]")):
        recorder_fields(doc)


def test_the_machine_answer_carries_them() -> None:
    run = RunResult(node="n1", state=NodeState.OK, exit_code=0, stdout="", stderr="",
                    seconds=0.1)
    good = {"format": RAW, "processes": [], "dumps": [], "recorder": [_row()], "unread": 0,
            "socket_errors": [],
            "fr_raw": {"10": {"dump": "{}", "clock_ns": 5, "table": None}}}
    bad = {**good, "recorder": "x"}
    cols = read_answers({"n1": ProbeResult("n1", run, good, None), "n2": ProbeResult("n2", run, bad, None)})
    assert cols["n1"].recorder[0].summary == {"v": 1} and cols["n1"].fr_raw[10]["clock_ns"] == 5
    assert cols["n2"].state == "probe_error" and "recorder" in str(cols["n2"].error)


def test_save_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    from brctl.core.errors import InputError
    from brctl.operations.stacks.save_fr import save_recorder
    from brctl.operations.stacks.types import Collection, NodeCollection

    rec = RankRead(0, 10, "brctl-socket", "read")
    nc = NodeCollection("n1", "ok", None, recorder={0: rec},
                        fr_raw={10: {"dump": "{}", "clock_ns": 5, "table": None}})
    root = tmp_path / "save"
    (root / "n1").mkdir(parents=True)
    target = tmp_path / "cron"
    target.write_text("untouched")
    (root / "n1" / "0-10.fr.json").symlink_to(target)  # the job user planted it
    with pytest.raises(InputError, match="exists; brctl writes only new files"):
        save_recorder(root, [Collection({"n1": nc}, 0.0, 0.0)])  # the py-spy half's rule too
    assert target.read_text() == "untouched"
    (root / "n1" / "0-10.fr.json").unlink()
    save_recorder(root, [Collection({"n1": nc}, 0.0, 0.0)])
    assert (root / "n1" / "0-10.fr.json").read_text() == "{}"
    fresh = tmp_path / "save2"
    fresh.mkdir()
    (fresh / "round-2").symlink_to(tmp_path)  # a link where a directory goes
    with pytest.raises(InputError):
        save_recorder(fresh, [Collection({"n1": nc}, 0.0, 0.0)] * 2)
    assert not (tmp_path / "n1").exists()  # nothing written through the link
