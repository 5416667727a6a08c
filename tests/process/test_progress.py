"""Progress on a terminal: done/left, the machine still running, elapsed; never in --json,
never on a stderr that is not a terminal. Run for real: brctl's stderr is a pty."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kits.waiting import PATIENCE, scaled


class StageRecorder:
    """A ``Track`` that records each stage, its machines and the machines it heard finish."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, list[str], list[str]]] = []

    def __call__(self, stage: str, machines: Sequence[str]) -> Callable[[Any], None]:
        done: list[str] = []
        self.stages.append((stage, list(machines), done))
        return lambda item=None: done.append(getattr(item, "node", "?"))

    def names(self) -> list[str]:
        return [name for name, _, _ in self.stages]

    def complete(self) -> bool:
        """Every stage heard every one of its machines finish."""
        return all(sorted(done) == sorted(machines) for _, machines, done in self.stages)


def run_with_tty_stderr(args: list[str], cwd: Path, gate: Path | None = None,
                        when: Sequence[str] = ()) -> tuple[int, str, str]:
    """(exit, stdout, everything brctl wrote to its terminal stderr).

    A slow machine waits for ``gate`` (``GATED``): it is created once the terminal shows
    every text of ``when`` (or, if it never does, at the outer timeout, for the test to
    fail on what is missing), so the line is seen while the machine still runs, not
    hoped for from a sleep.
    """
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "brctl", *args], stdout=subprocess.PIPE,
                            stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + scaled(PATIENCE)
    while True:
        if gate is not None and not gate.exists() and (
                all(t in seen.decode(errors="replace") for t in when) or time.monotonic() > deadline):
            gate.touch()
        if time.monotonic() > deadline + scaled(PATIENCE):
            break
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode() if proc.stdout else ""
    os.close(master)
    return proc.wait(timeout=scaled(60)), out, seen.decode(errors="replace")


# The slow machine's part of a command: it runs until the test opens its gate.
GATED = 'until [ -z "$GATE" ] || [ -e "$GATE" ]; do sleep 0.05; done'


@contextlib.contextmanager
def held(gate: Path, seconds: float = 2.0) -> Iterator[None]:
    """The slow machine held for ``seconds`` where a test looks for an absence (no
    progress line): time for a wrong one to show, which no event can stand for. It can
    only let a wrong one through, never fail a right one."""
    gate.unlink(missing_ok=True)
    timer = threading.Timer(seconds, gate.touch)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        gate.touch()


def test_exec_shows_which_machine_it_still_waits_on(tmp_path: Path) -> None:
    inv, gate = tmp_path / "inv.yaml", tmp_path / "gate"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": "fast[1-3]", "connection": "local", "gpus": 0},
        {"name": "slow1", "connection": "local", "gpus": 0, "env": {"GATE": str(gate)}}]}))
    code, out, tty = run_with_tty_stderr(["-i", str(inv), "exec", GATED], tmp_path, gate,
                                         ["exec: waiting on slow1", "3/4"])
    assert code == 0, tty
    assert "exec: waiting on slow1" in tty and "3/4" in tty, tty
    with held(gate):
        code, out, tty = run_with_tty_stderr(["-i", str(inv), "--json", "exec", GATED], tmp_path)
    assert code == 0 and out.startswith("{") and "waiting on" not in tty, tty
    with held(gate):
        quiet = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "exec", GATED],
                               capture_output=True, text=True, timeout=scaled(120), check=False)
    assert quiet.returncode == 0 and quiet.stderr == ""


PASSING_DCGM = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
    {"name": "software", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                      "entity_id": 0, "status": "Pass"}],
     "test_summary": {"status": "Pass"}}]}]}}


