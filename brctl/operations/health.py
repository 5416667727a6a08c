"""The health sweep: probe every machine once, judge, remember the sample.

This is the library the daemon calls every poll (with its long-lived transport,
probe runner and store) and what ``brctl health`` renders::

    from brctl.operations.health import sweep
    report = sweep(inv, transport, inv.job_nodes(), store, runner=runner)
    for node, reason in report.evict_candidates().items():
        ...  # evict: a confident hardware signal, no diagnosis needed

``sweep`` runs ``brctl.diagnostics.health_probe`` on the nodes in one fan-out,
evaluates each document with ``brctl.analysis.health`` against the previous
sample of that node (counters for deltas, the kernel-log cursor, this boot's
Xids) kept in the state database (table ``health_samples``), writes the new
samples in one transaction and returns a ``HealthReport``. It never prints.

Confident eviction signal (``HealthReport.evict_candidates``): a node is a
candidate when a check failed with a hardware cause no retry fixes: GPUs
missing, volatile uncorrectable ECC, retirement/remap pending or failed, a
driver-requested recovery action, an evict-class Xid this boot, an inactive
NVLink, an RDMA port down or flapping, a configured NIC down. Heat, throttling,
disk space and a missing training process are findings, not eviction signals.
A node that did not answer is ``incomplete``, never a candidate (no verdict).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union, get_args

from brctl.analysis.health.checks import (
    FAIL,
    GPU_CHECKS,
    OK,
    UNKNOWN,
    WARN,
    Check,
    Sample,
    Status,
    apply_process_rule,
    evaluate,
    eviction_reason,
    node_status,
    process_pids,
)
from brctl.analysis.health.doc import parse
from brctl.analysis.inventory import Inventory
from brctl.core.errors import ExitCode, exit_code_of
from brctl.core.transport import Node, NodeState, RunResult, Transport
from brctl.remote.probes import ProbeResult, ProbeRunner
from brctl.state import Component, Store

PROBE = "brctl.diagnostics.health_probe"
COMPONENT = Component("health", [
    "CREATE TABLE health_samples ("
    " node TEXT PRIMARY KEY,"
    " sample TEXT NOT NULL,"  # analysis.health.checks.Sample as JSON
    " updated REAL NOT NULL)",
])


# No verdict: the transport state that stopped the probe, or "error" (its answer was unusable).
NoVerdict = Literal["timeout", "unreachable", "auth", "hostkey", "refused", "error"]
_NO_VERDICT: dict[str, NoVerdict] = {s: s for s in get_args(NoVerdict)}


@dataclass(frozen=True)
class NodeHealth:
    """One machine's verdict.

    Attributes:
        status: ok | warn | unknown | fail (the worst check), or the transport state
            (unreachable, timeout, auth, hostkey, refused) or ``error`` (the probe ran but
            returned nothing usable).
        checks: the checks in report order (empty when the probe gave no document).
        error: why there is no verdict, when ``status`` is not ok/warn/fail.
        seconds: wall time of the probe round trip seen from the controller.
    """

    node: str
    status: Union[Status, NoVerdict]
    checks: tuple[Check, ...]
    error: Optional[str] = None
    seconds: float = 0.0

    @property
    def answered(self) -> bool:
        """The probe produced a verdict."""
        return self.status in (OK, WARN, UNKNOWN, FAIL)

    def to_json(self) -> dict[str, Any]:
        """``{status, checks: [{name, status, message}], error, seconds}``."""
        return {"status": self.status, "checks": [c.to_json() for c in self.checks],
                "error": self.error, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class HealthReport:
    """Every swept machine's verdict, in the order swept."""

    nodes: dict[str, NodeHealth]

    def evict_candidates(self) -> dict[str, str]:
        """Machines with a confident eviction signal → the reason (see module docstring)."""
        out = {}
        for name, health in self.nodes.items():
            reason = eviction_reason(health.checks)
            if reason:
                out[name] = reason
        return out

    def incomplete(self) -> list[str]:
        """Machines with no verdict (unreachable, timed out, refused, probe failed)."""
        return [n for n, h in self.nodes.items() if not h.answered]

    def unknown(self) -> list[str]:
        """Machines where a configured check could not look (status ``unknown``)."""
        return [n for n, h in self.nodes.items()
                if any(c.status == UNKNOWN for c in h.checks)]

    @property
    def exit_code(self) -> ExitCode:
        """4 if a machine was refused (a safety rule), else 3 if any machine gave no verdict
        or a check could not look, else 1 if any check failed, else 0."""
        return exit_code_of(
            refused=any(h.status == NodeState.REFUSED.value for h in self.nodes.values()),
            incomplete=bool(self.incomplete() or self.unknown()),
            findings=any(h.status == FAIL for h in self.nodes.values()))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.health/1``."""
        return {"nodes": {n: h.to_json() for n, h in self.nodes.items()},
                "evict": self.evict_candidates(), "incomplete": self.incomplete(),
                "unknown": self.unknown()}


def probe_request(inv: Inventory, node: Node, before: Optional[Sample]) -> dict[str, Any]:
    """The JSON request for one node's probe (only what the enabled checks need)."""
    cfg = inv.health
    enabled = set(cfg.checks)
    parts = []
    if enabled.intersection(GPU_CHECKS) and node.gpus > 0:
        parts.append("nvml")
    for check, part in (("xid", "kernel_log"), ("ib", "ib"), ("net", "net"), ("disk", "disk")):
        if check in enabled:
            parts.append(part)
    in_job = inv.job is not None and node.name in inv.job.nodes
    if "process" in enabled and in_job:
        parts.append("process")
    return {
        "root": cfg.root.replace("{node}", node.name),
        "checks": parts,
        "kernel_logs": list(cfg.kernel_logs),
        "xid_cursor": dict(before.xid_cursor) if before is not None else {},
        "ib_devices": list(cfg.ib_devices),
        "interfaces": list(cfg.interfaces),
        "disk_paths": list(cfg.disk_paths),
        "process_match": inv.job.process_match if inv.job is not None and in_job else None,
    }


