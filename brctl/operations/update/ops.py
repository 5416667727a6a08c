"""``brctl update``: hot update of the job's code on its machines, lazy or urgent, with rollback.

The operations the CLI and the daemon call: ``push`` (pack once, send in
parallel, resumable, verified on arrival, staged; urgent: switch now and run the
restart hook), ``apply`` (switch every machine to the pending release, or catch up
machines that drifted), ``rollback`` (back to the release before the last update,
or a named one), ``status`` and ``history``. A switch is all-or-nothing: it
starts only when every machine answered and holds the release (lagging machines
are sent it first); if one machine fails to switch, the others are switched back
and the report says why. Every push, apply and rollback is recorded in the state
database with who, when, version, checksum, machines and outcome.

Returns dataclasses; never prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.inventory import Inventory
from brctl.analysis.update import (
    VERSION_RE,
    NodeView,
    Pending,
    TransferPlan,
    check_version,
    drift,
    is_due,
    plan_switch,
    plan_transfer,
    retained,
    rollback_target,
)
from brctl.core import nodeset
from brctl.core.errors import InputError, RefusedError
from brctl.core.transport import Node, RunResult, Transport
from brctl.operations.jobadapter import HookRun, JobAdapter
from brctl.operations.ledger.audit import Audit
from brctl.operations.update import pack as update_pack
from brctl.operations.update.report import (
    NodeOutcome,
    NodeStatus,
    PushReport,
    StatusReport,
    SwitchOutcome,
    SwitchReport,
)
from brctl.operations.update.tables import (
    COMPONENT,
    JobState,
    history,
    job_state,
    pushed_release,
    write_job,
)
from brctl.remote.fanout import run_all
from brctl.remote.probes import ProbeRunner, parse_document, refused
from brctl.state import Store

PROBE = "brctl.diagnostics.release"
MAX_PRUNED = 10_000  # releases one machine may say it removed in one prune

@dataclass
class UpdateContext:
    """What the update operations need (the CLI and the daemon build one).

    Args:
        inventory: the inventory (targets: the job's machines, or all without a job).
        transport: the backend.
        store: the state database.
        artifacts: where packed releases are kept (``<state>/update/artifacts``).
        who: recorded in the history (``user@host``).
        now: the clock (epoch seconds).
        timeout: per-machine command timeout (None: each node's ``command_timeout``).
        concurrency: machines in flight at once.
        nodes: override the target machines (default: the job's, else all).
        on_done: called as each machine finishes a step (progress).
        audit: a human's push/apply/rollback: each history row is also an ``update``
            event in the audit trail, announced through the daemon's notifier (the
            daemon records and announces its own actions itself).
    """

    inventory: Inventory
    transport: Transport
    store: Store
    artifacts: Path
    who: str
    now: Callable[[], float] = time.time
    timeout: Optional[float] = None
    concurrency: int = 64
    nodes: Optional[Sequence[Node]] = None
    on_done: Optional[Callable[[RunResult], None]] = None
    audit: Optional[Audit] = None
    runner: ProbeRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = ProbeRunner(self.transport)
        self.store.migrate(COMPONENT)

    @property
    def job(self) -> str:
        """The key of this job's update state."""
        return self.inventory.job_key

    def targets(self) -> list[Node]:
        """The machines that carry the job's code."""
        if self.nodes is not None:
            return list(self.nodes)
        return self.inventory.job_nodes() or list(self.inventory.nodes.values())

    def root(self, node: Node) -> str:
        """The update root on ``node`` (``{node}`` replaced by its name)."""
        return self.inventory.update.root.replace("{node}", node.name)


def who(environ: Mapping[str, str]) -> str:
    """``user@host`` for the history (``$SUDO_USER`` first: the person, not root)."""
    import getpass
    import socket

    user = environ.get("SUDO_USER") or environ.get("USER") or environ.get("LOGNAME")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ---------------------------------------------------------------- state database


def _record(ctx: UpdateContext, action: str, version: str, sha256: str,
            from_version: Optional[str], machines: Sequence[str], outcome: str,
            detail: Mapping[str, Any], job: Optional[JobState] = None) -> int:
    """Write a history row (and the job's new state, in the same transaction); its id."""
    with ctx.store.transaction() as db:
        if job is not None:
            write_job(db, ctx.job, job)
        cur = db.execute(
            "INSERT INTO update_events(job, at, who, action, version, sha256, from_version,"
            " machines, outcome, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (ctx.job, ctx.now(), ctx.who, action, version, sha256, from_version,
             json.dumps(list(machines)), outcome, json.dumps(detail, sort_keys=True)))
        row = int(cur.lastrowid or 0)
    if ctx.audit is not None:
        ctx.audit.record("update", machines, {"action": action, "version": version,
                                              "from_version": from_version, "sha256": sha256,
                                              "outcome": outcome, "history": row},
                         outcome=outcome, reason=f"update {action} {version}"
                         + (f" (from {from_version})" if from_version else ""))
    return row


def _register_release(ctx: UpdateContext, version: str, art: update_pack.Artifact) -> None:
    with ctx.store.transaction() as db:
        row = db.execute("SELECT sha256 FROM update_releases WHERE version = ?",
                         (version,)).fetchone()
        if row is not None and row[0] != art.sha256:
            raise InputError(
                f"release {version} was already pushed with sha256 {row[0][:12]} "
                f"(this one is {art.sha256[:12]}); releases are immutable",
                hint="push the new code under a new --version")
        if row is None:
            db.execute("INSERT INTO update_releases VALUES (?,?,?,?,?,?)",
                       (version, art.sha256, art.size, art.source, ctx.now(), ctx.who))


# ---------------------------------------------------------------- machine steps


def _failure(res: RunResult, error: Optional[str]) -> NodeOutcome:
    if not res.state.ran:
        return NodeOutcome(res.state.value, res.stderr.strip()[-300:])
    return NodeOutcome("failed", error or f"exit {res.exit_code}")


def inspect(ctx: UpdateContext, nodes: Sequence[Node]
            ) -> tuple[dict[str, Optional[NodeView]], dict[str, NodeOutcome]]:
    """Ask every machine what it holds; (views, failures) where failures have no view."""
    results = ctx.runner.run(nodes, PROBE, lambda n: {"action": "inspect", "root": ctx.root(n)},
                             timeout=ctx.timeout, concurrency=ctx.concurrency,
                             on_done=ctx.on_done)
    views: dict[str, Optional[NodeView]] = {}
    failures: dict[str, NodeOutcome] = {}
    for node in nodes:
        res = results[node.name]
        if res.document is not None:
            views[node.name] = NodeView.from_document(res.document)
        else:
            views[node.name] = None
            failures[node.name] = _failure(res.run, res.error)
    return views, failures


def transfer(ctx: UpdateContext, nodes: Sequence[Node], art: update_pack.Artifact,
             version: str, plan: TransferPlan) -> dict[str, NodeOutcome]:
    """Send the artifact (from each machine's resume offset) and stage it there."""
    todo = [n for n in nodes if n.name in plan.send]
    if not todo:
        return {}
    data = memoryview(art.path.read_bytes())

    def stdin_for(node: Node) -> bytes:
        # a view, not a copy: after a cut push every machine may resume from its own
        # offset, and a copy per offset of a multi-GB artifact is the controller's memory
        return data[plan.send[node.name]:]  # type: ignore[return-value]

    def argv_for(node: Node) -> list[str]:
        request = {"action": "receive", "root": ctx.root(node), "version": version,
                   "sha256": art.sha256, "size": art.size, "offset": plan.send[node.name]}
        return ctx.runner.command(node, PROBE, json.dumps(request))

    results = run_all(ctx.transport, todo, argv_for, timeout=ctx.timeout, stdin=stdin_for,
                      concurrency=ctx.concurrency, on_done=ctx.on_done)
    out: dict[str, NodeOutcome] = {}
    for node in todo:
        res = refused(results[node.name])  # a link planted in the root: refused, as in ckpt.dir
        doc, error = parse_document(res)
        sent = art.size - plan.send[node.name]
        if doc is not None and doc.get("staged"):
            state = "present" if doc.get("already") else "staged"
            out[node.name] = NodeOutcome(state, "", sent)
        else:
            outcome = _failure(res, error)
            out[node.name] = NodeOutcome(outcome.state, outcome.message, sent)
    return out


def _switch_nodes(ctx: UpdateContext, nodes: Sequence[Node], versions: Mapping[str, Optional[str]],
                  sha256: Optional[Mapping[str, str]] = None) -> dict[str, NodeOutcome]:
    """Point ``current`` at ``versions[node]`` on each machine (None: remove the link)."""
    def request(node: Node) -> dict[str, Any]:
        req: dict[str, Any] = {"action": "switch", "root": ctx.root(node),
                               "version": versions[node.name]}
        if sha256 is not None:
            req["sha256"] = sha256[node.name]
        return req

    results = ctx.runner.run(nodes, PROBE, request, timeout=ctx.timeout,
                             concurrency=ctx.concurrency, on_done=ctx.on_done)
    return {n.name: NodeOutcome("switched") if results[n.name].ok
            else _failure(results[n.name].run, results[n.name].error) for n in nodes}


def _describe(outcomes: Mapping[str, NodeOutcome]) -> str:
    by_message: dict[str, list[str]] = {}
    for name, o in outcomes.items():
        by_message.setdefault(f"{o.state}: {o.message}".rstrip(": "), []).append(name)
    return "; ".join(f"{nodeset.fold(names)}: {msg}" for msg, names in by_message.items())


def switch_all(ctx: UpdateContext, action: str, version: str, sha256: str,
               from_version: Optional[str]) -> SwitchReport:
    """Switch every target machine to ``version``, all or none (see the module docstring)."""
    targets = ctx.targets()
    by_name = {n.name: n for n in targets}
    views, failures = inspect(ctx, targets)
    plan = plan_switch(views, version, sha256)
    nodes: dict[str, NodeOutcome] = dict(failures)

    def report(outcome: SwitchOutcome, reason: str) -> SwitchReport:
        return SwitchReport(action, ctx.job, version, from_version, outcome, reason, nodes)

    if plan.unknown:
        return report("incomplete", "not switched (no machine was): "
                      f"{_describe(failures)}; rerun once they answer or leave the job")
    if plan.lagging:
        art = update_pack.load(ctx.artifacts, sha256, version)
        sent = transfer(ctx, [by_name[n] for n in plan.lagging], art, version,
                        plan_transfer({n: views[n] for n in plan.lagging}, version, sha256,
                                      art.size))
        nodes.update(sent)
        bad = {n: o for n, o in sent.items() if o.state not in ("staged", "present")}
        if bad:
            return report("failed", f"not switched: catching up failed on {_describe(bad)}")
    nodes.update({n: NodeOutcome("already") for n in plan.already})
    movers = [by_name[n] for n in (*plan.ready, *plan.lagging)]
    if not movers:
        return report("ok", f"every machine is already on {version}")
    switched = _switch_nodes(ctx, movers, {n.name: version for n in movers},
                             {n.name: sha256 for n in movers})
    nodes.update(switched)
    bad = {n: o for n, o in switched.items() if o.state != "switched"}
    if not bad:
        return report("ok", f"switched {nodeset.fold([n.name for n in movers])} to {version}")
    return _revert(ctx, report, nodes, movers, views, bad)


def _revert(ctx: UpdateContext, report: Callable[[SwitchOutcome, str], SwitchReport],
            nodes: dict[str, NodeOutcome], movers: Sequence[Node],
            views: Mapping[str, Optional[NodeView]],
            bad: Mapping[str, NodeOutcome]) -> SwitchReport:
    """Switch the machines that did switch back to what they ran before."""
    done = [n for n in movers if n.name not in bad]
    previous: dict[str, Optional[str]] = {}
    for node in done:
        view = views[node.name]
        previous[node.name] = view.current if view is not None else None
    back = _switch_nodes(ctx, done, previous) if done else {}
    why = _describe(bad)
    stuck = {n: o for n, o in back.items() if o.state != "switched"}
    for name, o in back.items():
        nodes[name] = NodeOutcome("reverted", f"switched back to {previous[name]}") \
            if o.state == "switched" else NodeOutcome(o.state, f"switch back failed: {o.message}")
    if stuck:
        return report("failed", f"switch failed on {why}; switching back failed on "
                      f"{_describe(stuck)}: machines are on MIXED versions, fix them and rerun")
    return report("rolled_back", f"switch failed on {why}; every machine was switched back")


def run_restart_hook(inv: Inventory, version: str, reason: str, timeout: float) -> Optional[HookRun]:
    """Run ``job.restart_command`` on the job's machines (the job adapter's restart, the
    daemon's too, with ``{version}`` and ``{reason}``); None without one."""
    if inv.job is None:
        return None
    return JobAdapter(inv, timeout).restart(list(inv.job.nodes), version, reason)


def _hook_timeout(ctx: UpdateContext) -> float:
    return ctx.timeout or ctx.inventory.ssh.command_timeout


def _finish_switch(ctx: UpdateContext, rep: SwitchReport, sha256: str, restart: bool,
                   state: JobState, clear_pending: bool) -> SwitchReport:
    """Record the job's new version and its history row in one transaction, then run the
    hook and prune, and add what they did to that row.

    A kill in between leaves the version and its history consistent: a rollback that
    switched is never forgotten (and never done again by a daemon that resumes it).
    """
    machines = [n.name for n in ctx.targets()]
    detail: dict[str, Any] = {"switched": rep.outcome == "ok", "reason": rep.reason,
                              "nodes": {n: o.to_json() for n, o in rep.nodes.items()},
                              "restart": None}
    if rep.outcome != "ok":
        _record(ctx, rep.action, rep.version or "", sha256, rep.from_version, machines,
                rep.outcome, detail)
        return rep
    pending = None if clear_pending else state.pending
    event_id = _record(ctx, rep.action, rep.version or "", sha256, rep.from_version, machines,
                       rep.outcome, detail, job=JobState(rep.version, sha256, pending))
    if restart:
        hook = run_restart_hook(ctx.inventory, rep.version or "",
                                f"update {rep.action} {rep.version}", _hook_timeout(ctx))
        rep = replace(rep, restart=hook)
        detail["restart"] = hook.to_json() if hook else None
    detail["pruned"] = prune(ctx, [rep.version, rep.from_version,
                                   state.pending.version if state.pending else None])
    with ctx.store.transaction() as db:
        db.execute("UPDATE update_events SET detail = ? WHERE id = ?",
                   (json.dumps(detail, sort_keys=True), event_id))
    return rep


def prune(ctx: UpdateContext, protect: Sequence[Optional[str]]) -> dict[str, Any]:
    """Drop releases beyond ``update.keep`` on the machines and artifacts on the controller.

    Best effort: a machine that fails to prune keeps its releases (reported, not fatal).

    Returns:
        ``{"removed": {machine: [versions]}, "errors": {machine: why}, "artifacts": n}``.
    """
    rows = ctx.store.query("SELECT version, sha256 FROM update_releases ORDER BY pushed_at, rowid")
    keep = retained([r["version"] for r in rows], ctx.inventory.update.keep, protect)
    results = ctx.runner.run(ctx.targets(), PROBE, lambda n: {"action": "prune",
                                                              "root": ctx.root(n),
                                                              "keep": sorted(keep)},
                             timeout=ctx.timeout, concurrency=ctx.concurrency)
    removed: dict[str, list[str]] = {}
    errors = {n: r.error or "" for n, r in results.items() if r.document is None}
    for n, r in results.items():
        if r.document is not None:
            said = _pruned(r.document.get("removed"), keep)
            if said is None:
                errors[n] = "an answer that does not say which releases it removed"
            elif said:
                removed[n] = said
    kept_sha = {r["sha256"] for r in rows if r["version"] in keep}
    dropped = 0
    for row in rows:
        path = ctx.artifacts / f"{row['sha256']}.tar.gz"
        if row["sha256"] not in kept_sha and path.exists():
            path.unlink()
            dropped += 1
    return {"removed": removed, "errors": errors, "artifacts": dropped}


def _pruned(said: object, keep: set[str]) -> Optional[list[str]]:
    """A machine's list of the releases it removed, if it is one (release names, none it
    was told to keep, each once, at most ``MAX_PRUNED``), else None: it is kept in history."""
    if not isinstance(said, list) or len(said) > MAX_PRUNED:
        return None
    names = [v for v in said if isinstance(v, str) and VERSION_RE.match(v) and v not in keep]
    return names if len(names) == len(said) == len(set(names)) else None


# ---------------------------------------------------------------- operations


@contextmanager
def exclusive(ctx: UpdateContext) -> Iterator[None]:
    """Hold the job's update lock (``<state>/update/<job>.lock``) for one push/apply/rollback.

    Raises:
        RefusedError: another brctl (a person, cron or the daemon) is changing this
            job's releases right now (exit 4).
    """
    path = ctx.artifacts.parent / (re.sub(r"[^A-Za-z0-9._-]", "_", ctx.job) + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held across the yield
    except OSError as exc:
        raise InputError(f"update lock {path}: {exc.strerror}") from None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise RefusedError(f"job {ctx.job}: another brctl update is changing its releases "
                               f"({holder})", hint="wait for it to finish, then rerun") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{ctx.who}, pid {os.getpid()}\n")
        fh.flush()
        yield  # closing the file releases the lock, also when the process dies


def push(ctx: UpdateContext, src: str, version: str, *, rev: Optional[str] = None,
         urgent: bool = False, window_s: Optional[float] = None) -> PushReport:
    """Pack ``src`` once, send it to every target machine, stage it; urgent: switch now.

    Raises:
        InputError / UsageError: a bad source or version, or the version exists with other code.
        RefusedError: another push/apply/rollback of this job is running.
    """
    check_version(version)
    with exclusive(ctx):
        return _push(ctx, src, version, rev, urgent, window_s)


def _push(ctx: UpdateContext, src: str, version: str, rev: Optional[str], urgent: bool,
          window_s: Optional[float]) -> PushReport:
    art = update_pack.pack(src, rev, ctx.artifacts, ctx.inventory.update.max_bytes)
    _register_release(ctx, version, art)
    targets = ctx.targets()
    views, failures = inspect(ctx, targets)
    plan = plan_transfer(views, version, art.sha256, art.size)
    nodes: dict[str, NodeOutcome] = dict(failures)
    nodes.update({n: NodeOutcome("present") for n in plan.skip})
    nodes.update({n: NodeOutcome("conflict", why) for n, why in plan.conflict.items()})
    nodes.update(transfer(ctx, targets, art, version, plan))
    nodes = {n.name: nodes[n.name] for n in targets}
    state = job_state(ctx.store, ctx.job)
    window = window_s if window_s is not None else ctx.inventory.update.window
    pending = state.pending
    if version != state.version or urgent:
        pending = Pending(version, art.sha256, ctx.now(), window, urgent)
    outcome = ("ok" if all(o.state in ("staged", "present") for o in nodes.values())
               else "incomplete" if any(not o.answered for o in nodes.values()) else "failed")
    _record(ctx, "push", version, art.sha256, state.version, list(nodes), outcome,
            {"source": art.source, "size": art.size, "urgent": urgent, "window_s": window,
             "bytes_sent": sum(o.bytes_sent for o in nodes.values()),
             "nodes": {n: o.to_json() for n, o in nodes.items()}},
            job=JobState(state.version, state.sha256, pending))
    switch = None
    if urgent and outcome == "ok":
        # The switch is job-wide even when -w narrowed the push: never mix versions.
        switch = _apply(replace(ctx, nodes=None), False, True)
        pending = job_state(ctx.store, ctx.job).pending
    message = _push_message(version, outcome, urgent, pending, switch)
    return PushReport(ctx.job, version, art.sha256, art.size, art.source, urgent, nodes,
                      pending, switch, message)


def _push_message(version: str, outcome: str, urgent: bool, pending: Optional[Pending],
                  switch: Optional[SwitchReport]) -> str:
    if switch is not None:
        return switch.reason
    if outcome != "ok":
        tail = "kept pending; `brctl update apply` catches the other machines up"
        return f"{version} not staged everywhere: {tail}" + (" (urgent: not switched)"
                                                             if urgent else "")
    if pending is None:
        return f"{version} staged; the job already runs it"
    return f"{version} staged everywhere, pending: applied by `brctl update apply` (due at " \
           f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(pending.due_at))})"


