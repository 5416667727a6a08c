"""py-spy parsing, the stacks probe on this host (real py-spy, real processes), save/load, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.analysis.stacks.pyspy import PySpyFormatError, parse_dump
from brctl.core.transport import Node
from brctl.operations.stacks import ops as op
from brctl.operations.stacks import save as stacks_save
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner
from tests.kits.waiting import wait_for

DATA = Path(__file__).parent.parent / "unit" / "data"
GOLDEN_PID = 27080  # the process tests/unit/data/pyspy_dump.json was taken from
# Per test process: a run of this file in another checkout, or another xdist worker, on
# the same host starts ranks of its own that the same pattern would find.
MARK = f"brctl-unit-stacks-{os.getpid()}-target"  # pid 12 must not match 123
TARGET = """
import os, sys, threading, time
def waiting():  # the test dumps the ranks once each says so and sleeps
    open(os.path.join(os.environ["READY"], os.environ["RANK"]), "w").close()
def stuck_reading_batch():
    waiting()
    time.sleep(600)
def wait_for_peers():
    waiting()
    threading.Event().wait()
def train_step():
    if os.environ["RANK"] == os.environ.get("BAD_RANK"):
        stuck_reading_batch()
    wait_for_peers()
if os.environ["RANK"] == "0":  # a data-loader worker: inherits RANK, reported under rank 0
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "worker"])
train_step()
"""


def test_parse_golden_dump_picks_the_main_thread() -> None:
    text = (DATA / "pyspy_dump.json").read_text()
    stack = parse_dump(text, GOLDEN_PID)
    assert [f.name for f in stack] == ["<module>", "train_step", "blocked_in_collective",
                                       "Event.wait", "Condition.wait"]
    assert stack[-1].file == "threading.py" and stack[0].line > 0
    # without the pid match, the thread name still finds it
    assert parse_dump(text, 1)[-1].name == "Condition.wait"


def test_parse_tolerates_old_py_spy_and_interns_frames() -> None:
    old = [{"pid": 5, "thread_id": 1, "thread_name": None, "os_thread_id": 5, "active": False,
            "owns_gil": False, "process_info": None,
            "frames": [{"name": "wait", "filename": "/x/a.py", "module": None,
                        "short_filename": "a.py", "line": 3, "locals": None},
                       {"name": "<module>", "filename": "/x/a.py", "module": None,
                        "short_filename": None, "line": 9, "locals": None}]}]
    table: dict[Any, Any] = {}
    one = parse_dump(json.dumps(old), 5, table)
    two = parse_dump(json.dumps(old), 5, table)
    assert one == two and one[0] is two[0]
    assert one[0].file == "/x/a.py" and one[1].file == "a.py"


def _native_dump(pid: int, base: int) -> str:
    """``py-spy dump --native --json`` of a rank sleeping in train_step (as seen on a real run)."""
    def native(name: str, lib: str) -> dict[str, Any]:
        return {"name": name, "filename": f"/usr/lib/{lib}", "module": f"/usr/lib/{lib}",
                "short_filename": lib, "line": 0, "locals": None, "is_entry": True}

    frames = [native("clock_nanosleep", "libc.so.6"), native("time_sleep", "libpython3.11.so.1.0"),
              {"name": "train_step", "filename": "/w/train.py", "short_filename": "train.py",
               "line": 62, "module": None},
              {"name": "<module>", "filename": "/w/train.py", "short_filename": "train.py",
               "line": 90, "module": None},
              native(hex(base + 0x4524A), "libc.so.6")]  # unsymbolised: ASLR moves it per process
    return json.dumps([{"pid": pid, "thread_id": 1, "thread_name": "MainThread",
                        "os_thread_id": pid, "frames": frames}])


def test_native_frames_of_different_processes_cluster_together() -> None:
    from brctl.analysis.stacks.tree import signature

    one = parse_dump(_native_dump(101, 0x7F89B6000000), 101)
    two = parse_dump(_native_dump(102, 0x7F5B7B200000), 102)
    assert signature(one) == signature(two)
    assert one[0].name == "<native>" and one[0].file == "libc.so.6"
    assert one[-1].name == "clock_nanosleep"  # symbolised native frames keep their names


@pytest.mark.parametrize("text", ["", "{}", "[1]", '[{"frames": [{"line": 1}]}]', "nope"])
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(PySpyFormatError):
        parse_dump(text, 1)


def _asleep(pid: int) -> bool:
    """Whether ``pid``'s main thread is blocked (state S)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
    except (OSError, IndexError):
        return False


