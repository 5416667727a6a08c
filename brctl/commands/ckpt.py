"""``brctl ckpt plan|verify|backup|restore``: checkpoint backups outside every parallel group."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.commands._complete import node_names
from brctl.env import Env

PLAN_HELP = ("Placement file to use instead of brctl's own plan "
             "(YAML or JSON: placements: [{node, backup_node}]).")


def register(app: typer.Typer) -> None:
    """Add the ``ckpt`` command group to the root app."""
    sub = typer.Typer(no_args_is_help=True, help=(
        "Place checkpoint backups outside every parallel group, prove it, and copy shards.\n\n"
        "Each machine's shards get a second copy on a peer that shares no TP/CP/EP/DP/PP "
        "group with it, so evicting any one group never loses state."))
    sub.command("plan")(plan_command)
    sub.command("verify")(verify_command)
    sub.command("backup")(backup_command)
    sub.command("restore")(restore_command)
    app.add_typer(sub, name="ckpt", help="Checkpoint backup placement, proof, backup and restore.")


def _backups(env: Env, plan_file: Optional[str]) -> dict[str, str]:
    from brctl.operations.ckpt import ops

    inv = env.inventory()
    return ops.read_plan_file(plan_file, inv) if plan_file else ops.plan(inv).backups()


def plan_command(
    ctx: typer.Context,
    fmt: str = typer.Option("table", "--format", metavar="FORMAT",
                            help="table, json or yaml (yaml is for training code)."),
) -> int:
    """Pick a backup peer for every job machine (pairs, balanced, rack-aware).

    A peer shares no TP/CP/EP/DP/EDP/PP group with any rank on the machine. When the
    shape allows none (e.g. PP=1: the DP group spans every machine), the best fallback
    is given and marked as not meeting the rule. Exit 0 when every placement meets
    the rule, 1 when some do not.
    """
    from brctl.core.errors import UsageError
    from brctl.operations.ckpt import ops
    from brctl.render.ckpt import render_plan

    env: Env = ctx.obj
    if fmt not in ("table", "json", "yaml"):
        raise UsageError(f"--format {fmt}: expected table, json or yaml")
    inv = env.inventory()
    report = ops.plan_report(inv)
    render_plan(env.output, report, "json" if env.output.json else fmt)
    return int(report.exit_code)


def verify_command(
    ctx: typer.Context,
    plan_file: Optional[str] = typer.Option(None, "--plan", metavar="FILE", help=PLAN_HELP),
) -> int:
    """Evict every parallel group (and every machine) and check each shard keeps a copy.

    Also gives the exact probability that k = 1..4 simultaneous random machine failures
    lose some shard. Exit 0 when no single eviction loses a shard, 1 otherwise.
    """
    from brctl.operations.ckpt import ops
    from brctl.render.ckpt import render_verify

    env: Env = ctx.obj
    result = ops.verify(env.inventory(), _backups(env, plan_file))
    render_verify(env.output, result)
    return int(result.exit_code)


def backup_command(
    ctx: typer.Context,
    select: Optional[str] = opt.nodes("the job's machines"),
    plan_file: Optional[str] = typer.Option(None, "--plan", metavar="FILE", help=PLAN_HELP),
    parallel: Optional[int] = typer.Option(None, "--parallel", metavar="N",
                                           help="File copies in flight (default: ckpt.parallel)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Show each step and file that would be copied, from where "
                                      "to where; write nothing."),
) -> int:
    """Copy each machine's newest complete step to its backup peer, checksummed.

    Files stream node → controller → node (nodes need not reach each other), land under
    a temp name and are renamed once their sha256 matches; the peer writes a manifest last, so
    a partial copy is never taken for complete. Rerunning resumes: files already there
    with the right sha256 are not sent again. Copies go to ckpt.backup_dir (default:
    ckpt.dir + ".brctl-backup", root-owned 0700); symlinks in ckpt.dir are never
    followed. --dry-run reads each machine's newest complete step and what its peer
    already holds, and lists the files it would send, from where to where (state
    planned); it creates, sends and writes nothing. Exit 0 when every copy is complete
    (or planned), 1 when one failed or a machine had no step, 3 when a node could not
    be reached, 4 when one was refused (an unsafe backup root, a bad name in a node's
    answer).
    """
    from brctl.core.errors import UsageError
    from brctl.core.nodeset import select as pick
    from brctl.operations.ckpt import ops
    from brctl.render.ckpt import render_copies

    env: Env = ctx.obj
    inv = env.inventory()
    if parallel is not None and parallel < 1:
        raise UsageError(f"--parallel {parallel}: expected at least 1")
    backups = _backups(env, plan_file)
    nodes = pick(list(backups), select, None, inv.group) if select else None
    if nodes is not None and not nodes:
        raise UsageError(f"-w {select}: selects no job machine")
    with env.output.stages("ckpt backup") as track:
        report = ops.backup(env.transport(), inv, backups, nodes=nodes, parallel=parallel,
                            dry_run=dry_run, track=track)
    render_copies(env.output, "ckpt.backup", report)
    return int(report.exit_code)


def restore_command(
    ctx: typer.Context,
    to: str = typer.Option(..., "--to", metavar="NODE", autocompletion=node_names,
                           help="The replacement machine."),
    evicted: str = typer.Option(..., "--for", metavar="NODE", autocompletion=node_names,
                                help="The machine whose shards to restore."),
    source: Optional[str] = typer.Option(None, "--from", metavar="NODE", autocompletion=node_names,
                                         help="Take the copy from this node (default: the planned peer)."),
    plan_file: Optional[str] = typer.Option(None, "--plan", metavar="FILE", help=PLAN_HELP),
    parallel: Optional[int] = typer.Option(None, "--parallel", metavar="N",
                                           help="File copies in flight (default: ckpt.parallel)."),
    force: bool = typer.Option(False, "--force",
                               help="Restore onto a live member of the job (replaces its own shards)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Find and check the copy, show what would land where; "
                                      "write nothing."),
    by: Optional[str] = opt.BY,
) -> int:
    """Put an evicted machine's newest verified backup onto a replacement machine.

    The peer's copy is re-hashed first (a corrupted or truncated step is skipped for the
    previous one), received into a fresh staging dir in ckpt.dir on the target, checked
    there, given the owner and group of ckpt.dir and renamed into place. A --to that is a
    member of the job is refused unless --force. The outcome goes to the audit trail
    (the daemon's events and event log) and the daemon's notifier with the operator.
    --dry-run finds and re-hashes the copy it would restore, says whether the target
    already has that step (it would be moved aside) and lists the files, from where to
    where (state planned); it stages, sends and records nothing. Exit 0 when restored
    and verified (or planned), 1
    when no good copy exists, 3 when unreachable, 4 when refused (a live member, a
    safety rule on a node, a bad name in a node's answer).
    """
    from brctl.operations.ckpt import ops
    from brctl.operations.ledger.audit import Audit
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.update.ops import who
    from brctl.render.ckpt import render_copies

    env: Env = ctx.obj
    inv = env.inventory()
    audit = None if dry_run else Audit.of(inv, DaemonState(env.store(), inv.job_key),
                                          env.state_dir(), by or who(env.environ))
    with env.output.stages("ckpt restore") as track:
        report = ops.restore(env.transport(), inv, _backups(env, plan_file), target=to,
                             evicted=evicted, source=source, parallel=parallel, force=force,
                             dry_run=dry_run, audit=audit, track=track)
    render_copies(env.output, "ckpt.restore", report)
    return int(report.exit_code)
