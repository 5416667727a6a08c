"""The diagnose ladder as a library: ``diagnose(...) -> DiagnoseReport`` (never prints).

Used by ``brctl diagnose`` and by the daemon. Steps:

1. Evidence from every machine (``brctl.diagnostics.evidence``: log tails, kernel Xid
   lines, live training processes), the logs optionally from ``logs_dir``
   (``DIR/<node>.log``) instead. Training processes alive and no ``force`` → refuse.
2. Classify with the playbooks (``brctl.analysis.playbook.classify``).
3. Unless the playbook decides on the evidence alone (user code → rollback,
   confident hardware signal → evict), run its stages in order, each on the
   machines still in doubt, stopping at the first stage that names faulty
   machines: ``eud`` (``dcgmi diag``), ``alltoall`` (inside each machine),
   ``allgather`` (a group of all machines, then pairs and re-pairs).
4. Decide (``brctl.analysis.diagnose.decide.decide``) with the job's earlier
   verdicts from the state database, and record this one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brctl.analysis.diagnose import doc as dd
from brctl.analysis.diagnose import stages as st
from brctl.analysis.diagnose.decide import (
    DecisionName,
    PastConclusion,
    StageOutcome,
    as_decision,
    decide,
)
from brctl.analysis.inventory import Inventory
from brctl.analysis.playbook import (
    Classification,
    NodeEvidence,
    Playbook,
    Stage,
    StageName,
    classify,
)
from brctl.core.errors import ExitCode, RefusedError, UsageError, exit_code_of
from brctl.core.nodeset import fold
from brctl.core.transport import Node, NodeState, Transport
from brctl.diagnostics.xid import parse_xid_lines
from brctl.operations import Track, untracked
from brctl.operations.jobadapter import rendezvous_address
from brctl.remote.probes import ProbeResult, ProbeRunner
from brctl.state import Component, Store

COMPONENT = Component("diagnose", [
    "CREATE TABLE diagnose_verdicts ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, symptom TEXT NOT NULL,"
    " decision TEXT NOT NULL, faulty TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL);"
    "CREATE INDEX diagnose_verdicts_job ON diagnose_verdicts(job, at)",
])
_MARGIN = 20.0  # seconds a probe may take beyond its own limits (ssh, python, shipping the zip)
# torchrun's failure summary: "exitcode  : -6 (pid: 1234)". Bounded: int() refuses a
# number of thousands of digits, and a job's log may hold anything.
_EXITCODE = re.compile(r"\bexitcode\s*:\s*(-?\d{1,9})(?!\d)")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class StageReport:
    """One stage: what it tested, what it found, how long it took."""

    name: str
    nodes_tested: tuple[str, ...]
    faulty: tuple[str, ...]
    seconds: float
    verdicts: tuple[st.NodeVerdict, ...] = ()
    rounds: tuple[tuple[tuple[tuple[str, ...], bool], ...], ...] = ()  # allgather groups

    def outcome(self) -> StageOutcome:
        """What this stage could test, for the decision's reason."""
        tested = tuple(v.node for v in self.verdicts if v.status in ("pass", "warn", "fail"))
        warned = tuple(v.node for v in self.verdicts if v.status == "warn")
        return StageOutcome(self.name, tested, warned, self.skip_reasons())

    def skip_reasons(self) -> tuple[str, ...]:
        """The distinct reasons machines were skipped, in first-seen order."""
        return tuple(dict.fromkeys("; ".join(v.evidence) or "skipped"
                                   for v in self.verdicts if v.status == "skip"))

    def to_json(self) -> dict[str, Any]:
        """The stage's JSON (name, nodes_tested, faulty, seconds) plus the evidence."""
        out: dict[str, Any] = {
            "name": self.name, "nodes_tested": list(self.nodes_tested),
            "faulty": list(self.faulty), "seconds": round(self.seconds, 3),
            "skipped": list(self.skip_reasons()),
            "nodes": {v.node: {k: x for k, x in v.to_json().items() if k != "node"}
                      for v in self.verdicts},
        }
        if self.rounds:
            out["rounds"] = [[{"members": list(g), "ok": ok} for g, ok in rnd] for rnd in self.rounds]
        return out


