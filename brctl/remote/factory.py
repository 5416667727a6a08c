"""Pick the backend per node: ``connection: local`` → LocalTransport, ``connection:
slurm`` → SlurmTransport, else SshTransport.

paramiko is imported only when an ssh node is actually contacted, so commands that
touch only local nodes (and ``--help``) never pay for it. Fan-outs that include
slurm nodes go through ``run_batch`` (srun reaches many nodes per call).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO, Optional

from brctl.core.transport import Node, RunResult, Transport
from brctl.remote.local import LocalTransport
from brctl.remote.threads import ArgvFor, StdinFor, run_threads

if TYPE_CHECKING:
    from brctl.remote.slurm.transport import JobRef, SlurmTransport


class RoutingTransport:
    """One Transport over mixed nodes; the ssh backend is created on first use."""

    def __init__(self, *, connect_rate: float = 100.0, ssh_config: str | None = None,
                 slurm_job: Optional[JobRef] = None, slurm_partition: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        """Args: connect_rate: new ssh connections per second; ssh_config: path to an ssh
        config; slurm_job, slurm_partition, environ: for ``connection: slurm``
        (``job.slurm``, ``slurm.partition``, the environment srun runs in)."""
        self._local = LocalTransport()
        self._ssh: Transport | None = None
        self._slurm: SlurmTransport | None = None
        self._slurm_args = (slurm_job, slurm_partition, environ)
        self._connect_rate = connect_rate
        self._ssh_config = ssh_config
        self._lock = threading.Lock()

    def _slurm_backend(self) -> SlurmTransport:
        with self._lock:
            if self._slurm is None:
                from brctl.remote.slurm.transport import SlurmTransport

                job, partition, environ = self._slurm_args
                self._slurm = SlurmTransport(job=job, partition=partition, environ=environ)
            return self._slurm

    def _backend(self, node: Node) -> Transport:
        if node.connection == "local":
            return self._local
        if node.connection == "slurm":
            return self._slurm_backend()
        with self._lock:
            if self._ssh is None:
                from brctl.remote.ssh.transport import SshTransport  # type: ignore[import-not-found,import-untyped,unused-ignore]

                self._ssh = SshTransport(connect_rate=self._connect_rate, ssh_config=self._ssh_config)
            return self._ssh

    def process_factory(self, processes: int) -> Callable[[], RoutingTransport]:
        """A picklable maker of an equivalent transport for a worker process (fanout ``processes``)."""
        return functools.partial(
            RoutingTransport, connect_rate=self._connect_rate / max(1, processes), ssh_config=self._ssh_config
        )

    def run_batch(
        self, nodes: Sequence[Node], argv: ArgvFor, *, timeout: float | None = None,
        stdin: StdinFor = None, concurrency: int = 64, deadline: float | None = None,
        on_done: Callable[[RunResult], None] | None = None,
    ) -> dict[str, RunResult] | None:
        """A fan-out with slurm nodes: those through srun, then the others as threads;
        None when there are none (``run_all``'s own paths then)."""
        slurm = [n for n in nodes if n.connection == "slurm"]
        if not slurm:
            return None
        start = time.monotonic()
        done = self._slurm_backend().run_batch(slurm, argv, timeout=timeout, stdin=stdin,
                                               concurrency=concurrency, deadline=deadline,
                                               on_done=on_done)
        others = [n for n in nodes if n.connection != "slurm"]
        if others:
            if deadline is not None:
                deadline = max(0.0, deadline - (time.monotonic() - start))
            done.update(run_threads(self, others, argv, timeout=timeout, stdin=stdin,
                                    concurrency=concurrency, deadline=deadline, on_done=on_done))
        return {n.name: done[n.name] for n in nodes}

    def preload(self, nodes: Iterable[Node]) -> None:
        """Read the ssh nodes' known_hosts now: a malformed file is exit 2 before any fan-out."""
        ssh_nodes = [n for n in nodes if n.connection == "ssh"]
        if ssh_nodes:
            self._backend(ssh_nodes[0]).preload(ssh_nodes)  # type: ignore[attr-defined]

    def check_config(self, nodes: Sequence[Node]) -> None:
        """Resolve the ssh nodes' settings before a fan-out to them (see ``SshTransport.check_config``)."""
        ssh_nodes = [n for n in nodes if n.connection == "ssh"]
        if ssh_nodes:
            self._backend(ssh_nodes[0]).check_config(ssh_nodes)  # type: ignore[attr-defined]

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
            backends = [b for b in (self._ssh, self._slurm) if b is not None]
        for backend in backends:
            backend.cancel()

    def close(self) -> None:
        """Close the ssh connections, if any were opened."""
        if self._ssh is not None:
            self._ssh.close()
