"""Stragglers from collective arrival: the rank that enqueues last, group after group.

Pure. Over the last collectives of each group instance that every answering
member recorded, each rank's arrival is compared with its peers' median: the
one that arrives last by more than ``threshold_ms`` is late in that
collective, and a rank late in most of its instance's window (at least
``MIN_WINDOW`` collectives) is late. Its waiting peers arrive on time and are
never blamed. Arrival is the enqueue time on gloo (``time_created_ns``); on
NCCL it is the GPU's start (``time_discovered_started_ns``, with
``TORCH_NCCL_ENABLE_TIMING``: the CPU's enqueue runs ahead of the GPU), and
where that is off the arrival is unknown and no rank is judged.

A slow pipeline stage delays the next one through p2p (not recorded on gloo),
so a late rank whose pipeline predecessor (same coordinates, previous stage) is
late too is a victim: the straggler is the earliest late rank along the
pipeline.

Clocks: ranks on one machine share its clock, and a late verdict among them
is ``trusted``. Across machines a clock step (or a node lying about its clock)
alone would make a healthy machine's ranks look late, so a cross-machine verdict
is trusted only where the instance spans at least ``MIN_MACHINES`` machines and
the rank is also late behind the median of the other machines' own medians (one
machine's clock cannot move that median past its neighbours). An untrusted late
rank is listed, never evicted (``fusion``). The default threshold (20 ms) is
well above NTP/PTP error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from brctl.analysis.collectives import RankRecord
from brctl.analysis.topology import Topology
from brctl.analysis.wavefront import Instance

MIN_WINDOW = 3  # collectives an instance needs before anyone in it is judged late
MIN_MACHINES = 4  # machines an instance needs before a cross-machine arrival is trusted:
# the median of >= 3 other machines' medians is robust to one bad clock (of 2 it is a mean)


@dataclass(frozen=True)
class Late:
    """A rank that arrived last in most of its group's recent collectives."""

    rank: int
    group: Instance
    late_in: int  # collectives of the window it arrived last in, by more than the threshold
    window: int
    late_ms: float  # its median lateness behind its peers' median in those
    victim_of: int | None = None  # the late pipeline predecessor that delayed it
    trusted: bool = True  # false: it rests on comparing two machines' clocks (not evicted)

    def to_json(self) -> dict[str, object]:
        """A row of ``stragglers``."""
        return {"rank": self.rank, "group": self.group.name, "desc": self.group.desc,
                "late_in": self.late_in, "window": self.window,
                "late_ms": round(self.late_ms, 3),
                "role": "straggler" if self.victim_of is None else "victim",
                "victim_of": self.victim_of, "trusted": self.trusted}


def arrival_basis(records: Mapping[int, RankRecord]) -> str:
    """``enqueue`` (gloo), ``started`` (NCCL with timing), or ``unknown``."""
    backends = {r.backend for r in records.values()}
    if "nccl" not in backends:
        return "enqueue" if records else "unknown"
    timed = any(t[2] for r in records.values() for g in r.groups.values() for t in g.recent)
    return "started" if timed else "unknown"


def _behind_machines(rank: int, s: int, arrivals: Mapping[int, Mapping[int, int]],
                     machine: Mapping[int, str]) -> float:
    """How far ``rank`` arrived at ``s`` behind the median of the other machines' medians."""
    per: dict[str, list[int]] = {}
    for r, a in arrivals.items():
        if machine[r] != machine[rank]:
            per.setdefault(machine[r], []).append(a[s])
    return arrivals[rank][s] - median(median(v) for v in per.values())


def _instance_late(inst: Instance, records: Mapping[int, RankRecord], use_started: bool,
                   threshold_ns: float, window: int, topo: Topology) -> list[Late]:
    arrivals: dict[int, dict[int, int]] = {}  # rank → seq → arrival
    for r in inst.members:
        rec = records.get(r)
        g = rec.groups.get(inst.name) if rec is not None else None
        if g is None:
            continue
        times = {s: (st if use_started else enq) for s, enq, st in g.recent}
        arrivals[r] = {s: t for s, t in times.items() if t}  # 0: not started
    if len(arrivals) < 2:
        return []
    common = set.intersection(*(set(a) for a in arrivals.values()))
    seqs = sorted(common)[-window:]
    if len(seqs) < MIN_WINDOW:
        return []
    late: dict[int, list[float]] = {}
    for s in seqs:
        order = sorted((a[s], r) for r, a in arrivals.items())
        t_last, last = order[-1]
        behind = t_last - median(t for t, _ in order[:-1])
        if behind > threshold_ns:
            late.setdefault(last, []).append(behind / 1e6)
    machine = {r: topo.machine_of(r) for r in arrivals}
    spans = len(set(machine.values()))
    out = []
    for r, v in late.items():
        if 2 * len(v) <= len(seqs):
            continue
        trusted = spans == 1 or (spans >= MIN_MACHINES and 2 * sum(
            _behind_machines(r, s, arrivals, machine) > threshold_ns for s in seqs) > len(seqs))
        out.append(Late(r, inst, len(v), len(seqs), median(v), trusted=trusted))
    return out


def stragglers(records: Mapping[int, RankRecord], insts: Mapping[str, Instance],
               topo: Topology, threshold_ms: float = 20.0, window: int = 20
               ) -> tuple[tuple[Late, ...], str]:
    """Late ranks (stragglers, then their pipeline victims) and the arrival basis.

    Args:
        records: rank → record of one capture.
        insts: the group instances (``wavefront.instances``).
        topo: the layout (who is whose pipeline predecessor).
        threshold_ms: how far behind its peers' median a rank must arrive to be late.
        window: the most recent collectives per instance compared.
    """
    basis = arrival_basis(records)
    if basis == "unknown":
        return (), basis
    found: dict[int, Late] = {}
    for inst in insts.values():
        if inst.kind == "world" or len(inst.members) < 2:
            continue  # the world's collectives wait on every stage: no peer to compare
        for late in _instance_late(inst, records, basis == "started", threshold_ms * 1e6,
                                   window, topo):
            if late.rank not in found or late.late_in > found[late.rank].late_in:
                found[late.rank] = late
    out = []
    for r, late in found.items():
        pred = _predecessor(r, topo)
        if pred is not None and pred in found:
            late = Late(late.rank, late.group, late.late_in, late.window, late.late_ms, pred,
                        late.trusted)
        out.append(late)
    out.sort(key=lambda x: (x.victim_of is not None, -x.late_in, x.rank))
    return tuple(out), basis


def _predecessor(rank: int, topo: Topology) -> int | None:
    """The rank of the previous pipeline stage with the same other coordinates."""
    if topo.pp < 2 or rank >= topo.world:
        return None
    ranks = topo.group_ranks("pp", topo.group_id(rank, "pp"))
    at = ranks.index(rank)
    return ranks[at - 1] if at > 0 else None