@pytest.fixture
def job(tmp_path: Path) -> Iterator[dict[int, int]]:
    """Four ranks of a fake job on this host (rank 2 stuck elsewhere); rank → pid, once
    each is in its wait: it said so just before, and its main thread is blocked."""
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = []
    for rank in range(4):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4",
               "BAD_RANK": "2", "HF_TOKEN": "hunter2-secret", "READY": str(ready)}
        procs.append(subprocess.Popen([sys.executable, "-c", TARGET, MARK], env=env,
                                      start_new_session=True))
    try:
        wait_for(lambda: all((ready / str(rank)).exists() and _asleep(p.pid)
                             for rank, p in enumerate(procs)), "the four ranks to reach their wait")
        yield {rank: p.pid for rank, p in enumerate(procs)}
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait()


def local_nodes(tmp_path: Path, **env: str) -> list[Node]:
    return [Node(f"local{i}", "localhost", connection="local", gpus=2,
                 env={"HOME": str(tmp_path / "home"), **env}) for i in (1, 2)]


def test_collect_on_local_machines_dumps_each_rank_once(tmp_path: Path, job: dict[int, int]) -> None:
    nodes = local_nodes(tmp_path)
    shape = op.JobShape(("local1", "local2"), (2, 2), tp=1, pp=2)
    topo = shape.topology()
    col = op.collect(ProbeRunner(LocalTransport()), nodes, MARK, dump_timeout=20, timeout=60,
                     expected={m: topo.ranks_on(m) for m in topo.machines})
    got = {n: sorted((r.rank, r.pid) for r in nc.ranks) for n, nc in col.nodes.items()}
    assert got == {"local1": [(0, job[0]), (1, job[1])], "local2": [(2, job[2]), (3, job[3])]}
    assert col.nodes["local1"].workers == 1  # rank 0's worker, not a rank
    report = op.analyse([col], shape)
    assert [(o.rank, o.reason) for o in report.analysis.outliers] == [(2, "minority")]
    assert report.analysis.evict == ("local2",)
    assert int(report.exit_code) == 1
    # the probe shipped its reduced frames, not py-spy's JSON
    assert all(r.output is None and r.stack for nc in col.nodes.values() for r in nc.ranks)
    with pytest.raises(ValueError, match="raw"):
        stacks_save.save(tmp_path / "nope", [col], shape)

    # --save collects py-spy's JSON itself, and it parses to the very stacks the probe shipped
    col = op.collect(ProbeRunner(LocalTransport()), nodes, MARK, dump_timeout=20, timeout=60,
                     expected={m: topo.ranks_on(m) for m in topo.machines}, raw=True)
    reduced = {r.rank: r.stack for nc in report.collections[0].nodes.values() for r in nc.ranks}
    assert {r.rank: parse_dump(r.output or "", r.pid)
            for nc in col.nodes.values() for r in nc.ranks} == reduced
    stacks_save.save(tmp_path / "save", [col], shape)
    files = sorted(p.relative_to(tmp_path / "save").as_posix()
                   for p in (tmp_path / "save").rglob("*") if p.is_file())
    assert files == ["job.json", f"local1/0-{job[0]}.json", f"local1/1-{job[1]}.json",
                     f"local2/2-{job[2]}.json", f"local2/3-{job[3]}.json"]
    everything = "".join(p.read_text() for p in (tmp_path / "save").rglob("*") if p.is_file())
    assert "hunter2" not in everything and "BAD_RANK" not in everything
    assert json.loads((tmp_path / "save" / f"local1/0-{job[0]}.json").read_text())[0]["pid"] \
        == job[0]  # py-spy's JSON as it printed it
    again = op.analyse(*stacks_save.load(tmp_path / "save"))
    assert again.analysis.outliers == report.analysis.outliers
    assert again.analysis.evict == report.analysis.evict


