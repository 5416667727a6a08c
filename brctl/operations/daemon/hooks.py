"""The daemon's window on the machines: the ``Hooks`` protocol and ``LiveHooks``.

The loop (``operations.daemon``) sees the machines only through ``Hooks``: analyses
(health, log tails, stacks, diagnose, replay, standby self-checks) and remote
actions (checkpoint restore, code updates). ``LiveHooks`` wires the real operations
in one place; the unit tests script them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from brctl.analysis.daemon.plan import Release
from brctl.analysis.daemon.policy import Finding, ReplayOutcome, StandbyOutcome
from brctl.analysis.diagnose.decide import PastConclusion
from brctl.analysis.inventory import Inventory
from brctl.analysis.probe_doc import finite
from brctl.core.errors import BrctlError
from brctl.core.transport import Node, Transport
from brctl.remote.probes import ProbeRunner
from brctl.state import Store

if TYPE_CHECKING:
    from brctl.operations.stacks.ops import StacksReport

LOGTAIL = "brctl.diagnostics.logtail"

@dataclass(frozen=True)
class HealthView:
    """What the loop needs from one health sweep.

    Attributes:
        evict: machine → confident eviction reason.
        unanswered: machines with no verdict.
        running: False when training processes are gone on some job machine
            (True when all have them; None when not checked).
        stopped_on: job machines without training processes.
        status: machine → ok | warn | fail | why no verdict (for /metrics).
    """

    evict: Mapping[str, str] = field(default_factory=dict)
    unanswered: tuple[str, ...] = ()
    running: Optional[bool] = None
    stopped_on: tuple[str, ...] = ()
    status: Mapping[str, str] = field(default_factory=dict)


class Hooks(Protocol):
    """The loop's window on the machines: analyses and remote actions."""

    def health(self, nodes: Sequence[Node]) -> HealthView:
        """One health sweep of ``nodes``."""
        ...

    def log_tails(self, nodes: Sequence[Node]) -> dict[str, str]:
        """node → the tail of its job logs (empty when none)."""
        ...

    def stacks(self, nodes: Sequence[Node], rounds: int, *, arrival_first: bool = False
               ) -> Finding:
        """Stack and flight-recorder analysis of a stalled (1 round) or slow job (several;
        ``arrival_first``: one round's collective arrival times first): machines to evict."""
        ...

    def diagnose(self, nodes: Sequence[Node], history: Sequence[PastConclusion]) -> Finding:
        """The stop-time diagnose ladder of a stopped job; ``history``: the crash plans the
        daemon carried out since the job's last new step (what the ladder climbs from)."""
        ...

    def restore(self, evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        """Copy the evicted machine's checkpoint shards onto ``standby`` from its backup peer."""
        ...

    def release(self) -> Release:
        """The job's code now: its version, the pending release, the rollback target."""
        ...

    def apply_updates(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        """Switch ``nodes`` to ``version`` (the pending release, or the job's own to catch
        standbys up); refuses when the job's release is no longer the one planned."""
        ...

    def rollback(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        """Roll the job's code back to exactly ``version`` (idempotent: already there is ok)."""
        ...

    def replay(self, nodes: Sequence[Node]) -> ReplayOutcome:
        """Replay the stopped job on ``nodes`` (``brctl replay``) and return its verdict."""
        ...

    def check(self, nodes: Sequence[Node]) -> dict[str, tuple[StandbyOutcome, str]]:
        """Self-check standby machines: node → (checked | failed | untested, detail)."""
        ...


def joined_tails(doc: Optional[Mapping[str, Any]]) -> str:
    """A logtail answer's tails, oldest file first. Entries out of shape are left out: a
    broken or hostile machine's answer must not stop the loop (it would crash again on
    every restart)."""
    files = (doc or {}).get("files")
    good = [f for f in files if isinstance(f, dict) and isinstance(f.get("tail", ""), str)
            and finite(f.get("mtime", 0))] if isinstance(files, list) else []  # 10**400: no float
    return "\n".join(f.get("tail", "") for f in sorted(good, key=lambda f: float(f.get("mtime", 0))))


class LiveHooks:
    """The real operations behind ``Hooks``, over one long-lived transport and probe runner."""

    def __init__(self, inv: Inventory, transport: Transport, store: Store, state_dir: Path,
                 timeout_scale: float = 1.0, environ: Optional[Mapping[str, str]] = None,
                 dry_run: bool = False) -> None:
        """Args: the inventory, the daemon's transport and store, the state dir,
        $BRCTL_TIMEOUT_SCALE, the environment (playbook search path, who for the history);
        ``dry_run``: analyse only, record nothing the live daemon reads (health samples,
        diagnose verdicts)."""
        import os

        self.environ: Mapping[str, str] = environ if environ is not None else dict(os.environ)
        self.inv = inv
        self.transport = transport
        self.store = store
        self.state_dir = state_dir
        self.scale = timeout_scale
        self.runner = ProbeRunner(transport)
        self.dry_run = dry_run

    def health(self, nodes: Sequence[Node]) -> HealthView:
        """brctl health's sweep: eviction candidates and process liveness."""
        from brctl.operations.health import sweep

        # the job's machines now: a swapped-in standby's training processes count
        report = sweep(self._current(nodes), self.transport, nodes, self.store,
                       runner=self.runner, timeout=self.inv.health.timeout * self.scale,
                       save=not self.dry_run)
        stopped, seen_process = [], False
        for name, verdict in report.nodes.items():
            for check in verdict.checks:
                if check.name != "process":
                    continue
                seen_process = seen_process or check.status not in ("skip", "unknown")
                if check.status in ("fail", "warn"):
                    stopped.append(name)
        running = (not stopped) if seen_process else None
        return HealthView(report.evict_candidates(), tuple(report.incomplete()), running,
                          tuple(stopped), {n: h.status for n, h in report.nodes.items()})

    def log_tails(self, nodes: Sequence[Node]) -> dict[str, str]:
        """The tails of ``job.log_paths`` on each machine (the logtail probe)."""
        assert self.inv.job is not None
        if not self.inv.job.log_paths:
            return {}
        request = {"paths": list(self.inv.job.log_paths), "bytes": self.inv.daemon.log_tail_bytes,
                   "job_user": self.inv.job.user}  # its logs are read in a 1777 dir too
        results = self.runner.run(nodes, LOGTAIL, request, timeout=30 * self.scale,
                                  concurrency=self.inv.ssh.fanout)
        return {name: joined_tails(res.document) for name, res in results.items()}

    def _current(self, nodes: Sequence[Node]) -> Inventory:
        """The inventory with the job on its current machines (after swaps)."""
        assert self.inv.job is not None
        return replace(self.inv, job=replace(self.inv.job, nodes=tuple(n.name for n in nodes)))

    def stacks(self, nodes: Sequence[Node], rounds: int, *, arrival_first: bool = False
               ) -> Finding:
        """brctl stacks' collection and analysis (stacks and flight recorders, fused); the
        machines it proposes to evict, the collective evidence cited in the reason.

        ``arrival_first`` (fail-slow): one round's recorders name a late rank from its
        collective arrival times at once; only without such a verdict are the ``rounds``
        stack rounds taken (minutes, the fallback).
        """
        from brctl.operations.stacks.ops import analyse, collect_job

        cfg = self.inv.stacks
        try:
            if arrival_first:
                collections, shape = collect_job(self._current(nodes), self.transport,
                                                 rounds=1, timeout=120 * self.scale)
                report = analyse(collections, shape, stuck_after=cfg.stuck_after,
                                 straggler_threshold_ms=cfg.straggler_threshold_ms)
                coll = report.analysis.collectives
                # trusted: compared on one machine's clock (or against >= 3 machines'
                # medians); two machines' clocks alone never evict
                if coll is not None and report.analysis.evict \
                        and any(s.victim_of is None and s.trusted for s in coll.late):
                    return _finding(report, "late arrival in collectives")
            collections, shape = collect_job(self._current(nodes), self.transport, rounds=rounds,
                                             interval=self.inv.daemon.poll_interval,
                                             timeout=120 * self.scale)
            report = analyse(collections, shape, stuck_after=cfg.stuck_after,
                             straggler_threshold_ms=cfg.straggler_threshold_ms)
        except BrctlError as exc:
            return Finding(None, (), f"stack analysis gave no verdict: {exc.message}")
        return _finding(report, "stack outliers")

    def diagnose(self, nodes: Sequence[Node], history: Sequence[PastConclusion]) -> Finding:
        """brctl diagnose's ladder on the stopped job: its decision and faulty machines.

        The ladder climbs from ``history``, what the daemon actually carried out (not
        diagnose's own records of what it once advised)."""
        from brctl.load.playbooks import load_playbooks, playbook_dirs
        from brctl.operations.diagnose import Options
        from brctl.operations.diagnose import diagnose as run_ladder

        try:
            books = load_playbooks(playbook_dirs(None, self.environ))
            # force: the daemon has already judged the job dead; ranks left hanging
            # hold nothing worth protecting and the restart replaces them.
            report = run_ladder(self._current(nodes), self.transport, books,
                                Options(force=True, timeout_scale=self.scale,
                                        concurrency=self.inv.ssh.fanout),
                                nodes=nodes, history=history,
                                # no store: the history is given, and a dry run records no verdict
                                store=None if self.dry_run else self.store)
        except BrctlError as exc:
            return Finding(None, (), f"diagnose failed: {exc.message}")
        except Exception as exc:  # a bug the ladder hit must fail this diagnosis, not the loop
            import logging
            logging.getLogger(__name__).debug("diagnose ladder raised", exc_info=True)
            return Finding(None, (), f"diagnose failed: internal error: {type(exc).__name__}: "
                           f"{str(exc)[:200]}")
        return Finding(report.decision, tuple(report.faulty),
                       f"{report.found.playbook.name}: {report.reason}",
                       report.found.playbook.name)

    def restore(self, evicted: Node, standby: Node, members: Sequence[Node]) -> str:
        """brctl ckpt restore: the evicted machine's newest verified backup onto ``standby``.

        The backup peer is the placement of the job as it was before the swap (what
        ``brctl ckpt backup`` used). No backup yet is not an error: the job restarts
        from whatever checkpoint its restart command finds.
        """
        from brctl.operations.ckpt.ops import plan, restore

        before = [evicted if n.name == standby.name else n for n in members]
        try:
            backups = plan(self._current(before)).backups()
            # force: the standby was just swapped into the job for this very restore.
            report = restore(self.transport, self.inv, backups, target=standby.name,
                             evicted=evicted.name, runner=self.runner, force=True)
        except BrctlError as exc:
            raise BrctlError(f"ckpt restore {evicted.name} -> {standby.name}: {exc.message}") from None
        copy = report.copies[0] if report.copies else None
        if copy is None or copy.state != "ok":
            error = copy.error if copy is not None else "nothing copied"
            if copy is not None and "no complete backup" in (error or ""):
                return f"no backup of {evicted.name} yet: {error}"
            raise BrctlError(f"ckpt restore {evicted.name} -> {standby.name}: {error}")
        return (f"restored {copy.step} of {evicted.name} from {copy.source} onto {standby.name} "
                f"({copy.files} files, {copy.bytes} bytes)")

    def _update(self, nodes: Sequence[Node]) -> Any:
        from brctl.operations.update.ops import UpdateContext, who

        return UpdateContext(self.inv, self.transport, self.store,
                             self.state_dir / "update" / "artifacts", who(self.environ),
                             concurrency=self.inv.ssh.fanout, nodes=list(nodes))

    def release(self) -> Release:
        """The job's version, pending release and rollback target from the update records."""
        from brctl.operations.update.tables import release_targets

        assert self.inv.job is not None
        return release_targets(self.store, self.inv.job.name)

    def apply_updates(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        """brctl update apply to ``version``: the pending release, or the job's own (standbys
        catch up); a release pushed since the plan was written is not applied."""
        from brctl.operations.update.ops import apply

        if not version:
            return "no release recorded for the job: nothing to apply"
        now = self.release()
        if (now.pending or now.current) != (version, sha256):
            raise BrctlError(f"update apply: the job's release changed since the plan "
                             f"(planned {version}, now {(now.pending or now.current or ('none',))[0]})")
        rep = apply(self._update(nodes))
        if rep.outcome not in ("ok", "noop"):
            raise BrctlError(f"update apply {rep.outcome}: {rep.reason}")
        return f"update apply {rep.outcome}: {rep.version or '-'} ({rep.reason})"

    def rollback(self, nodes: Sequence[Node], version: str, sha256: str) -> str:
        """brctl update rollback --to ``version`` on the job's machines."""
        from brctl.operations.update.ops import rollback
        from brctl.operations.update.tables import release_sha256

        if release_sha256(self.store, version) != sha256:
            raise BrctlError(f"update rollback: release {version} is not the one planned "
                             f"(sha256 {sha256[:12]}…)")
        rep = rollback(self._update(nodes), to=version)
        if rep.outcome not in ("ok", "noop"):
            raise BrctlError(f"update rollback {rep.outcome}: {rep.reason}")
        return f"rolled back {rep.from_version} -> {rep.version}"

    def replay(self, nodes: Sequence[Node]) -> ReplayOutcome:
        """brctl replay on the job's current machines: ``daemon.replay_command``, else the
        built-in workload."""
        import random

        from brctl.core.templates import template_argv
        from brctl.operations.replay import BuiltinWorkload, CommandWorkload, Workload, replay

        cfg = self.inv.daemon
        workload: Workload = BuiltinWorkload() if cfg.replay_command is None else \
            CommandWorkload(tuple(template_argv(cfg.replay_command)))
        port = random.SystemRandom().randrange(20000, 40000)  # as brctl replay picks one
        report = replay(self.transport, self._current(nodes), workload=workload,
                        timeout=cfg.command_timeout * self.scale, port_base=port)
        v = report.verdict
        return ReplayOutcome(v.verdict, tuple(v.faulty), tuple(v.candidates), v.reason)

    def check(self, nodes: Sequence[Node]) -> dict[str, tuple[StandbyOutcome, str]]:
        """Self-check standby machines (``operations.standby.selfcheck.check_pool``)."""
        from brctl.operations.standby.selfcheck import check_pool

        checks = check_pool(self.inv, self.transport, nodes, store=self.store,
                            runner=self.runner, timeout_scale=self.scale)
        return {name: (c.outcome, c.detail) for name, c in checks.items()}


def _finding(report: StacksReport, what: str) -> Finding:
    """The daemon's finding from a stacks report; the recorder's evidence is cited in the
    reason, which the event log and ``brctl report`` keep."""
    evict = tuple(report.analysis.evict)
    groups = [f"{g.kind} group{'s' if len(g.indices) > 1 else ''} "
              f"{','.join(map(str, g.indices))}" for g in report.analysis.suspects]
    where = f" ({'; '.join(groups)})" if groups else ""
    evidence = [e for g in report.analysis.suspects for e in g.evidence][:4]
    cited = f"; evidence: {' | '.join(evidence)}" if evidence else ""
    return Finding("evict" if evict else None, evict,
                   f"{what}{where}: evict {', '.join(evict)}{cited}" if evict
                   else f"no {what}{cited}")
