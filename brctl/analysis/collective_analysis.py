"""The recorder evidence of one run: wavefront verdicts, culprits, stragglers, for output.

Pure. ``analyse_collectives`` runs ``wavefront.wavefront`` and
``stragglers.stragglers`` over the decoded captures; ``CollectiveAnalysis``
carries the result to ``fusion.fuse`` and to the ``brctl.stacks/2`` keys it adds.
Kept apart from ``fusion.py`` so that ``stacks.StackAnalysis`` can name its type
without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brctl.analysis.collectives import RankRecord
from brctl.analysis.stragglers import Late, stragglers
from brctl.analysis.topology import Topology
from brctl.analysis.wavefront import Culprit, GroupVerdict, Instance, Wavefront, wavefront


@dataclass(frozen=True)
class CollectiveAnalysis:
    """What the flight recorders say about the job, for fusing and for the output."""

    wave: Wavefront
    late: tuple[Late, ...]
    arrival: str  # enqueue | started | unknown
    stuck_after: float
    threshold_ms: float
    records: Mapping[int, RankRecord]  # the last capture
    instances: Mapping[str, Instance]

    @property
    def culprits(self) -> tuple[Culprit, ...]:
        """The ranks a stuck collective blames."""
        return self.wave.culprits

    @property
    def communicator(self) -> tuple[GroupVerdict, ...]:
        """Instances where every member joined and none completed."""
        return tuple(v for v in self.wave.groups if v.verdict == "communicator")

    def rank_json(self, rank: int) -> dict[str, Any] | None:
        """A rank's ``collectives``: per group its wavefront and pending collective, or None."""
        rec = self.records.get(rank)
        if rec is None:
            return None
        out: dict[str, Any] = {}
        for name, g in rec.groups.items():
            p = g.pending
            out[name] = {"desc": g.desc, "last_enqueued": g.last_enqueued,
                         "last_completed": g.last_completed, "pending": None if p is None else {
                             "seq": p.seq, "op": p.op, "sizes": [list(s) for s in p.sizes],
                             "dtypes": list(p.dtypes),
                             "age_s": round(max(0, rec.clock_ns - p.enqueued_ns) / 1e9, 3)}}
        return out

    def to_json(self) -> dict[str, Any]:
        """The keys this adds to ``brctl.stacks/2`` (new keys: no schema bump)."""
        return {
            "collective_groups": [v.to_json() for v in self.wave.groups],
            "collective_culprits": [{"rank": c.rank, "why": c.why, "group": c.verdict.group.name,
                                     "seq": c.verdict.seq, "text": c.text,
                                     "corroborated": c.corroborated}
                                    for c in self.wave.culprits],
            "stragglers": [s.to_json() for s in self.late],
            "arrival": self.arrival,
            "stuck_after_s": self.stuck_after,
            "straggler_threshold_ms": self.threshold_ms,
        }


def analyse_collectives(captures: Sequence[Mapping[int, RankRecord]], topo: Topology, *,
                        stuck_after: float = 60.0, interval: float | None = None,
                        straggler_threshold_ms: float = 20.0) -> CollectiveAnalysis:
    """The wavefront verdicts, culprits and stragglers of the captures (oldest first).

    Args:
        captures: rank → decoded record, one mapping per round (ranks without one
            are absent: their missing answer is evidence the analysis weighs).
        topo: the job's topology.
        stuck_after: seconds a pending collective may be old before it is stuck.
        interval: seconds between the captures (a frontier pending in two captures
            is stuck whatever its age); informational, the order of captures decides.
        straggler_threshold_ms: how late a rank must arrive to be late.
    """
    del interval  # two captures are its evidence; the value itself is not needed
    wave, insts = wavefront(captures, topo, stuck_after)
    last = captures[-1] if captures else {}
    late, basis = stragglers(last, insts, topo, straggler_threshold_ms)
    return CollectiveAnalysis(wave, late, basis, stuck_after, straggler_threshold_ms, last, insts)
