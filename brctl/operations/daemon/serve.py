"""Wiring of the live daemon: ``brctl daemon run``'s real hooks, notifier, metrics.

``serve`` builds a ``Daemon`` (``operations.daemon``) for the inventory's job over
the real operations (``LiveHooks``), the job adapter, the notifier, the event log
and ``/metrics``, and runs it until SIGTERM or a limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.daemon.policy import pick_standbys
from brctl.analysis.inventory import Inventory
from brctl.core.transport import Transport
from brctl.operations.daemon.hooks import LiveHooks
from brctl.operations.daemon.loop import Daemon
from brctl.operations.daemon.report import DaemonReport, PollResult
from brctl.operations.jobadapter import JobAdapter, Notifier
from brctl.operations.ledger.audit import event_log_path
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store


@dataclass(frozen=True)
class RunOptions:
    """``brctl daemon run`` options."""

    dry_run: bool = False
    max_iterations: Optional[int] = None
    until_step: Optional[int] = None
    duration: Optional[float] = None
    metrics: bool = True


def serve(inv: Inventory, transport: Transport, state_dir: Path, opts: RunOptions, *,
          timeout_scale: float = 1.0, stop: Optional[threading.Event] = None,
          on_event: Optional[Callable[[dict[str, Any]], None]] = None,
          on_poll: Optional[Callable[[PollResult], None]] = None,
          warn: Callable[[str], None] = lambda _m: None,
          environ: Optional[Mapping[str, str]] = None) -> DaemonReport:
    """Build the daemon for ``inv``'s job and run it until a limit or SIGTERM.

    Raises:
        UsageError: the inventory has no job, or no restart_command (without --dry-run).
        RefusedError: another daemon holds the job's lease.
    """
    from brctl.core.errors import UsageError
    from brctl.operations.ledger.state import owner_id

    if inv.job is None:
        raise UsageError(f"daemon: {inv.source} has no job: section",
                         hint="the daemon watches one job; see inventory.example.yaml")
    if inv.job.restart_command is None and inv.job.slurm is None and not opts.dry_run:
        raise UsageError(f"daemon: {inv.source}: job.restart_command is not set",
                         hint="the daemon restarts the job through it (a job.slurm job has "
                         "one built in); or use --dry-run")
    stop = stop or threading.Event()
    from brctl.remote.per_host import PerHost

    # One host's ssh config setting brctl cannot honour fails that host, not every poll.
    transport = PerHost(transport)
    store = Store(state_dir)
    metrics = None
    try:
        state = DaemonState(store, inv.job.name)
        cfg = inv.daemon
        log = event_log_path(cfg, state_dir)
        notifier = Notifier(inv.job.name, cfg.notify_webhook, cfg.notify_command)
        hooks = LiveHooks(inv, transport, store, state_dir, timeout_scale, environ, opts.dry_run)
        daemon = Daemon(inv, state, hooks,
                        JobAdapter(inv, cfg.command_timeout * timeout_scale), notifier=notifier,
                        owner=owner_id(), dry_run=opts.dry_run, event_log=log, on_event=on_event)
        if opts.metrics and cfg.metrics_port:
            from brctl.operations.daemon.metrics import DaemonView, MetricsServer

            def view() -> DaemonView:
                checked = {n for n, (ok, _, _) in state.checks().items() if ok}
                ready = pick_standbys(inv.standby, checked=checked, count=len(inv.standby),
                                      quarantined=state.quarantined(), in_use=daemon.members())
                return DaemonView(dict(daemon.health_status), len(ready), daemon.halted,
                                  daemon.polled, daemon.progress.step)

            try:
                metrics = MetricsServer(state, cfg.metrics_address, cfg.metrics_port, view)
            except OSError as exc:
                warn(f"/metrics not served on {cfg.metrics_address}:{cfg.metrics_port}: "
                     f"{exc.strerror or exc}; the loop runs without it")
        return daemon.run(stop=stop, max_iterations=opts.max_iterations,
                          until_step=opts.until_step, duration=opts.duration, on_poll=on_poll)
    finally:
        if metrics is not None:
            metrics.close()
        store.close()
