"""``brctl update push|apply|rollback|status|history``: hot update of the job's code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env

if TYPE_CHECKING:
    from brctl.operations.update.ops import UpdateContext

app = typer.Typer(no_args_is_help=True, help="""Roll code out to the job's machines in place.

Releases live on each machine under update.root (releases/<version>/ and a
`current` symlink switched atomically). `push` packs the code once, sends it
to every machine in parallel (resumable, sha256-verified on arrival) and
stages it: by default it waits as pending until `apply` (which the daemon
runs at the next restart or failure) or until its window expires (`apply
--if-due`, e.g. from cron); `--urgent` switches now and runs the job's
restart hook. A switch is all-or-nothing: if one machine cannot switch, the
others are switched back. `rollback` returns to the release before the last
update; `status` shows drift; `history` lists every change. A push, apply or
rollback by hand is also in the audit trail (the daemon's events and event log)
with the operator (`--by`, else $SUDO_USER, else $USER) and is announced through
the daemon's notifier.""")

_SELECT = opt.nodes("the job's machines, else every machine")
_DRY_RUN = typer.Option(False, "--dry-run",
                        help="Print what would be staged, switched and run; contact no machine, "
                        "write nothing.")
_TIMEOUT = opt.timeout(None, "Per-machine timeout of each step (default: ssh.command_timeout).")


def register(root: typer.Typer) -> None:
    """Add the ``update`` group to the root app."""
    root.add_typer(app, name="update")


def _context(env: Env, select: Optional[str], exclude: Optional[str],
             timeout: Optional[float], by: Optional[str] = None, *,
             audit: bool = False) -> UpdateContext:
    """The operations' context; with ``audit``, a human's change goes to the audit trail
    (never for a dry run: that writes nothing)."""
    from brctl.core.errors import UsageError
    from brctl.operations.ledger.audit import Audit
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.update.ops import UpdateContext, who

    inv = env.inventory()
    nodes = inv.select(select, exclude) if select or exclude else None
    if nodes is not None and not nodes:
        raise UsageError("update: the selection is empty", hint="check -w / -x against brctl nodes")
    operator = by or who(env.environ)
    trail = Audit.of(inv, DaemonState(env.store(), inv.job_key), env.state_dir(),
                     operator) if audit else None
    return UpdateContext(inv, env.transport(), env.store(), env.state_dir() / "update" / "artifacts",
                         operator, timeout=timeout, concurrency=inv.ssh.fanout,
                         nodes=nodes, audit=trail)


@app.command("push")
def push(
    ctx: typer.Context,
    src: str = typer.Argument(..., metavar="SRC",
                              help="A directory, a tarball, or a git repository (with --rev)."),
    version: str = typer.Option(..., "--version", "-V", metavar="V", help="Release name."),
    rev: Optional[str] = typer.Option(None, "--rev", metavar="REV",
                                      help="Pack this git revision of the repository SRC."),
    urgent: bool = typer.Option(False, "--urgent",
                                help="Switch every machine now and run job.restart_command."),
    window: Optional[str] = typer.Option(None, "--window", metavar="DURATION",
                                         help="Apply lazily within this time (e.g. 24h, 90m; "
                                         "default update.window, 24h)."),
    select: Optional[str] = _SELECT,
    exclude: Optional[str] = opt.EXCLUDE,
    timeout: Optional[float] = _TIMEOUT,
    dry_run: bool = _DRY_RUN,
    by: Optional[str] = opt.BY,
) -> int:
    """Pack SRC once, send it to every machine and stage it as release V.

    A release holds directories, regular files and symlinks to its own files;
    anything else (a link to a directory or outside SRC, a device, an absolute or
    '..' name) is refused with exit 2, naming it, before anything is sent; the
    machines check the same rules again. SRC is packed as root without trusting
    its owner: only links owned by root or you are followed to it, members are
    read by directory fd without following links, and a member others cannot
    read is refused (exit 2) rather than shipped readable by all. Machines that already hold the verified
    release are skipped; a transfer cut short resumes from where it stopped.
    Exit 0 when staged everywhere (and, with --urgent, switched and restarted),
    1 when a machine failed (e.g. the artifact arrived corrupted), 3 when machines
    did not answer (they are caught up by the next push or apply), 4 when another
    push/apply/rollback of the job is running.
    """
    from brctl.operations.update.ops import push as do_push
    from brctl.render.update import render_push

    env: Env = ctx.obj
    window_s = opt.parse_duration(window, "--window") if window is not None else None
    uctx = _context(env, select, exclude, timeout, by, audit=not dry_run)
    if dry_run:
        from brctl.operations.update.preview import preview_push
        from brctl.render.update import render_preview

        preview = preview_push(uctx, src, version, urgent=urgent)
        render_preview(env.output, preview)
        return int(preview.exit_code)
    with env.output.progress("push", 2 * len(uctx.targets())) as advance:
        uctx.on_done = advance
        report = do_push(uctx, src, version, rev=rev, urgent=urgent, window_s=window_s)
    render_push(env.output, report)
    return int(report.exit_code)


@app.command("apply")
def apply(
    ctx: typer.Context,
    if_due: bool = typer.Option(False, "--if-due",
                                help="Only when the pending release's window has passed."),
    restart: bool = typer.Option(False, "--restart",
                                 help="Run job.restart_command after switching."),
    timeout: Optional[float] = _TIMEOUT,
    dry_run: bool = _DRY_RUN,
    by: Optional[str] = opt.BY,
) -> int:
    """Switch every machine of the job to the pending release, all or none.

    Lagging machines (unreachable at push time, or new) are sent the release
    first. Without a pending release, machines that drifted are switched back to
    the job's version. Exit 0 switched (or nothing to do), 1 the switch failed
    and was rolled back, 3 machines did not answer (nothing switched), 4 another
    push/apply/rollback of the job is running.
    """
    from brctl.operations.update.ops import apply as do_apply
    from brctl.render.update import render_switch

    env: Env = ctx.obj
    uctx = _context(env, None, None, timeout, by, audit=not dry_run)
    if dry_run:
        from brctl.operations.update.preview import preview_apply
        from brctl.render.update import render_preview

        preview = preview_apply(uctx, if_due=if_due, restart=restart)
        render_preview(env.output, preview)
        return int(preview.exit_code)
    targets = uctx.targets()
    with env.output.progress("apply", 2 * len(targets), [n.name for n in targets]) as advance:
        uctx.on_done = advance  # inspect, then switch, each machine
        report = do_apply(uctx, if_due=if_due, restart=restart)
    render_switch(env.output, report)
    return int(report.exit_code)


@app.command("rollback")
def rollback(
    ctx: typer.Context,
    to: Optional[str] = typer.Option(None, "--to", metavar="V",
                                     help="Release to return to (default: the one before the "
                                     "last update)."),
    restart: bool = typer.Option(False, "--restart",
                                 help="Run job.restart_command after switching."),
    timeout: Optional[float] = _TIMEOUT,
    dry_run: bool = _DRY_RUN,
    by: Optional[str] = opt.BY,
) -> int:
    """Switch every machine back to the previous release (or V), all or none.

    Repeated rollbacks walk back one update each. Exit codes as for apply.
    """
    from brctl.operations.update.ops import rollback as do_rollback
    from brctl.render.update import render_switch

    env: Env = ctx.obj
    uctx = _context(env, None, None, timeout, by, audit=not dry_run)
    if dry_run:
        from brctl.operations.update.preview import preview_rollback
        from brctl.render.update import render_preview

        preview = preview_rollback(uctx, to=to, restart=restart)
        render_preview(env.output, preview)
        return int(preview.exit_code)
    targets = uctx.targets()
    with env.output.progress("rollback", 2 * len(targets), [n.name for n in targets]) as advance:
        uctx.on_done = advance  # inspect, then switch, each machine
        report = do_rollback(uctx, to=to, restart=restart)
    render_switch(env.output, report)
    return int(report.exit_code)


@app.command("status")
def status(
    ctx: typer.Context,
    select: Optional[str] = _SELECT,
    exclude: Optional[str] = opt.EXCLUDE,
    timeout: Optional[float] = _TIMEOUT,
) -> int:
    """Current and pending release per machine, folded; drifted machines highlighted.

    Exit 0 every machine is on the job's version, 1 drift, 3 machines did not answer.
    """
    from brctl.operations.update.ops import status as do_status
    from brctl.render.update import render_status

    env: Env = ctx.obj
    report = do_status(_context(env, select, exclude, timeout))
    render_status(env.output, report)
    return int(report.exit_code)


@app.command("history")
def history(
    ctx: typer.Context,
    limit: Optional[int] = typer.Option(None, "-n", "--limit", metavar="N", min=1,
                                        help="Only the last N events."),
) -> int:
    """Every push, apply and rollback of the job: who, when, version, checksum, outcome."""
    from brctl.core.errors import ExitCode
    from brctl.operations.update.tables import history as do_history
    from brctl.render.update import render_history

    env: Env = ctx.obj
    inv = env.inventory()
    events = do_history(env.store(), inv.job_key, limit)
    render_history(env.output, inv.job_key, events)
    return ExitCode.OK  # a history is an answer, not a finding
