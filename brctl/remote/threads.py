"""The threaded fan-out: a fixed pool of workers over one transport, never raising midway.

``brctl.remote.fanout.run_all`` calls it in-process, and each worker process of
``brctl.remote.shard`` calls it on its shard.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Union

from brctl.core.errors import InterruptedRun
from brctl.core.nodeset import fold
from brctl.core.transport import Node, NodeState, RunResult, Transport

CANCEL_WAIT_S = 5.0  # after Ctrl-C, how long running commands get to report their kill
ArgvFor = Union[Sequence[str], Callable[[Node], Sequence[str]]]
StdinFor = Union[bytes, None, Callable[[Node], Union[bytes, None]]]


def _resolve(value: ArgvFor | StdinFor, node: Node) -> object:
    return value(node) if callable(value) else value


def interrupted(todo: Sequence[Node], results: Mapping[str, RunResult]) -> InterruptedRun:
    """What a fan-out raises on Ctrl-C: the nodes it did not finish are named."""
    unfinished = fold(n.name for n in todo if n.name not in results)
    return InterruptedRun(
        f"interrupted; commands still running were killed; not finished: {unfinished or 'none'}")


def run_threads(
    transport: Transport,
    nodes: Iterable[Node],
    argv: ArgvFor,
    *,
    timeout: float | None = None,
    stdin: StdinFor = None,
    concurrency: int = 64,
    deadline: float | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> dict[str, RunResult]:
    """``run_all`` in this process's threads; same arguments (but ``processes``) and result."""
    todo = list(nodes)
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
    pending: set[Future[RunResult]] = set()
    try:
        for node in todo:  # a Ctrl-C while they are handed out must kill those started too
            pending.add(pool.submit(one, node))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                res = fut.result()
                results[res.node] = res
                if on_done is not None:
                    on_done(res)
    except KeyboardInterrupt:
        # First Ctrl-C: kill what runs on every node (the timeout's kill path) and wait
        # briefly for those runs to end; a second Ctrl-C stops waiting at once.
        pool.shutdown(wait=False, cancel_futures=True)
        transport.cancel()
        with contextlib.suppress(KeyboardInterrupt):
            wait(pending, timeout=CANCEL_WAIT_S)
        raise interrupted(todo, results) from None
    pool.shutdown(wait=True)
    return {n.name: results[n.name] for n in todo}
