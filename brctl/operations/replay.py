"""``brctl replay``: run the dual-phase replay rounds and return the verdict.

The I/O half of replay (the pure half is ``brctl/analysis/replay/groups.py`` and
``replay/judge.py``): a preflight ships the probe code to every machine (so no
group waits on another machine's first-time shipping), then ``decide`` names
each round and every group of a round runs at once, each on its own machines:
the built-in workload (``brctl.diagnostics.replay_workload``) or the user's
``--command`` template on every machine of the group. Each round runs ``repeat``
times; each run of a group gets a fresh rendezvous port. ``replay`` is also what
the daemon calls. With ``job.user`` set, the workload and ``--command`` run as
that user (``setpriv``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.probe_doc import OPT_FINITE, malformed
from brctl.analysis.replay.groups import (
    ReplayPlan,
    RoundSpec,
    Verdict,
    decide,
    plan,
    reference_of,
    shape_of,
)
from brctl.analysis.replay.judge import GroupRun, JudgedGroup, JudgedRound, judge_round
from brctl.core import templates
from brctl.core.errors import ExitCode, UsageError, exit_code_of
from brctl.core.transport import Node, NodeState, RunResult, Transport
from brctl.operations import Track, untracked
from brctl.operations.jobadapter import placeholder_values
from brctl.remote.fanout import run_all
from brctl.remote.probes import ProbeRunner

PROBE = "brctl.diagnostics.replay_workload"
FINGERPRINT = re.compile(r"^brctl-fingerprint\s+(\d+)\s+(\S+)\s*$")
MAX_PORT = 65535
Done = Optional[Callable[[RunResult], None]]  # the fan-out's per-machine callback (progress)


@dataclass(frozen=True)
class BuiltinWorkload:
    """The built-in deterministic GPT-style replay (torch on the nodes)."""

    steps: int = 4
    seed: int = 1234
    device: str = "auto"  # auto | cpu | cuda

    def describe(self) -> str:
        """One line for tables and JSON."""
        return f"builtin (tiny GPT, {self.steps} steps, seed {self.seed}, device {self.device})"


@dataclass(frozen=True)
class CommandWorkload:
    """A user workload: an argv template run on each machine of a group."""

    template: tuple[str, ...]

    def describe(self) -> str:
        """One line for tables and JSON."""
        return "command: " + " ".join(self.template)


Workload = Union[BuiltinWorkload, CommandWorkload]


def command_workload(template: str) -> CommandWorkload:
    """Parse and check ``--command`` (split like a shell, never run through one).

    Raises:
        InputError: an empty template or an unknown placeholder.
    """
    templates.check_template(template, "--command", templates.REPLAY_PLACEHOLDERS)
    return CommandWorkload(tuple(templates.template_argv(template)))


@dataclass(frozen=True)
class ReplayReport:
    """Everything ``brctl replay`` found.

    Attributes:
        plan: the groups of rounds 1 and 2 (or adaptive).
        rounds: every round run, judged.
        verdict: the answer.
        workload: what ran.
        repeat: runs per round.
        preflight: machines that could not even start a probe (node → reason).
        refused: machines brctl would not act on (a safety rule): exit 4, not 3.
    """

    plan: ReplayPlan
    rounds: tuple[JudgedRound, ...]
    verdict: Verdict
    workload: str
    repeat: int
    preflight: dict[str, str]
    refused: frozenset[str] = frozenset()

    @property
    def exit_code(self) -> ExitCode:
        """0 none, 1 found/ambiguous/not_reproduced, 3 incomplete, 4 when a machine of an
        incomplete replay was refused (a cron script must tell 'would not act' from 'no
        answer', as in every command)."""
        incomplete = self.verdict.verdict == "incomplete"
        return exit_code_of(refused=incomplete and bool(self.refused), incomplete=incomplete,
                            findings=self.verdict.verdict != "none")

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.replay/1``: the verdict, the plan, every round judged."""
        v = self.verdict
        return {
            "verdict": v.verdict, "faulty": list(v.faulty), "candidates": list(v.candidates),
            "cleared": list(v.cleared), "reason": v.reason, "workload": self.workload,
            "repeat": self.repeat, "plan": plan_json(self.plan),
            "rounds": [_round_json(i + 1, r) for i, r in enumerate(self.rounds)],
            "preflight": self.preflight,
        }


def plan_only_json(p: ReplayPlan) -> dict[str, Any]:
    """The payload of ``replay --plan-only --json``: no verdict, the groups of rounds 1-2."""
    return {"verdict": None, "plan": plan_json(p), "rounds": [
        {"index": i + 1, "kind": kind,
         "groups": [{"members": list(g), "fingerprint": None, "deviant": None} for g in rnd]}
        for i, (kind, rnd) in enumerate([("horizontal", p.round1), ("vertical", p.round2)])
        if rnd is not None]}


def plan_json(p: ReplayPlan) -> dict[str, Any]:
    """The plan as JSON: DP', group size, whether round 2 is a grid."""
    return {
        "dp": p.shape.dp,
        "tp": p.shape.tp,
        "pp": p.shape.pp,
        "machines_per_group": p.shape.slots,
        "groups_per_round": len(p.round1),
        "grid": p.grid,
        "can_vote": p.can_vote,
        "rounds_single_fault": p.rounds_single_fault(),
        "max_rounds_default": p.default_max_rounds(),
        "round1": [list(g) for g in p.round1],
        "round2": [list(g) for g in p.round2] if p.round2 is not None else None,
    }


def _group_json(g: JudgedGroup) -> dict[str, Any]:
    return {
        "members": list(g.nodes),
        "fingerprint": g.fingerprint,
        "deviant": g.deviant,
        "status": g.status,
        "first_deviant_step": g.first_deviant_step,
        "suspect": g.suspect,
        "suspects": list(g.suspects),
        "runs": [{"status": r.status, "steps": list(r.steps), "losses": list(r.losses),
                  "error": r.error, "seconds": round(r.seconds, 3)} for r in g.runs],
    }


def _round_json(i: int, rnd: JudgedRound) -> dict[str, Any]:
    return {"index": i, "kind": rnd.kind, "groups": [_group_json(g) for g in rnd.groups]}


def replay_plan(inv: Inventory, dp: Optional[int] = None) -> ReplayPlan:
    """The plan for the inventory's job (``--plan-only``).

    Raises:
        InputError: no job, or a shape replay cannot handle.
        UsageError: a ``dp`` that does not split the machines evenly.
    """
    return plan(shape_of(job_topology(inv), dp))


def disjoint_waves(groups: Sequence[tuple[str, ...]]) -> list[list[int]]:
    """The groups' indices in waves that share no machine, first fit in order."""
    waves: list[tuple[list[int], set[str]]] = []
    for i, group in enumerate(groups):
        wave = next((w for w in waves if not w[1] & set(group)), None)
        if wave is None:
            waves.append(([i], set(group)))
        else:
            wave[0].append(i)
            wave[1].update(group)
    return [indices for indices, _ in waves]


class RoundLauncher:
    """Runs the groups of one round at once and turns machine results into GroupRuns."""

    def __init__(self, transport: Transport, inv: Inventory, plan_: ReplayPlan,
                 workload: Workload, timeout: float, port_base: int, fanout: int) -> None:
        self.transport, self.inv, self.plan, self.workload = transport, inv, plan_, workload
        self.timeout, self.fanout = timeout, fanout
        self.runner = ProbeRunner(transport)
        self.next_port = port_base
        self.refused: set[str] = set()

    def _port(self) -> int:
        port = self.next_port
        self.next_port = self.next_port + 1 if self.next_port < MAX_PORT else 20000
        return port

    def preflight(self, names: Sequence[str], on_done: Done = None) -> dict[str, str]:
        """Ship the probe code everywhere first; returns machines that failed (→ why)."""
        nodes = [self.inv.nodes[n] for n in names]
        results = self.runner.run(nodes, "brctl.diagnostics.sysinfo", {},
                                  timeout=min(self.timeout, 120.0), concurrency=self.fanout,
                                  on_done=on_done)
        self.refused.update(n for n, r in results.items() if r.run.state is NodeState.REFUSED)
        return {n: r.error or "no answer" for n, r in results.items() if not r.ok}

    def run(self, groups: Sequence[tuple[str, ...]], *, retry: bool = True,
            on_done: Done = None) -> list[GroupRun]:
        """One run of every group; the groups of the round start together, except that
        groups sharing a machine (a control job and the job it mirrors) run in turn: a
        machine holds one rank of one group at a time.

        A group whose rendezvous port was taken on its first machine (a race with
        another program) is run once more on a fresh port: that is not a verdict.
        """
        out: dict[int, GroupRun] = {}
        for wave in disjoint_waves(groups):
            runs = self._run_once([groups[i] for i in wave], on_done)
            again = [j for j, r in enumerate(runs) if r.status == "error" and r.error
                     and "address already in use" in r.error.lower()]
            if retry and again:
                for j, run in zip(again, self._run_once([groups[wave[j]] for j in again])):
                    runs[j] = run
            out.update(zip(wave, runs))
        return [out[i] for i in range(len(groups))]

    def _run_once(self, groups: Sequence[tuple[str, ...]], on_done: Done = None) -> list[GroupRun]:
        slots: dict[str, tuple[int, int]] = {}  # machine → (group index, node rank)
        for gi, group in enumerate(groups):
            for rank, name in enumerate(group):
                slots[name] = (gi, rank)
        ports = [self._port() for _ in groups]
        nodes = [self.inv.nodes[m] for g in groups for m in g]
        # Every machine of a round must run at once: a group's ranks wait for each other.
        concurrency = max(self.fanout, len(nodes))
        results: dict[str, Any]
        if isinstance(self.workload, BuiltinWorkload):
            results = self._run_builtin(nodes, groups, slots, ports, concurrency, on_done)
        else:
            results = self._run_command(nodes, groups, slots, ports, concurrency, on_done)
        return [self._group_run(group, results) for group in groups]

    def _values(self, group: tuple[str, ...], rank: int, port: int) -> dict[str, object]:
        return {**placeholder_values(self.inv, group, port=port,
                                     nproc_per_node=self.plan.shape.gpus),
                "node": group[rank], "node_rank": rank}

    def _run_builtin(self, nodes: list[Node], groups: Sequence[tuple[str, ...]],
                     slots: dict[str, tuple[int, int]], ports: list[int],
                     concurrency: int, on_done: Done) -> dict[str, Any]:
        assert isinstance(self.workload, BuiltinWorkload)
        wl = self.workload
        coords = [list(c) for c in self.plan.shape.rank_coords]

        def request(node: Node) -> dict[str, Any]:
            gi, rank = slots[node.name]
            values = self._values(groups[gi], rank, ports[gi])
            return {**values, "ranks": coords, "steps": wl.steps, "seed": wl.seed,
                    "device": wl.device, "timeout": self.timeout}

        out = self.runner.run(nodes, PROBE, request, timeout=self.timeout + 30,
                              concurrency=concurrency, as_job=True, on_done=on_done)
        return dict(out)

    def _run_command(self, nodes: list[Node], groups: Sequence[tuple[str, ...]],
                     slots: dict[str, tuple[int, int]], ports: list[int],
                     concurrency: int, on_done: Done) -> dict[str, Any]:
        assert isinstance(self.workload, CommandWorkload)
        template = list(self.workload.template)

        def argv(node: Node) -> list[str]:
            gi, rank = slots[node.name]
            rendered = templates.render_argv(template, self._values(groups[gi], rank, ports[gi]))
            return self.runner.as_job_user(node, rendered)  # job-like code: never as root by choice

        return dict(run_all(self.transport, nodes, argv, timeout=self.timeout,
                            concurrency=concurrency, on_done=on_done))

    def _group_run(self, group: tuple[str, ...], results: dict[str, Any]) -> GroupRun:
        runs = [results[m] for m in group]
        raw: list[RunResult] = [r.run if hasattr(r, "run") else r for r in runs]
        self.refused.update(m for m, r in zip(group, raw) if r.state is NodeState.REFUSED)
        seconds = max((r.seconds for r in raw), default=0.0)
        if any(r.state is NodeState.TIMEOUT for r in raw):
            slow = [m for m, r in zip(group, raw) if r.state is NodeState.TIMEOUT]
            return GroupRun(group, "timeout", error=f"timed out on {','.join(slow)}",
                            seconds=seconds)
        if isinstance(self.workload, BuiltinWorkload):
            bad = [(m, r.error) for m, r in zip(group, runs) if not r.ok]
            if bad:
                return GroupRun(group, "error", error=f"{bad[0][0]}: {bad[0][1]}",
                                seconds=seconds)
            doc = runs[0].document
            steps = doc.get("steps") if isinstance(doc, dict) else None
            if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
                return GroupRun(group, "error", error=f"{group[0]}: no fingerprints in the answer",
                                seconds=seconds)
            # a diverged loss comes as null (its step's fingerprint says nan/inf): numbers
            # from a node are finite, and NaN/Infinity are not JSON
            why = malformed(doc.get("losses"), ([OPT_FINITE], None), "document.losses")
            if why is not None:  # the node's answer: any JSON, an int past a float's range too
                return GroupRun(group, "error", error=f"{group[0]}: malformed replay answer: {why}",
                                seconds=seconds)
            losses = tuple(None if x is None else float(x) for x in doc.get("losses") or [])
            return GroupRun(group, "ok", tuple(steps), seconds=seconds, losses=losses)
        failed = [(m, r) for m, r in zip(group, raw) if r.state is not NodeState.OK]
        if failed:
            m, r = failed[0]
            tail = (r.stderr.strip().splitlines() or [r.state.value])[-1][:300]
            return GroupRun(group, "error", error=f"{m}: exit {r.exit_code}: {tail}",
                            seconds=seconds)
        steps_ = parse_fingerprints(raw[0].stdout)
        if not steps_:
            return GroupRun(group, "error", seconds=seconds,
                            error=f"{group[0]}: printed no 'brctl-fingerprint STEP HEX' line")
        return GroupRun(group, "ok", steps_, seconds=seconds)


def parse_fingerprints(stdout: str) -> tuple[str, ...]:
    """``brctl-fingerprint STEP HEX`` lines → fingerprints in step order (later lines win)."""
    by_step: dict[int, str] = {}
    for line in stdout.splitlines():
        m = FINGERPRINT.match(line.strip())
        if m:
            value = m.group(2).lower()
            by_step[int(m.group(1))] = value
    return tuple(by_step[s] for s in sorted(by_step))


def replay(
    transport: Transport,
    inv: Inventory,
    *,
    workload: Workload,
    dp: Optional[int] = None,
    repeat: int = 1,
    timeout: float = 300.0,
    port_base: int = 29500,
    max_rounds: Optional[int] = None,
    on_round: Optional[Callable[[RoundSpec, int], None]] = None,
    track: Track = untracked,
) -> ReplayReport:
    """Run replay rounds until a verdict.

    Args:
        transport: the backend.
        inv: the inventory (its job's machines and parallel sizes).
        workload: built-in or ``--command``.
        dp: the replay DP' (None: the smallest that votes, and decodes in 2 rounds
            where the shape allows a grid).
        repeat: runs per round; a deviation seen in one run only is ``not_reproduced``.
        timeout: seconds one run of a round may take (per group).
        port_base: first rendezvous port; each group run takes the next one.
        max_rounds: give up (``ambiguous``) after this many rounds (None: what the
            shape needs, ``ReplayPlan.default_max_rounds``).
        on_round: called before each round with its spec and its index (1-based).
        track: progress: the preflight, then each round (and each repeat) on its machines.

    Returns:
        The report; never raises for a node or group failure (that is ``incomplete``).

    Raises:
        InputError: no job, or a job shape replay cannot handle.
        UsageError: bad ``dp``/``repeat``.
    """
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: expected 1 or more")
    if not 1024 <= port_base <= MAX_PORT:
        raise UsageError(f"--port {port_base}: expected a TCP port from 1024 to {MAX_PORT}")
    plan_ = replay_plan(inv, dp)
    fanout = inv.ssh.fanout
    launcher = RoundLauncher(transport, inv, plan_, workload, timeout, port_base, fanout)
    down = (launcher.preflight(plan_.shape.machines, track("preflight", plan_.shape.machines))
            if isinstance(workload, BuiltinWorkload) else {})
    rounds: list[JudgedRound] = []
    if down:
        verdict = Verdict("incomplete", (), (), (),
                          f"{len(down)} machine(s) could not run a probe: "
                          + "; ".join(f"{n}: {why}" for n, why in sorted(down.items())))
        return ReplayReport(plan_, (), verdict, workload.describe(), repeat, down,
                            frozenset(launcher.refused))
    while True:
        decision = decide(plan_, rounds, max_rounds=max_rounds)
        if isinstance(decision, Verdict):
            return ReplayReport(plan_, tuple(rounds), decision, workload.describe(), repeat, {},
                                frozenset(launcher.refused))
        if on_round is not None:
            on_round(decision, len(rounds) + 1)
        members = [m for g in decision.groups for m in g]
        runs = [launcher.run(decision.groups, on_done=track(
                    f"round {len(rounds) + 1} ({decision.kind}, {len(decision.groups)} groups"
                    + (f", run {r + 1}/{repeat})" if repeat > 1 else ")"), members))
                for r in range(repeat)]
        rounds.append(judge_round(decision.kind, runs, reference_of(rounds),
                                  decision.suspects or None))
