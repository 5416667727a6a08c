"""``brctl stacks``: collect py-spy dumps from every rank, analyse them, save or reload them.

- ``collect`` runs the ``stacks_probe`` on every machine (shipping the
  controller's py-spy to machines that have none) and returns one ``Collection``.
  Each machine answers with its ranks' main-thread frames as indices into its
  frame table, its ranks packed in a few strings (``diagnostics.pyspy_frames``,
  read by ``analysis.stacks.pyspy``: checked, a malformed answer or one of another
  format is that machine's error); only ``raw`` collections (for ``save``)
  carry py-spy's JSON itself.
- ``collect_rounds`` repeats it ``rounds`` times, ``interval`` seconds apart.
- ``analyse`` drops the answers of machines that lie about their ranks, turns the rest
  into the pure analyser's input (live rank → machine, parsed stacks, missing ranks)
  and returns a ``StacksReport``. ``save``/``load``: ``stacks/save.py``.

The daemon calls ``collect_rounds`` and ``analyse`` directly.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

from brctl.analysis.collective_analysis import analyse_collectives
from brctl.analysis.fusion import fuse
from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.stacks.pyspy import (
    FrameCache,
    PySpyFormatError,
    frame_table,
    packed_ints,
    packed_stacks,
    parse_dump,
)
from brctl.analysis.stacks.tree import Frame, RankSample, Round, Stack, StackAnalysis
from brctl.analysis.stacks.tree import analyse as analyse_rounds
from brctl.analysis.topology import Topology
from brctl.core.errors import (
    ExitCode,
    IncompleteError,
    RefusedError,
    RemoteDataError,
    exit_code_of,
)
from brctl.core.transport import Node, NodeState, RunResult, Transport
from brctl.diagnostics.pyspy_frames import PACKED, RAW
from brctl.operations.stacks.collectives import decode_captures
from brctl.operations.stacks.recorder import RecorderAnswerError, rank_reads, recorder_fields
from brctl.operations.stacks.types import Collection as Collection
from brctl.operations.stacks.types import JobShape as JobShape
from brctl.operations.stacks.types import NodeCollection as NodeCollection
from brctl.operations.stacks.types import RankDump as RankDump
from brctl.remote.probes import Bundle, ProbeResult, ProbeRunner

PROBE = "brctl.diagnostics.stacks_probe"
RECENT = 20  # collectives per group each rank's summary keeps (the arrival window)


@dataclass(frozen=True)
class StacksReport:
    """The analysis plus the collections it came from."""

    analysis: StackAnalysis
    topology: Topology
    collections: tuple[Collection, ...]
    node_errors: dict[str, str] = field(default_factory=dict)
    summary_errors: dict[int, str] = field(default_factory=dict)  # rank → its refused summary

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused a machine (a safety rule there), else 3 when machines gave
        no answer or a rank could not be read, else 1 when an eviction is proposed, else 0."""
        return exit_code_of(
            refused=any(nc.state == NodeState.REFUSED.value for c in self.collections[-1:]
                        for nc in c.nodes.values()),
            # an unread rank (py-spy refused, no socket) makes the run incomplete too
            incomplete=bool(self.node_errors) or bool(self.analysis.unread),
            findings=bool(self.analysis.evict))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.stacks/2`` (classes, outliers, suspect_groups, evict)."""
        a, topo = self.analysis, self.topology
        last = self.collections[-1]
        return {
            "classes": [c.to_json() for c in a.classes],
            "outliers": [o.to_json() for o in a.outliers],
            "suspect_groups": [g.to_json() for g in a.suspects],
            "evict": list(a.evict),
            "rounds": a.rounds,
            "group_votes": [{"kind": k, "index": i, "votes": v}
                            for (k, i), v in sorted(a.group_votes.items(), key=lambda x: -x[1])],
            "topology": {"world": topo.world, "tp": topo.tp, "cp": topo.cp, "ep": topo.ep,
                         "dp": topo.dp, "pp": topo.pp, "order": topo.order},
            "nodes": {n: {"state": nc.state, "error": nc.error, "ranks": len(nc.ranks),
                          "workers": nc.workers, "seconds": round(nc.seconds, 3)}
                      for n, nc in last.nodes.items()},
            "unanswered": sorted(self.node_errors),
            "ranks": rank_reads(last, a.collectives, self.summary_errors),
            **(a.collectives.to_json() if a.collectives is not None else {}),
        }


def controller_py_spy() -> Bundle | None:
    """The py-spy binary installed with brctl on the controller, to ship to nodes without one."""
    path = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    try:
        with open(path, "rb") as fh:
            return Bundle("py-spy", fh.read(), 0o755)
    except OSError:
        return None


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector while a round's ~10⁶ objects are built.

    They are tuples, dicts and strings without cycles, yet each full collection
    walks all of them: a third of a 131,072-rank round's CPU. Reference counting
    still frees everything; the collector resumes (as it was) afterwards, with the
    objects built meanwhile moved to its oldest generation (``freeze`` then
    ``unfreeze``: a list splice) instead of walked at once by the first young
    collection, another 0.2-0.5 s a round.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was:
            gc.enable()


class MalformedAnswer(ValueError):
    """A stacks probe answer that is not the probe's document (says where)."""


