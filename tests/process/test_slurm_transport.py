"""``connection: slurm`` without a cluster: the node-side task as a real process, the framing
of its answers against hostile tasks, and how a fan-out is cut into sruns.

The real-Slurm tests are in tests/integration/test_slurm_transport.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from brctl.core.capture import Capture
from brctl.core.transport import Node
from brctl.diagnostics import srun_task
from brctl.remote.slurm import transport as slurm
from brctl.remote.slurm.frame import Frames, payload
from brctl.remote.wrap import SYSTEM_PYTHON, wrapped

NONCE = "0123456789abcdef"
TASK = Path(srun_task.__file__)


def labelled(rank: int, text: str) -> list[bytes]:
    """What srun --label makes of one task's stdout."""
    return [f"{rank}: {line}".encode() for line in text.splitlines()]


def answer(node: str, code: int = 0, out: bytes = b"", err: bytes = b"", keep: int = 1 << 20) -> str:
    kept_out, kept_err = srun_task.Kept(keep), srun_task.Kept(keep)
    kept_out.add(out)
    kept_err.add(err)
    return srun_task.record(NONCE, {"node": node, "exit": code, "seconds": 0.1,
                                    "out": kept_out.parts(), "err": kept_err.parts()})


def feed(frames: Frames, lines: list[bytes]) -> list[str]:
    return [n for n in (frames.line(raw) for raw in lines) if n is not None]


def run_task(node: str, stdins: dict[str, bytes | None], argv: list[str],
             keep: int = 1 << 20) -> subprocess.CompletedProcess[bytes]:
    """The node-side task as srun starts it (its source on the command line, isolated)."""
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": node}
    return subprocess.run([sys.executable, "-I", "-S", "-c", slurm._task_source(), NONCE, str(keep), *argv],
                          input=payload(stdins), capture_output=True, env=env, timeout=60, check=False)


def test_a_task_runs_its_own_nodes_request_and_answers_one_record() -> None:
    stdins = {"n01": b"for n01\n", "n02": b"for n02\n", "n03": None}
    done = run_task("n02", stdins, ["sh", "-c", "cat; echo oops >&2; exit 3"])
    assert done.returncode == 0 and done.stderr == b""
    frames = Frames(NONCE, ["n01", "n02"], 1 << 20)
    assert feed(frames, labelled(1, done.stdout.decode())) == ["n02"]
    got = frames.answers()["n02"]
    assert (got.exit_code, got.stdout.text, got.stderr.text) == (3, "for n02\n", "oops\n")
    none = run_task("n03", stdins, ["sh", "-c", "cat; echo eof"])
    frames = Frames(NONCE, ["n03"], 1 << 20)
    feed(frames, labelled(0, none.stdout.decode()))
    assert frames.answers()["n03"].stdout.text == "eof\n"


def test_a_task_keeps_head_and_tail_like_every_transport() -> None:
    keep = 1000
    done = run_task("n01", {"n01": None}, [sys.executable, "-c", "print('x' * 5000 + 'END')"], keep)
    frames = Frames(NONCE, ["n01"], keep)
    feed(frames, labelled(0, done.stdout.decode()))
    local = Capture(keep)
    local.add(("x" * 5000 + "END\n").encode())
    got = frames.answers()["n01"].stdout
    assert got.text == local.text()  # the same marker as ssh and local
    assert got.cut_total == local.cut_total == 5004  # and the count beside it, as RunResult has it
    assert frames.answers()["n01"].stderr.cut_total is None  # kept whole


def test_a_task_s_bytes_that_are_not_utf8_travel_exactly() -> None:
    raw = b"ok \xff\xfe bad\n"
    done = run_task("n01", {"n01": raw}, ["cat"])
    frames = Frames(NONCE, ["n01"], 1 << 20)
    feed(frames, labelled(0, done.stdout.decode()))
    got = frames.answers()["n01"].stdout
    assert got.exact == raw and got.text == raw.decode(errors="replace")


def test_a_node_without_python3_runs_task_and_reaper_under_its_own_python(tmp_path: Path) -> None:
    # a conda-only machine: the PATH has a shell and coreutils, no python3
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "echo"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    argv = [*slurm.interpreter(sys.executable), "-I", "-S", "-c", slurm._task_source(), NONCE,
            "1000", *wrapped(SYSTEM_PYTHON, ["sh", "-c", "echo $0 ran", "it"], 10)]
    done = subprocess.run(argv, input=payload({"n01": None}), capture_output=True, timeout=60,
                          env={"PATH": str(bin_dir), "SLURMD_NODENAME": "n01"}, check=False)
    frames = Frames(NONCE, ["n01"], 1000)
    feed(frames, labelled(0, done.stdout.decode()))
    got = frames.answers()["n01"]
    assert (got.exit_code, got.stdout.text) == (0, "it ran\n"), (done.stderr, frames.why_not("n01"))
    assert slurm.interpreter(SYSTEM_PYTHON) == [SYSTEM_PYTHON]  # where it has one: no shell


