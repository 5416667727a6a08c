"""``connection: local``: run on this host with subprocess, no ssh.

The command runs in its own session (process group) so a timeout kills it and
everything it started, as the ssh backend does on a node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import BinaryIO

from brctl.core.transport import Node, NodeState, RunResult, state_for_exit


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


class LocalTransport:
    """Runs argv lists on the controller itself; ``node.env`` is added to our environment."""

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None
    ) -> RunResult:
        """Run ``argv`` locally; kill its process group after ``timeout`` seconds."""
        start = time.monotonic()
        env = {**os.environ, **node.env}
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return RunResult(node.name, NodeState.FAILED, 127, "", f"{argv[0]}: {exc.strerror}",
                             time.monotonic() - start)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return RunResult(node.name, NodeState.TIMEOUT, None, _decode(out),
                             _decode(err) + f"\nkilled after {timeout:g}s",
                             time.monotonic() - start)
        return RunResult(node.name, state_for_exit(proc.returncode), proc.returncode,
                         _decode(out), _decode(err), time.monotonic() - start)

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """Run ``argv`` locally with bulk stdin/stdout files (the child reads/writes them itself)."""
        start = time.monotonic()
        try:
            proc = subprocess.Popen(list(argv), stdin=stdin or subprocess.DEVNULL,
                                    stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={**os.environ, **node.env}, start_new_session=True)
        except OSError as exc:
            return RunResult(node.name, NodeState.FAILED, 127, "", f"{argv[0]}: {exc.strerror}",
                             time.monotonic() - start)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return RunResult(node.name, NodeState.TIMEOUT, None, _decode(out),
                             _decode(err) + f"\nkilled after {timeout:g}s", time.monotonic() - start)
        return RunResult(node.name, state_for_exit(proc.returncode), proc.returncode,
                         _decode(out), _decode(err), time.monotonic() - start)

    def put(self, node: Node, local_path: str, remote_path: str, *, timeout: float) -> RunResult:
        """Copy to ``remote_path`` on this host, atomically."""
        return _copy(node, local_path, remote_path)

    def get(self, node: Node, remote_path: str, local_path: str, *, timeout: float) -> RunResult:
        """Copy from ``remote_path`` on this host, atomically."""
        return _copy(node, remote_path, local_path)

    def close(self) -> None:
        """Nothing to close."""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)


def _copy(node: Node, src: str, dst: str) -> RunResult:
    start = time.monotonic()
    try:
        dst_dir = os.path.dirname(os.path.abspath(dst))
        os.makedirs(dst_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dst_dir, prefix=".brctl-")
        os.close(fd)
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as exc:
        return RunResult(node.name, NodeState.FAILED, 1, "", f"copy {src} -> {dst}: {exc}",
                         time.monotonic() - start)
    return RunResult(node.name, NodeState.OK, 0, "", "", time.monotonic() - start)
