"""The job's ``Topology`` from the inventory (the glue every job-aware command uses)."""

from __future__ import annotations

from collections.abc import Sequence

from brctl.analysis.inventory import Inventory
from brctl.analysis.topology import Topology, TopologyError
from brctl.core.errors import InputError


def job_topology(inv: Inventory, rank_machines: Sequence[str] | None = None) -> Topology:
    """The topology of ``inv.job`` (machine order from ``job.nodes``, GPUs from each node).

    Args:
        inv: the inventory.
        rank_machines: live rank → machine mapping read from the processes, if known.

    Raises:
        InputError: the inventory has no job, or its sizes do not divide.
    """
    if inv.job is None:
        raise InputError(f"{inv.source}: no job: section",
                         hint="add job: nodes/tp/pp (see inventory.example.yaml)")
    job = inv.job
    gpus = [inv.nodes[n].gpus for n in job.nodes]
    try:
        return Topology.build(job.nodes, gpus, tp=job.tp, pp=job.pp, cp=job.cp, ep=job.ep,
                              order=job.order, rank_machines=rank_machines)
    except TopologyError as exc:  # name the file, the key at fault and its line
        head, _, what = exc.message.partition(": ")
        if not head.startswith("job"):
            raise InputError(f"{inv.source}: {exc.message}", hint=exc.hint,
                             file=inv.source) from None
        key = _culprit(inv) if head == "job" else head
        line = inv.lines.get(key)
        at = f"{inv.source}:{line}" if line is not None else inv.source
        raise InputError(f"{at}: {key}: {what}", hint=exc.hint, file=inv.source, key=key,
                         line=line) from None


def _culprit(inv: Inventory) -> str:
    """The first of job.tp, job.cp, job.pp whose product with those before it does not
    divide the job's GPU count (the key a human changes)."""
    assert inv.job is not None
    world = sum(inv.nodes[n].gpus for n in inv.job.nodes)
    block = 1
    for name in ("tp", "cp", "pp"):
        block *= getattr(inv.job, name)
        if world % block:
            return f"job.{name}"
    return "job"