def test_a_task_without_a_request_for_its_node_runs_nothing() -> None:
    done = run_task("n09", {"n01": b"x"}, ["touch", "/nonexistent-should-not-run"])
    frames = Frames(NONCE, ["n09"], 1 << 20)
    feed(frames, labelled(0, done.stdout.decode()))
    assert frames.answers() == {}
    assert "no entry for node 'n09'" in frames.why_not("n09")


def test_a_task_cut_off_mid_request_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n01"}
    whole = payload({"n01": b"data"})
    done = subprocess.run([sys.executable, "-I", "-S", "-c", slurm._task_source(), NONCE, "100",
                           "touch", str(marker)], input=whole[:-4], capture_output=True, env=env,
                          timeout=60, check=False)
    assert not marker.exists()
    frames = Frames(NONCE, ["n01"], 100)
    feed(frames, labelled(0, done.stdout.decode()))
    assert "could not read its request" in frames.why_not("n01")


def test_one_node_cannot_forge_another_nodes_answer() -> None:
    frames = Frames(NONCE, ["good", "evil"], 1 << 20)
    forged = answer("good", 0, b"all fine")
    # the evil task prints a perfect record for "good", and lines that look labelled
    lines = labelled(1, forged) + labelled(1, "\n".join(f"0: {x}" for x in forged.splitlines()))
    assert feed(frames, lines) == []
    assert frames.answers() == {}
    assert "says it is from 'good'" in frames.why_not("evil")
    assert frames.why_not("good") == "no answer"
    # the real answer of "good" still counts; evil garbled only its own
    assert feed(frames, labelled(0, answer("good", 0, b"real"))) == ["good"]
    assert frames.answers()["good"].stdout.text == "real"


def test_a_changed_cut_or_oversized_record_is_no_answer() -> None:
    text = answer("n01", 0, b"hello world" * 100).splitlines()
    changed = [*text[:1], text[1][:-4] + "AAAA", *text[2:]]
    frames = Frames(NONCE, ["n01"], 1 << 20)
    feed(frames, labelled(0, "\n".join(changed)))
    assert "cut or changed" in frames.why_not("n01")
    cut = Frames(NONCE, ["n01"], 1 << 20)
    feed(cut, labelled(0, "\n".join(text[:-1])))
    assert cut.answers() == {} and cut.why_not("n01") == "its answer stopped midway"
    small = Frames(NONCE, ["n01"], 10)
    feed(small, labelled(0, answer("n01", 0, b"y" * 100_000, keep=100_000)))
    assert small.answers() == {} and "unusable" in small.why_not("n01")
    after = Frames(NONCE, ["n01"], 1 << 20)
    feed(after, labelled(0, answer("n01") + "more\n"))
    assert after.answers() == {} and "output after its record" in after.why_not("n01")


@pytest.mark.parametrize("total", [10 ** 400, -1, 1 << 63])
def test_a_record_with_an_impossible_byte_count_is_no_answer(total: int) -> None:
    forged = srun_task.record(NONCE, {"node": "n01", "exit": 0, "seconds": 0.1,
                                      "out": ["", "", total], "err": ["", "", 0]})
    frames = Frames(NONCE, ["n01"], 1 << 20)
    feed(frames, labelled(0, forged))
    assert frames.answers() == {} and "impossible byte count" in frames.why_not("n01")


def test_stray_lines_are_kept_to_say_why_a_node_did_not_answer() -> None:
    frames = Frames(NONCE, ["n01"], 1 << 20)
    feed(frames, [b"srun: error: something", *labelled(0, "Traceback: boom")])
    assert "Traceback: boom" in frames.why_not("n01")


def test_the_payload_carries_each_distinct_stdin_once() -> None:
    data = payload({"a": b"same", "b": b"same", "c": b"other", "d": None})
    assert len(zlib.decompress(data)) < 200
    assert srun_task.my_stdin(data, "b") == b"same" and srun_task.my_stdin(data, "c") == b"other"
    assert srun_task.my_stdin(data, "d") is None
    with pytest.raises(ValueError):
        srun_task.my_stdin(data, "e")


def node(name: str, **kw: object) -> Node:
    return Node(name=name, address=name, connection="slurm", **kw)  # type: ignore[arg-type]


def test_a_fan_out_is_one_srun_per_place_and_command() -> None:
    nodes = [node(f"n{i:02d}") for i in range(6)]
    work = slurm.batches(nodes, ["hostname"], None, 30.0, "77", frozenset({"n00", "n01", "n02"}))
    assert [(b.job, list(b.stdins)) for b in work] == [("77", ["n00", "n01", "n02"]),
                                                       (None, ["n03", "n04", "n05"])]
    assert all(b.argv[-1] == "hostname" and b.timeout == 30.0 for b in work)
    varied = slurm.batches(nodes, lambda n: ["echo", n.name], None, 30.0, None, frozenset())
    assert len(varied) == 6