@dataclass(frozen=True)
class DiagnoseReport:
    """The verdict of one diagnosis."""

    job: str
    found: Classification
    stages: tuple[StageReport, ...]
    faulty: tuple[str, ...]
    decision: DecisionName
    reason: str
    incomplete: Mapping[str, str]  # machine → why it has no verdict
    evidence_notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    seconds: float = 0.0
    refused: tuple[str, ...] = ()  # machines where a safety rule stopped brctl's probe

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused a machine, else 3 when some machine got no verdict, else 1
        for faulty machines or any decision other than reattempt, else 0."""
        return exit_code_of(refused=bool(self.refused), incomplete=bool(self.incomplete),
                            findings=bool(self.faulty) or self.decision != "reattempt")

    def to_json(self) -> dict[str, Any]:
        """The ``brctl.diagnose/1`` payload."""
        return {
            "job": self.job,
            "symptom": self.found.playbook.name,
            "symptom_text": self.found.playbook.symptom,
            "matched_nodes": list(self.found.nodes),
            "evidence": [h.to_json() for h in self.found.hits],
            "stages": [s.to_json() for s in self.stages],
            "faulty": list(self.faulty),
            "decision": self.decision,
            "reason": self.reason,
            "incomplete": dict(self.incomplete),
            "notes": {k: list(v) for k, v in self.evidence_notes.items() if v},
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Options:
    """What the caller chose; timeouts come from the playbook, else ``inv.diagnose``."""

    logs_dir: Path | None = None
    symptom: str | None = None  # force this playbook
    force: bool = False  # run stop-time stages although training processes are alive
    timeout_scale: float = 1.0
    concurrency: int = 64
    track: Track = untracked  # progress: each stage (and all-gather round) and its machines

    def stage(self, name: str, nodes: Sequence[Node]) -> Callable[[Any], None]:
        """Start tracking ``name`` on ``nodes``; the fan-out's ``on_done``."""
        return self.track(name, [n.name for n in nodes])


def diagnose(
    inv: Inventory,
    transport: Transport,
    playbooks: Sequence[Playbook],
    options: Options = Options(),
    *,
    nodes: Sequence[Node] | None = None,
    store: Store | None = None,
    now: float | None = None,
    progress: Progress | None = None,
    history: Sequence[PastConclusion] | None = None,
) -> DiagnoseReport:
    """Diagnose the failed job on ``nodes`` (default: the job's machines).

    Args:
        inv: the inventory (``job``, ``diagnose:`` settings).
        transport: how to reach the machines.
        playbooks: loaded with ``brctl.load.playbooks.load_playbooks``.
        options: logs directory, forced symptom, ``force``, timeout scale.
        nodes: the machines to diagnose; default the job's.
        store: the state database (earlier verdicts in, this one recorded); None: neither.
        now: the time used for the history window (default: the clock).
        progress: called with a one-line message as each step starts.
        history: the earlier verdicts the escalation ladder climbs from; default the
            store's (the daemon gives what it actually carried out).

    Returns:
        The report; ``report.exit_code`` follows the exit-code table of brctl(1).

    Raises:
        RefusedError: training processes are alive and ``options.force`` is false.
        UsageError: no machines to diagnose.
        InputError: ``--logs`` or ``--symptom`` is bad.
    """
    start = time.monotonic()

    def say(message: str) -> None:  # -v: each step with the seconds since the start
        if progress is not None:
            progress(f"diagnose {time.monotonic() - start:6.1f}s  {message}")

    targets = list(nodes) if nodes is not None else inv.job_nodes()
    if not targets:
        raise UsageError("diagnose: no machines (the inventory has no job: give -w NODESET)")
    runner = ProbeRunner(transport)
    say(f"collecting evidence from {fold([n.name for n in targets])}")
    evidence, incomplete, notes, refused = _collect(inv, runner, targets, options)
    found = classify(evidence, playbooks, options.symptom)
    say(f"symptom: {found.playbook.name} ({found.playbook.symptom})")
    candidates = [n for n in targets if n.name not in incomplete]
    stages: list[StageReport] = []
    faulty: tuple[str, ...] = ()
    faulty_stage = None
    decided_by_evidence = found.playbook.decision.on_match != "diagnose" and found.nodes
    if not decided_by_evidence:
        for stage in found.playbook.stages:
            if not candidates:
                break
            say(f"stage {stage.name} on {fold([n.name for n in candidates])}")
            report = _run_stage(inv, runner, stage, candidates, options)
            stages.append(report)
            for v in report.verdicts:
                if v.status == "error":
                    incomplete[v.node] = f"{stage.name}: {'; '.join(v.evidence)[:300]}"
            candidates = [n for n in candidates if n.name not in incomplete]
            if report.faulty:
                faulty, faulty_stage = report.faulty, stage.name
                break  # fast isolation: the first stage that names machines ends the ladder
        if not faulty:
            incomplete.update(_untested(stages, candidates))
    job = inv.job_key
    when = time.time() if now is None else now
    history = list(history) if history is not None else _history(store, job)
    verdict = decide(found, faulty, history, now=when, window=inv.diagnose.repeat_window,
                     faulty_stage=faulty_stage, stages=[s.outcome() for s in stages])
    if store is not None:
        _record(store, job, found.playbook.name, verdict.decision, verdict.faulty, verdict.reason,
                when)
    return DiagnoseReport(job, found, tuple(stages), verdict.faulty, verdict.decision,
                          verdict.reason, incomplete, notes, time.monotonic() - start,
                          tuple(refused))


