"""``brctl daemon run --dry-run`` over local machines: it writes nothing the live daemon reads.

Health counters (IB link_downed, ECC, Xid counts) are judged as deltas against the
last stored sample: a dry-run sweep that stored its samples between two live sweeps
would eat the delta, and the live daemon would miss the fault. The diagnose ladder's
verdicts are the history ``brctl diagnose`` climbs from. A dry run reads both and
leaves both as they were, byte for byte.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from brctl.analysis.inventory import Inventory, from_document
from brctl.operations.daemon.hooks import LiveHooks
from brctl.operations.daemon.serve import RunOptions, serve
from brctl.remote.factory import RoutingTransport
from brctl.state import Store


def inventory(tmp_path: Path) -> Inventory:
    return from_document({
        "nodes": [{"name": "n[1-2]", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-2]",
                # no such process: the job looks crashed, so the dry run diagnoses it
                "process_match": "brctl-test-no-such-training-process",
                "restart_command": [sys.executable, "-c", "raise SystemExit(9)"]},
        "health": {"checks": ["disk", "process"]},
        "daemon": {"poll_interval": 0.05, "startup_grace": 0.01, "stall_after": 30,
                   "metrics_port": 0, "standby_stages": []},
    }, "test.yaml")


def rows(state_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    store = Store(state_dir)
    try:
        return {t: [tuple(r) for r in store.query(f"SELECT * FROM {t} ORDER BY 1, 2")]
                for t in ("health_samples", "diagnose_verdicts")}
    finally:
        store.close()


def live_sweep_and_diagnose(inv: Inventory, state_dir: Path, dry_run: bool) -> None:
    store = Store(state_dir)
    try:
        hooks = LiveHooks(inv, RoutingTransport(), store, state_dir, dry_run=dry_run)
        nodes = [inv.node(n) for n in ("n1", "n2")]
        hooks.health(nodes)
        hooks.diagnose(nodes, [])
    finally:
        store.close()


def test_a_dry_run_leaves_health_samples_and_diagnose_verdicts_byte_identical(
        tmp_path: Path) -> None:
    inv, state_dir = inventory(tmp_path), tmp_path / "state"
    live_sweep_and_diagnose(inv, state_dir, dry_run=False)  # the live daemon's records
    before = rows(state_dir)
    assert before["health_samples"] and before["diagnose_verdicts"]
    seen: list[dict[str, Any]] = []
    report = serve(inv, RoutingTransport(), state_dir, RunOptions(dry_run=True, max_iterations=4),
                   stop=threading.Event(), on_event=seen.append)
    kinds = [e["kind"] for e in seen]
    assert "crash" in kinds and "analysis" in kinds, kinds  # it swept and diagnosed
    assert report.iterations == 4
    assert rows(state_dir) == before


def test_the_hooks_of_a_live_daemon_do_record(tmp_path: Path) -> None:
    """The other side: the same calls outside a dry run move both records."""
    inv, state_dir = inventory(tmp_path), tmp_path / "state"
    live_sweep_and_diagnose(inv, state_dir, dry_run=False)
    before = rows(state_dir)
    live_sweep_and_diagnose(inv, state_dir, dry_run=False)
    after = rows(state_dir)
    assert after["health_samples"] != before["health_samples"]
    assert len(after["diagnose_verdicts"]) == len(before["diagnose_verdicts"]) + 1
    live_sweep_and_diagnose(inv, state_dir, dry_run=True)
    assert rows(state_dir) == after
