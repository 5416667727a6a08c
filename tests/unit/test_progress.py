"""Progress on a terminal: done/left, the machine still running, elapsed; never in --json,
never on a stderr that is not a terminal. Run for real: brctl's stderr is a pty."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import yaml


def run_with_tty_stderr(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """(exit, stdout, everything brctl wrote to its terminal stderr)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "brctl", *args], stdout=subprocess.PIPE,
                            stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
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
    return proc.wait(timeout=60), out, seen.decode(errors="replace")


def test_exec_shows_which_machine_it_still_waits_on(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": "fast[1-3]", "connection": "local", "gpus": 0},
        {"name": "slow1", "connection": "local", "gpus": 0, "env": {"PAUSE": "3"}}]}))
    code, out, tty = run_with_tty_stderr(["-i", str(inv), "exec", "sleep ${PAUSE:-0}"], tmp_path)
    assert code == 0, tty
    assert "exec: waiting on slow1" in tty and "3/4" in tty, tty
    code, out, tty = run_with_tty_stderr(["-i", str(inv), "--json", "exec", "sleep ${PAUSE:-0}"],
                                         tmp_path)
    assert code == 0 and out.startswith("{") and "waiting on" not in tty, tty
    quiet = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "exec", "sleep ${PAUSE:-0}"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert quiet.returncode == 0 and quiet.stderr == ""