def _untested(stages: Sequence[StageReport], nodes: Sequence[Node]) -> dict[str, str]:
    """Machines no stage could test (every stage skipped them): they have no verdict.

    Only asked when the ladder ran to its end; a ladder that stopped at a faulty
    machine leaves the others untested on purpose (fast isolation).
    """
    if not stages:
        return {}
    judged = {v.node for s in stages for v in s.verdicts if v.status in ("pass", "warn", "fail")}
    out: dict[str, str] = {}
    for node in nodes:
        if node.name in judged:
            continue
        why = [f"{s.name}: {'; '.join(v.evidence) or 'skipped'}"
               for s in stages for v in s.verdicts if v.node == node.name and v.status == "skip"]
        out[node.name] = "no stage could test it (" + ("; ".join(why) or "not tested") + ")"
    return out


def _collect(inv: Inventory, runner: ProbeRunner, targets: list[Node], options: Options
             ) -> tuple[dict[str, NodeEvidence], dict[str, str], dict[str, tuple[str, ...]],
                        list[str]]:
    """Each machine's evidence; why the others have none, notes, and those brctl refused."""
    cfg = inv.diagnose
    job = inv.job
    request = {
        "log_paths": [] if options.logs_dir is not None or job is None else list(job.log_paths),
        "tail_lines": cfg.log_tail_lines,
        "process_match": job.process_match if job else None,
        "job_user": job.user if job else None,  # its logs are read in a 1777 dir too
    }
    results = runner.run(targets, "brctl.diagnostics.evidence", request,
                         timeout=cfg.collect_timeout * options.timeout_scale,
                         concurrency=options.concurrency, on_done=options.stage("evidence", targets))
    incomplete: dict[str, str] = {}
    refused: list[str] = []
    notes: dict[str, tuple[str, ...]] = {}
    evidence: dict[str, NodeEvidence] = {}
    alive: dict[str, list[dict[str, Any]]] = {}
    for node in targets:
        res = results[node.name]
        why = None if res.document is None else dd.malformed(res.document, dd.EVIDENCE,
                                                             "evidence answer")
        if res.document is None or why is not None:
            incomplete[node.name] = f"evidence: {why or res.error}"
            if res.run.state is NodeState.REFUSED:
                refused.append(node.name)
            continue
        doc = res.document
        if doc.get("processes"):
            alive[node.name] = doc["processes"]
        lines: list[str] = []
        for path_lines in (doc.get("logs") or {}).values():
            lines.extend(path_lines)
        node_notes = list(doc.get("log_errors") or [])
        if options.logs_dir is not None:
            lines, note = _read_log(options.logs_dir, node.name, cfg.log_tail_lines)
            node_notes.extend([note] if note else [])
        elif job is not None and job.log_paths and not doc.get("logs"):
            node_notes.append(f"no log file matched {', '.join(job.log_paths)}")
        if doc.get("kernel_error"):
            node_notes.append(f"kernel log: {doc['kernel_error']}")
        evidence[node.name] = _node_evidence(node.name, lines, doc.get("xid_lines") or [])
        notes[node.name] = tuple(node_notes)
    if alive and not options.force:
        first = next(iter(alive.items()))
        raise RefusedError(
            f"training processes are still alive on {fold(list(alive))} "
            f"(e.g. {first[0]} pid {first[1][0]['pid']}: {first[1][0]['cmdline'][:80]}); "
            "stop-time stages would take their GPUs",
            hint="stop the job first, or pass --force to diagnose anyway")
    return evidence, incomplete, notes, refused