def _node_collection(name: str, doc: dict[str, Any] | None, error: str | None,
                     run: RunResult, known: FrameCache | None = None) -> NodeCollection:
    """A machine's answer as a NodeCollection; a malformed answer is that machine's error."""
    if doc is None:
        state = run.state.value if not run.state.ran else "probe_error"
        return NodeCollection(name, state, error or "no answer", seconds=run.seconds)
    try:
        nc = _parse_answer(name, doc, run, known if known is not None else {})
        return replace(nc, **recorder_fields(doc)) if "recorder" in doc else nc
    except (MalformedAnswer, PySpyFormatError, RecorderAnswerError) as exc:
        return NodeCollection(name, "probe_error", f"malformed stacks probe answer: {exc}",
                              seconds=run.seconds)


_NO_PY_SPY = "py-spy is not available on this machine and none could be shipped"


def _parse_answer(name: str, doc: dict[str, Any], run: RunResult,
                  known: FrameCache) -> NodeCollection:
    """The probe's document, checked field by field (it comes from a node: hostile)."""
    form = doc.get("format")
    if form == PACKED:
        return _parse_packed(name, doc, run, known)
    if form != RAW:
        raise MalformedAnswer(f"format {form!r:.60} is not this brctl's stacks probe answer "
                              f"({PACKED}); is the node running a probe of another version?")
    procs, dumps = doc.get("processes"), doc.get("dumps")
    if type(procs) is not list or type(dumps) is not list:
        raise MalformedAnswer("it lacks the processes/dumps lists")
    by_pid: dict[int, dict[str, Any]] = {}
    for i, d in enumerate(dumps):
        if type(d) is not dict or type(pid := d.get("pid")) is not int:
            raise MalformedAnswer(f"dumps[{i}]: expected an object with an integer pid")
        err, text = d.get("error"), d.get("output")
        if not (err is None or type(err) is str) or not (text is None or type(text) is str):
            raise MalformedAnswer(f"dumps[{i}]: error and output must be strings")
        by_pid[pid] = d
    missing = bool(doc.get("py_spy_missing"))
    ranks, workers = [], 0
    for i, p in enumerate(procs):
        if type(p) is not dict:
            raise MalformedAnswer(f"processes[{i}]: expected an object")
        role = p.get("role")
        if role == "worker":
            workers += 1
        if role != "rank" or type(rank := p.get("rank")) is not int:
            continue
        if type(pid := p.get("pid")) is not int:
            raise MalformedAnswer(f"processes[{i}]: pid must be an integer")
        d = by_pid.get(pid, {})
        err = d.get("error")
        if not d:
            if not missing:
                continue  # left to the machine that owns it (machines sharing one kernel)
            err = _NO_PY_SPY
        local, size = p.get("local_rank"), p.get("world_size")
        ranks.append(RankDump(rank, pid, d.get("output"), err,
                              local if type(local) is int else None,
                              size if type(size) is int else None))
    return NodeCollection(name, "ok", None, tuple(ranks), workers, run.seconds)


