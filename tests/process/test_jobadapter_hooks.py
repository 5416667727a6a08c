"""The one controller-side hook runner (job adapter commands and update's restart hook)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from brctl.operations.jobadapter import run_hook
from tests.kits.waiting import alive, deadline, scaled, wait_for


def test_hook_output_streams_and_exit_code() -> None:
    run = run_hook([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                    "sys.exit(3)"], 30)
    assert (run.exit_code, run.stdout.strip(), run.stderr.strip()) == (3, "out", "err")
    assert not run.ok and run.output.split() == ["out", "err"]
    assert set(run.to_json()) == {"argv", "exit_code", "stdout", "stderr", "seconds"}


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    said = tmp_path / "child.pid"
    # the hook starts a child, says its pid, and outlives its timeout; so would the child
    code = (f"import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(600)']); open({str(said) + '.tmp'!r}, 'w').write(str(child.pid)); "
            f"os.replace({str(said) + '.tmp'!r}, {str(said)!r}); time.sleep(600)")
    timeout = scaled(2)  # a Python start and a Popen: ~0.1 s
    with deadline(30, "a hook killed at its 2 s timeout (its sleep: 600 s)"):
        run = run_hook([sys.executable, "-c", code], timeout)
    assert run.exit_code is None and f"killed after {timeout:g}s" in run.stderr, run.stderr
    assert said.exists(), f"the hook did not start its child within its {timeout:g} s timeout"
    child = int(said.read_text())
    try:
        wait_for(lambda: not alive(child), f"the hook's child {child} to be killed with it")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_missing_hook_is_exit_127_with_the_reason() -> None:
    run = run_hook(["/nonexistent/brctl-hook"], 5)
    assert run.exit_code == 127 and "/nonexistent/brctl-hook" in run.stderr