def _read_log(directory: Path, node: str, tail: int) -> tuple[list[str], str | None]:
    path = directory / f"{node}.log"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], f"--logs: no {path}"
    except OSError as exc:
        return [], f"--logs: {path}: {exc.strerror}"
    return text.splitlines()[-tail:], None


def _node_evidence(node: str, lines: list[str], xid_lines: list[str]) -> NodeEvidence:
    """Exit codes from torchrun's failure summary, Xids from the kernel log and the job log."""
    codes = tuple(dict.fromkeys(int(m.group(1)) for ln in lines for m in _EXITCODE.finditer(ln)))
    xids: list[int] = []
    xid_text: list[str] = []
    for line in [*xid_lines, *(ln for ln in lines if "Xid" in ln)]:
        for event in parse_xid_lines(line):
            xids.append(event.code)
            xid_text.append(line)
    return NodeEvidence(node, tuple(lines), codes, tuple(xids), tuple(xid_text))


def self_check(inv: Inventory, transport: Transport, nodes: Sequence[Node], options: Options, *,
               stages: Sequence[StageName] = ("eud", "alltoall"),
               runner: ProbeRunner | None = None) -> list[StageReport]:
    """Run ladder stages on idle machines with no symptom and no evidence (a self-check).

    ``brctl standby check`` and the daemon use it on pool machines: the same stage
    code and verdicts as the ladder, each stage on every machine given.
    """
    runner = runner or ProbeRunner(transport)
    return [_run_stage(inv, runner, Stage(name), list(nodes), options) for name in stages]


def _run_stage(inv: Inventory, runner: ProbeRunner, stage: Stage, nodes: list[Node],
               options: Options) -> StageReport:
    start = time.monotonic()
    if stage.name == "eud":
        verdicts = _eud(inv, runner, stage, nodes, options)
        rounds: tuple[Any, ...] = ()
    elif stage.name == "alltoall":
        verdicts = _alltoall(inv, runner, stage, nodes, options)
        rounds = ()
    else:
        verdicts, rounds = _allgather(inv, runner, stage, nodes, options)
    faulty = tuple(v.node for v in verdicts if v.status == "fail")
    tested = tuple(v.node for v in verdicts if v.status != "skip")
    return StageReport(stage.name, tested, faulty, time.monotonic() - start, tuple(verdicts),
                       rounds)


def _unrun(node: str, res: ProbeResult) -> st.NodeVerdict:
    return st.NodeVerdict(node, "error", (res.error or "no answer",))


def _eud(inv: Inventory, runner: ProbeRunner, stage: Stage, nodes: list[Node],
         options: Options) -> list[st.NodeVerdict]:
    timeout = (stage.timeout or inv.diagnose.dcgm_timeout) * options.timeout_scale
    level = stage.level or inv.diagnose.dcgm_level
    results = runner.run(nodes, "brctl.diagnostics.dcgm", {"level": level, "timeout": timeout},
                         timeout=timeout + _MARGIN, concurrency=options.concurrency,
                         on_done=options.stage(f"eud (dcgmi diag -r {level})", nodes))
    return [st.parse_dcgm(n.name, results[n.name].document or {}) if results[n.name].ok
            else _unrun(n.name, results[n.name]) for n in nodes]


def _alltoall(inv: Inventory, runner: ProbeRunner, stage: Stage, nodes: list[Node],
              options: Options) -> list[st.NodeVerdict]:
    cfg = inv.diagnose
    timeout = (stage.timeout or cfg.alltoall_timeout) * options.timeout_scale

    startup = cfg.startup_timeout * options.timeout_scale

    def request(node: Node) -> dict[str, Any]:
        return {"op": "alltoall", "world": node.gpus, "bytes": cfg.alltoall_bytes,
                "iterations": cfg.iterations, "timeout": timeout, "startup_timeout": startup}

    results = runner.run(nodes, "brctl.diagnostics.collective", request,
                         timeout=startup + timeout + _MARGIN, concurrency=options.concurrency,
                         on_done=options.stage("alltoall", nodes))
    docs, broken = _checked(results, dd.COLLECTIVE, "alltoall answer")
    backends = {d.get("backend") for d in docs.values()}
    ratio = cfg.bandwidth_ratio if backends == {"nccl"} else cfg.cpu_bandwidth_ratio
    if backends != {"nccl"} and any(n.gpus < 2 for n in nodes):
        ratio = 0.0  # a one-process gloo "all-to-all" is a memcpy: its speed is noise
    if any(n.connection == "local" for n in nodes):
        ratio = 0.0  # local "machines" share this host's CPUs: no independent speeds to compare
    judged = {**{v.node: v for v in st.judge_alltoall(docs, ratio)}, **broken}
    return [judged[n.name] if n.name in judged else _unrun(n.name, results[n.name]) for n in nodes]


