"""SshTransport against real sshd nodes: every state, and proof that it really happened."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from brctl.core.transport import Node, NodeState, RunResult
from brctl.remote.ssh.config import ACCEPTED_SUFFIX
from brctl.remote.ssh.transport import SshTransport
from tests.kits.cluster import SshCluster, _write_ed25519, scaled, silent_listener
from tests.kits.waiting import deadline, wait_for

pytestmark = pytest.mark.integration
MakeCluster = Callable[..., SshCluster]


def nodes_of(cluster: SshCluster, names: list[str] | None = None, **kw: Any) -> list[Node]:
    """Nodes as the inventory would resolve them for ``cluster``."""
    base = {
        "port": cluster.port,
        "identity_file": str(cluster.client_key),
        "known_hosts": str(cluster.known_hosts),
        "connect_timeout": scaled(10),
    }
    base.update(kw)
    return [Node(name=n, address=cluster.address(n), **base) for n in (names or cluster.names)]


@pytest.fixture
def transport() -> Iterator[SshTransport]:
    t = SshTransport(ssh_config=os.devnull)  # never read the real ~/.ssh/config
    try:
        yield t
    finally:
        t.close()


def test_ok_runs_on_the_node_it_claims(ssh_cluster: SshCluster, transport: SshTransport) -> None:
    for node in nodes_of(ssh_cluster):
        r = transport.run(node, ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
        assert r.state is NodeState.OK, r
        assert r.exit_code == 0
        assert r.stdout.split()[2:4] == [node.address, str(ssh_cluster.port)]


def test_failed_keeps_exit_code_and_output(ssh_cluster: SshCluster, transport: SshTransport) -> None:
    node = nodes_of(ssh_cluster)[0]
    r = transport.run(node, ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=scaled(10))
    assert (r.state, r.exit_code, r.stdout, r.stderr) == (NodeState.FAILED, 3, "out\n", "err\n")


def test_env_and_stdin_and_quoting(ssh_cluster: SshCluster, transport: SshTransport) -> None:
    node = replace(nodes_of(ssh_cluster)[1], env={"BRCTL_X": "a b $HOME 'q'"})
    r = transport.run(
        node, ["sh", "-c", 'printf "%s|" "$BRCTL_X" "$1"; cat', "sh", "; rm -rf /x"],
        timeout=scaled(10), stdin=b"from-stdin",
    )  # fmt: skip
    assert r.state is NodeState.OK, r
    assert r.stdout == "a b $HOME 'q'|; rm -rf /x|from-stdin"


def test_an_argument_that_is_not_utf8_reaches_the_node_as_its_bytes(
    ssh_cluster: SshCluster, transport: SshTransport,
) -> None:
    # ``brctl exec -- printf %s $'a\xffb'``: the shell hands Python the byte 0xff, which it
    # keeps as a lone surrogate; paramiko refused to encode it and brctl exited 70.
    # ssh and the local transport pass the bytes as they are.
    arg = b"a\xffb".decode("utf-8", "surrogateescape")
    r = transport.run(nodes_of(ssh_cluster)[0], ["printf", "%s", arg], timeout=scaled(10))
    assert r.state is NodeState.OK, r
    assert r.stdout_bytes == b"a\xffb"


def test_large_stdin_echoed_back_does_not_deadlock(ssh_cluster: SshCluster,
                                                    transport: SshTransport) -> None:
    # cat writes back while it reads: stdin must be fed while stdout is drained.
    node = nodes_of(ssh_cluster)[2]
    data = bytes(range(256)) * (8 * 4096)  # 8 MiB, far above the channel windows
    r = transport.run(node, ["sh", "-c", "cat | sha256sum"], timeout=scaled(60),
                      stdin=data)
    assert r.state is NodeState.OK, r.stderr
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    text = b"brctl stdin test line\n" * (8 << 20 // 22)  # ~8 MiB echoed straight back
    echoed = transport.run(node, ["cat"], timeout=scaled(60), stdin=text)
    assert echoed.state is NodeState.OK, echoed.stderr
    assert echoed.stdout == text.decode()


def test_timeout_kills_the_remote_process_group(ssh_cluster: SshCluster, transport: SshTransport) -> None:
    node = nodes_of(ssh_cluster)[2]
    marker = r"^sleep 777\s*$"  # the sleeps themselves, not the sh -c around them
    done: dict[str, Any] = {}
    timeout = scaled(3)  # the sleeps are seen running within it (node_pids: tens of ms)

    def go() -> None:
        # A child in the background too: the whole process group must die.
        done["r"] = transport.run(node, ["sh", "-c", "sleep 777 & sleep 777"], timeout=timeout)

    th = threading.Thread(target=go)
    th.start()
    def both() -> list[int] | None:
        pids = ssh_cluster.node_pids(node.name, marker)
        return pids if len(pids) == 2 else None

    seen = wait_for(both, "both sleeps running on the node")
    th.join()
    r = done["r"]
    assert r.state is NodeState.TIMEOUT, r
    # Killed at its timeout (3 s), long before the sleeps' own 777 s end.
    assert r.seconds < timeout + scaled(15), r
    wait_for(lambda: not [p for p in seen if os.path.exists(f"/proc/{p}")],
             "the remote process group gone (orphans otherwise)")


def test_command_exiting_124_early_is_failed_not_timeout(
    ssh_cluster: SshCluster, transport: SshTransport
) -> None:
    r = transport.run(nodes_of(ssh_cluster)[0], ["sh", "-c", "exit 124"], timeout=scaled(10))
    assert (r.state, r.exit_code) == (NodeState.FAILED, 124)


def test_stopped_node_is_unreachable(make_cluster: MakeCluster, transport: SshTransport) -> None:
    cluster = make_cluster(2)
    cluster.stop_node(cluster.names[1])
    up, down = nodes_of(cluster)
    t0 = time.monotonic()
    r = transport.run(down, ["true"], timeout=scaled(10))
    assert r.state is NodeState.UNREACHABLE, r
    assert r.exit_code is None
    assert "refused" in r.stderr.lower()
    assert time.monotonic() - t0 < scaled(3)  # a few quick retries, not the connect timeout
    assert transport.run(up, ["true"], timeout=scaled(10)).state is NodeState.OK


def test_silent_listener_costs_the_connect_timeout(ssh_cluster: SshCluster, transport: SshTransport) -> None:
    with silent_listener() as (address, port):
        node = Node(
            name="hung", address=address, port=port, identity_file=str(ssh_cluster.client_key),
            known_hosts=str(ssh_cluster.known_hosts), connect_timeout=1.5,
        )  # fmt: skip
        # The 1.5 s connect timeout ends it (a banner timeout), not the 300 s command timeout.
        with deadline(15, "the connect timeout"):
            r = transport.run(node, ["true"], timeout=scaled(300))
    assert r.state is NodeState.TIMEOUT, r
    assert "banner" in r.stderr


def test_wrong_key_is_auth(ssh_cluster: SshCluster, transport: SshTransport, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    _write_ed25519(other)
    node = nodes_of(ssh_cluster, identity_file=str(other))[0]
    r = transport.run(node, ["true"], timeout=scaled(10))
    assert r.state is NodeState.AUTH, r
    assert "refused" in r.stderr and "PRIVATE" not in r.stderr


def test_unknown_host_key_is_refused(
    ssh_cluster: SshCluster, transport: SshTransport, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = transport.run(nodes_of(ssh_cluster, known_hosts=str(empty))[0], ["true"], timeout=10)
    assert r.state is NodeState.HOSTKEY, r
    assert "unknown" in r.stderr and "SHA256:" in r.stderr
    assert not Path(str(empty) + ACCEPTED_SUFFIX).exists()


def test_changed_host_key_is_refused_even_with_accept_new(
    ssh_cluster: SshCluster, transport: SshTransport, tmp_path: Path
) -> None:
    node = nodes_of(ssh_cluster)[0]
    wrong = _write_ed25519(tmp_path / "imposter")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{node.address}]:{node.port} {wrong}\n")
    for policy in ("strict", "accept-new"):
        n = replace(node, known_hosts=str(kh), host_key_policy=policy)
        r = transport.run(n, ["true"], timeout=scaled(10))
        assert r.state is NodeState.HOSTKEY, r
        assert "CHANGED" in r.stderr and "SHA256:" in r.stderr
    assert not Path(str(kh) + ACCEPTED_SUFFIX).exists()


def test_accept_new_writes_its_own_file(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    nodes = nodes_of(ssh_cluster, known_hosts=str(kh), host_key_policy="accept-new")
    t = SshTransport(ssh_config=os.devnull)
    try:
        assert all(t.run(n, ["true"], timeout=scaled(10)).state is NodeState.OK for n in nodes)
    finally:
        t.close()
    assert kh.read_text() == ""  # the user's file is never written
    accepted = Path(str(kh) + ACCEPTED_SUFFIX).read_text().splitlines()
    assert len(accepted) == len(nodes)
    for line in accepted:
        assert line in ssh_cluster.known_hosts.read_text()
    # accept-new trusts what it recorded; strict never does (only known_hosts).
    for policy, state in (("accept-new", NodeState.OK), ("strict", NodeState.HOSTKEY)):
        t = SshTransport(ssh_config=os.devnull)
        try:
            got = [t.run(replace(n, host_key_policy=policy), ["true"], timeout=scaled(10)) for n in nodes]
            assert all(r.state is state for r in got), got
        finally:
            t.close()


def test_connection_is_reused(make_cluster: MakeCluster, transport: SshTransport) -> None:
    cluster = make_cluster(1)
    node = nodes_of(cluster)[0]
    for _ in range(3):
        assert transport.run(node, ["true"], timeout=scaled(10)).state is NodeState.OK
    assert cluster.count_connections(node.name) == 1
    # A dead cached connection (node restarted) is reopened once, transparently.
    cluster.stop_node(node.name)
    cluster.start_node(node.name)
    r = transport.run(node, ["true"], timeout=scaled(10))
    assert r.state is NodeState.OK, r
    assert cluster.count_connections(node.name) == 2


def _fan_out(nodes: list[Node], argv: list[str]) -> list[RunResult]:
    t = SshTransport(ssh_config=os.devnull, connect_rate=1000)
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:  # full fan-out: all handshakes at once
            return list(pool.map(lambda n: t.run(n, argv, timeout=scaled(20)), nodes))
    finally:
        t.close()


def test_hung_node_with_an_open_connection_costs_one_connect_timeout(
    make_cluster: MakeCluster, transport: SshTransport
) -> None:
    cluster = make_cluster(1)
    node = nodes_of(cluster, connect_timeout=1.5)[0]
    assert transport.run(node, ["true"], timeout=scaled(10)).state is NodeState.OK
    cluster.freeze_node(node.name)
    try:
        t0 = time.monotonic()
        r = transport.run(node, ["true"], timeout=scaled(10))
        elapsed = time.monotonic() - t0
    finally:
        cluster.thaw_node(node.name)
    assert r.state is NodeState.TIMEOUT, r
    assert "hung" in r.stderr
    assert 1.4 <= elapsed < 1.5 + scaled(1.5)
    # Once it answers again, the next run reconnects (a roomier budget: loaded CI).
    again = transport.run(replace(node, connect_timeout=scaled(10)), ["true"], timeout=scaled(10))
    assert again.state is NodeState.OK, again


def test_fanout_16_nodes_and_jump_host_multiplexing(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(17)
    jump, targets = cluster.names[0], cluster.names[1:]
    direct = nodes_of(cluster, targets)
    via = nodes_of(cluster, targets, proxy_jump=f"root@{cluster.address(jump)}:{cluster.port}")
    for round_nodes in (direct, via, via):
        before = {n: cluster.count_connections(n) for n in cluster.names}
        results = _fan_out(round_nodes, ["sh", "-c", "echo $SSH_CONNECTION"])
        for node, r in zip(round_nodes, results):
            assert r.state is NodeState.OK, r
            assert r.stdout.split()[2] == node.address
        after = {n: cluster.count_connections(n) for n in cluster.names}
        assert all(after[n] == before[n] + 1 for n in targets)
        assert after[jump] - before[jump] == (1 if round_nodes is via else 0)


def test_jump_host_failures_say_where(make_cluster: MakeCluster, transport: SshTransport) -> None:
    cluster = make_cluster(2)
    jump, target = cluster.names
    cluster.stop_node(target)
    via = nodes_of(cluster, [target], proxy_jump=f"root@{cluster.address(jump)}:{cluster.port}")[0]
    r = transport.run(via, ["true"], timeout=scaled(10))
    assert r.state is NodeState.UNREACHABLE, r
    assert "could not connect" in r.stderr and cluster.address(target) in r.stderr
    cluster.stop_node(jump)
    r = transport.run(replace(via, name="other"), ["true"], timeout=scaled(10))
    assert r.state is NodeState.UNREACHABLE, r
    assert r.stderr.startswith("jump host ")


def test_ssh_config_is_honoured(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    target = ssh_cluster.names[1]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host gpu-alias\n  HostName {ssh_cluster.address(target)}\n  Port {ssh_cluster.port}\n"
        f"  User root\n  IdentityFile {ssh_cluster.client_key}\n"
    )
    t = SshTransport(ssh_config=str(cfg))
    try:
        node = Node(name="gpu-alias", address="gpu-alias", known_hosts=str(ssh_cluster.known_hosts))
        r = t.run(node, ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.OK, r
    assert r.stdout.split()[2] == ssh_cluster.address(target)


def test_fanout_over_worker_processes(ssh_cluster: SshCluster) -> None:
    from brctl.remote.shard import run_sharded

    nodes = nodes_of(ssh_cluster)
    parent = SshTransport(ssh_config=os.devnull)
    seen: list[str] = []
    try:
        # run_all(processes=N) shards only from 128 nodes per worker; the mechanism
        # is the same, so drive it directly on 4 nodes.
        results = run_sharded(
            parent.process_factory(2), nodes, ["sh", "-c", "echo $SSH_CONNECTION"],
            processes=2, timeout=scaled(20), on_done=lambda r: seen.append(r.node),
        )  # fmt: skip
    finally:
        parent.close()
    assert sorted(seen) == sorted(n.name for n in nodes)  # progress streamed from the workers
    for node in nodes:
        r = results[node.name]
        assert r.state is NodeState.OK, r
        assert r.stdout.split()[2] == node.address
    assert parent.connections_opened == 0  # the workers did the connecting


def test_connect_rate_caps_new_connections(ssh_cluster: SshCluster) -> None:
    t = SshTransport(ssh_config=os.devnull, connect_rate=4)  # bucket of 1: 4 nodes need >= 0.75 s
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda n: t.run(n, ["true"], timeout=scaled(20)), nodes_of(ssh_cluster)))
        elapsed = time.monotonic() - t0
    finally:
        t.close()
    assert all(r.state is NodeState.OK for r in results), results
    assert elapsed >= 0.7
