"""``brctl exec``: one command on many nodes, folded."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from brctl.core.errors import ExitCode, UsageError
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

    def to_json(self) -> dict[str, object]:
        """The payload of ``brctl.exec/1``: the argv and each node's result."""
        return {"argv": list(self.argv), "nodes": self.results.to_json()}


def command_argv(args: Sequence[str], *, shell: bool = True) -> list[str]:
    """The argv ``brctl exec`` runs for its arguments, read as ssh/clush/pdsh read them.

    One argument is a shell command line: ``sh -c ARG`` (``'echo hi | wc -l'`` pipes
    on the node, as ``ssh host 'echo hi | wc -l'`` does). Two or more are an argv,
    passed argument by argument. ``shell=False`` (``--argv``) reads one argument
    as an argv of one (a program name) too.

    Raises:
        UsageError: no command, or an empty one.
    """
    if not args or (len(args) == 1 and not args[0].strip()):
        raise UsageError("exec: empty command", hint="brctl exec 'CMD | ...' or brctl exec -- PROG ARG...")
    if len(args) == 1 and shell:
        return ["sh", "-c", args[0]]
    return list(args)


def execute(
    transport: Transport,
    nodes: Sequence[Node],
    argv: Sequence[str],
    *,
    timeout: float | None,
    concurrency: int,
    stdin: bytes | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> ExecReport:
    """Run ``argv`` on ``nodes`` (with ``stdin`` for each) and collect every node's result."""
    # Large fan-outs of fresh connections spread over one worker process per core
    # (run_all shards only when each worker gets enough machines to pay for itself).
    results = run_all(transport, nodes, argv, timeout=timeout, stdin=stdin,
                      concurrency=concurrency, on_done=on_done, processes=os.cpu_count() or 1)
    return ExecReport(tuple(argv), results)