def _checked(results: Mapping[str, ProbeResult], shape: Mapping[str, Any], what: str
             ) -> tuple[dict[str, dict[str, Any]], dict[str, st.NodeVerdict]]:
    """The answers that fit ``shape``, and an error verdict for each that does not."""
    docs: dict[str, dict[str, Any]] = {}
    broken: dict[str, st.NodeVerdict] = {}
    for name, res in results.items():
        if res.document is None:
            continue
        why = dd.malformed(res.document, shape, what)
        if why is None:
            docs[name] = res.document
        else:
            broken[name] = st.NodeVerdict(name, "error", (why,))
    return docs, broken


def _allgather(inv: Inventory, runner: ProbeRunner, stage: Stage, nodes: list[Node],
               options: Options) -> tuple[list[st.NodeVerdict], tuple[Any, ...]]:
    if len(nodes) < 2:
        return [st.NodeVerdict(n.name, "skip", ("all-gather needs two machines",)) for n in nodes], ()
    by_name = {n.name: n for n in nodes}
    names = [n.name for n in nodes]
    timeout = (stage.timeout or inv.diagnose.allgather_timeout) * options.timeout_scale
    rounds: list[tuple[tuple[tuple[str, ...], bool], ...]] = []
    evidence: dict[str, list[str]] = {n: [] for n in names}
    spent: dict[str, float] = dict.fromkeys(names, 0.0)  # each machine's test seconds, all rounds
    skipped: dict[str, str] = {}
    broken: dict[str, str] = {}  # machine → why an answer of its was out of shape

    def run(groups: list[list[str]]) -> list[tuple[tuple[str, ...], bool]]:
        outcome = _run_groups(inv, runner, [[by_name[n] for n in g] for g in groups], timeout,
                              options, evidence, skipped, spent, broken)
        rounds.append(tuple(outcome))
        return outcome

    if len(names) >= 3:  # one wide group first: when it passes, the stage is done
        wide = run([names])
        if wide[0][1] or skipped:
            return (_gather_verdicts(names, [], evidence, skipped, st.cleared_nodes(rounds),
                                     spent, broken), tuple(rounds))
    pairs: list[st.Round] = []
    while not skipped:
        groups = st.next_round(names, pairs)
        if not groups:
            break
        pairs.append(run(groups))
    faulty, _ = st.judge_rounds(names, pairs)
    return (_gather_verdicts(names, faulty, evidence, skipped, st.cleared_nodes(rounds), spent,
                             broken), tuple(rounds))


def _gather_verdicts(names: list[str], faulty: list[str], evidence: dict[str, list[str]],
                     skipped: dict[str, str], cleared: set[str], spent: Mapping[str, float],
                     broken: Mapping[str, str]) -> list[st.NodeVerdict]:
    out = []
    for n in names:
        details = {"seconds": round(spent[n], 3)}
        if n in broken:  # its answers could not be read: no verdict, whatever its groups did
            out.append(st.NodeVerdict(n, "error", (broken[n],), details))
        elif n in skipped:
            out.append(st.NodeVerdict(n, "skip", (skipped[n],), details))
        elif n in faulty:
            out.append(st.NodeVerdict(n, "fail", ("failed the all-gather with every partner",
                                              *evidence[n][:4]), details))
        elif evidence[n] and n not in cleared:
            out.append(st.NodeVerdict(n, "warn", ("every group it was in failed", *evidence[n][:4]),
                                  details))
        else:
            out.append(st.NodeVerdict(n, "pass", (), details))
    return out


