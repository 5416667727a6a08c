"""A scripted transport for unit tests: no sockets, no processes.

``FakeTransport(handler)`` calls ``handler(node, argv, stdin)`` for every run and
records every call; the handler returns a ``Reply`` (or raises ``FakeTimeout``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from brctl.core.transport import Node, NodeState, RunResult, state_for_exit


@dataclass(frozen=True)
class Reply:
    """What a fake node answers; ``state`` overrides the exit-code mapping (e.g. unreachable)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = 0
    state: NodeState | None = None


@dataclass(frozen=True)
class Call:
    """One recorded call."""

    node: str
    argv: tuple[str, ...]
    stdin: bytes | None


Handler = Callable[[Node, Sequence[str], "bytes | None"], Reply]


class FakeTransport:
    """Answers from ``handler``; ``calls`` lists what was asked."""

    def __init__(self, handler: Handler) -> None:
        """Args: handler: computes each node's reply."""
        self.handler = handler
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None
    ) -> RunResult:
        """Record the call and answer with the handler's reply."""
        with self._lock:
            self.calls.append(Call(node.name, tuple(argv), stdin))
        reply = self.handler(node, argv, stdin)
        if reply.state is not None:
            state = reply.state
        else:
            state = state_for_exit(reply.exit_code if reply.exit_code is not None else 1)
        code = reply.exit_code if state.ran else None
        return RunResult(node.name, state, code, reply.stdout, reply.stderr, 0.0)

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """``run`` with stdin read from a file and the reply's stdout written to one."""
        res = self.run(node, argv, timeout=timeout, stdin=stdin.read() if stdin else None)
        if stdout is None:
            return res
        stdout.write(res.stdout.encode())
        return RunResult(res.node, res.state, res.exit_code, "", res.stderr, res.seconds)

    def cancel(self) -> None:
        """Nothing runs for real."""

    def close(self) -> None:
        """Nothing to close."""
