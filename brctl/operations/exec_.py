"""``brctl exec``: one command on many nodes, folded."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from brctl.core.errors import ExitCode
from brctl.core.transport import Node, Results, RunResult, Transport
from brctl.remote.fanout import run_all


@dataclass(frozen=True)
class ExecReport:
    """Per-node results of one command."""

    argv: tuple[str, ...]
    results: Results

    @property
    def exit_code(self) -> ExitCode:
        """3 if any node gave no answer, else 1 if any non-zero exit, else 0."""
        return self.results.exit_code


def execute(
    transport: Transport,
    nodes: Sequence[Node],
    argv: Sequence[str],
    *,
    timeout: float | None,
    concurrency: int,
    on_done: Callable[[RunResult], None] | None = None,
) -> ExecReport:
    """Run ``argv`` on ``nodes`` and collect every node's result."""
    # Large fan-outs of fresh connections spread over one worker process per core
    # (run_all shards only when each worker gets enough machines to pay for itself).
    results = run_all(transport, nodes, argv, timeout=timeout, concurrency=concurrency,
                      on_done=on_done, processes=os.cpu_count() or 1)
    return ExecReport(tuple(argv), results)