def apply(ctx: UpdateContext, *, if_due: bool = False, restart: bool = False) -> SwitchReport:
    """Switch every machine to the pending release (or back to the job's version if drifted).

    Args:
        ctx: the context.
        if_due: only apply a pending release whose window has passed (or an urgent one);
            for cron, with ``restart`` so the job picks the code up.
        restart: run ``job.restart_command`` after a successful switch.

    Raises:
        RefusedError: another push/apply/rollback of this job is running.
    """
    with exclusive(ctx):
        return _apply(ctx, if_due, restart)


def _apply(ctx: UpdateContext, if_due: bool, restart: bool) -> SwitchReport:
    state = job_state(ctx.store, ctx.job)
    pending = state.pending
    if pending is not None and (not if_due or is_due(pending, ctx.now())):
        version, sha256, clear = pending.version, pending.sha256, True
    elif state.version is not None and state.sha256 is not None and not if_due:
        version, sha256, clear = state.version, state.sha256, False
    else:
        why = "pending release is not due yet" if pending else "nothing pushed"
        return SwitchReport("apply", ctx.job, None, state.version, "noop", why, {})
    rep = switch_all(ctx, "apply", version, sha256, state.version)
    if not clear and rep.outcome == "ok" and all(o.state == "already" for o in rep.nodes.values()):
        return replace(rep, outcome="noop", reason=f"no drift: every machine is on {version}")
    return _finish_switch(ctx, rep, sha256, restart, state, clear)


