"""The watcher every srun runs under (issue 35, item 6), on plain processes: it ends its
command once brctl's pipe closes (brctl died, SIGKILL included), passes SIGTERM on, and
ends with the command's own status. The real-Slurm test is
tests/integration/test_slurm_transport.py::test_srun_does_not_outlive_brctl."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from brctl.remote.slurm.transport import watched

SOURCE = (Path(__file__).parent.parent.parent / "brctl" / "remote" / "slurm" / "srun_watch.py").read_text()


def _watch(fd: int, *argv: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", SOURCE, str(fd), *argv],
                            pass_fds=(fd,), **kw)  # type: ignore[call-overload]


def _scale() -> float:
    return float(os.environ.get("BRCTL_TIMEOUT_SCALE", "1"))


def test_the_command_ends_when_the_pipe_closes() -> None:
    read, write = os.pipe()
    try:
        proc = _watch(read, "sh", "-c", "echo started; exec sleep 600", stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    finally:
        os.close(write)  # what brctl's death does
    os.close(read)
    # gone before its 600 s: < 10 s x $BRCTL_TIMEOUT_SCALE
    assert proc.wait(timeout=10 * _scale()) == -signal.SIGTERM


def test_its_status_is_the_commands_and_sigterm_passes_on() -> None:
    read, write = os.pipe()
    try:
        done = _watch(read, "sh", "-c", "echo out; echo err >&2; exit 7",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert done.communicate(timeout=10 * _scale()) == (b"out\n", b"err\n")
        assert done.returncode == 7
        proc = _watch(read, "sh", "-c", "trap 'exit 42' TERM; echo up; while :; do sleep 0.1; done",
                      stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10 * _scale()) == 42
    finally:
        os.close(write)
        os.close(read)


def test_a_missing_program_is_the_popen_error_as_before() -> None:
    with pytest.raises(FileNotFoundError):
        watched(["no-such-srun-here"], {"PATH": "/nonexistent"})
    cmd, fd = watched(["sh", "-c", "true"], os.environ)
    assert cmd[:3] == [sys.executable, "-I", "-S"] and cmd[5:7] == [str(fd), cmd[6]]
    assert os.path.isabs(cmd[6])  # srun resolved here, on srun's own PATH
    assert subprocess.run(cmd, pass_fds=(fd,), check=False, timeout=10 * _scale()).returncode == 0
