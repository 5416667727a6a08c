"""`brctl exec` and the shipped probe over real sshd nodes, through the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tests.kits.cluster import SshCluster


@pytest.fixture(scope="module")
def cluster16(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.integration.conftest import _require
    from tests.kits.cluster import SshCluster

    _require()
    cluster = SshCluster(tmp_path_factory.mktemp("c16"), 16, prefix="gpu")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_exec_across_16_nodes_folds_identical_output(cluster16: SshCluster, tmp_path: Path,
                                                      brctl: Callable[..., Any]) -> None:
    inv = cluster16.write_inventory(tmp_path, node_env={"gpu07": {"ODD": "1"}})
    res = brctl("-i", inv, "exec", "--", "sh", "-c", 'echo "${ODD:-same}"')
    assert res.exit_code == 0, res.stderr
    assert "gpu[01-06,08-16] (15) ok\nsame" in res.stdout
    assert "gpu07 (1) ok\n1" in res.stdout
    doc = brctl("-i", inv, "--json", "exec", "-w", "gpu[01-16]", "-x", "gpu[09-16]",
                "sh", "-c", "echo $SSH_CONNECTION").json
    assert sorted(doc["nodes"]) == [f"gpu{i:02d}" for i in range(1, 9)]
    for name, result in doc["nodes"].items():
        # The command really ran on the machine it claims: sshd's own address is its 127.0.0.N.
        assert result["stdout"].split()[2] == cluster16.address(name)


def test_exec_exit_codes_failed_and_unreachable(make_cluster: Callable[..., SshCluster],
                                               tmp_path: Path, brctl: Callable[..., Any]) -> None:
    cluster = make_cluster(3)
    inv = cluster.write_inventory(tmp_path, node_env={"node02": {"RC": "7"}})
    res = brctl("-i", inv, "--json", "exec", "sh", "-c", 'exit "${RC:-0}"')
    assert res.exit_code == 1
    assert res.json["nodes"]["node02"] == {**res.json["nodes"]["node02"], "state": "failed",
                                           "exit_code": 7}
    cluster.stop_node("node03")
    res = brctl("-i", inv, "--json", "exec", "sh", "-c", 'exit "${RC:-0}"')
    assert res.exit_code == 3  # incomplete wins over findings
    assert res.json["nodes"]["node03"]["state"] == "unreachable"
    assert res.json["nodes"]["node03"]["exit_code"] is None


def test_probe_ships_once_to_a_bare_python_and_reports_the_node(
        make_cluster: Callable[..., SshCluster], tmp_path: Path) -> None:
    from brctl.load.inventory import load_inventory
    from brctl.remote.factory import RoutingTransport
    from brctl.remote.probes import ProbeRunner

    cluster = make_cluster(4)
    # /usr/bin/python3 has no brctl installed: the probe code must travel over ssh.
    inv = load_inventory(cluster.write_inventory(tmp_path, python="/usr/bin/python3"))
    transport = RoutingTransport()
    try:
        runner = ProbeRunner(transport)
        first = runner.run(list(inv.nodes.values()), "brctl.diagnostics.sysinfo", {"echo": 1})
        assert all(r.ok for r in first.values()), {n: r.error for n, r in first.items()}
        assert runner.bytes_shipped == 4 * len(runner.bundle.data)
        for name, result in first.items():
            doc = result.document or {}
            assert doc["ssh_connection"].split()[2] == cluster.address(name)
            assert doc["executable"] == "/usr/bin/python3" and doc["cpus"] >= 1
            assert f".cache/brctl/{runner.bundle.digest}/brctl.zip" in doc["brctl_path"]
            cached = cluster.node_path(name, f"/root/.cache/brctl/{runner.bundle.digest}/brctl.zip")
            assert cached.read_bytes() == runner.bundle.data
        second = runner.run(list(inv.nodes.values()), "brctl.diagnostics.sysinfo", {"echo": 2})
        assert all((r.document or {}).get("echo") == 2 for r in second.values())
        assert runner.bytes_shipped == 4 * len(runner.bundle.data)  # nothing shipped again
    finally:
        transport.close()


def test_nodes_probe_cli_reports_unreachable(make_cluster: Callable[..., SshCluster],
                                            tmp_path: Path, brctl: Callable[..., Any]) -> None:
    cluster = make_cluster(2)
    inv = cluster.write_inventory(tmp_path, python="/usr/bin/python3")
    cluster.stop_node("node02")
    res = brctl("-i", inv, "--json", "nodes", "--probe", "-t", "10")
    assert res.exit_code == 3
    assert res.json["nodes"]["node01"]["probe"]["ok"] is True
    assert res.json["nodes"]["node02"]["probe"]["state"] == "unreachable"
