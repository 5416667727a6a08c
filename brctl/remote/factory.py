"""Pick the backend per node: ``connection: local`` → LocalTransport, else SshTransport.

paramiko is imported only when an ssh node is actually contacted, so commands that
touch only local nodes (and ``--help``) never pay for it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import BinaryIO

from brctl.core.transport import Node, RunResult, Transport
from brctl.remote.local import LocalTransport


class RoutingTransport:
    """One Transport over mixed nodes; the ssh backend is created on first use."""

    def __init__(self, *, connect_rate: float = 100.0, ssh_config: str | None = None) -> None:
        """Args: connect_rate: new ssh connections per second; ssh_config: path to an ssh config."""
        self._local = LocalTransport()
        self._ssh: Transport | None = None
        self._connect_rate = connect_rate
        self._ssh_config = ssh_config
        self._lock = threading.Lock()

    def _backend(self, node: Node) -> Transport:
        if node.connection == "local":
            return self._local
        with self._lock:
            if self._ssh is None:
                from brctl.remote.ssh import SshTransport  # type: ignore[import-not-found,import-untyped,unused-ignore]

                self._ssh = SshTransport(connect_rate=self._connect_rate, ssh_config=self._ssh_config)
            return self._ssh

    def process_factory(self, processes: int) -> Callable[[], RoutingTransport]:
        """A picklable maker of an equivalent transport for a worker process (fanout ``processes``)."""
        return functools.partial(
            RoutingTransport, connect_rate=self._connect_rate / max(1, processes), ssh_config=self._ssh_config
        )

    def preload(self, nodes: Iterable[Node]) -> None:
        """Read the ssh nodes' known_hosts now: a malformed file is exit 2 before any fan-out."""
        ssh_nodes = [n for n in nodes if n.connection == "ssh"]
        if ssh_nodes:
            self._backend(ssh_nodes[0]).preload(ssh_nodes)  # type: ignore[attr-defined]

    def check(self, nodes: Sequence[Node]) -> None:
        """Resolve the ssh nodes' settings before a fan-out to them (see ``SshTransport.check``)."""
        ssh_nodes = [n for n in nodes if n.connection == "ssh"]
        if ssh_nodes:
            self._backend(ssh_nodes[0]).check(ssh_nodes)  # type: ignore[attr-defined]

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None
    ) -> RunResult:
        """Run on the node's backend."""
        return self._backend(node).run(node, argv, timeout=timeout, stdin=stdin)

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """Stream on the node's backend."""
        return self._backend(node).stream(node, argv, timeout=timeout, stdin=stdin, stdout=stdout)

    def cancel(self) -> None:
        """Kill what runs on every backend (Ctrl-C)."""
        self._local.cancel()
        with self._lock:
            ssh = self._ssh
        if ssh is not None:
            ssh.cancel()

    def close(self) -> None:
        """Close the ssh connections, if any were opened."""
        if self._ssh is not None:
            self._ssh.close()