def test_py_spy_missing_on_the_node_is_shipped(tmp_path: Path, job: dict[int, int],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    bare = "/usr/bin/python3"  # no py-spy beside it
    if not os.access(bare, os.X_OK):
        pytest.skip("needs /usr/bin/python3")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the login HOME: where brctl caches
    nodes = [Node("local1", "localhost", connection="local", gpus=4, python=bare,
                  env={"PATH": "/usr/bin:/bin"})]
    runner = ProbeRunner(LocalTransport())
    col = op.collect(runner, nodes, MARK, dump_timeout=20, timeout=60)
    assert col.py_spy_shipped == ("local1",)
    cached = list((tmp_path / "home" / ".cache" / "brctl").glob("*/py-spy"))
    assert len(cached) == 1 and os.access(cached[0], os.X_OK)
    assert all(r.stack for r in col.nodes["local1"].ranks)
    paths: dict[str, str] = {}
    second = op.collect(runner, nodes, MARK, dump_timeout=20, timeout=60, py_spy_paths=paths)
    assert second.py_spy_shipped == ("local1",) and paths["local1"] == str(cached[0])
    shipped_before = runner.bytes_shipped
    op.collect(runner, nodes, MARK, dump_timeout=20, timeout=60, py_spy_paths=paths)
    assert runner.bytes_shipped == shipped_before  # cached: nothing sent again


def test_refused_py_spy_makes_the_rank_unread_not_an_outlier(
        tmp_path: Path, job: dict[int, int]) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "py-spy").write_text(
        "#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    (fake / "py-spy").chmod(0o755)
    nodes = [Node("local1", "localhost", connection="local", gpus=4, python="/usr/bin/python3",
                  env={"HOME": str(tmp_path / "home"), "PATH": f"{fake}:/usr/bin:/bin"})]
    col = op.collect(ProbeRunner(LocalTransport()), nodes, MARK, dump_timeout=20, timeout=60)
    report = op.analyse([col], op.JobShape(("local1",), (4,)))
    # ptrace refused is no evidence against the rank: unread, never an outlier; the run
    # is incomplete (exit 3) and, no rank read, nothing is evicted
    assert report.analysis.outliers == () and report.analysis.evict == ()
    assert report.analysis.unread == (0, 1, 2, 3)
    assert report.exit_code == 3
    assert "CAP_SYS_PTRACE" in (col.nodes["local1"].ranks[0].error or "")


def test_no_training_process_is_incomplete(tmp_path: Path) -> None:
    from brctl.core.errors import IncompleteError

    col = op.collect(ProbeRunner(LocalTransport()), local_nodes(tmp_path)[:1],
                     "no-such-process-anywhere-[x]", timeout=60)
    with pytest.raises(IncompleteError, match="no training process"):
        op.analyse([col], op.JobShape(("local1",), (2,)))


SLOW = "py-spy did not finish within 10s on process 103"  # read, not answering: an outlier


def test_cli_offline_analysis_and_bad_save_dirs(tmp_path: Path, brctl: Any) -> None:
    stacks = {r: parse_dump((DATA / "pyspy_dump.json").read_text(), GOLDEN_PID) for r in range(4)}
    assert stacks
    save = tmp_path / "save"
    text = (DATA / "pyspy_dump.json").read_text()
    for rank in range(4):
        node = f"m{rank // 2}"
        (save / node).mkdir(parents=True, exist_ok=True)
        if rank == 3:
            (save / node / f"{rank}-{100 + rank}.error").write_text(f"{SLOW}\n")
        else:
            (save / node / f"{rank}-{100 + rank}.json").write_text(text)
    job = {"schema": stacks_save.SAVE_SCHEMA, "machines": ["m0", "m1"], "gpus": [2, 2], "tp": 1, "pp": 1,
           "cp": 1, "ep": 1, "order": "tp-cp-ep-dp-pp",
           "rounds": [{"dir": ".", "nodes": {
               f"m{n}": {"state": "ok", "error": None,
                         "ranks": [{"rank": r, "pid": 100 + r} for r in (2 * n, 2 * n + 1)]}
               for n in (0, 1)}}]}
    (save / "job.json").write_text(json.dumps(job))
    res = brctl("--json", "stacks", "--from", save)
    assert res.exit_code == 1, res.stderr
    doc = res.json
    assert doc["schema"] == "brctl.stacks/2"
    assert doc["outliers"] == [{"node": "m1", "rank": 3, "pid": 103, "reason": "undumpable",
                                "rounds": 1, "detail": SLOW}]
    assert [(g["kind"], g["members"]) for g in doc["suspect_groups"]] == [("tp", ["m1"])]
    assert doc["evict"] == ["m1"]
    assert doc["classes"][0] == {"ranks": "0-2", "count": 3, "outlier": False, "stages": [0],
                                 "signature": ["<module> (target.py)", "train_step (target.py)",
                                               "blocked_in_collective (target.py)",
                                               "Condition.wait (threading.py)"]}
    human = brctl("stacks", "--from", save)
    assert "ranks 0-2 (3)" in human.stdout and "rank 3 (1)" in human.stdout
    assert "evict: m1" in human.stdout

    # ptrace refused for rank 3 instead: unread, no outlier, the run incomplete (exit 3)
    (save / "m1" / "3-103.error").write_text("py-spy may not ptrace process 103\n")
    res = brctl("--json", "stacks", "--from", save)
    assert res.exit_code == 3 and res.json["outliers"] == [] and res.json["evict"] == []
    (save / "m1" / "3-103.error").unlink()
    res = brctl("stacks", "--from", save)
    assert res.exit_code == 2 and "3-103" in res.stderr and "Traceback" not in res.stderr
    res = brctl("stacks", "--from", tmp_path / "nowhere")
    assert res.exit_code == 2 and "job.json" in res.stderr
    (save / "job.json").write_text(json.dumps({**job, "tp": "two"}))
    res = brctl("stacks", "--from", save)
    assert res.exit_code == 2 and "'tp'" in res.stderr


def test_cli_rejects_save_with_from(tmp_path: Path, brctl: Any) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "a", "connection": "local"}]}))
    res = brctl("-i", inv, "stacks", "--from", tmp_path, "--save", tmp_path)
    assert res.exit_code == 2 and "--from" in res.stderr


