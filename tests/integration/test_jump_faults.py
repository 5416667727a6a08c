"""Targets behind a jump host under a frozen jump host whose socket is full (issue 14).

One authenticated connection to the jump host carries every target's connection
(a ``direct-tcpip`` channel each) and, here, commands run on the jump host itself:
Commands on it being fed a big stdin fill its socket once it freezes (``_feeding``,
``_freeze_full``). Every send over it then blocks until the kernel drops the
connection (TCP_USER_TIMEOUT), or for ever where none guards it (a jump host
reached through another). Each target's result still comes within its own bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brctl.core.transport import Node, NodeState
from brctl.remote.fanout import run_all
from brctl.remote.ssh.transport import SshTransport
from brctl.remote.wrap import GRACE_S, SLACK_S
from tests.integration.test_ssh_transport import MakeCluster, nodes_of
from tests.integration.test_transport_faults import (
    _ended,
    _feeding,
    _freeze_full,
    _freezing_at,
    _in_thread,
    _timed_out,
    _wait_for,
)
from tests.kits.cluster import SshCluster, scaled

pytestmark = pytest.mark.integration


def _jump_and_target(cluster: SshCluster, connect_timeout: float) -> tuple[Node, Node]:
    """The jump host as a node of its own (same connection as the jump) and a target behind it."""
    jump, target = cluster.names
    (via,) = nodes_of(cluster, [target], connect_timeout=connect_timeout,
                      proxy_jump=f"root@{cluster.address(jump)}:{cluster.port}")
    (own,) = nodes_of(cluster, [jump], connect_timeout=connect_timeout)
    return own, via


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_new_target_behind_a_frozen_jump_host_whose_socket_is_full_is_a_timeout_within_connect_timeout(
    make_cluster: MakeCluster,
) -> None:
    """The channel request for the target cannot even be sent: it is still bounded by the
    target's ``connect_timeout``, not the kernel's (or no) drop of the jump connection."""
    cluster = make_cluster(2)
    own, via = _jump_and_target(cluster, connect_timeout=scaled(3))
    transport = SshTransport(ssh_config=os.devnull)
    try:
        feeding = _feeding(cluster, transport, own, scaled(60))
        _freeze_full(cluster, own)
        t0 = time.monotonic()
        box = _in_thread(transport, via, ["true"], scaled(3))
        r = _timed_out(box, t0, via.connect_timeout + scaled(2), via.connect_timeout + scaled(20))
        assert r.stderr.startswith("jump host "), r
        assert transport.connections_opened == 1  # the jump host's only: no target was reached
        _ended(feeding)
    finally:
        cluster.thaw_node(own.name)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("method", ["open_session", "exec_command"])
def test_a_target_whose_request_is_stuck_in_a_frozen_jump_host_s_full_socket_returns_in_its_bound(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, method: str,
) -> None:
    """The target's connection is open; its session or exec request goes into the jump
    connection, which cannot send (the jump host froze, its socket full): the target's
    own connection is found unable to send at its bound and closed, and that close must
    not wait for the stuck send in the jump connection (the jump connection, itself
    unable to send, is closed)."""
    cluster = make_cluster(2)
    own, via = _jump_and_target(cluster, connect_timeout=scaled(3))
    transport = SshTransport(ssh_config=os.devnull)
    timeout = scaled(5)  # the freeze (retries included) happens within it
    bound = via.connect_timeout if method == "open_session" else timeout + GRACE_S + SLACK_S
    try:
        assert transport.run(via, ["true"], timeout=scaled(10)).state is NodeState.OK
        feeding = _feeding(cluster, transport, own, scaled(60))
        if method == "open_session":  # frozen before the session request
            _freeze_full(cluster, own)
        else:  # the session opened: frozen just before the exec request
            _freezing_at(monkeypatch, cluster, own, method)
        t0 = time.monotonic()
        box = _in_thread(transport, via, ["true"], timeout, name="probe")
        # 1.6 s past the bound measured: the target's connection found unable to send, then
        # the jump connection (STUCK_S each), one judgement more than a direct node's.
        _timed_out(box, t0, bound + scaled(2.5), bound + scaled(20))
        _ended(feeding)
    finally:
        cluster.thaw_node(own.name)
        transport.close()


@contextlib.contextmanager
def _dropping_syns() -> Iterator[tuple[str, int]]:
    """An address whose SYNs are dropped (a powered-off machine behind a router): a listener
    whose accept queue is full; a connect to it hangs (the kernel's SYN retries, ~2 min)."""
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(0)
        address = lsock.getsockname()
        fillers = [socket.socket() for _ in range(2)]
        try:
            for s in fillers:
                s.setblocking(False)
                s.connect_ex(address)
            time.sleep(0.2)  # the first sits in the queue, unaccepted; the second's SYNs are dropped
            yield address
        finally:
            for s in fillers:
                s.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_target_the_jump_host_cannot_reach_in_time_leaves_the_jump_connection_to_the_others(
    make_cluster: MakeCluster,
) -> None:
    """The jump host answers a channel request only once its own connect to the target ends:
    for a target dropping SYNs, long after ``connect_timeout``. That target is a ``timeout``
    at its bound; the jump connection, which can send, stays: commands over it go on."""
    cluster = make_cluster(2)
    own, via = _jump_and_target(cluster, connect_timeout=scaled(10))
    transport = SshTransport(ssh_config=os.devnull)
    try:
        running = [_in_thread(transport, node, ["sleep", "3"], scaled(30)) for node in (own, via)]
        assert _wait_for(lambda: all(cluster.node_pids(n.name, r"^sleep 3") for n in (own, via)), scaled(10))
        with _dropping_syns() as (host, port):
            dark = dataclasses.replace(via, name="dark", address=host, port=port, connect_timeout=scaled(1))
            r = transport.run(dark, ["true"], timeout=scaled(5))
        assert r.state is NodeState.TIMEOUT, r
        assert r.stderr.startswith("jump host ") and "no answer" in r.stderr, r
        assert r.seconds <= dark.connect_timeout + scaled(1), r
        for run in running:  # the jump connection was not closed under them
            run["thread"].join(scaled(10))  # type: ignore[attr-defined]
            assert getattr(run.get("result"), "state", None) is NodeState.OK, run
        assert transport.connections_opened == 2
    finally:
        transport.close()


@pytest.fixture
def silent_bastion() -> Iterator[tuple[str, int]]:
    """A jump host that completes TCP handshakes and never says a word (a hung sshd)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # never accepted: the kernel's backlog answers SYN, nobody reads
        yield listener.getsockname()


def test_nodes_behind_a_hung_jump_host_all_fail_within_one_connect_timeout(
    silent_bastion: tuple[str, int], tmp_path: Path,
) -> None:
    # Each thread used to wait for the jump host's lock and then try it again itself:
    # n nodes behind a hung bastion took n connect_timeouts (64 nodes, 10 s: ~11 minutes).
    host, port = silent_bastion
    timeout = scaled(1.0)
    nodes = [Node(name=f"n{i}", address=f"127.0.0.{i + 2}", port=22, connect_timeout=timeout,
                  known_hosts=str(tmp_path / "known_hosts"), proxy_jump=f"root@{host}:{port}")
             for i in range(6)]
    transport = SshTransport(ssh_config=os.devnull)
    try:
        t0 = time.monotonic()
        results = run_all(transport, nodes, ["true"], timeout=scaled(5))
        took = time.monotonic() - t0
    finally:
        transport.close()
    assert {r.state for r in results.values()} == {NodeState.TIMEOUT}, results
    assert all(r.stderr.startswith("jump host ") for r in results.values()), results
    assert took < 2.5 * timeout, took  # one attempt (and its retries' budget), not six
