"""The one context object a command receives (no hidden globals).

The root CLI callback builds an ``Env`` from the global options; commands ask it
for the inventory, a transport, the probe runner and the state store, each created
on first use and closed when the command ends (``close``): the one owner of every
resource's lifetime. Tests build one with a fake transport and string buffers and
pass it to ``brctl.cli.app.run(argv, env=...)``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from brctl.render.output import Output

if TYPE_CHECKING:
    from brctl.analysis.inventory import Inventory
    from brctl.core.transport import Transport
    from brctl.remote.probes import ProbeRunner
    from brctl.remote.slurm.transport import JobRef
    from brctl.state import Store


def state_dir(environ: Mapping[str, str]) -> Path:
    """``$BRCTL_STATE``, else ``$XDG_STATE_HOME/brctl``, else ``~/.local/state/brctl``."""
    if environ.get("BRCTL_STATE"):
        return Path(environ["BRCTL_STATE"]).expanduser()
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "brctl"


def timeout_scale(environ: Mapping[str, str]) -> float:
    """``$BRCTL_TIMEOUT_SCALE`` (default 1): lets slow CI machines stretch timeouts."""
    raw = environ.get("BRCTL_TIMEOUT_SCALE", "1")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):  # NaN fails both
        from brctl.core.errors import UsageError

        raise UsageError(f"$BRCTL_TIMEOUT_SCALE={raw!r}: expected a finite number greater than 0")
    return value


@dataclass
class Env:
    """Global options plus the lazily created inventory, transport, probe runner and store.

    ``transport_given``: a given transport (tests: ``FakeTransport``), the caller's to
    close; by default the run builds a ``RoutingTransport`` for the inventory on first
    use. ``sleep``: how the run waits between sweeps and polls (tests: no real wait).
    """

    inventory_path: str | None = None
    output: Output = field(default_factory=Output)
    debug: bool = False
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    transport_given: Transport | None = None
    sleep: Callable[[float], None] = time.sleep
    _inventory: Inventory | None = None
    _current: Inventory | None = None
    _transport: Transport | None = None
    _probes: ProbeRunner | None = None
    _store: Store | None = None

    def inventory(self, *, as_listed: bool = False, job_may_wait: bool = False) -> Inventory:
        """The validated inventory (exit 2 with a hint when there is none).

        The job is on the machines it runs on now: with ``job.slurm`` the scheduler says
        which (asked once per command, ``operations.slurm.job``); otherwise, when the daemon
        recorded a swap in the state database, its list replaces ``job.nodes`` and one
        warning on stderr names the swaps (``brctl.operations.ledger.members``). ``as_listed``:
        the file as written, resolved with Slurm (the daemon's own commands, which read the
        record). A Slurm job that is not running is exit 3 unless ``job_may_wait`` (or
        ``as_listed``): its machines are unknown, and a stale list would be wrong.
        """
        if self._inventory is None:
            from brctl.load.inventory import find_inventory, load_inventory

            inv = load_inventory(find_inventory(self.inventory_path, dict(self.environ)))
            if inv.job is not None and inv.job.slurm is not None:
                from brctl.operations.slurm.job import Slurm, resolve

                inv, _ = resolve(inv, Slurm(inv.slurm, inv.job.slurm.cluster, self.environ))
            self._inventory = inv
        if as_listed:
            return self._inventory
        job = self._inventory.job
        if job is not None and job.slurm is not None and job.state != "RUNNING" \
                and not job_may_wait:
            from brctl.core.errors import IncompleteError

            raise IncompleteError(f"job {job.name}: {job.source}: not running, so its machines "
                                  "are unknown", hint="brctl nodes shows the job's state; "
                                  "-w NODESET names machines without the job")
        if self._current is None:
            from brctl.operations.ledger.members import current_inventory

            self._current, note = current_inventory(self._inventory, self.state_dir())
            if note:
                self.output.warn(note)
        return self._current

    def transport(self) -> Transport:
        """The transport for this run (ssh opened lazily, only for ssh nodes)."""
        if self._transport is None and self.transport_given is not None:
            self._transport = self.transport_given
        if self._transport is None:
            from brctl.remote.factory import RoutingTransport

            inv = self.inventory(as_listed=True)  # every machine either way; no warning here
            ref = inv.job.slurm if inv.job else None
            job: JobRef | None = None
            if ref:  # only then: brctl.remote.slurm costs a run without Slurm ~10 ms to import
                from brctl.remote.slurm.transport import JobRef

                # the id this command resolved: a name asked again could find a newcomer
                job = JobRef(inv.job.scheduler_id if inv.job and inv.job.scheduler_id else ref.job,
                             ref.name, ref.user, ref.cluster)
            transport = RoutingTransport(
                connect_rate=inv.ssh.connect_rate, slurm_partition=inv.slurm.partition,
                slurm_job=job, environ=self.environ)
            transport.preload(inv.nodes.values())
            self._transport = transport
        return self._transport

    def probes(self) -> ProbeRunner:
        """Ships and runs node-side probes over this run's transport (one per run)."""
        if self._probes is None:
            from brctl.remote.probes import ProbeRunner

            self._probes = ProbeRunner(self.transport())
        return self._probes

    def store(self) -> Store:
        """The state database, opened once on first use and closed when the command ends."""
        if self._store is None:
            from brctl.state import Store

            self._store = Store(self.state_dir())
        return self._store

    def state_dir(self) -> Path:
        """Where the SQLite database and small state files live."""
        return state_dir(self.environ)

    def timeout_scale(self) -> float:
        """Multiplier for timeouts tests depend on."""
        return timeout_scale(self.environ)

    def close(self) -> None:
        """Close the connections and the state database opened during the command."""
        self._probes = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._transport is not None and self._transport is not self.transport_given:
            self._transport.close()  # a given transport is its giver's to close
        self._transport = None
