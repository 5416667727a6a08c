"""Quiet when fine: cron mails nothing on a healthy run, pipes close quietly.

Against the real CLI process where the behaviour is the process's (SIGPIPE, the
streams a cron job captures).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from brctl.operations.daemon.loop import DaemonReport, PollResult

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "local.yaml"


def cli(*args: str, cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BRCTL_INVENTORY": ""}
    return subprocess.run([sys.executable, "-m", "brctl", *args], capture_output=True, text=True,
                          cwd=cwd, env={**env, **kw.pop("env", {})}, **kw)


def test_a_healthy_run_writes_nothing_on_stderr(tmp_path: Path) -> None:
    env = {"BRCTL_STATE": str(tmp_path / "state"), "HOME": str(tmp_path)}
    for args in (["nodes"], ["exec", "-w", "local[1-2]", "true"], ["health", "-w", "local1"],
                 ["standby", "list"]):
        r = cli("-i", str(LOCAL), *args, env=env)
        assert (r.returncode, r.stderr) == (0, ""), (args, r.stderr)
    r = cli("-i", str(LOCAL), "-v", "exec", "-w", "local[1-2]", "true", env=env)
    assert "ok: local[1-2]" in r.stderr  # -v: the summary


def test_a_reader_that_leaves_early_is_not_an_error() -> None:
    # the reader is gone before brctl writes: every write hits EPIPE
    proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(LOCAL), "nodes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert err == b""
    shell = subprocess.run(f"set -o pipefail; {sys.executable} -m brctl -i {LOCAL} nodes | head -1",
                           shell=True, executable="/bin/bash", capture_output=True, text=True)
    assert shell.returncode == 0 and shell.stdout.strip() and shell.stderr == ""


def test_standby_size_with_every_input_needs_no_inventory(tmp_path: Path) -> None:
    r = cli("--json", "standby", "size", "--machines", "1200", "--daily-failure-rate", "0.002",
            "--window", "24", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"size": 7' in r.stdout and '"configured": null' in r.stdout
    missing = cli("standby", "size", "--machines", "1200", cwd=tmp_path)  # needs the history
    assert missing.returncode == 2 and "no inventory" in missing.stderr


def test_ettr_with_no_records_says_so_and_exits_0(brctl: Any, state_dir: Path) -> None:
    r = brctl("-i", LOCAL, "ettr")
    assert r.exit_code == 0 and "nothing recorded yet" in r.stdout


def test_a_daemon_stopped_by_sigterm_exits_0() -> None:
    handled = DaemonReport("j", handled=[PollResult(at=0.0, step=1, moved=True)], refusals=["cap"],
                           stopped_by="signal")
    assert handled.exit_code == 0
    assert DaemonReport("j", refusals=["cap"], stopped_by="iterations").exit_code == 4


def test_a_stderr_reader_that_leaves_early_is_not_an_error() -> None:
    # `brctl exec ... 2>&1 >/dev/null | head -1`: the reader of stderr leaves after one line
    proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(LOCAL), "exec", "-w",
                             "local1", "seq 1 100000 >&2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    assert proc.stderr.readline()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0
