"""The job adapter: how brctl restarts, stops, asks about and drains the job.

``job.restart_command``, ``stop_command``, ``status_command`` and ``evict_command``
are argv templates (never a shell) run on the controller with a timeout; their
process group is killed when they outlive it. Placeholders are filled from the
job's *current* machines (after standby swaps): ``{nodes}`` ``{nodes_folded}``
``{nnodes}`` ``{nproc_per_node}`` ``{master_addr}`` ``{master_port}`` ``{job}``,
plus ``{node}`` and ``{reason}`` for evict. Examples (Slurm requeue with the
evicted machines excluded, a Kubernetes patch, a launcher script) are in
``inventory.example.yaml``.

Also the notifier: one JSON message per action and refusal, POSTed to
``daemon.notify_webhook`` and/or given on stdin to ``daemon.notify_command``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from brctl.analysis.inventory import Inventory, Template
from brctl.analysis.redact import redact_text
from brctl.core.nodeset import fold
from brctl.core.templates import render_argv
from brctl.core.transport import Node, NodeState
from brctl.operations.ledger.hookrun import HookRun as HookRun  # its old home: re-exported
from brctl.remote.local import LocalTransport

if TYPE_CHECKING:
    from brctl.operations.slurm.hooks import SlurmHooks
    from brctl.operations.slurm.job import SlurmJob

MASTER_PORT = 29500  # torch.distributed's customary rendezvous port
_OUTPUT_KEEP = 2000  # characters of a hook's output kept in the action log


def rendezvous_address(node: Node) -> str:
    """The address a group's first machine is reached at for a rendezvous
    (``{master_addr}``): 127.0.0.1 for a local "machine" (its name need not resolve)."""
    return "127.0.0.1" if node.connection == "local" else node.address


def placeholder_values(inv: Inventory, group: Sequence[str], *, port: int = MASTER_PORT,
                       nproc_per_node: Optional[int] = None) -> dict[str, object]:
    """The placeholders of a job or group running on ``group`` (rank order), for every
    argv template brctl fills (restart/stop/evict/status commands, replay workloads):
    ``{nodes}`` ``{nodes_folded}`` ``{nnodes}`` ``{nproc_per_node}`` ``{master_addr}``
    ``{master_port}``. The one builder, so they never disagree."""
    first = inv.nodes.get(group[0]) if group else None
    return {
        "nodes": ",".join(group),
        "nodes_folded": fold(group),
        "nnodes": len(group),
        "nproc_per_node": nproc_per_node if nproc_per_node is not None else (first.gpus if first else 1),
        "master_addr": rendezvous_address(first) if first else "",
        "master_port": port,
    }


# The controller as a "machine" of LocalTransport: hooks run here, with brctl's environment.
CONTROLLER = Node(name="controller", address="127.0.0.1", connection="local")


def run_hook(argv: Sequence[str], timeout: float, stdin: Optional[bytes] = None) -> HookRun:
    """Run ``argv`` on the controller (LocalTransport: own session, group killed after
    ``timeout``); output redacted (secrets from the environment) and trimmed."""
    res = LocalTransport().run(CONTROLLER, list(argv), timeout=timeout, stdin=stdin)

    def keep(text: str) -> str:
        return redact_text(text, os.environ)[-_OUTPUT_KEEP:]

    code = None if res.state is NodeState.TIMEOUT else res.exit_code
    return HookRun(tuple(argv), code, keep(res.stdout), keep(res.stderr), res.seconds)


class JobAdapter:
    """Runs the job's hooks for the current machine list: the ``job.*_command`` templates,
    else, for a ``job.slurm`` job, the built-in Slurm hooks (``operations.slurm.hooks``)."""

    def __init__(self, inv: Inventory, timeout: float) -> None:
        """Args: inv: the inventory (job hooks, machine addresses); timeout: seconds per hook."""
        assert inv.job is not None
        self.inv = inv
        self.job = inv.job
        self.timeout = timeout
        self.slurm: Optional[SlurmHooks] = None
        if inv.job.slurm is not None:
            from brctl.operations.slurm.hooks import SlurmHooks
            from brctl.operations.slurm.job import Slurm

            wanted = inv.job.scheduler_id or str(inv.job.slurm.job or "")
            self.slurm = SlurmHooks(Slurm(inv.slurm, inv.job.slurm.cluster), wanted)

    def values(self, members: Sequence[str]) -> dict[str, object]:
        """Placeholder values for the job running on ``members``."""
        return {"job": self.job.name, **placeholder_values(self.inv, members)}

    def _run(self, template: Optional[Template], values: Mapping[str, object]) -> Optional[HookRun]:
        if template is None:
            return None
        return run_hook(render_argv(template, values), self.timeout)

    def restart(self, members: Sequence[str], version: str = "", reason: str = "") -> Optional[HookRun]:
        """Run ``restart_command`` (None when there is none): the one restart path, for the
        daemon and ``brctl update --restart`` alike (``{version}`` the job's release)."""
        if self.job.restart_command is None and self.slurm is not None:
            return self.slurm.restart(members)
        return self._run(self.job.restart_command,
                         {**self.values(members), "version": version, "reason": reason})

    def stop(self, members: Sequence[str]) -> Optional[HookRun]:
        """Run ``stop_command`` (None when there is none)."""
        if self.job.stop_command is None and self.slurm is not None:
            return self.slurm.stop()
        return self._run(self.job.stop_command, self.values(members))

    def evict_argv(self, members: Sequence[str], node: str, reason: str) -> Optional[list[str]]:
        """The ``evict_command`` argv for ``node`` (None when there is none): what a dry
        run shows and ``evict`` runs."""
        template = self.job.evict_command
        return None if template is None else render_argv(
            template, {**self.values(members), "node": node, "reason": reason})

    def unevict_argv(self, members: Sequence[str], node: str) -> Optional[list[str]]:
        """The ``unevict_command`` argv for ``node`` (None when there is none)."""
        template = self.job.unevict_command
        return None if template is None else render_argv(
            template, {**self.values(members), "node": node})

    def evict_preview(self, members: Sequence[str], node: str, reason: str
                      ) -> Optional[tuple[str, ...]]:
        """What ``evict`` would run for ``node``: the evict_command, else for a
        ``job.slurm`` job the built-in drain; None when neither."""
        argv = self.evict_argv(members, node, reason)
        if argv is None and self.slurm is not None:
            return self.slurm.drain_argv(node, reason)
        return tuple(argv) if argv is not None else None

    def unevict_preview(self, members: Sequence[str], node: str) -> Optional[tuple[str, ...]]:
        """What ``unevict`` would run for ``node`` (the unevict_command, else the Slurm resume)."""
        argv = self.unevict_argv(members, node)
        if argv is None and self.slurm is not None:
            return self.slurm.resume_argv(node)
        return tuple(argv) if argv is not None else None

    def evict(self, members: Sequence[str], node: str, reason: str) -> Optional[HookRun]:
        """Run ``evict_command`` for ``node`` (None when there is none; the built-in Slurm
        drain for a ``job.slurm`` job without one)."""
        argv = self.evict_argv(members, node, reason)
        if argv is None and self.slurm is not None:
            return self.slurm.evict(node, reason)
        return None if argv is None else run_hook(argv, self.timeout)

    def unevict(self, members: Sequence[str], node: str) -> Optional[HookRun]:
        """Run ``unevict_command`` for ``node`` (None when there is none; the built-in Slurm
        resume for a ``job.slurm`` job without one)."""
        argv = self.unevict_argv(members, node)
        if argv is None and self.slurm is not None:
            return self.slurm.unevict(node)
        return None if argv is None else run_hook(argv, self.timeout)

    def running(self, members: Sequence[str]) -> Optional[bool]:
        """``status_command``: exit 0 running, anything else not; None without one."""
        if self.job.status_command is None and self.slurm is not None:
            return _unless_unanswered(self.slurm.running)
        run = self._run(self.job.status_command, self.values(members))
        return None if run is None else run.ok

    def allocation(self) -> Optional[SlurmJob]:
        """The job as its scheduler shows it now (state, machines while it runs, restart
        count); None without a built-in scheduler or when it gave no answer."""
        if self.slurm is None:
            return None
        from brctl.core.errors import BrctlError

        try:
            return self.slurm.allocation()
        except BrctlError:
            return None

    def evicted(self, node: str) -> Optional[bool]:
        """Whether the scheduler shows ``node`` drained by brctl; None when it cannot say
        (an evict_command is opaque)."""
        if self.job.evict_command is None and self.slurm is not None:
            return _unless_unanswered(lambda: self.slurm.evicted(node) if self.slurm else None)
        return None

    def restarted_on(self, members: Sequence[str]) -> Optional[bool]:
        """Whether the scheduler shows the job restarted on exactly ``members``; None when
        it cannot say (a restart_command is opaque)."""
        if self.job.restart_command is None and self.slurm is not None:
            return _unless_unanswered(
                lambda: self.slurm.restarted_on(members) if self.slurm else None)
        return None


def _unless_unanswered(ask: Callable[[], Optional[bool]]) -> Optional[bool]:
    """The scheduler's answer, or None when it gave none (not answering is not "no")."""
    from brctl.core.errors import BrctlError

    try:
        return ask()
    except BrctlError:
        return None


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: a webhook's path and query often are its secret."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}/…"


def _without_secrets(text: str, url: str) -> str:
    """``text`` with the URL, its path, query and credentials cut out (an error message
    from urllib or http.client may quote any of them)."""
    parts = urllib.parse.urlsplit(url)
    for secret in sorted({url, parts.path, parts.query, parts.netloc, parts.password or ""},
                         key=len, reverse=True):
        if len(secret) > 1:
            text = text.replace(secret, "…")
    return text


@dataclass(frozen=True)
class Notifier:
    """Sends one message per action or refusal; failures are returned, never raised."""

    job: str
    webhook: Optional[str]
    command: Optional[Template]
    timeout: float = 10.0

    def send(self, kind: str, state: str, node: Optional[str], reason: str,
             detail: Mapping[str, Any]) -> list[str]:
        """Deliver the message; returns the delivery errors (empty when all went out).

        Best effort: whatever a webhook answers (no HTTP at all, a reset, a malformed
        redirect) or a notify_command does is an error string, never an exception, and
        the webhook URL appears only redacted.
        """
        message = {"job": self.job, "kind": kind, "state": state, "node": node, "reason": reason,
                   "detail": dict(detail), "at": time.time()}
        body = json.dumps(message, default=str).encode()
        errors = []
        if self.webhook:
            try:
                request = urllib.request.Request(self.webhook, data=body, method="POST",
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                    resp.read(65536)
            except Exception as exc:  # http.client raises far more than OSError
                errors.append(f"webhook {redact_url(self.webhook)}: {type(exc).__name__}: "
                              f"{_without_secrets(str(exc), self.webhook)[:200]}")
        if self.command is not None:
            try:
                argv = render_argv(self.command, {"job": self.job, "kind": kind, "state": state,
                                                  "node": node or "", "reason": reason})
                run = run_hook(argv, self.timeout, stdin=body)
                if not run.ok:
                    errors.append(f"notify_command exited {run.exit_code}: {run.output[-200:]}")
            except Exception as exc:  # a page is never worth a dead daemon
                errors.append(f"notify_command: {type(exc).__name__}: {str(exc)[:200]}")
        return errors