def _parse_packed(name: str, doc: dict[str, Any], run: RunResult,
                  known: FrameCache) -> NodeCollection:
    """A ``PACKED`` answer: bounds checked over whole lists, one Python step per rank."""
    table = frame_table(doc.get("frames"), known)
    nums = packed_ints(doc.get("ranks"), "i", "ranks")
    heads = packed_ints(doc.get("stacks"), "i", "stacks")
    n = len(nums) // 4
    if len(nums) != 4 * n or len(heads) != 2 * n:
        raise MalformedAnswer(f"ranks: 4 integers per rank and stacks: 2 per rank, not "
                              f"{len(nums)} and {len(heads)}")
    stacks = packed_stacks(heads, doc.get("indices"), table)
    workers, errors = doc.get("workers"), doc.get("errors")
    if type(workers) is not int or workers < 0:
        raise MalformedAnswer("workers: expected a count")
    if type(errors) is not list:
        raise MalformedAnswer("errors: expected a list of [position, reason]")
    why: dict[int, str] = {}
    for e in errors:
        if not (type(e) is list and len(e) == 2 and type(at := e[0]) is int and 0 <= at < n
                and stacks[at] is None and type(e[1]) is str):
            raise MalformedAnswer(f"errors: {str(e)[:60]} is not [position of a rank without "
                                  f"a stack (0 to {n - 1}), reason]")
        why[at] = e[1]
    errs: list[str | None] = [None] * n
    for at, reason in why.items():
        errs[at] = reason
    gaps = [i for i, stack in enumerate(stacks) if stack is None and errs[i] is None
            ] if None in stacks else []
    if doc.get("py_spy_missing"):
        for i in gaps:
            errs[i] = _NO_PY_SPY
        gaps = []
    lr, ws = nums[2::4], nums[3::4]  # negative: unknown
    local: list[int | None] = list(lr) if min(lr, default=0) >= 0 else [
        v if v >= 0 else None for v in lr]
    size: list[int | None] = list(ws) if min(ws, default=0) >= 0 else [
        v if v >= 0 else None for v in ws]
    # tuple.__new__ builds each NamedTuple in C (its own __new__ is a Python call per rank)
    rows = list(map(tuple.__new__, repeat(RankDump), zip(
        nums[::4], nums[1::4], repeat(None), errs, local, size, stacks)))
    for i in reversed(gaps):
        del rows[i]  # left to the machine that owns it (machines sharing one kernel)
    ranks: tuple[RankDump, ...] = tuple(rows)
    return NodeCollection(name, "ok", None, ranks, workers, run.seconds)


def collect(
    runner: ProbeRunner,
    nodes: Sequence[Node],
    process_match: str,
    *,
    dump_timeout: float = 10.0,
    timeout: float = 120.0,
    concurrency: int = 64,
    py_spy_paths: dict[str, str] | None = None,
    on_done: Callable[[RunResult], None] | None = None,
    expected: dict[str, list[int]] | None = None,
    raw: bool = False,
    known: FrameCache | None = None,
    socket_timeout: float | None = 2.0,
) -> Collection:
    """One round: find and dump every rank on ``nodes``.

    Args:
        runner: the probe runner (its transport reaches the nodes; reuse it across rounds).
        nodes: the job's machines.
        process_match: regex on the command line that finds training processes.
        dump_timeout: seconds for one ``py-spy dump``.
        timeout: seconds for the whole probe on one machine.
        concurrency: machines in flight at once.
        py_spy_paths: node → py-spy path shipped in an earlier round (updated in place).
        on_done: progress callback per machine.
        expected: node → ranks the inventory places there (used for local machines).
        raw: ship py-spy's JSON as it printed it (for ``save``) instead of the
            probe's reduced frames.
        known: frame-table rows already read (shared across rounds: equal frames, one object).
        socket_timeout: seconds for each request to a rank's socket (``brctl.job``'s or
            torch's worker server: the flight recorder, brctl's table, a traceback);
            None: the sockets are not read.

    Returns:
        The round's collection; a machine's failure is recorded, never raised.
    """
    paths = py_spy_paths if py_spy_paths is not None else {}
    start, wall = time.monotonic(), time.time()

    def request(node: Node) -> dict[str, Any]:
        req: dict[str, Any] = {"process_match": process_match, "py_spy": paths.get(node.name),
                               "dump_timeout": dump_timeout, "raw": raw}
        if socket_timeout is not None:
            req["recorder"] = {"timeout": socket_timeout, "k": RECENT}
        if node.connection == "local" and expected is not None:
            # local machines share this host's processes: each dumps only the ranks
            # the inventory places on it, so no process is attached twice at once
            req["only_ranks"] = expected.get(node.name, [])
        return req

    results = runner.run(nodes, PROBE, request, timeout=timeout, concurrency=concurrency,
                         on_done=on_done)
    shipped: list[str] = []
    need = [n for n in nodes if _lacks_py_spy(results[n.name].document)]
    bundle = controller_py_spy() if need else None
    if need and bundle is not None:
        placed = runner.ensure_file(need, bundle, timeout=timeout)
        again = []
        for n in need:
            where = placed[n.name]
            if isinstance(where, str) and where:
                paths[n.name] = where
                again.append(n)
                shipped.append(n.name)
        if again:
            results.update(runner.run(again, PROBE, request, timeout=timeout,
                                      concurrency=concurrency))
    cols = read_answers({n.name: results[n.name] for n in nodes}, known)
    return Collection(cols, wall, time.monotonic() - start, tuple(shipped))


