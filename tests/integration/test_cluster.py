"""The test cluster itself: each node is a separate machine reached over real sshd."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest
import yaml

from tests.kits.cluster import EMPTY_RC_FILES, SshCluster

pytestmark = pytest.mark.integration


def _ssh(cluster: SshCluster, name: str, command: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH's own client, so the fixture is proven independently of brctl's transport."""
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(cluster.client_key),
            "-o", f"UserKnownHostsFile={cluster.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "KexAlgorithms=curve25519-sha256",
            "-p", str(cluster.port), f"root@{cluster.address(name)}", command,
        ],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_nodes_are_separate_machines(ssh_cluster: SshCluster) -> None:
    a, b = ssh_cluster.names[:2]
    ra = _ssh(ssh_cluster, a, "echo $SSH_CONNECTION; echo $$ > /opt/train/who; ls /proc")
    rb = _ssh(ssh_cluster, b, "cat /opt/train/who 2>/dev/null || echo none")
    assert ra.returncode == 0, ra.stderr
    assert ra.stdout.split()[2] == ssh_cluster.address(a)
    # Own PID namespace: only the node's sshd and this session are visible.
    pids = [p for p in ra.stdout.split()[4:] if p.isdigit()]
    assert len(pids) < 10
    # Own mount namespace: node b does not see what node a wrote in /opt/train.
    assert rb.stdout.strip() == "none"
    assert ssh_cluster.node_path(a, "/opt/train/who").exists()
    assert not ssh_cluster.node_path(b, "/opt/train/who").exists()


def test_login_is_fast_without_rc_files(ssh_cluster: SshCluster) -> None:
    # What makes a login slow is root's rc files (pyenv init: ~150 ms of sshd CPU each):
    # on the node every one that exists is empty, so no login runs anything.
    name = ssh_cluster.names[0]
    r = _ssh(ssh_cluster, name, "cat " + " ".join(EMPTY_RC_FILES) + " 2>/dev/null | wc -c")
    assert (r.returncode, r.stdout.strip()) == (0, "0"), r


def test_stop_start_and_connection_count(make_cluster: Callable[..., SshCluster]) -> None:
    cluster = make_cluster(2)
    name = cluster.names[1]
    before = cluster.count_connections(name)
    assert _ssh(cluster, name, "true").returncode == 0
    assert cluster.count_connections(name) == before + 1
    cluster.stop_node(name)
    assert _ssh(cluster, name, "true").returncode == 255
    cluster.start_node(name)
    assert _ssh(cluster, name, "true").returncode == 0


def test_node_pids_sees_only_that_node(make_cluster: Callable[..., SshCluster]) -> None:
    cluster = make_cluster(2)
    a, b = cluster.names
    subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", str(cluster.client_key),
         "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "BatchMode=yes",
         "-p", str(cluster.port), f"root@{cluster.address(a)}",
         "sleep 30.5 </dev/null >/dev/null 2>&1 &"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ).wait(timeout=30)  # fmt: skip
    deadline = time.monotonic() + 5  # the backgrounded child may not have exec'd yet
    while not (pids := cluster.node_pids(a, r"sleep 30\.5")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids
    assert not cluster.node_pids(b, r"sleep 30\.5")
    cluster.stop_node(a)  # the namespace dies with everything in it
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_inventory_dict_and_file(ssh_cluster: SshCluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    names = ssh_cluster.names[:2]
    path = ssh_cluster.write_inventory(
        tmp_path,
        names=names,
        node_env={names[1]: {"FOO": "bar"}},
        job={"tp": 1},
        extra={"ssh": {"connect_timeout": 3}},
        python="/usr/bin/python3",
    )
    inv = yaml.safe_load(path.read_text())
    assert [n["name"] for n in inv["nodes"]] == names
    assert inv["nodes"][1]["env"] == {"FOO": "bar"}
    assert inv["ssh"]["connect_timeout"] == 3
    assert inv["ssh"]["python"] == "/usr/bin/python3"
    assert inv["job"]["nodes"] == ",".join(names)


def test_inventory_loads_with_brctl(ssh_cluster: SshCluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from brctl.load.inventory import load_inventory

    names = ssh_cluster.names[:2]
    inv = load_inventory(
        ssh_cluster.write_inventory(tmp_path, names=names, node_env={names[0]: {"A": "1"}})
    )
    node = inv.node(names[0])
    assert (node.address, node.port, dict(node.env)) == (
        ssh_cluster.address(names[0]),
        ssh_cluster.port,
        {"A": "1"},
    )
    assert node.known_hosts == str(ssh_cluster.known_hosts)
