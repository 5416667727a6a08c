"""Run one command on many nodes, bounded, never raising midway.

Before anything runs, a transport with a ``check_config`` judges the nodes' settings
(``SshTransport.check_config``: an ssh config setting brctl cannot honour is exit 2).

A fixed pool of ``concurrency`` workers (``brctl.remote.threads``), or for large
fan-outs of fresh connections several worker processes (``brctl.remote.shard``);
a transport with ``run_batch`` (``connection: slurm``) takes its nodes in few calls;
each node costs at most its own timeout; an overall ``deadline`` (seconds from the
start) turns nodes that never started into ``timeout`` results. Results come back
in the order of ``nodes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from brctl.core.transport import Node, Results, RunResult, Transport
from brctl.remote.threads import ArgvFor, StdinFor, run_threads


def run_all(
    transport: Transport,
    nodes: Iterable[Node],
    argv: ArgvFor,
    *,
    timeout: float | None = None,
    stdin: StdinFor = None,
    concurrency: int = 64,
    deadline: float | None = None,
    on_done: Callable[[RunResult], None] | None = None,
    processes: int = 1,
) -> Results:
    """Run ``argv`` (or ``argv(node)``) on every node; one result per node.

    Args:
        transport: the backend.
        nodes: where to run.
        argv: the argv list, or a function of the node returning one.
        timeout: per-node command timeout; None uses each node's ``command_timeout``.
        stdin: bytes for every node, or a function of the node.
        concurrency: nodes in flight at once.
        deadline: seconds for the whole fan-out; later nodes get what is left.
        on_done: called (in the caller's thread) as each node finishes, e.g. progress.
        processes: at most this many worker processes for large fan-outs of fresh
            connections (see ``brctl.remote.shard``: one per 128 nodes at most); used
            when the transport has a ``process_factory`` and ``argv``/``stdin`` are
            picklable, else threads.

    Returns:
        One ``RunResult`` per node, in the order of ``nodes``.

    Raises:
        InputError: the transport's ``check_config`` refused a node's settings (nothing ran).
    """
    todo = list(nodes)
    check_config = getattr(transport, "check_config", None)
    if check_config is not None:  # e.g. an ssh config setting brctl cannot honour: exit 2, nothing run
        check_config(todo)
    batch = getattr(transport, "run_batch", None)  # a transport that reaches many nodes per call
    if batch is not None:
        done = batch(todo, argv, timeout=timeout, stdin=stdin, concurrency=concurrency,
                     deadline=deadline, on_done=on_done)
        if done is not None:
            return Results(done.values())
    make = getattr(transport, "process_factory", None)
    if processes > 1 and make is not None:
        # here, not at the top: multiprocessing and pickle cost every command ~5 ms to import
        from brctl.remote.shard import picklable, run_sharded, worth_processes

        processes = worth_processes(processes, len(todo))
        factory = make(processes)
        if processes > 1 and picklable(factory, argv, stdin):
            return Results(run_sharded(
                factory, todo, argv, processes=processes, timeout=timeout, stdin=stdin,
                concurrency=concurrency, deadline=deadline, on_done=on_done,
            ).values())  # fmt: skip
    return Results(run_threads(
        transport, todo, argv, timeout=timeout, stdin=stdin, concurrency=concurrency,
        deadline=deadline, on_done=on_done,
    ).values())  # fmt: skip
