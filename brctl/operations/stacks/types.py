"""The records of ``brctl stacks``'s collection: a rank's dump, a machine's answer, a round,
the job's shape. Moved out of ``operations/stacks/ops.py`` (the module cap); imported
from there as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from brctl.analysis.stacks.tree import Stack
from brctl.analysis.topology import Topology


class RankDump(NamedTuple):
    """One rank process found on a machine and its stack (or why there is none).

    A NamedTuple, not a frozen dataclass: one per rank, 131,072 in a round.
    """

    rank: int
    pid: int
    output: str | None  # py-spy's JSON text, as printed (collected raw, for --save)
    error: str | None
    local_rank: int | None = None
    world_size: int | None = None
    stack: Stack | None = None  # the main thread's frames, as the probe reduced them


class RankRead(NamedTuple):
    """What one rank's socket and process state said (``stacks_probe``'s ``recorder`` row).

    ``state``: ``read`` (some channel gave evidence), ``unread`` (none could: py-spy
    refused, no socket), ``unresponsive`` (read but silent: a timeout, stat D/T/Z).
    ``channel``: ``brctl-socket``, ``torch-socket`` or ``none``. ``summary`` is the
    node's recorder summary as it came (``diagnostics.recorder``), decoded by the
    collective analysis; ``table``/``traceback``: brctl's handler / the traceback
    answered (a recorder without either: the main thread holds the GIL in native code).
    """

    rank: int
    pid: int
    channel: str
    state: str
    proc_state: str = ""
    traceback: bool = False
    table: bool = False
    error: str | None = None
    summary: dict[str, Any] | None = None
    wchan: str | None = None


@dataclass(frozen=True)
class NodeCollection:
    """What one machine answered: ``state`` is the transport state, or ``probe_error``."""

    node: str
    state: str
    error: str | None
    ranks: tuple[RankDump, ...] = ()
    workers: int = 0  # data-loader / checkpoint processes found under the ranks
    seconds: float = 0.0
    recorder: dict[int, RankRead] = field(default_factory=dict)  # rank → its sockets' word
    unread: int = 0  # processes whose environment was refused and no socket named
    socket_errors: tuple[str, ...] = ()  # a refused socket directory, a peer not the job's
    # pid → {"dump": the recorder's JSON text, "clock_ns", "table"} (for --save)
    fr_raw: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        """The probe ran and returned its document."""
        return self.state == "ok"


@dataclass(frozen=True)
class Collection:
    """One round over the job's machines."""

    nodes: dict[str, NodeCollection]
    started: float  # wall-clock time.time() at the start of the round
    seconds: float
    py_spy_shipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobShape:
    """What ``Topology.build`` needs, as saved in ``job.json``."""

    machines: tuple[str, ...]
    gpus: tuple[int, ...]
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    order: str = "tp-cp-ep-dp-pp"

    def topology(self, rank_machines: Sequence[str] | None = None) -> Topology:
        """The topology, with the live rank → machine mapping when known."""
        return Topology.build(self.machines, list(self.gpus), tp=self.tp, pp=self.pp, cp=self.cp,
                              ep=self.ep, order=self.order, rank_machines=rank_machines)
