"""The one controller-side hook runner (job adapter commands and update's restart hook)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from brctl.operations.jobadapter import run_hook


def test_hook_output_streams_and_exit_code() -> None:
    run = run_hook([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                    "sys.exit(3)"], 30)
    assert (run.exit_code, run.stdout.strip(), run.stderr.strip()) == (3, "out", "err")
    assert not run.ok and run.output.split() == ["out", "err"]
    assert set(run.to_json()) == {"argv", "exit_code", "stdout", "stderr", "seconds"}


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    # the hook starts a grandchild that would write the marker after 2 s
    code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"\"import time; time.sleep(2); open({str(marker)!r}, 'w')\"]); time.sleep(60)")
    start = time.monotonic()
    run = run_hook([sys.executable, "-c", code], 0.5)
    assert run.exit_code is None and "killed after 0.5s" in run.stderr
    assert time.monotonic() - start < 10
    time.sleep(2.5)
    assert not marker.exists()  # the whole process group went


def test_a_missing_hook_is_exit_127_with_the_reason() -> None:
    run = run_hook(["/nonexistent/brctl-hook"], 5)
    assert run.exit_code == 127 and "/nonexistent/brctl-hook" in run.stderr
