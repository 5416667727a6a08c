"""``connection: slurm``: run on nodes through Slurm's own fan-out (``srun``), no ssh.

One ``srun`` reaches many nodes at once: slurmd's tree (``TreeWidth``) launches the
tasks, so the controller pays one process and one stream per batch instead of one
ssh connection per node. Nodes of the job's running allocation (``job.slurm``) are
reached by a step inside it (``srun --overlap --jobid J``), others (idle standbys,
no job) by a short allocation of their own (``srun --immediate``: a busy node
answers ``unreachable`` at once, it never waits in the queue).

Each task runs ``brctl.diagnostics.srun_task``, which runs the command under the
same node-side reaper as over ssh (the timeout and the kill of its whole tree are
the reaper's; the step's ``--time`` is only a backstop) and answers one framed
record (``brctl.remote.slurm.frame``), so a node's hostile output cannot forge
another node's result. ``--kill-on-bad-exit=0``: a failing node does not end the
others' tasks. States are those of ssh: ``ok``/``failed`` from the record's exit
code, ``timeout`` when the reaper killed the command or no answer came in time,
``unreachable`` when Slurm could not start the task there or no whole record came
back (a retry without the nodes Slurm named first: their failure aborts the step).
``stream`` (checkpoint shards) is one single-task srun whose stdin and stdout are the
bytes themselves.

srun runs in a session of its own, under ``brctl.remote.slurm.srun_watch``: when brctl dies
without its Ctrl-C path (SIGKILL, the OOM killer), the watcher sees brctl's pipe close
and gives srun SIGTERM (it cancels its step), so no command runs on to its own timeout.

The interpreter, as over ssh (``brctl.remote.wrap.shell_line``): the system ``python3``
on the task's PATH, else (a conda-only machine) the node's configured ``python``; the
task and the reaper below it run under the same one. Output is bounded as over ssh:
``output_keep`` bytes at each end of each stream, with the total beside the text.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import queue
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Optional

from brctl.core.capture import Capture
from brctl.core.errors import InputError
from brctl.core.transport import Node, NodeState, RunResult, with_env
from brctl.remote.children import Children
from brctl.remote.local import drain
from brctl.remote.slurm.frame import Frames, payload
from brctl.remote.threads import CANCEL_WAIT_S, ArgvFor, StdinFor, interrupted
from brctl.remote.wrap import GRACE_S, SLACK_S, SYSTEM_PYTHON, exit_state, wrapped

# Runs "$@" under python3 where the task's PATH has one, else under $0 (the node's python).
_FALLBACK = f'p={SYSTEM_PYTHON}; command -v {SYSTEM_PYTHON} >/dev/null 2>&1 || p="$0"; exec "$p" "$@"'
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what sshd gives a root login
PAYLOAD_CAP = 256 << 10  # distinct stdins per srun (each task receives all of them)
PARALLEL_SRUNS = 8  # sruns of one fan-out in flight at once
STOP_WAIT_S = 10.0  # after SIGTERM (srun cancels its step), before SIGKILL
LAUNCH_MIN_S = 20.0  # Slurm reports a node it cannot reach after MessageTimeout (10 s by default)
NODELIST_ARG_MAX = 64 << 10  # a longer --nodelist goes through a file (argv words are capped)
_LAUNCH_FAILED = re.compile(r"Task launch for \S+ failed on node (\S+?):\s*(.*)")
_KEEP_SRUN_LINES = 20

_STARTED = re.compile(r"\bNode (\S+), \d+ tasks started")  # srun -v (the prefix before it varies by version)


@functools.cache
def _task_source() -> str:
    text = (Path(__file__).parents[2] / "diagnostics" / "srun_task.py").read_text()
    return text.split('"""', 2)[2].lstrip()  # the module docstring need not travel


@functools.cache
def _death_pipe() -> int:
    """The read end of a pipe whose write end this process holds until it dies (never
    closed, never inherited): its EOF tells every srun watcher that brctl is gone."""
    read, _write = os.pipe()  # both close-on-exec; a watcher gets the read end by pass_fds
    return read