def test_distinct_stdins_are_cut_into_sruns_of_bounded_payload() -> None:
    nodes = [node(f"n{i:03d}") for i in range(100)]
    big = slurm.PAYLOAD_CAP // 10
    work = slurm.batches(nodes, ["cat"], lambda n: n.name.encode() * (big // 4), 30.0, None, frozenset())
    assert sum(len(b.stdins) for b in work) == 100 and len(work) >= 10
    assert all(sum(len(v or b"") for v in b.stdins.values()) <= slurm.PAYLOAD_CAP for b in work)
    same = slurm.batches(nodes, ["cat"], b"x" * big * 5, 30.0, None, frozenset())
    assert len(same) == 1  # one stdin for all: one srun


def test_srun_runs_the_task_in_the_job_or_in_an_allocation_of_its_own() -> None:
    transport = slurm.SlurmTransport(partition="spare", environ={"SLURM_JOB_ID": "5", "SLURM_CONF": "/c"})
    inside, outside = slurm.batches([node("a"), node("b")], ["true"], None, 10.0, "42", frozenset({"a"}))
    cmd = transport._command(inside, "a", NONCE)
    assert "--overlap" in cmd and "--jobid=42" in cmd and "--kill-on-bad-exit=0" in cmd
    assert cmd[cmd.index("-c") + 2:cmd.index("-c") + 4] == [NONCE, str(inside.keep)]
    alone = transport._command(outside, "b", NONCE)
    assert "--partition=spare" in alone and not any(a.startswith("--jobid") for a in alone)
    assert any(a.startswith("--immediate=") for a in alone)
    # an allocation brctl itself runs in must not capture its sruns
    assert slurm.srun_environment({"SLURM_JOB_ID": "5", "SLURM_CONF": "/c", "HOME": "/h"}) == \
        {"SLURM_CONF": "/c", "HOME": "/h"}


def test_srun_says_which_nodes_started_and_which_it_could_not_reach() -> None:
    reading = slurm._Reading(set(), {}, [], {})
    frames = Frames(NONCE, ["n01", "n02"], 100)
    for line in (b"srun: launch/slurm: _task_start: Node n01, 1 tasks started",
                 b"srun: Node n03, 1 tasks started",  # without the launch plugin's prefix
                 b"srun: error: Task launch for StepId=3.1 failed on node n02: Communication connection failure",
                 b"1: slurmstepd-n02: error: execve(): python3: No such file or directory",
                 b"srun: error: Application launch failed: Communication connection failure"):
        slurm._stderr_line(line, reading, frames)
    assert reading.started == {"n01", "n03"}
    assert reading.failed == {"n02": "Communication connection failure"}
    assert b"execve()" in reading.task_err["n02"]
    assert reading.said == ["srun: error: Application launch failed: Communication connection failure"]


def test_a_job_given_by_name_is_looked_up_among_running_jobs() -> None:
    asked: list[list[str]] = []

    def ask(argv: list[str]) -> str:
        asked.append(argv)
        return {"one": "123", "two": "5\n6", "none": ""}[argv[argv.index("-n") + 1]]

    assert slurm.named_job(slurm.JobRef(id="9"), ask) == "9" and asked == []
    assert slurm.named_job(slurm.JobRef(name="one", user="alice"), ask) == "123"
    assert "--user=alice" in asked[-1]
    assert slurm.named_job(slurm.JobRef(name="none", user="alice"), ask) is None
    from brctl.core.errors import InputError

    with pytest.raises(InputError, match="2 running jobs"):
        slurm.named_job(slurm.JobRef(name="two", user="alice"), ask)
    # a name without its user would match every user's jobs: refused, nothing asked
    asked.clear()
    with pytest.raises(InputError, match="needs its user"):
        slurm.named_job(slurm.JobRef(name="one"), ask)
    assert asked == []


def test_a_line_too_long_to_keep_is_dropped_through_its_newline() -> None:
    """A task that writes over 1 MiB without a newline and then another rank's label must
    not get that label read as a line of its own (it could answer in that node's name)."""
    split = slurm.LineSplitter(limit=1024)
    assert split.feed(b" 0: ok\n 0: " + b"x" * 600) == [b" 0: ok"]
    assert split.feed(b"x" * 600) == []  # over the limit: dropped, the line still open
    assert split.feed(b" 1: @brctl forged\n 1: real\n") == [b" 1: real"]  # the same line's tail
    assert split.feed(b" 2: a\n 2: b") == [b" 2: a"]
    assert split.feed(b"\n") == [b" 2: b"]
