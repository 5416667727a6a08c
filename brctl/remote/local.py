"""``connection: local``: run on this host with subprocess, no ssh.

Commands (``run`` and ``stream``) run under the same node-side reaper as on an ssh
node (``brctl.remote.wrap``), by the interpreter running brctl (always there, and
the one trusted here): a timeout, or ``cancel()`` (Ctrl-C), kills everything the
command started. Output is captured bounded (``brctl.core.capture``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, BinaryIO

from brctl.core.capture import Capture
from brctl.core.transport import Node, NodeState, RunResult, with_env
from brctl.remote.children import Children
from brctl.remote.wrap import GRACE_S, SLACK_S, exit_state, wrapped

LINGER_S = 1.0  # after the command exits, how long its output may still arrive


def _feed(pipe: BinaryIO, data: bytes) -> None:
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


class LocalTransport:
    """Runs argv lists on the controller itself, with ``node.env`` added as ``env K=V`` (``with_env``)."""

    def __init__(self) -> None:
        self._children = Children()

    def cancel(self) -> None:
        """Kill every running command (the reaper ends its whole tree); start no more."""
        self._children.cancel()

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None
    ) -> RunResult:
        """Run ``argv`` locally under the reaper; read its output bounded."""
        return self._run(node, argv, timeout, subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         subprocess.PIPE, stdin)

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """``run`` with bulk stdin/stdout files, which the command reads and writes itself;
        without ``stdout`` its output is kept bounded, as ``run`` keeps it."""
        return self._run(node, argv, timeout, stdin or subprocess.DEVNULL, stdout or subprocess.PIPE, None)

    def _run(self, node: Node, argv: Sequence[str], timeout: float, stdin: int | IO[Any],
             stdout: int | IO[Any],
             feed: bytes | None) -> RunResult:
        start = time.monotonic()
        if self._children.cancelled:
            return RunResult(node.name, NodeState.TIMEOUT, None, "", "brctl: interrupted before start", 0.0)
        try:
            proc = subprocess.Popen(
                wrapped(sys.executable, with_env(argv, node.env), timeout),  # as over ssh
                stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C on the terminal is ours to relay, not its
            )
        except OSError as exc:
            return RunResult(node.name, NodeState.FAILED, 127, "", f"{argv[0]}: {exc.strerror}",
                             time.monotonic() - start)
        with self._children.tracked(proc):
            out, err = Capture(node.output_keep), Capture(node.output_keep)
            if feed is not None and proc.stdin is not None:
                threading.Thread(target=_feed, args=(proc.stdin, feed), daemon=True).start()
            gave_up = not drain(proc, out, err, start + timeout + GRACE_S + SLACK_S)
            if gave_up:
                _kill_group(proc)
            code = proc.wait()
        elapsed = time.monotonic() - start
        cancelled = self._children.cancelled
        if gave_up or (cancelled and code == 128 + signal.SIGTERM):
            why = "interrupted; the command was killed" if cancelled else "gave up waiting"
            return RunResult.captured(node.name, NodeState.TIMEOUT, None, out, err, elapsed,
                                      note=f"brctl: {why}\n")
        state = exit_state(code, elapsed, timeout)
        return RunResult.captured(node.name, state, None if state is NodeState.TIMEOUT else code,
                                  out, err, elapsed)

    def close(self) -> None:
        """Nothing to close."""


def drain(proc: subprocess.Popen[bytes], out: Capture, err: Capture, give_up: float) -> bool:
    """Read stdout and stderr to their end (True), or until ``give_up`` (False).

    A command that exited leaving a background child on its stdout is done
    ``LINGER_S`` later (the child keeps running, as under ``ssh``).
    """
    with selectors.DefaultSelector() as sel:
        for pipe, capture in ((proc.stdout, out), (proc.stderr, err)):
            if pipe is not None:
                sel.register(pipe, selectors.EVENT_READ, capture)
        exited = None
        while sel.get_map():
            now = time.monotonic()
            if exited is None and proc.poll() is not None:
                exited = now
            if exited is not None and now - exited >= LINGER_S:
                return True
            left = give_up - now
            if left <= 0:
                return False
            for key, _ in sel.select(min(left, LINGER_S)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)