def watched(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], int]:
    """``argv`` (an srun) under ``brctl.remote.slurm.srun_watch``, which ends it when brctl dies
    (SIGKILL included); and the fd to pass. srun is resolved here, so that a missing
    one is this Popen's OSError as before.

    Raises:
        FileNotFoundError: no such program on ``environ``'s PATH.
    """
    found = shutil.which(argv[0], path=environ.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    fd = _death_pipe()
    source = (Path(__file__).parent / "srun_watch.py").read_text()
    return [sys.executable, "-I", "-S", "-c", source, str(fd), found, *argv[1:]], fd


@dataclass(frozen=True)
class Batch:
    """Nodes one ``srun`` reaches with one command (``stdins`` in ``--nodelist`` order)."""

    job: Optional[str]  # a step in this job's allocation; None: an allocation of its own
    python: str  # the node's configured interpreter (used where it has no python3)
    argv: tuple[str, ...]  # the command under the reaper
    timeout: float
    keep: int
    launch: float  # how long starting the tasks may take (from the nodes' connect_timeout)
    stdins: Mapping[str, Optional[bytes]]


def batches(nodes: Sequence[Node], argv: ArgvFor, stdin: StdinFor, timeout: Optional[float],
            job: Optional[str], allocated: frozenset[str]) -> list[Batch]:
    """The fan-out as sruns: nodes with the same command and place together, each srun's
    distinct stdins at most ``PAYLOAD_CAP`` bytes (every task receives all of them)."""
    grouped: dict[tuple[Optional[str], str, tuple[str, ...], float, int, float],
                  dict[str, Optional[bytes]]] = {}
    for node in nodes:
        limit = node.command_timeout if timeout is None else timeout
        cmd = argv(node) if callable(argv) else argv
        data = stdin(node) if callable(stdin) else stdin
        where = job if node.name in allocated else None
        key = (where, node.python, tuple(wrapped(SYSTEM_PYTHON, with_env(cmd, node.env), limit)),
               limit, node.output_keep, max(LAUNCH_MIN_S, 2 * node.connect_timeout))
        grouped.setdefault(key, {})[node.name] = data
    out = []
    for (where, python, cmd, limit, keep, launch), stdins in grouped.items():
        block: dict[str, Optional[bytes]] = {}
        seen: set[bytes] = set()
        size = 0
        for name, data in stdins.items():
            extra = len(data) if data is not None and data not in seen else 0
            if block and size + extra > PAYLOAD_CAP:
                out.append(Batch(where, python, cmd, limit, keep, launch, block))
                block, seen, size, extra = {}, set(), 0, len(data or b"")
            block[name] = data
            if data is not None:
                seen.add(data)
            size += extra
        out.append(Batch(where, python, cmd, limit, keep, launch, block))
    return out


def interpreter(python: str) -> list[str]:
    """The argv prefix that runs a node-side script under ``python3``, else ``python``."""
    return [SYSTEM_PYTHON] if python == SYSTEM_PYTHON else ["sh", "-c", _FALLBACK, python]


def _result(node: str, state: NodeState, t0: float, why: str) -> RunResult:
    return RunResult(node, state, None, "", why, time.monotonic() - t0)


def srun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """srun's environment: ours without the SLURM_* of an allocation brctl may run in
    (they would make every srun a step of that job); ``SLURM_CONF`` stays."""
    return {k: v for k, v in environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


@dataclass
class _Reading:
    """What one srun said besides the records."""

    started: set[str]
    failed: dict[str, str]  # node -> why Slurm could not start its task
    said: list[str]  # srun's own error lines (the last few)
    task_err: dict[str, bytes]  # a task's own stderr (e.g. slurmstepd's exec error), bounded
    sent: bool = False  # the tasks got their requests (before that, no command ran anywhere)


@dataclass(frozen=True)
class JobRef:
    """The job whose allocation ``srun --jobid`` joins: its id, or its name (narrowed by
    user and cluster), as ``job.slurm`` gives them."""

    id: Optional[str] = None
    name: Optional[str] = None
    user: Optional[str] = None
    cluster: Optional[str] = None


def named_job(ref: JobRef, ask: Callable[[list[str]], str]) -> Optional[str]:
    """The id of the job ``job.slurm`` names (None: no such job runs now).

    Raises:
        InputError: the name matches several running jobs of its user (exit 2: say which
            one), or a name comes without its user.
    """
    if ref.id is not None:
        return ref.id
    if not ref.user:  # the inventory's load refuses this: every user's jobs would match
        raise InputError(f"job.slurm: the job named {ref.name!r} needs its user (job.slurm.user)")
    argv = ["squeue", "-h", "-t", "RUNNING", "-o", "%i", "-n", str(ref.name), f"--user={ref.user}"]
    argv += [f"--clusters={ref.cluster}"] if ref.cluster else []
    ids = [line for line in ask(argv).split() if line[:1].isdigit()]
    if len(ids) > 1:
        raise InputError(f"job.slurm: {len(ids)} running jobs are named {ref.name!r}: {', '.join(ids[:8])}",
                         hint="give the id as job.slurm.job")
    return ids[0] if ids else None


class SlurmTransport:
    """Runs commands on nodes through ``srun``; see the module docstring.

    Args:
        job: the job (``job.slurm``), looked up when each fan-out starts; None: no job.
        partition: where allocations for nodes outside the job are made (None: the default).
        environ: the environment srun runs in (``SLURM_CONF``...); default ours.
    """

    def __init__(self, *, job: Optional[JobRef] = None, partition: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        self._job = job
        self._partition = partition
        self._env = srun_environment(os.environ if environ is None else environ)
        self._children = Children()

    # -- where each node is reached ---------------------------------------------------

    def allocation(self) -> tuple[Optional[str], frozenset[str]]:
        """The job's id and the nodes of its running allocation (none when it does not run)."""
        job = named_job(self._job, self._client) if self._job is not None else None
        if job is None:
            return None, frozenset()
        listed = self._client(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%N"])
        if not listed:
            return job, frozenset()
        return job, frozenset(self._client(["scontrol", "show", "hostnames", listed]).split())

    def _client(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, env=self._env, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""

    # -- fan-out -------------------------------------------------------------------

    def run_batch(
        self,
        nodes: Iterable[Node],
        argv: ArgvFor,
        *,
        timeout: Optional[float] = None,
        stdin: StdinFor = None,
        concurrency: int = PARALLEL_SRUNS,
        deadline: Optional[float] = None,
        on_done: Optional[Callable[[RunResult], None]] = None,
    ) -> dict[str, RunResult]:
        """``run_all`` for slurm nodes: one srun per batch, results in the order of ``nodes``."""
        todo = list(nodes)
        if not todo:
            return {}
        job, allocated = self.allocation()
        if deadline is not None:
            timeout = min(timeout if timeout is not None else min(n.command_timeout for n in todo),
                          deadline)
        work = batches(todo, argv, stdin, timeout, job, allocated)
        done: queue.Queue[Optional[RunResult]] = queue.Queue()

        def one(batch: Batch) -> None:
            try:
                self._run(batch, done.put, retry=True)
            finally:
                done.put(None)

        results: dict[str, RunResult] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_SRUNS, concurrency, len(work))))
        futures = [pool.submit(one, b) for b in work]
        left = len(work)
        try:
            while left:
                item = done.get()
                if item is None:
                    left -= 1
                elif item.node not in results:
                    results[item.node] = item
                    if on_done is not None:
                        on_done(item)
        except KeyboardInterrupt:
            # as run_threads: srun cancels its step (the reapers end the commands); wait a
            # little for that, a second Ctrl-C stops waiting at once
            pool.shutdown(wait=False, cancel_futures=True)
            self.cancel()
            with contextlib.suppress(KeyboardInterrupt):
                wait(futures, timeout=CANCEL_WAIT_S)
            raise interrupted(todo, results) from None
        pool.shutdown(wait=True)
        for fut in futures:
            fut.result()  # a bug in a batch is a bug (exit 70), not a node state
        return {n.name: results[n.name] for n in todo}

    def _command(self, batch: Batch, nodelist: str, nonce: str) -> list[str]:
        """The srun of a batch: every task runs ``srun_task``, which runs the reaper."""
        return [*self._srun(batch, nodelist), "--label", "--verbose", *interpreter(batch.python),
                "-I", "-S", "-c", _task_source(), nonce, str(batch.keep), *batch.argv]

    def _srun(self, batch: Batch, nodelist: str) -> list[str]:
        count = len(batch.stdins)
        minutes = math.ceil((batch.timeout + GRACE_S + SLACK_S + batch.launch) / 60) + 1
        where = (["--overlap", f"--jobid={batch.job}"] if batch.job is not None else
                 [f"--immediate={max(1, math.ceil(batch.launch))}",
                  *([f"--partition={self._partition}"] if self._partition else [])])
        return ["srun", *where, f"--nodelist={nodelist}", f"--nodes={count}", f"--ntasks={count}",
                "--ntasks-per-node=1", "--distribution=arbitrary",
                "--kill-on-bad-exit=0", f"--time={minutes}", "--job-name=brctl",
                f"--export=PATH={NODE_PATH}"]

    def _run(self, batch: Batch, report: Callable[[RunResult], None], *, retry: bool) -> None:
        """One srun; every node of ``batch`` reported once. Nodes Slurm could not start
        abort the step before any command ran (see ``_read``): the others run again once."""
        t0 = time.monotonic()
        names = list(batch.stdins)
        if self._children.cancelled:
            for name in names:
                report(_result(name, NodeState.TIMEOUT, t0, "brctl: interrupted before start"))
            return
        nonce = secrets.token_hex(8)
        frames = Frames(nonce, names, batch.keep)
        reading = _Reading(set(), {}, [], {})
        answered: set[str] = set()

        def answer(name: str) -> None:
            got = frames.answers()[name]
            state = exit_state(got.exit_code, got.seconds, batch.timeout)
            answered.add(name)
            report(RunResult(name, state, None if state is NodeState.TIMEOUT else got.exit_code,
                             got.stdout.text, got.stderr.text, time.monotonic() - t0,
                             got.stdout.cut_total, got.stderr.cut_total,
                             got.stdout.exact, got.stderr.exact))

        with _nodelist(names) as nodelist:
            try:
                cmd, fd = watched(self._command(batch, nodelist, nonce), self._env)
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(fd,),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=self._env, start_new_session=True)
            except OSError as exc:
                for name in names:
                    report(_result(name, NodeState.UNREACHABLE, t0, f"srun: {exc.strerror}"))
                return
            with self._children.tracked(proc):
                gave_up = _read(proc, frames, reading, answer, payload(batch.stdins),
                                launch_by=t0 + batch.launch,
                                give_up=t0 + batch.launch + batch.timeout + GRACE_S + SLACK_S)
        missing = [n for n in names if n not in answered]
        retry = retry and bool(reading.failed) and not reading.sent
        again = [n for n in missing if n not in reading.failed] if retry else []
        for name in missing:
            if name in reading.failed:
                why, state = f"slurm could not start the task: {reading.failed[name]}", NodeState.UNREACHABLE
            elif name in again:
                continue
            elif self._children.cancelled:
                why, state = "interrupted; the command was killed", NodeState.TIMEOUT
            elif gave_up:
                why = (f"brctl: no answer {batch.timeout:g}s+{GRACE_S + SLACK_S + batch.launch:g}s "
                       "after start; gave up on the node")
                state = NodeState.TIMEOUT
            else:
                why, state = _why_unreachable(frames.why_not(name), reading, name), NodeState.UNREACHABLE
            report(_result(name, state, t0, why))
        if again:
            self._run(replace(batch, stdins={n: batch.stdins[n] for n in again}), report, retry=False)

    # -- the rest of the Transport protocol -------------------------------------------

    def run(self, node: Node, argv: Sequence[str], *, timeout: float,
            stdin: Optional[bytes] = None) -> RunResult:
        """One node: a batch of one."""
        return self.run_batch([node], list(argv), timeout=timeout, stdin=stdin)[node.name]

    def stream(self, node: Node, argv: Sequence[str], *, timeout: float,
               stdin: Optional[BinaryIO] = None, stdout: Optional[BinaryIO] = None) -> RunResult:
        """Bulk bytes (checkpoint shards) through one single-task srun, under the reaper:
        srun hands ``stdin`` to the task and its stdout to ``stdout`` as they come, and
        exits with the task's exit code. One node's own bytes: no record to frame. stderr,
        and stdout when no ``stdout`` is given (the relay's receiving side), are kept as
        over ssh: the first and last ``output_keep`` bytes, read to the end, with the total."""
        t0 = time.monotonic()
        job, allocated = self.allocation()
        [batch] = batches([node], argv, None, timeout, job, allocated)
        # the reaper alone (its argv after the interpreter): no record
        cmd = [*self._srun(batch, node.name), *interpreter(batch.python), *batch.argv[1:]]
        try:
            cmd, fd = watched(cmd, self._env)
            proc = subprocess.Popen(cmd, stdin=stdin or subprocess.DEVNULL, pass_fds=(fd,),
                                    stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._env, start_new_session=True)
        except OSError as exc:
            return _result(node.name, NodeState.UNREACHABLE, t0, f"srun: {exc.strerror}")
        out, err = Capture(node.output_keep), Capture(node.output_keep)
        with self._children.tracked(proc):
            # bounded as over ssh: each stream's first and last output_keep bytes, read to
            # its end (a node's gigabytes of stderr must not become controller memory)
            if not drain(proc, out, err, t0 + batch.launch + timeout + GRACE_S + SLACK_S):
                _stop(proc)
                return _result(node.name, NodeState.TIMEOUT, t0, f"stream stalled or ran past {timeout:g}s")
            proc.wait()
        said = err.text()
        if proc.returncode != 0 and re.search(r"^srun: error: (Task launch|Unable to|.*[Ii]nvalid job)",
                                               said, re.M):
            return _result(node.name, NodeState.UNREACHABLE, t0, said.strip().splitlines()[-1][:300])
        state = exit_state(proc.returncode, time.monotonic() - t0, timeout)
        return RunResult.captured(node.name, state, None if state is NodeState.TIMEOUT else proc.returncode,
                                  out, err, time.monotonic() - t0)

    def cancel(self) -> None:
        """Ctrl-C: srun cancels its step on SIGTERM (the reapers end their trees); start no more."""
        self._children.cancel()

    def close(self) -> None:
        """Nothing stays open between fan-outs."""


@contextlib.contextmanager
def _nodelist(names: list[str]) -> Iterator[str]:
    """``--nodelist``'s value: the names, or a file of them when too long for one argv word."""
    text = ",".join(names)
    if len(text) < NODELIST_ARG_MAX:
        yield text
        return
    with tempfile.NamedTemporaryFile("w", prefix="brctl-nodes-", suffix=".txt") as fh:
        fh.write("\n".join(names) + "\n")
        fh.flush()
        yield fh.name  # srun reads a --nodelist with a '/' as a file, in its order


def _why_unreachable(why: str, reading: _Reading, name: str) -> str:
    parts = [why]
    err = reading.task_err.get(name, b"").decode(errors="replace").strip()
    if err:
        parts.append(err[-300:])
    if name not in reading.started and reading.said:
        parts.append(reading.said[-1])
    return "; ".join(parts)


class LineSplitter:
    """srun's output as lines; a line longer than ``limit`` is dropped whole, through its
    newline. Its tail must not pass for a line of its own: a task could write another
    rank's ``N: `` label there and answer in that node's name."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self._buf = bytearray()
        self._limit = limit
        self._skipping = False  # inside a line too long to keep

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes."""
        self._buf += chunk
        *lines, rest = bytes(self._buf).split(b"\n")
        if lines and self._skipping:
            lines, self._skipping = lines[1:], False
        if len(rest) >= self._limit:
            rest, self._skipping = b"", True
        self._buf[:] = rest
        return lines


def _read(proc: subprocess.Popen[bytes], frames: Frames, reading: _Reading,
          answer: Callable[[str], None], data: bytes, *, launch_by: float, give_up: float) -> bool:
    """Read srun's output to its end; True when ``give_up`` came first (srun then stopped).

    The payload is written only once every task started (``--verbose``'s "tasks
    started" for each node) or ``launch_by`` passed: when Slurm cannot start a task
    it aborts the whole step, and then no task has its request yet, so no command ran.
    """
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    expected = set(frames.nodes)
    splitters = {proc.stdout: LineSplitter(), proc.stderr: LineSplitter()}

    def send() -> None:
        reading.sent = True
        threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, False)
        sel.register(proc.stderr, selectors.EVENT_READ, True)
        while sel.get_map():
            now = time.monotonic()
            if not reading.sent and (now >= launch_by or expected <= reading.started) and not reading.failed:
                send()
            if now >= give_up:
                _stop(proc)
                return True
            wait = (give_up if reading.sent else min(launch_by, give_up)) - now
            for key, _ in sel.select(max(0.01, min(wait, 1.0))):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                for line in splitters[key.fileobj].feed(chunk):  # type: ignore[index]
                    if key.data:
                        _stderr_line(line, reading, frames)
                    else:
                        node = frames.line(line)
                        if node is not None:
                            answer(node)
    if not reading.sent:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
    return False


def _feed(pipe: BinaryIO, data: bytes) -> None:
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _stderr_line(raw: bytes, reading: _Reading, frames: Frames) -> None:
    line = raw.decode(errors="replace").rstrip("\r")
    labelled = re.match(r"^ *(\d+): (.*)$", line)
    if labelled is not None:
        rank = int(labelled.group(1))
        name = frames.nodes[rank] if rank < len(frames.nodes) else None
        if name is not None and len(reading.task_err.get(name, b"")) < 2048:
            reading.task_err[name] = reading.task_err.get(name, b"") + labelled.group(2).encode() + b"\n"
        return
    started, failed = _STARTED.search(line), _LAUNCH_FAILED.search(line)
    if started is not None:
        reading.started.add(started.group(1))
    elif failed is not None:
        reading.failed[failed.group(1)] = failed.group(2).strip()
    elif "error" in line:
        reading.said.append(line.strip()[:300])
        del reading.said[:-_KEEP_SRUN_LINES]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM srun (it cancels the step: the reapers end the commands), SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