def _lacks_py_spy(doc: dict[str, Any] | None) -> bool:
    """The machine has ranks to dump and no py-spy. Read before the answer is checked
    (``_parse_answer``): fields out of shape are left for it to refuse."""
    if doc is None or not doc.get("py_spy_missing"):
        return False
    ranks, procs = doc.get("ranks"), doc.get("processes")
    if doc.get("format") == PACKED:
        return type(ranks) is str and ranks != ""
    return type(procs) is list and any(type(p) is dict and p.get("role") == "rank" for p in procs)


def read_answers(results: Mapping[str, ProbeResult], known: FrameCache | None = None
                 ) -> dict[str, NodeCollection]:
    """Every machine's stacks probe answer as its NodeCollection.

    An answer that is not the probe's document (a frame row that is not
    ``[name, file, line]``, an index outside the frame table, a pid that is not
    an integer ...) is that machine's ``probe_error``, said in its error.
    """
    rows = known if known is not None else {}
    with _no_cycle_collection():
        return {name: _node_collection(name, res.document, res.error, res.run, rows)
                for name, res in results.items()}


def collect_rounds(
    runner: ProbeRunner,
    nodes: Sequence[Node],
    process_match: str,
    *,
    rounds: int = 1,
    interval: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    on_round: Callable[[int], None] | None = None,
    **kwargs: Any,
) -> list[Collection]:
    """``rounds`` collections, ``interval`` seconds apart (start to start); fewer when a
    round finds no training process on any machine (the job is not running there: more
    rounds would only make the operator wait to be told so)."""
    paths: dict[str, str] = {}
    known: FrameCache = {}
    out: list[Collection] = []
    for i in range(rounds):
        began = time.monotonic()
        out.append(collect(runner, nodes, process_match, py_spy_paths=paths, known=known,
                           **kwargs))
        if on_round is not None:
            on_round(i + 1)
        if not any(nc.ranks for nc in out[-1].nodes.values()):
            break
        if i + 1 < rounds:
            sleep(max(0.0, interval - (time.monotonic() - began)))
    return out


def collect_job(
    inv: Inventory,
    transport: Transport,
    *,
    rounds: int = 1,
    interval: float = 10.0,
    dump_timeout: float = 10.0,
    timeout: float = 120.0,
    on_round: Callable[[int], None] | None = None,
    raw: bool = False,
) -> tuple[list[Collection], JobShape]:
    """Collect ``rounds`` rounds over the inventory's job machines (``raw``: for ``save``).

    Raises:
        InputError: the inventory has no job or its sizes do not divide.
    """
    topo = job_topology(inv)  # validates the job section before any node is contacted
    assert inv.job is not None
    shape = JobShape(topo.machines, tuple(inv.nodes[m].gpus for m in topo.machines), topo.tp,
                     topo.pp, topo.cp, topo.ep, topo.order)
    runner = ProbeRunner(transport)
    collections = collect_rounds(runner, inv.job_nodes(), inv.job.process_match, rounds=rounds,
                                 interval=interval, on_round=on_round, dump_timeout=dump_timeout,
                                 timeout=timeout, concurrency=inv.ssh.fanout, raw=raw,
                                 expected={m: topo.ranks_on(m) for m in topo.machines})
    return collections, shape


