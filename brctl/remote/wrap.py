"""The node-side wrapper every command runs under (``brctl.diagnostics.reaper``).

Its source travels in the argv (``python3 -I -S -c SOURCE SECONDS ARGV...``), so
nothing has to be installed on the node. It enforces the timeout and kills the
whole tree the command started (``setsid`` escapees included) on a timeout, on a
lost channel (Ctrl-C, a dead controller) and on SIGTERM; exit 124 means "killed
for its timeout", whatever the command did with SIGTERM.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Sequence
from pathlib import Path

from brctl.core.transport import NODE_PROGRAM, NodeState, command_line

TIMEOUT_EXIT = 124  # brctl.diagnostics.reaper.TIMEOUT_EXIT
GRACE_S = 2.0  # reaper.GRACE_S: SIGTERM, then SIGKILL this much later
SLACK_S = 5.0  # how long past GRACE_S the controller waits before it gives up itself
SYSTEM_PYTHON = NODE_PROGRAM[0]  # isolate.TRUSTED_PYTHON: what runs the reaper where it exists


@functools.cache
def _source() -> str:
    text = (Path(__file__).parent.parent / "diagnostics" / "reaper.py").read_text()
    return text.split('"""', 2)[2].lstrip()  # the module docstring need not travel


def wrapped(python: str, argv: Sequence[str], timeout: float) -> list[str]:
    """``argv`` under the reaper with ``timeout`` seconds, run by ``python``."""
    return [python, "-I", "-S", "-c", _source(), repr(float(timeout)), *argv]  # 0.0004 is not 0


def shell_line(python: str, argv: Sequence[str], timeout: float) -> str:
    """The command line a node's login shell runs: ``argv`` under the reaper.

    The reaper runs under the system ``python3``, the interpreter brctl trusts on a
    node (a configured ``python`` may be one the job user can write: probes check it
    before they run it, the reaper could not). Only a node without ``python3`` on its
    login PATH (a conda-only machine) runs it under its configured ``python``, which
    then must be as trustworthy as any program brctl starts there.
    """
    reaper = wrapped(SYSTEM_PYTHON, argv, timeout)
    if python == SYSTEM_PYTHON:
        return command_line(reaper)
    return (f"p={SYSTEM_PYTHON}; command -v {SYSTEM_PYTHON} >/dev/null 2>&1 || p={shlex.quote(python)};"
            f' exec "$p" {command_line(reaper[1:])}')


def exit_state(code: int, elapsed: float, timeout: float) -> NodeState:
    """The state of a command the reaper reported ``code`` for, ``elapsed`` s after start."""
    if code == TIMEOUT_EXIT and elapsed >= timeout * 0.98:
        return NodeState.TIMEOUT
    return NodeState.OK if code == 0 else NodeState.FAILED
