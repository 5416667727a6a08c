"""``brctl daemon run|status``: the unattended detect → diagnose → act loop."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env

app = typer.Typer(help="Run the unattended loop (run) or read its records (status).",
                  no_args_is_help=True)


def register(root: typer.Typer) -> None:
    """Add the command group to the root app."""
    root.add_typer(app, name="daemon",
                   help="Unattended loop: detect, diagnose, evict/reattempt/roll back, restart.")


@app.command("run")
def run(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Decide and record, but run no action or hook."),
    max_iterations: Optional[int] = typer.Option(None, "--max-iterations", metavar="N",
                                                 help="Stop after N polls."),
    until_step: Optional[int] = typer.Option(None, "--until-step", metavar="STEP",
                                             help="Stop once the job logs this step."),
    duration: Optional[float] = typer.Option(None, "--for", metavar="SECONDS", callback=opt.seconds,
                                             help="Stop after this long."),
    no_metrics: bool = typer.Option(False, "--no-metrics", help="Do not serve /metrics."),
) -> int:
    """Watch the job and act on what breaks, until SIGTERM or a limit.

    Each poll (daemon.poll_interval) sweeps health on the job's machines and reads
    the step from its logs. A confident hardware fault evicts at once; a stopped
    job goes to the diagnose ladder; a stall (daemon.stall_after) to stack
    analysis; then evict (swapping in a checked standby, restoring its checkpoint
    shards and pending updates), reattempt, roll back or replay (brctl replay on
    the stopped job: evict the machines it proves faulty, or reattempt and page a
    human with its evidence), and restart through job.restart_command (a
    job.slurm job without one: requeued held, pinned to the planned machines,
    released; Slurm's allocation wins over the recorded swaps and its state is a
    signal: a job that is over has stopped). A machine evicted by hand (brctl
    evict) is swapped out at the next poll.
    Every step is recorded before and after it runs, under the job's lease: a
    daemon restarted after a crash or kill -9 takes over at once from its dead
    predecessor and finishes what it left, except a step that may have run and
    cannot be checked (a restart or stop command; Slurm's built-in hooks can be
    checked): that plan is abandoned and a human paged, never run twice. A
    refusal or an abandoned plan stops further actions; the daemon stays up and
    keeps reporting; the halt outlives the daemon (kill -9, OOM, a systemd
    restart) until a human lifts it with brctl daemon rearm. --dry-run takes no
    lease and records nothing. With
    daemon.metrics_port, /metrics (Prometheus text; every
    family labelled job) serves brctl_node_health{node,status},
    brctl_daemon_events_total{kind}, brctl_daemon_actions_total{kind,state} (actions
    that reached each final state over the job's whole history: it never
    decreases), brctl_daemon_actions_in_flight{kind,state} (begun, not finished),
    brctl_standby_ready, brctl_ettr{window}, brctl_daemon_halted (1 while a cap holds
    the daemon back), brctl_daemon_last_poll_timestamp_seconds, brctl_job_step (the
    stall alert: changes(brctl_job_step[30m]) == 0) and brctl_build_info{version,python}.
    SIGTERM stops after the current step. Exit 0: nothing
    happened; 1: incidents were handled; 4: an action was refused or a plan
    abandoned (caps, restarts without progress, no standby), another daemon
    holds the job's lease, or this one lost it.
    """
    import signal
    import threading

    from brctl.core.errors import UsageError
    from brctl.operations.daemon.serve import RunOptions, serve
    from brctl.render.daemon import event_line, render_run

    env: Env = ctx.obj
    if max_iterations is not None and max_iterations <= 0:  # --for: its callback
        raise UsageError(f"--max-iterations {max_iterations}: expected a number greater than 0")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        report = serve(env.inventory(), env.transport(), env.state_dir(),
                       RunOptions(dry_run, max_iterations, until_step, duration, not no_metrics),
                       timeout_scale=env.timeout_scale(), stop=stop,
                       on_event=lambda doc: event_line(env.output, doc), warn=env.output.warn,
                       environ=env.environ)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    render_run(env.output, report)
    return int(report.exit_code)


@app.command("rearm")
def rearm(
    ctx: typer.Context,
    reason: str = typer.Option(..., "--reason", metavar="TEXT",
                               help="What the human did (goes to the log and the page)."),
    by: Optional[str] = typer.Option(None, "--by", metavar="NAME",
                                     help="Operator recorded (default: $SUDO_USER or $USER)."),
) -> int:
    """Lift the daemon's halt once a human has dealt with what it halted on.

    A refused or abandoned plan halts the daemon: it stays up, reports and acts on
    nothing, and a restarted daemon (kill -9, OOM, systemd) starts halted too, so
    an incident a human owns is never planned again behind their back. rearm
    records who lifted the halt and why (event rearmed, announced like a hand
    evict); the running daemon acts again from its next poll. Nothing is recorded
    when the daemon is not halted. Exit 0.
    """
    from brctl.operations.evict import rearm as do_rearm
    from brctl.operations.ledger.audit import Audit
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.update.ops import who
    from brctl.render.daemon import render_rearm

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    audit = Audit.of(inv, DaemonState(env.store(), inv.job_key), env.state_dir(),
                     by or who(env.environ))
    report = do_rearm(audit, reason)
    render_rearm(env.output, report)
    return int(report.exit_code)


@app.command("status")
def status(
    ctx: typer.Context,
    events: int = typer.Option(20, "--events", metavar="N", help="Recent events and actions shown."),
    since: Optional[str] = typer.Option(None, "--since", metavar="WHEN",
                                        help="Only records since WHEN: an age (30m, 2h, 7d) or a "
                                             "date (2026-11-30, 2026-11-30T22:00)."),
    node: Optional[str] = typer.Option(None, "--node", metavar="NODE",
                                       help="Only records about this machine."),
    kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND",
                                       help="Only records of this kind (decision, gpu_fault, "
                                            "evict, restart, ...)."),
    follow: bool = typer.Option(False, "--follow",
                                help="Keep printing new records as the daemon writes them "
                                     "(Ctrl-C ends)."),
) -> int:
    """Show the daemon's lease, last poll, every recorded event and action, quarantines.

    Each decision shows what was decided and why; a step that did nothing says so
    (skipped: no backup). Times have a date and zone (--utc for UTC). Reads the
    state database only. Exit 0 when a daemon holds the job's lease, 1 when none
    does (the job is not being watched).
    """
    import time

    from brctl.core.errors import UsageError
    from brctl.operations.daemon.report import follow as follow_status
    from brctl.operations.daemon.report import read_status
    from brctl.render.daemon import StatusView, render_status, status_json

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    if events < 1:
        raise UsageError(f"--events {events}: expected at least 1")
    view = StatusView(since=_since(since, time.time()) if since else 0.0, node=node, kind=kind)
    limit = max(events, 100_000) if since else events
    report = read_status(inv, env.store(), events=limit)
    env.output.ndjson = env.output.ndjson or follow  # --follow --json: NDJSON, one per line
    render_status(env.output, report, view)
    if not follow:
        return int(report.exit_code)
    for fresh in follow_status(inv, env.store(), report, events=events,
                               every=inv.daemon.poll_interval, sleep=env.sleep):
        shown = status_json(fresh, view)
        if shown["events"] or shown["actions"]:  # a poll that found nothing new prints nothing
            render_status(env.output, fresh, view, header=False)
    raise AssertionError("unreachable: --follow ends only when interrupted")


def _since(text: str, now: float) -> float:
    """``30m``/``2h``/``7d`` ago, or an ISO date or time (local unless it says a zone)."""
    import datetime

    from brctl.commands._options import parse_duration
    from brctl.core.errors import UsageError

    try:
        return now - parse_duration(text, "--since")
    except UsageError:
        pass  # not an age: a date
    try:
        at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {text}: expected an age (30m, 2h, 7d) or a date "
                         "(2026-11-30 or 2026-11-30T22:00)") from None
    return (at if at.tzinfo else at.astimezone()).timestamp()