def load_samples(store: Store, nodes: Sequence[str]) -> dict[str, Sample]:
    """The previous sample of each node that has one."""
    store.migrate(COMPONENT)
    out = {}
    for row in store.query("SELECT node, sample FROM health_samples"):
        if row["node"] in nodes:
            try:
                out[row["node"]] = Sample.from_json(json.loads(row["sample"]))
            except (ValueError, TypeError, AttributeError):
                continue  # a damaged row is a missing baseline, not an error
    return out


def save_samples(store: Store, samples: Mapping[str, Sample], now: float) -> None:
    """Replace the stored sample of each node, in one transaction."""
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO health_samples(node, sample, updated) VALUES(?, ?, ?) "
            "ON CONFLICT(node) DO UPDATE SET sample = excluded.sample, updated = excluded.updated",
            [(n, json.dumps(s.to_json(), separators=(",", ":")), now)
             for n, s in samples.items()])


def sweep(
    inv: Inventory,
    transport: Transport,
    nodes: Sequence[Node],
    store: Store,
    *,
    runner: Optional[ProbeRunner] = None,
    timeout: Optional[float] = None,
    concurrency: Optional[int] = None,
    on_done: Optional[Callable[[RunResult], None]] = None,
    save: bool = True,
) -> HealthReport:
    """Probe ``nodes`` once, judge every check, remember the samples.

    Args:
        inv: the inventory (health section, job, expected GPU counts).
        transport: any transport; the daemon passes its long-lived one.
        nodes: the machines to check.
        store: the state database (the samples of the previous sweep).
        runner: a ProbeRunner to reuse (keeps its shipping bookkeeping across polls).
        timeout: per-node probe timeout in seconds (default ``health.timeout``).
        concurrency: machines in flight (default ``ssh.fanout``).
        on_done: called with each node's transport result (progress bars).
        save: remember the samples (False: ``daemon run --dry-run``, whose sweep must
            not move the baseline the live daemon's counter deltas are taken against).

    Returns:
        The report; nodes that did not answer have ``status`` set to why.
    """
    previous = load_samples(store, [n.name for n in nodes])
    probe = runner or ProbeRunner(transport)
    results = probe.run(
        nodes, PROBE, lambda node: probe_request(inv, node, previous.get(node.name)),
        timeout=timeout or inv.health.timeout,
        concurrency=concurrency or inv.ssh.fanout, on_done=on_done)
    report, samples = judge(inv, nodes, results, previous)
    if save:
        save_samples(store, samples, time.time())
    return report


def sweeps(one_sweep: Callable[[], HealthReport], *, every: Optional[float],
          count: Optional[int], sleep: Callable[[float], None] = time.sleep
          ) -> Iterator[HealthReport]:
    """``health --watch``: a sweep, then one every ``every`` seconds (``count`` in all).

    Without ``every`` there is one sweep; without ``count`` it runs until interrupted.
    ``sleep`` waits between sweeps (tests: change a machine instead).
    """
    done = 0
    while True:
        yield one_sweep()
        done += 1
        if every is None or (count is not None and done >= count):
            return
        sleep(every)


def judge(inv: Inventory, nodes: Sequence[Node], results: Mapping[str, ProbeResult],
          previous: Mapping[str, Sample]) -> tuple[HealthReport, dict[str, Sample]]:
    """Pure: probe results + previous samples → the report and the samples to keep."""
    checks: dict[str, list[Check]] = {}
    samples: dict[str, Sample] = {}
    pids: dict[str, Optional[list[int]]] = {}
    pid_errors: dict[str, str] = {}
    verdicts: dict[str, NodeHealth] = {}
    for node in nodes:
        res = results[node.name]
        doc = None if res.document is None else parse(res.document)  # typed, or why not
        if doc is None or isinstance(doc, str):
            status = "error" if res.run.state.ran else _NO_VERDICT[res.run.state.value]
            error = res.error if doc is None else f"malformed health document: {doc}"
            verdicts[node.name] = NodeHealth(node.name, status, (), error, res.run.seconds)
            continue
        node_checks, samples[node.name] = evaluate(doc, previous.get(node.name),
                                                   inv.health, node.gpus)
        checks[node.name] = node_checks
        pids[node.name] = process_pids(doc)
        err = (doc.get("process") or {}).get("error")
        if err:
            pid_errors[node.name] = str(err)
    job_nodes = inv.job.nodes if inv.job is not None else ()
    process = apply_process_rule(pids, pid_errors, job_nodes)
    for name, node_checks in checks.items():
        final = tuple(process[name] if c.name == "process" else c for c in node_checks)
        verdicts[name] = NodeHealth(name, node_status(final), final, None,
                                    results[name].run.seconds)
    return HealthReport({n.name: verdicts[n.name] for n in nodes}), samples