def rollback(ctx: UpdateContext, *, to: Optional[str] = None, restart: bool = False
             ) -> SwitchReport:
    """Switch every machine back to the release before the last update (or to ``to``).

    Raises:
        InputError: there is no earlier release to go back to, or ``to`` was never pushed.
        RefusedError: another push/apply/rollback of this job is running.
    """
    with exclusive(ctx):
        return _rollback(ctx, to, restart)


def rollback_choice(ctx: UpdateContext, to: Optional[str]) -> tuple[str, str, JobState]:
    """The release a rollback returns to: (version, its sha256, the job's state now).

    ``rollback`` and its ``--dry-run`` preview both choose through here.

    Raises:
        InputError: no earlier release, or ``to`` was never pushed.
    """
    state = job_state(ctx.store, ctx.job)
    target = to if to is not None else rollback_target(history(ctx.store, ctx.job), state.version)
    if target is None:
        raise InputError(f"job {ctx.job}: no earlier release to roll back to "
                         f"(current: {state.version or 'none recorded'})",
                         hint="name one with --to VERSION (see brctl update history)")
    check_version(target)
    sha256, _source = pushed_release(ctx.store, target)
    return target, sha256, state


def _rollback(ctx: UpdateContext, to: Optional[str], restart: bool) -> SwitchReport:
    target, sha256, state = rollback_choice(ctx, to)
    rep = switch_all(ctx, "rollback", target, sha256, state.version)
    # a pending release that is the one being rolled away from must not come back lazily
    clear = state.pending is not None and state.pending.version == state.version
    return _finish_switch(ctx, rep, sha256, restart, state, clear)


def status(ctx: UpdateContext) -> StatusReport:
    """Current and pending release per machine, with drift against the job's version."""
    state = job_state(ctx.store, ctx.job)
    targets = ctx.targets()
    views, failures = inspect(ctx, targets)
    currents = {n: v.current for n, v in views.items() if v is not None}
    drifted = set(drift(currents, state.version))
    nodes: dict[str, NodeStatus] = {}
    for node in targets:
        view = views[node.name]
        if view is None:
            fail = failures[node.name]
            nodes[node.name] = NodeStatus(fail.state, None, (), None, False, fail.message)
            continue
        staged = None if state.pending is None else view.has(state.pending.version,
                                                               state.pending.sha256)
        nodes[node.name] = NodeStatus("ok", view.current, tuple(sorted(view.releases)), staged,
                                      node.name in drifted)
    return StatusReport(ctx.job, state.version, state.sha256, state.pending,
                        is_due(state.pending, ctx.now()), nodes)
