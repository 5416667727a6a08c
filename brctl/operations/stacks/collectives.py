"""The recorder summaries of a ``brctl stacks`` run, decoded per round for the analysis.

Each round's machines sent, per rank, the summary ``diagnostics.recorder`` made
on the machine (``NodeCollection.recorder``). ``decode_captures`` turns them into
one ``{rank: RankRecord}`` per round (``analysis.collectives.decode_summary``): a
summary out of shape is that rank's error, kept beside the captures; a row a
machine sent for a rank the topology places elsewhere (machines sharing one
kernel see each other's processes) is left to that rank's own machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from brctl.analysis.collectives import CollectiveFormatError, RankRecord, decode_summary
from brctl.analysis.topology import Topology
from brctl.operations.stacks.types import Collection


def decode_captures(collections: Sequence[Collection], topo: Topology
                    ) -> tuple[list[dict[int, RankRecord]], dict[int, str]]:
    """(per round: rank → its decoded record, rank → why its last summary was refused)."""
    captures: list[dict[int, RankRecord]] = []
    errors: dict[int, str] = {}
    machine_of = topo.rank_machines
    for col in collections:
        got: dict[int, RankRecord] = {}
        for node, nc in col.nodes.items():
            for rank, rec in nc.recorder.items():
                if rec.summary is None or not 0 <= rank < topo.world \
                        or machine_of[rank] != node or rank in got:
                    continue
                try:
                    got[rank] = decode_summary(rec.summary, rank, topo.world)
                    errors.pop(rank, None)
                except CollectiveFormatError as exc:
                    errors[rank] = str(exc)
        captures.append(got)
    return captures, errors