def test_diagnose_shows_each_stage_its_machines_the_slowest_and_the_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ladder's stages as bars (evidence, eud, alltoall, allgather), each naming the
    machine it still waits on; with -v each step's line carries the seconds since the start;
    never with --json, nothing on a stderr that is not a terminal."""
    import json

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dcgm.json").write_text(json.dumps(PASSING_DCGM))
    dcgmi = fake / "dcgmi"
    dcgmi.write_text(f'#!/bin/sh\n{GATED}\ncat {fake / "dcgm.json"}\n')
    gate = tmp_path / "gate"
    dcgmi.chmod(0o755)
    log = tmp_path / "train.log"
    log.write_text("[rank1]: Watchdog caught collective operation timeout\n")
    path = f"{fake}:/usr/bin:/bin"
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "m[1-2]", "connection": "local", "gpus": 1, "env": {"PATH": path}},
                  {"name": "slow1", "connection": "local", "gpus": 1,
                   "env": {"PATH": path, "GATE": str(gate)}}],
        "job": {"name": "j", "nodes": "m[1-2],slow1", "log_paths": [str(log)],
                "process_match": "no-such-training-process"}}))
    monkeypatch.setenv("BRCTL_STATE", str(tmp_path / "state"))
    code, out, tty = run_with_tty_stderr(["-i", str(inv), "-v", "diagnose"], tmp_path, gate,
                                         ["diagnose eud (dcgmi diag -r 2): waiting on slow1", "2/3"])
    assert code in (0, 3), tty  # the collectives need torch on the machines: they may skip
    for stage in ("diagnose evidence", "diagnose alltoall", "diagnose allgather"):
        assert stage in tty, (stage, tty)
    assert "diagnose eud (dcgmi diag -r 2): waiting on slow1" in tty, tty
    assert "2/3" in tty and "0:00:0" in tty, tty
    assert re.search(r"diagnose +\d+\.\ds  stage eud on m\[1-2\],slow1", tty), tty
    with held(gate):
        code, out, tty = run_with_tty_stderr(["-i", str(inv), "--json", "diagnose"], tmp_path)
    assert out.startswith("{") and "waiting on" not in tty and "diagnose eud" not in tty, tty
    with held(gate):
        piped = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "diagnose"],
                               capture_output=True, text=True, timeout=scaled(120), check=False)
    assert "waiting on" not in piped.stderr and "diagnose eud" not in piped.stderr


def _slow_python(tmp_path: Path, gate: Path) -> str:
    """A Python for one machine that starts once ``gate`` exists (its probes are slow)."""
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nGATE={gate}\n{GATED}\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    return str(slow)


def test_nodes_probe_and_update_apply_rollback_show_the_machine_they_wait_on(
        tmp_path: Path) -> None:
    inv, gate = tmp_path / "inv.yaml", tmp_path / "gate"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "fast[1-3]", "connection": "local", "gpus": 1,
                   "python": sys.executable},
                  {"name": "slow1", "connection": "local", "gpus": 1,
                   "python": _slow_python(tmp_path, gate)}],
        "job": {"name": "j", "nodes": "fast[1-3],slow1"},
        "update": {"root": str(tmp_path / "nodes" / "{node}")}}))
    env = {**os.environ, "BRCTL_STATE": str(tmp_path / "state")}
    os.environ["BRCTL_STATE"] = env["BRCTL_STATE"]  # run_with_tty_stderr passes os.environ
    try:
        code, _, tty = run_with_tty_stderr(["-i", str(inv), "nodes", "--probe"], tmp_path, gate,
                                           ["probe: waiting on slow1", "3/4"])
        assert code == 0, tty
        assert "probe: waiting on slow1" in tty and "3/4" in tty, tty
        src = tmp_path / "src"
        src.mkdir()
        for version in ("v1", "v2"):
            (src / "train.py").write_text(f"print({version!r})\n")
            pushed = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "update",
                                     "push", str(src), "--version", version], env=env,
                                    capture_output=True, text=True, timeout=scaled(120), check=False)
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr
            gate.unlink()
            code, _, tty = run_with_tty_stderr(["-i", str(inv), "update", "apply"], tmp_path, gate,
                                               ["apply: waiting on slow1"])
            assert code == 0, tty
            assert "apply: waiting on slow1" in tty, tty
        gate.unlink()
        code, _, tty = run_with_tty_stderr(["-i", str(inv), "update", "rollback"], tmp_path, gate,
                                           ["rollback: waiting on slow1"])
        assert code == 0, tty
        assert "rollback: waiting on slow1" in tty, tty
    finally:
        del os.environ["BRCTL_STATE"]


def test_finished_stage_bars_stay_on_the_terminal_with_their_times() -> None:
    """``Output.stages``: when the run ends, every stage's line is still on the terminal
    (a transient bar would erase them all as the command finishes)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from brctl.render.output import Output

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    buf = Terminal()
    out = Output(stderr=buf)
    out._err = Console(file=buf, force_terminal=True, width=100)
    with out.stages("diagnose") as track:
        for stage in ("evidence", "eud"):
            advance = track(stage, ["m1", "m2"])
            for node in ("m1", "m2"):
                advance(SimpleNamespace(node=node))
    last_screen = buf.getvalue().rsplit("\x1b[2K", 1)[-1]
    assert "diagnose evidence" in last_screen and "diagnose eud" in last_screen, repr(last_screen)
    assert "2/2" in last_screen and "0:00:0" in last_screen
