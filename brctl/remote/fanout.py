"""Run one command on many nodes, bounded, never raising midway.

A fixed pool of ``concurrency`` workers; each node costs at most its own timeout;
an overall ``deadline`` (seconds from the start) turns nodes that never started
into ``timeout`` results. Results come back in the order of ``nodes``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Union

from brctl.core.errors import InterruptedRun
from brctl.core.nodeset import fold
from brctl.core.transport import Node, NodeState, RunResult, Transport

ArgvFor = Union[Sequence[str], Callable[[Node], Sequence[str]]]
StdinFor = Union[bytes, None, Callable[[Node], Union[bytes, None]]]


def _resolve(value: ArgvFor | StdinFor, node: Node) -> object:
    return value(node) if callable(value) else value


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
) -> dict[str, RunResult]:
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
        ``{node name: RunResult}`` in the order of ``nodes``.
    """
    todo = list(nodes)
    make = getattr(transport, "process_factory", None)
    if processes > 1 and make is not None:
        from brctl.remote.shard import picklable, run_sharded, worth_processes

        processes = worth_processes(processes, len(todo))
        factory = make(processes)
        if processes > 1 and picklable(factory, argv, stdin):
            return run_sharded(
                factory, todo, argv, processes=processes, timeout=timeout, stdin=stdin,
                concurrency=concurrency, deadline=deadline, on_done=on_done,
            )  # fmt: skip
    start = time.monotonic()
    results: dict[str, RunResult] = {}

    def one(node: Node) -> RunResult:
        limit = node.command_timeout if timeout is None else timeout
        if deadline is not None:
            left = deadline - (time.monotonic() - start)
            if left <= 0:
                return RunResult(node.name, NodeState.TIMEOUT, None, "", "deadline passed before start", 0.0)
            limit = min(limit, left)
        cmd = _resolve(argv, node)
        data = _resolve(stdin, node)
        return transport.run(node, list(cmd), timeout=limit, stdin=data)  # type: ignore[call-overload, arg-type]

    pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(todo) or 1)))
    pending: set[Future[RunResult]] = {pool.submit(one, n) for n in todo}
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                res = fut.result()
                results[res.node] = res
                if on_done is not None:
                    on_done(res)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        unfinished = fold(n.name for n in todo if n.name not in results)
        raise InterruptedRun(f"interrupted; not finished: {unfinished or 'none'}") from None
    pool.shutdown(wait=True)
    return {n.name: results[n.name] for n in todo}