def _saved_job(save: Path) -> dict[str, Any]:
    """A two-machine ``--save`` directory (rank 3 undumpable); returns its job.json."""
    text = (DATA / "pyspy_dump.json").read_text()
    for rank in range(4):
        (save / f"m{rank // 2}").mkdir(parents=True, exist_ok=True)
        (save / f"m{rank // 2}" / f"{rank}-{100 + rank}.json").write_text(text)
    return {"schema": stacks_save.SAVE_SCHEMA, "machines": ["m0", "m1"], "gpus": [2, 2], "tp": 1, "pp": 1,
            "cp": 1, "ep": 1, "order": "tp-cp-ep-dp-pp",
            "rounds": [{"dir": ".", "started": 0.0, "seconds": 1.0, "nodes": {
                f"m{n}": {"state": "ok", "error": None, "workers": 0,
                          "ranks": [{"rank": r, "pid": 100 + r, "local_rank": r % 2}
                                    for r in (2 * n, 2 * n + 1)]}
                for n in (0, 1)}}]}


# A hand-edited or truncated job.json: every wrongly typed value is exit 2 naming the file.
NODE0 = {"state": "ok", "ranks": [{"rank": 0, "pid": 100}, {"rank": 1, "pid": 101}]}
MISTYPED: list[tuple[str, Any]] = [
    ("gpus", ["two", 2]), ("gpus", [None, 2]), ("machines", [["m0"], "m1"]),
    ("machines", [None, None]), ("tp", 3), ("order", "tp-zz-pp"), ("rounds", ["x"]),
    ("rounds", [{"nodes": []}]), ("rounds", [{"nodes": {"m0": "x"}}]),
    ("rounds", [{"nodes": {"m0": {"ranks": "x"}}}]), ("rounds", [{"nodes": {"m0": {"ranks": ["x"]}}}]),
    ("rounds", [{"nodes": {"m0": {**NODE0, "workers": "many"}}}]),
    ("rounds", [{"started": "noon", "nodes": {"m0": NODE0}}]),
    ("rounds", [{"dir": 7, "nodes": {"m0": NODE0}}]),
]


@pytest.mark.parametrize(("key", "value"), MISTYPED)
def test_from_a_mistyped_job_json_is_an_input_error(
        tmp_path: Path, brctl: Any, key: str, value: Any) -> None:
    save = tmp_path / "save"
    job = _saved_job(save)
    (save / "job.json").write_text(json.dumps({**job, key: value}))
    res = brctl("stacks", "--from", save)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert "job.json" in res.stderr and "Traceback" not in res.stderr


def test_rounds_stop_at_one_that_finds_no_training_process(tmp_path: Path) -> None:
    """``brctl stacks`` takes 5 rounds 10 s apart; with no training process on any machine
    the operator waited 40 s to be told so. A round that finds none ends the collection."""
    slept: list[float] = []
    cols = op.collect_rounds(ProbeRunner(LocalTransport()), local_nodes(tmp_path)[:2],
                             "no-such-process-anywhere-[x]", rounds=5, interval=10.0,
                             sleep=slept.append, timeout=60)
    assert len(cols) == 1 and not slept
