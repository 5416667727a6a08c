"""Fan-out over several worker processes, for large fan-outs of fresh connections.

One paramiko process tops out near 150 new connections/s: the key exchange and
packet handling are Python under the GIL (benchmarks/README.md). ``run_sharded`` splits
the nodes round-robin over ``processes`` worker processes; each builds its own
transport from ``factory`` (a picklable zero-argument callable, e.g. what
``SshTransport.process_factory`` returns), runs the ordinary threaded fan-out on
its shard with its share of the concurrency and of the connect rate, and streams
each node's result back as it finishes, so progress (``on_done``) stays live.

Workers are started with ``spawn`` (never ``fork``: the parent has transport
threads whose locks a forked child could inherit held), as ``python -I``: spawn
runs ``python -c 'from multiprocessing.spawn import ...'`` (and its resource
tracker likewise), and ``-c`` puts the cwd first on ``sys.path``, so a
``multiprocessing.py`` in the operator's cwd would run as root in every worker.
Isolated, a worker imports only from the interpreter's own paths until spawn hands
it the parent's ``sys.path``. ``-P`` exists only from Python 3.11, so the
executable multiprocessing starts is a two-line ``sh`` wrapper adding ``-I``, made
once per process in a private ``mkdtemp`` directory (removed at exit) on a
filesystem that allows exec; where none does, the fan-out runs in threads. Each costs an interpreter
start plus the paramiko import (~0.3 s of CPU), so sharding pays off from a few
hundred fresh connections up; connections die with the workers, so a caller that
reuses connections (the daemon) keeps ``processes=1``.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import queue as queue_mod
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from brctl.core.errors import InterruptedRun
from brctl.core.transport import Node, NodeState, RunResult, Transport
from brctl.remote.threads import CANCEL_WAIT_S, interrupted, run_threads

_SHARD_DONE = "done"
# A worker costs ~0.3-0.5 s of CPU to start (interpreter, paramiko import) against
# ~6-8 ms per fresh connection, so each must have this many nodes to pay for itself.
MIN_NODES_PER_PROCESS = 128


def worth_processes(requested: int, nodes: int) -> int:
    """How many worker processes ``nodes`` fresh connections justify (1: stay in threads)."""
    return max(1, min(requested, nodes // MIN_NODES_PER_PROCESS))


def picklable(*values: object) -> bool:
    """True when every value can be sent to a spawned worker."""
    try:
        pickle.dumps(values)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


_ISOLATED_LOCK = threading.Lock()
_isolated: list[str] = []  # the wrapper, once made


def isolated_python() -> str | None:
    """An executable that runs this interpreter as ``python -I "$@"`` (made once), or
    None where no temp directory may hold one (all mounted ``noexec``)."""
    with _ISOLATED_LOCK:
        if not _isolated:
            _isolated.append(_make_wrapper() or "")
        return _isolated[0] or None


def _make_wrapper() -> str | None:
    for base in (tempfile.gettempdir(), os.path.expanduser("~/.cache"), "/run", "/var/tmp"):
        try:
            if os.statvfs(base).f_flag & os.ST_NOEXEC:  # a hardened /tmp: try the next
                continue
            where = tempfile.mkdtemp(prefix="brctl-python-", dir=base)  # 0700, ours
        except OSError:
            continue
        atexit.register(shutil.rmtree, where, True)
        path = os.path.join(where, "python")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I \"$@\"\n")
        return path
    return None


def _worker(
    factory: Callable[[], Transport],
    nodes: list[Node],
    argv: Any,
    timeout: float | None,
    stdin: Any,
    concurrency: int,
    deadline_at: float | None,
    out: Any,
) -> None:
    # Ctrl-C reaches a worker once, from the parent, as SIGTERM (a terminal's SIGINT to the
    # whole process group is ignored here): run_threads then kills what runs, as in-process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _interrupt)
    transport = None
    try:
        transport = factory()
        deadline = None if deadline_at is None else max(0.0, deadline_at - time.time())
        run_threads(
            transport, nodes, argv, timeout=timeout, stdin=stdin, concurrency=concurrency,
            deadline=deadline, on_done=out.put,
        )  # fmt: skip
    except (InterruptedRun, KeyboardInterrupt):
        pass  # the parent reports the interruption
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if transport is not None:
            transport.close()
        out.put(_SHARD_DONE)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _collect(workers: list[Any], out: Any, results: dict[str, RunResult],
             on_done: Callable[[RunResult], None] | None) -> None:
    """Take the workers' results as they come until every worker said it was done."""
    finished = 0
    while finished < len(workers):
        try:
            item = out.get(timeout=0.5)
        except queue_mod.Empty:
            if all(w.exitcode is not None for w in workers) and out.empty():
                return  # a worker died without saying it was done
            continue
        if item == _SHARD_DONE:
            finished += 1
            continue
        results[item.node] = item
        if on_done is not None:
            on_done(item)