def screen_ranks(collections: Sequence[Collection], shape: JobShape) -> list[Collection]:
    """The collections without the answers of machines that lie about their ranks: a
    RANK outside the world, or one the machine the inventory expects for it holds under
    another pid. Such a machine's answer is dropped in every round (``probe_error``, what
    it claimed): one hostile or confused machine cannot stop the analysis of the others.

    Raises:
        RemoteDataError: one rank in two processes, neither where the inventory expects it.
    """
    base = shape.topology()
    lies = _outside_the_world(collections, base.world)
    if collections:
        lies.update(_claimed_twice(collections[0], base.rank_machines, set(lies)))
    if not lies:
        return list(collections)
    return [replace(col, nodes={
        node: (NodeCollection(node, "probe_error", f"an impossible answer: {lies[node]}", (),
                              seconds=nc.seconds) if node in lies else nc)
        for node, nc in col.nodes.items()}) for col in collections]


def _outside_the_world(collections: Sequence[Collection], world: int) -> dict[str, str]:
    """Machine → what it claimed, for machines with a process whose RANK is not in the world."""
    lies: dict[str, str] = {}
    for col in collections:
        for node, nc in col.nodes.items():
            for rd in nc.ranks:
                if not 0 <= rd.rank < world and node not in lies:
                    lies[node] = (f"process {rd.pid} has RANK={rd.rank}, outside the job's world of "
                                  f"{world} (machines × gpus in the inventory)")
    return lies


def _claimed_twice(first: Collection, expected: Sequence[str], skip: set[str]) -> dict[str, str]:
    """Machine → its claim, for machines holding a rank another pid holds where expected."""
    holders: dict[int, dict[int, str]] = {}  # rank → pid → the first machine with it
    for node, nc in first.nodes.items():
        if node not in skip:
            for rd in nc.ranks:
                holders.setdefault(rd.rank, {}).setdefault(rd.pid, node)
    lies: dict[str, str] = {}
    for rank, pids in holders.items():
        if len(pids) < 2:
            continue  # one process (several machines on one kernel see the same pid)
        owner = [pid for pid, node in pids.items() if node == expected[rank]]
        if len(owner) != 1 or len(set(pids.values())) < len(pids):
            (pid_a, node_a), (pid_b, node_b) = list(pids.items())[:2]
            raise RemoteDataError(
                f"RANK={rank} is held by two processes: pid {pid_a} on {node_a} and pid "
                f"{pid_b} on {node_b}", hint="two jobs match job.process_match; make the regex stricter")
        for pid, node in pids.items():
            if pid != owner[0]:
                lies.setdefault(node, f"process {pid} claims RANK={rank}, which pid {owner[0]} "
                                      f"holds on {expected[rank]}, where the inventory puts it")
    return lies


def live_rank_machines(collections: Sequence[Collection], shape: JobShape) -> list[str]:
    """Rank → machine: the inventory's order, overridden by each rank's live RANK.

    Machines that share one kernel (``connection: local``) all see the same process:
    the same RANK and pid on several machines is one process, kept where the inventory
    expects it (else on the first that saw it). Ranks are in the world (``screen_ranks``).
    """
    expected = shape.topology().rank_machines
    elsewhere: dict[int, str] = {}  # rank → the first unexpected machine that saw it
    confirmed: set[int] = set()  # ranks seen on the machine the inventory expects
    for col in collections:
        for node, nc in col.nodes.items():
            for rd in nc.ranks:
                if expected[rd.rank] == node:
                    confirmed.add(rd.rank)
                else:
                    elsewhere.setdefault(rd.rank, node)
    mapping = list(expected)
    for rank, node in elsewhere.items():
        if rank not in confirmed:
            mapping[rank] = node
    return mapping


