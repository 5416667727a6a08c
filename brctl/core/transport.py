"""The transport interface: run an argv on one node, copy files, close.

Every remote I/O in brctl goes through a ``Transport``. Backends: ``SshTransport``
(paramiko, production), ``SlurmTransport`` (``connection: slurm``: srun, many nodes
per call through ``run_batch``), ``LocalTransport`` (``connection: local``),
``FakeTransport`` (unit tests). A transport never raises for a node-level failure: it returns a
``RunResult`` whose ``state`` says what happened.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import BinaryIO, Literal, Protocol

from brctl.core.capture import DEFAULT_KEEP, Capture, not_utf8
from brctl.core.errors import ExitCode, exit_code_of

HostKeyPolicy = Literal["strict", "accept-new"]
ConnectionKind = Literal["ssh", "local", "slurm"]


class NodeState(str, Enum):
    """What happened on one node; each state is distinct."""

    OK = "ok"  # ran, exit code 0
    FAILED = "failed"  # ran, non-zero exit
    TIMEOUT = "timeout"  # connect or command timed out (the remote command was killed)
    UNREACHABLE = "unreachable"  # no TCP connection / no SSH banner / connection lost
    AUTH = "auth"  # the node refused our credentials
    HOSTKEY = "hostkey"  # the node's host key is unknown or changed
    REFUSED = "refused"  # brctl would not act there: a safety rule, a bad name from that node

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
    agent: bool = True  # offer the ssh-agent's keys too
    python: str = "python3"
    output_keep: int = DEFAULT_KEEP  # bytes of each stream kept at each end (brctl.core.capture)
    connection: ConnectionKind = "ssh"
    gpus: int = 8
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    job_user: str | None = None  # job.user: job-writable code runs as this user, never as root


@dataclass(frozen=True)
class RunResult:
    """One node's outcome; the fields are the JSON contract (``exit_code`` None if never ran).

    What brctl knows about the streams travels beside their text, never in it (a node
    can print anything, a truncation marker too): ``stdout_total`` is the byte count
    of a stream that was cut (None: kept whole), ``stdout_bytes`` the kept bytes
    exactly where they are not valid UTF-8 (the text has U+FFFD in their place).
    """

    node: str
    state: NodeState
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    stdout_total: int | None = None
    stderr_total: int | None = None
    stdout_bytes: bytes | None = field(default=None, repr=False)
    stderr_bytes: bytes | None = field(default=None, repr=False)

    @classmethod
    def captured(cls, node: str, state: NodeState, exit_code: int | None, out: Capture,
                 err: Capture, seconds: float, *, note: str = "") -> RunResult:
        """The result of a run whose streams ``out`` and ``err`` kept; ``note``: brctl's own
        words appended to stderr (why it ended)."""
        stdout, stderr = out.data(), err.data() + note.encode()
        return cls(node, state, exit_code, stdout.decode(errors="replace"),
                   stderr.decode(errors="replace"), seconds, out.cut_total, err.cut_total,
                   not_utf8(stdout), not_utf8(stderr))

    def to_json(self) -> dict[str, object]:
        """The per-node JSON object of every fan-out (``exec --json`` and the others):
        ``stdout_total``/``stderr_total`` only for a stream that was cut,
        ``stdout_b64``/``stderr_b64`` (the exact bytes) only where they are not UTF-8."""
        doc: dict[str, object] = {
            "state": self.state.value,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seconds": round(self.seconds, 3),
        }
        for name, total, exact in (("stdout", self.stdout_total, self.stdout_bytes),
                                   ("stderr", self.stderr_total, self.stderr_bytes)):
            if total is not None:
                doc[f"{name}_total"] = total
            if exact is not None:
                doc[f"{name}_b64"] = base64.b64encode(exact).decode("ascii")
        return doc


class Results(Mapping[str, RunResult]):
    """One fan-out's results by node name, in the order of its nodes (ClusterShell's Task).

    The run's verdict lives here once: which nodes gave no answer, which failed,
    identical outcomes folded, and the exit code (3 > 1 > 0).
    """

    def __init__(self, results: Iterable[RunResult]) -> None:
        """Args: one result per node, in node order."""
        self._by_node = {r.node: r for r in results}

    def __getitem__(self, node: str) -> RunResult:
        return self._by_node[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)

    def __repr__(self) -> str:
        return f"Results({list(self._by_node.values())!r})"

    def incomplete(self) -> list[str]:
        """Nodes where the command never ran to completion (timeout, unreachable, …)."""
        return [n for n, r in self._by_node.items() if not r.state.ran]

    def failed(self) -> list[str]:
        """Nodes where the command ran and exited non-zero."""
        return [n for n, r in self._by_node.items() if r.state is NodeState.FAILED]

    def folded(self) -> list[tuple[str, RunResult, int]]:
        """Nodes with the same outcome (state, exit code, stdout, stderr) folded together:
        ``[(node set, one of their results, count)]``, largest group first."""
        from brctl.core.nodeset import fold_by

        keyed = {n: (r.state, r.exit_code, r.stdout, r.stderr) for n, r in self._by_node.items()}
        first = {key: self._by_node[n] for n, key in reversed(keyed.items())}
        return [(nodes, first[key], count) for nodes, key, count in fold_by(keyed)]

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused some node, else 3 when some gave no answer, else 1 when
        some exited non-zero, else 0."""
        return exit_code_of(
            refused=any(r.state is NodeState.REFUSED for r in self._by_node.values()),
            incomplete=bool(self.incomplete()), findings=bool(self.failed()))

    def to_json(self) -> dict[str, dict[str, object]]:
        """``{node: the per-node JSON object}``."""
        return {n: r.to_json() for n, r in self._by_node.items()}