def _stop(workers: list[Any], grace: float) -> None:
    """Every started worker ended: given ``grace`` seconds to exit, then killed."""
    for w in workers:
        if w.pid is not None and w.exitcode is None:
            w.join(timeout=grace)
            if w.exitcode is None:
                w.kill()
                w.join()


def _drain_until_gone(workers: list[Any], out: Any, until: float) -> None:
    """Read (and drop) what the workers still send until they all exit or ``until``:
    a worker cannot exit while its queue's pipe is full."""
    while time.monotonic() < until and any(w.pid is not None and w.exitcode is None for w in workers):
        with contextlib.suppress(queue_mod.Empty):
            out.get(timeout=0.05)


def run_sharded(
    factory: Callable[[], Transport],
    nodes: Sequence[Node],
    argv: Any,
    *,
    processes: int,
    timeout: float | None = None,
    stdin: Any = None,
    concurrency: int = 64,
    deadline: float | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> dict[str, RunResult]:
    """``run_all`` over ``processes`` worker processes; same arguments and result.

    ``argv`` and ``stdin`` (values or functions of the node) must be picklable
    (module-level functions, not lambdas); ``run_all`` checks that before it
    chooses this path.
    """
    todo = list(nodes)
    shards = [todo[i::processes] for i in range(processes) if todo[i::processes]]
    per_shard = max(1, math.ceil(concurrency / len(shards)))
    deadline_at = None if deadline is None else time.time() + deadline
    isolated = isolated_python()
    if isolated is None:  # no isolated worker can start here: the threads, in this process
        transport = factory()
        try:
            return run_threads(transport, todo, argv, timeout=timeout, stdin=stdin,
                               concurrency=concurrency, deadline=deadline, on_done=on_done)
        finally:
            transport.close()
    import multiprocessing  # here: ~8 ms to import, and most fan-outs never shard

    ctx = multiprocessing.get_context("spawn")
    # before the first Queue: its semaphore starts the resource tracker with this too
    ctx.set_executable(isolated)
    out = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker,
            args=(factory, shard, argv, timeout, stdin, per_shard, deadline_at, out),
            daemon=True,
        )
        for shard in shards
    ]
    results: dict[str, RunResult] = {}
    grace = 5.0  # how long a worker may take to exit before it is killed
    try:
        for w in workers:
            w.start()
        _collect(workers, out, results, on_done)
    except KeyboardInterrupt:
        # First Ctrl-C: each worker kills what it runs (the timeout's kill path) and gets
        # CANCEL_WAIT_S for the reports; a second Ctrl-C stops waiting at once.
        for w in workers:
            if w.pid is not None:
                w.terminate()  # SIGTERM: the worker's Ctrl-C (see _worker)
        try:
            _drain_until_gone(workers, out, time.monotonic() + CANCEL_WAIT_S + 1)
        except KeyboardInterrupt:
            grace = 0.0  # a second Ctrl-C: kill the workers and go
        raise interrupted(todo, results) from None
    finally:
        _stop(workers, grace)
        out.close()
    for node in todo:
        if node.name not in results:
            lost = RunResult(
                node.name, NodeState.UNREACHABLE, None, "", "brctl worker process exited early", 0.0
            )
            results[node.name] = lost
            if on_done is not None:
                on_done(lost)
    return {n.name: results[n.name] for n in todo}
