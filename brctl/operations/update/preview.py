"""``--dry-run`` of ``brctl update push|apply|rollback``: what would happen, read-only.

The preview makes the same choices as the real command (the pending release, the
rollback target, the restart hook's argv) from the state database, then stops:
nothing is packed, sent, switched, recorded or run, and no machine is contacted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.update import check_version, is_due
from brctl.core.errors import ExitCode, InputError
from brctl.core.nodeset import fold
from brctl.core.templates import render_argv
from brctl.operations.jobadapter import JobAdapter
from brctl.operations.update.ops import UpdateContext, rollback_choice
from brctl.operations.update.tables import job_state


@dataclass(frozen=True)
class Preview:
    """What ``update ACTION`` would do: in order, with the restart hook's exact argv."""

    action: str  # push | apply | rollback
    job: str
    version: Optional[str]  # the release it would stage or switch to (None: nothing to do)
    from_version: Optional[str]  # the job's recorded version now
    machines: tuple[str, ...]
    steps: tuple[str, ...]
    restart: Optional[tuple[str, ...]]  # the argv job.restart_command would run, if it would

    exit_code = ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """``{action, job, version, from_version, members, steps, restart, dry_run}``."""
        return {"action": self.action, "job": self.job, "version": self.version,
                "from_version": self.from_version, "members": list(self.machines),
                "steps": list(self.steps), "restart": list(self.restart) if self.restart else None,
                "dry_run": True}


def _restart_argv(ctx: UpdateContext, version: str, reason: str) -> Optional[tuple[str, ...]]:
    inv = ctx.inventory
    if inv.job is None or inv.job.restart_command is None:
        return None
    adapter = JobAdapter(inv, ctx.timeout or inv.ssh.command_timeout)
    values = {**adapter.values(list(inv.job.nodes)), "version": version, "reason": reason}
    return tuple(render_argv(inv.job.restart_command, values))


def _switch(ctx: UpdateContext, action: str, version: str, current: Optional[str], restart: bool,
            steps: list[str]) -> Preview:
    machines = tuple(n.name for n in ctx.targets())
    steps.append(f"switch {fold(machines)} from {current or 'no recorded release'} to {version}, "
                 "all or none (machines already on it are left alone)")
    argv = _restart_argv(ctx, version, f"update {action} {version}") if restart else None
    if restart:
        steps.append("run job.restart_command" if argv else "restart: job.restart_command is not set")
    return Preview(action, ctx.job, version, current, machines, tuple(steps), argv)


def preview_push(ctx: UpdateContext, src: str, version: str, *, urgent: bool) -> Preview:
    """``update push --dry-run``: the release it would stage and, with ``urgent``, switch to."""
    check_version(version)
    if not Path(src).exists():
        raise InputError(f"update push: {src}: no such file or directory")
    state = job_state(ctx.store, ctx.job)
    targets = tuple(n.name for n in ctx.targets())
    steps = [f"pack {src} once", f"send it to {fold(targets)} and stage it as releases/{version} "
             "(machines that hold it verified are skipped)"]
    if not urgent:
        steps.append(f"leave {version} pending until brctl update apply or its window")
        return Preview("push", ctx.job, version, state.version, targets, tuple(steps), None)
    # The urgent switch is job-wide even when -w narrowed the push, as in the real push.
    return _switch(replace(ctx, nodes=None), "push", version, state.version, True, steps)


def preview_apply(ctx: UpdateContext, *, if_due: bool, restart: bool) -> Preview:
    """``update apply --dry-run``: the release it would switch to, or why nothing."""
    state = job_state(ctx.store, ctx.job)
    pending = state.pending
    if pending is not None and (not if_due or is_due(pending, ctx.now())):
        return _switch(ctx, "apply", pending.version, state.version, restart, [])
    if state.version is not None and not if_due:
        return _switch(ctx, "apply", state.version, state.version, restart,
                       [f"bring machines that drifted back to {state.version}"])
    why = "the pending release is not due yet" if pending else "nothing was pushed"
    return Preview("apply", ctx.job, None, state.version, (), (f"nothing: {why}",), None)


def preview_rollback(ctx: UpdateContext, *, to: Optional[str], restart: bool) -> Preview:
    """``update rollback --dry-run``: the release it would return to.

    Raises:
        InputError: no earlier release, or ``to`` was never pushed (as the real rollback).
    """
    target, _sha256, state = rollback_choice(ctx, to)
    return _switch(ctx, "rollback", target, state.version, restart, [])