def state_for_exit(code: int) -> NodeState:
    """OK for 0, FAILED otherwise."""
    return NodeState.OK if code == 0 else NodeState.FAILED


# How brctl's own node-side programs start (the probe bootstrap, the bundle installer):
# the system interpreter (the node-side isolate.TRUSTED_PYTHON), isolated, with code brctl
# sends, whose first line is NODE_CODE_MARK (``node_program``): what ``with_env`` knows them
# by, not by the interpreter's flags alone, which an operator's command may use too.
NODE_PROGRAM = ("python3", "-I", "-S", "-c")
NODE_CODE_MARK = "# brctl node program: the node's env comes in its request\n"


def node_program(code: str, *args: str) -> list[str]:
    """The argv that runs one of brctl's own node programs, ``code`` with ``args``."""
    return [*NODE_PROGRAM, NODE_CODE_MARK + code, *args]


def with_env(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Prefix ``argv`` with ``env K=V`` so the environment does not depend on sshd's AcceptEnv.

    Not brctl's own node programs (``node_program``): a declared ``PATH`` would pick which
    ``python3`` runs them as root, and ``LD_PRELOAD``/``LD_LIBRARY_PATH`` what it loads,
    before anything is checked. They get the node's ``env`` in their request and apply it
    once it passed the checks (``brctl.diagnostics.isolate.launch``).
    """
    own = (tuple(argv[:len(NODE_PROGRAM)]) == NODE_PROGRAM and len(argv) > len(NODE_PROGRAM)
           and argv[len(NODE_PROGRAM)].startswith(NODE_CODE_MARK))
    if not env or own:
        return list(argv)
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv]


def command_line(argv: Sequence[str]) -> str:
    """The one place an argv becomes a remote command line: every argument quoted."""
    return shlex.join(argv)


class Transport(Protocol):
    """Run commands on one node at a time (bulk data goes by ``stream``); thread-safe."""

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

    def stream(
        self,
        node: Node,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: BinaryIO | None = None,
        stdout: BinaryIO | None = None,
    ) -> RunResult:
        """``run`` for bulk data: stdin read from, stdout written to, binary files as it goes.

        Nothing is held in memory; with ``stdout`` given the result's ``stdout`` is
        empty. ``timeout`` bounds the command, and also any pause of the stream.
        """
        ...

    def cancel(self) -> None:
        """Ctrl-C: kill every command running through this transport (the timeout's kill
        path), make those runs return promptly, and start no more."""
        ...

    def close(self) -> None:
        """Close every connection this transport holds."""
        ...