def _run_groups(inv: Inventory, runner: ProbeRunner, groups: list[list[Node]], timeout: float,
                options: Options, evidence: dict[str, list[str]], skipped: dict[str, str],
                spent: dict[str, float], broken: dict[str, str]
                ) -> list[tuple[tuple[str, ...], bool]]:
    """Run one all-gather per group at once; a group is ok when every member passed
    (an answer out of shape fails its group and leaves its machine in ``broken``)."""
    cfg = inv.diagnose
    startup = cfg.startup_timeout * options.timeout_scale
    masters = [g[0] for g in groups]
    ports = runner.run(masters, "brctl.diagnostics.collective",
                       lambda n: {"op": "free_port", "address": rendezvous_address(n)},
                       timeout=cfg.collect_timeout * options.timeout_scale)
    plan: dict[str, dict[str, Any]] = {}
    for group in groups:
        res = ports[group[0].name]
        doc = res.document
        why = (f"free_port: {res.error}" if doc is None
               else dd.malformed(doc, dd.FREE_PORT, "free_port answer"))
        if why is not None:  # no rendezvous port: the group cannot meet because of its master
            broken.setdefault(group[0].name, why)
        port = doc.get("port") if doc and why is None else None
        addr = rendezvous_address(group[0])
        ifname = cfg.gloo_ifname or ("lo" if addr.startswith("127.") else None)
        for rank, node in enumerate(group):
            plan[node.name] = {"op": "allgather", "nnodes": len(group), "node_rank": rank,
                               "master_addr": addr, "master_port": port or 0,
                               "timeout": timeout, "startup_timeout": startup,
                               "bytes": cfg.allgather_bytes,
                               "iterations": cfg.iterations, "gloo_ifname": ifname}
    members = [n for g in groups for n in g]
    label = "allgather" + (f" ({len(groups)} groups)" if len(groups) > 1 else "")
    results = runner.run(members, "brctl.diagnostics.collective", lambda n: plan[n.name],
                         timeout=startup + timeout + _MARGIN, concurrency=options.concurrency,
                         on_done=options.stage(label, members))
    outcome = []
    for group in groups:
        ok = True
        names = tuple(n.name for n in group)
        for node in group:
            res = results[node.name]
            doc = res.document or {}
            why = dd.malformed(doc, dd.COLLECTIVE, "allgather answer")
            if why is not None:
                broken.setdefault(node.name, why)
                ok = False
                evidence[node.name].append(f"with {fold(list(names))}: {why}"[:300])
                continue
            spent[node.name] += float(doc.get("seconds") or 0.0)
            if "skipped" in doc:
                skipped[node.name] = str(doc["skipped"])
                ok = False
            elif doc.get("status") != "pass":
                ok = False
                why = res.error or _gather_failure(doc)
                evidence[node.name].append(f"with {fold(list(names))}: {why}")
        if not ok:
            for node in group:  # every member of a failed group saw it fail
                if not any(fold(list(names)) in e for e in evidence[node.name]):
                    evidence[node.name].append(f"with {fold(list(names))}: a peer failed")
        outcome.append((names, ok))
    return outcome


def _gather_failure(doc: Mapping[str, Any]) -> str:
    if doc.get("status") == "hang" and doc.get("phase") == "startup":
        return f"not at the rendezvous within {doc.get('startup_timeout')}s"
    if doc.get("status") == "hang":
        return f"hung past {doc.get('timeout')}s"
    if doc.get("status") == "wrong_data":
        return "wrong data: " + "; ".join(doc.get("mismatches") or [])[:200]
    return "; ".join(doc.get("errors") or [])[:200] or str(doc.get("status"))


def _history(store: Store | None, job: str) -> list[PastConclusion]:
    if store is None:
        return []
    store.migrate(COMPONENT)
    rows = store.query("SELECT symptom, decision, at FROM diagnose_verdicts WHERE job = ? "
                       "ORDER BY at DESC LIMIT 20", (job,))
    return [PastConclusion(r["symptom"], decision, r["at"]) for r in rows
            if (decision := as_decision(r["decision"])) is not None]


def _record(store: Store, job: str, symptom: str, decision: str, faulty: Sequence[str],
            reason: str, at: float) -> None:
    store.migrate(COMPONENT)
    with store.transaction() as db:
        db.execute("INSERT INTO diagnose_verdicts(job, symptom, decision, faulty, reason, at) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (job, symptom, decision, ",".join(faulty), reason, at))