def _to_round(col: Collection, topo: Topology, intern: dict[Frame, Frame],
              last: dict[int, Stack]) -> Round:
    """One collection as the analyser's round.

    ``last`` holds each rank's stack from the round before: an equal stack is
    replaced by that very object, so the analysis recognises it without hashing
    it again (a cheap comparison: equal stacks share their interned frames).
    """
    samples: list[RankSample] = []
    found: set[int] = set()
    machine_of = topo.rank_machines
    for node, nc in col.nodes.items():
        for rd in nc.ranks:
            rank = rd.rank
            if machine_of[rank] != node or rank in found:
                continue  # the same process seen from another machine on one kernel
            found.add(rank)
            stack, error = rd.stack, rd.error
            if stack is None and rd.output is not None:
                try:
                    stack = parse_dump(rd.output, rd.pid, intern)
                except PySpyFormatError as exc:
                    error = f"unusable py-spy output: {exc}"
            if stack is not None:
                before = last.get(rank)
                if before == stack:
                    stack = before
                last[rank] = stack
            rec = nc.recorder.get(rank)  # the probe's word: no channel could read it
            samples.append(RankSample(rank, node, rd.pid, stack, error, False,
                                      rec is not None and rec.state == "unread"))
    answered = {n for n, nc in col.nodes.items() if nc.answered}
    for rank in sorted(set(range(topo.world)).difference(found)):
        node = machine_of[rank]
        if node in answered and col.nodes[node].unread:
            # processes whose environment was refused, none named by a socket: unknown ranks
            samples.append(RankSample(rank, node, 0, None, _UNREAD.format(
                node=node, n=col.nodes[node].unread), unread=True))
        elif node in answered:
            samples.append(RankSample(rank, node, 0, None,
                                      f"no process with RANK={rank} on {node}", missing=True))
    silent = frozenset(n for n, nc in col.nodes.items() if not nc.answered)
    return Round(tuple(samples), silent)


def _why(nc: NodeCollection) -> str:
    """Why a machine gave no stacks, led by its state (once: a refusal already says so)."""
    error = nc.error or ""
    return error if error.startswith(f"{nc.state}:") else f"{nc.state}: {error}"


def analyse(collections: Sequence[Collection], shape: JobShape, *, stuck_after: float = 60.0,
            straggler_threshold_ms: float = 20.0) -> StacksReport:
    """Analyse one or more rounds of collections: the stacks, and where ranks' sockets
    answered, their flight recorders (``analysis.collective_analysis``), fused into one
    eviction (``analysis.fusion``). ``stuck_after``: seconds a pending collective may be
    old before it is stuck; ``straggler_threshold_ms``: how late a rank must arrive.

    Raises:
        IncompleteError: no machine answered, or no rank process was found anywhere.
        RefusedError: the same, where brctl refused a machine (a safety rule there).
        RemoteDataError: one rank in two processes, neither where the inventory expects it.
    """
    if not collections:
        raise IncompleteError("stacks: nothing was collected")
    collections = screen_ranks(collections, shape)
    last = collections[-1]
    errors = {n: _why(nc) for n, nc in last.nodes.items() if not nc.answered}
    if not any(nc.ranks for col in collections for nc in col.nodes.values()):
        detail = "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())[:5])
        refused = any(nc.state == NodeState.REFUSED.value for nc in last.nodes.values())
        raise (RefusedError if refused else IncompleteError)(
            "stacks: no training process (one with RANK in its environment) was found on any "
            "machine" + (f" ({detail})" if detail else ""),
            hint="is the job running? job.process_match must match its command line")
    with _no_cycle_collection():
        topo = shape.topology(live_rank_machines(collections, shape))
        intern: dict[Frame, Frame] = {}
        stacks: dict[int, Stack] = {}
        rounds = [_to_round(c, topo, intern, stacks) for c in collections]
        analysis = analyse_rounds(rounds, topo)
        captures, bad_summaries = decode_captures(collections, topo)
        if any(captures):
            coll = analyse_collectives(captures, topo, stuck_after=stuck_after,
                                       interval=_interval(collections),
                                       straggler_threshold_ms=straggler_threshold_ms)
            analysis = fuse(analysis, coll, topo, rounds[-1])
        # a rank its socket read is read, though py-spy was refused: out of the stack vote,
        # not an unread rank that makes the run incomplete
        read = {r for nc in last.nodes.values() for r, rec in nc.recorder.items()
                if rec.state == "read"}
        if analysis.unread and read:
            analysis = replace(analysis, unread=tuple(r for r in analysis.unread if r not in read))
        return StacksReport(analysis, topo, tuple(collections), errors, bad_summaries)


_UNREAD = ("{n} process(es) on {node} could not be read: their environment is refused (no "
           "ptrace rights) and no socket of brctl.job named their rank")


def _interval(collections: Sequence[Collection]) -> float | None:
    """Seconds between the last two rounds' starts (None: one round)."""
    if len(collections) < 2:
        return None
    return collections[-1].started - collections[-2].started
