"""The transport interface: run an argv on one node, copy files, close.

Every remote I/O in brctl goes through a ``Transport``. Backends: ``SshTransport``
(paramiko, production), ``LocalTransport`` (``connection: local``), ``FakeTransport``
(unit tests). A transport never raises for a node-level failure: it returns a
``RunResult`` whose ``state`` says what happened.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol

HostKeyPolicy = Literal["strict", "accept-new"]
ConnectionKind = Literal["ssh", "local"]


class NodeState(str, Enum):
    """What happened on one node; each state is distinct (DESIGN.md, remote execution)."""

    OK = "ok"  # ran, exit code 0
    FAILED = "failed"  # ran, non-zero exit
    TIMEOUT = "timeout"  # connect or command timed out (the remote command was killed)
    UNREACHABLE = "unreachable"  # no TCP connection / no SSH banner / connection lost
    AUTH = "auth"  # the node refused our credentials
    HOSTKEY = "hostkey"  # the node's host key is unknown or changed

    @property
    def ran(self) -> bool:
        """The command ran to completion (whatever its exit code)."""
        return self in (NodeState.OK, NodeState.FAILED)


@dataclass(frozen=True)
class Node:
    """Everything needed to reach one machine, resolved from the inventory."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: HostKeyPolicy = "strict"
    connect_timeout: float = 10.0
    command_timeout: float = 600.0
    proxy_jump: str | None = None
    python: str = "python3"
    connection: ConnectionKind = "ssh"
    gpus: int = 8
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunResult:
    """One node's outcome; the fields are the JSON contract (``exit_code`` None if never ran)."""

    node: str
    state: NodeState
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float

    def to_json(self) -> dict[str, object]:
        """The per-node JSON object of DESIGN.md."""
        return {
            "state": self.state.value,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seconds": round(self.seconds, 3),
        }


def state_for_exit(code: int) -> NodeState:
    """OK for 0, FAILED otherwise."""
    return NodeState.OK if code == 0 else NodeState.FAILED


def with_env(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Prefix ``argv`` with ``env K=V`` so the environment does not depend on sshd's AcceptEnv."""
    if not env:
        return list(argv)
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv]


def command_line(argv: Sequence[str]) -> str:
    """The one place an argv becomes a remote command line: every argument quoted."""
    return shlex.join(argv)


class Transport(Protocol):
    """Run commands on and copy files to/from one node at a time; thread-safe."""

    def run(
        self,
        node: Node,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
    ) -> RunResult:
        """Run ``argv`` (never a shell string) on ``node``; kill it if it outlives ``timeout``."""
        ...

    def put(self, node: Node, local_path: str, remote_path: str, *, timeout: float) -> RunResult:
        """Copy a local file to ``remote_path`` on ``node`` (written under a temp name, renamed)."""
        ...

    def get(self, node: Node, remote_path: str, local_path: str, *, timeout: float) -> RunResult:
        """Copy ``remote_path`` on ``node`` to a local file (temp name, renamed)."""
        ...

    def close(self) -> None:
        """Close every connection this transport holds."""
        ...
