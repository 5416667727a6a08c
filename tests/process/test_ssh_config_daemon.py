"""An ssh config setting brctl cannot honour: exit 2 up front by hand, that host alone in the daemon.

No network: the refused host's setting (``BindAddress``) is judged before any
connection, and the other machine is local.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.inventory import Inventory, from_document
from brctl.core.transport import NodeState
from brctl.operations.daemon.serve import RunOptions, serve
from brctl.remote.factory import RoutingTransport
from brctl.remote.fanout import run_all
from brctl.remote.per_host import PerHost
from brctl.remote.ssh.openssh import SshConfigError


def _setup(tmp_path: Path) -> tuple[Inventory, RoutingTransport]:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host n2\n  BindAddress 10.1.1.1\n")
    inv = from_document({
        "nodes": [{"name": "n1", "connection": "local", "gpus": 1},
                  {"name": "n2", "address": "127.0.0.1", "port": 9, "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-2]", "process_match": "brctl-test-no-such-process",
                "restart_command": [sys.executable, "-c", "raise SystemExit(9)"]},
        "health": {"checks": ["disk"]},
        "daemon": {"poll_interval": 0.05, "startup_grace": 0.01, "stall_after": 30,
                   "metrics_port": 0, "standby_stages": []},
    }, "test.yaml")
    return inv, RoutingTransport(ssh_config=str(cfg))


def test_by_hand_the_fan_out_is_refused_before_anything_runs(tmp_path: Path) -> None:
    inv, transport = _setup(tmp_path)
    nodes = [inv.node("n1"), inv.node("n2")]
    with pytest.raises(SshConfigError, match=r"host n2: ssh config setting 'BindAddress 10\.1\.1\.1'"):
        run_all(transport, nodes, ["true"], timeout=10)
    results = run_all(PerHost(transport), nodes, ["true"], timeout=10)
    assert results["n1"].state is NodeState.OK
    assert results["n2"].state is NodeState.UNREACHABLE and "BindAddress 10.1.1.1" in results["n2"].stderr


def test_the_daemon_keeps_polling_the_other_hosts(tmp_path: Path) -> None:
    inv, transport = _setup(tmp_path)
    seen: list[dict[str, Any]] = []
    polls: list[Any] = []
    report = serve(inv, transport, tmp_path / "state", RunOptions(dry_run=True, max_iterations=3),
                   stop=threading.Event(), on_event=seen.append, on_poll=polls.append)
    assert report.iterations == 3 and len(polls) == 3


def test_in_the_daemon_s_sweep_that_host_is_unreachable_and_not_evicted(tmp_path: Path) -> None:
    from brctl.operations.daemon.hooks import LiveHooks
    from brctl.state import Store

    inv, transport = _setup(tmp_path)
    store = Store(tmp_path / "state")
    try:
        view = LiveHooks(inv, PerHost(transport), store, tmp_path, dry_run=True).health(
            [inv.node("n1"), inv.node("n2")])
    finally:
        store.close()
    assert view.status == {"n1": "ok", "n2": "unreachable"}
    assert view.unanswered == ("n2",) and not view.evict
