"""The recorder's evidence fused with the stacks': one eviction, reasons citing both.

Pure. ``analyse_collectives`` (``collective_analysis.py``, re-exported here)
runs the wavefront (``wavefront.py``) and the arrival analysis
(``stragglers.py``) over the decoded captures; ``fuse`` folds the result into
the stack analysis:

- the ranks to cover are the collective culprits (those resting on one
  machine's word only where the culprit's own stack shows it outside any
  collective), the stragglers, and the stack
  outliers the collective evidence does not explain away: a rank that waits in
  a stuck collective, or is a straggler's victim, is not blamed (the ranks a
  culprit blocked are not named); nor, from one round, is a stack ``minority``
  whose own recorder answered and corroborates nothing (its groups not stuck,
  it not late): in a two-rank stage a 1-vs-1 stack vote can pick the healthy
  rank, and the recorder's evidence is the sharper one (listed, not evicted);
- they are covered by the same smallest whole-group eviction as stack outliers
  alone (``evictset.minimal_cover``), and each group's evidence cites the
  recorder and the rank's main thread, e.g. ``rank 5 never entered all_reduce
  #1042 of DATA_PARALLEL_GROUP (ranks 1,5,9,13); its main thread: loader.py:88
  next_batch``;
- a group whose every member joined and none completed is a ``communicator``
  suspect (GPU, NCCL or network): listed, sent to the all-gather ladder after
  the stop, never evicted on this evidence alone.

Without a stuck collective or a straggler the stack analysis stands as it was.
"""

from __future__ import annotations

from dataclasses import replace

from brctl.analysis.collective_analysis import CollectiveAnalysis as CollectiveAnalysis
from brctl.analysis.collective_analysis import analyse_collectives as analyse_collectives
from brctl.analysis.stacks.evictset import SuspectGroup, minimal_cover
from brctl.analysis.stacks.tree import Outlier, Round, Stack, StackAnalysis, _kinds
from brctl.analysis.topology import Topology
from brctl.analysis.wavefront import GroupVerdict


def _frame(stack: Stack | None) -> str:
    if not stack:
        return ""
    f = stack[-1]
    return f"; its main thread: {f.file}:{f.line} {f.name}"


def fuse(stacks: StackAnalysis, coll: CollectiveAnalysis, topo: Topology, last: Round
         ) -> StackAnalysis:
    """The stack analysis with the collective evidence folded in (see the module docstring).

    Args:
        stacks: the stack analysis of the same rounds.
        coll: ``analyse_collectives`` of those rounds.
        topo: the job's topology.
        last: the last round's samples (each blamed rank's innermost frame is cited).
    """
    samples = {s.rank: s for s in last.samples}
    comm = tuple(_communicator(v, topo) for v in coll.communicator)
    # Only a culprit its own record backs: a stack outside any collective is what a healthy
    # rank between two collectives shows too, so with it one lying machine could evict a peer.
    blamed: dict[int, str] = {c.rank: c.text for c in coll.culprits if c.corroborated}
    for late in coll.late:
        if late.victim_of is None and late.trusted:  # two machines' clocks alone: listed only
            blamed.setdefault(late.rank, f"rank {late.rank} arrived last in {late.late_in} of the "
                              f"last {late.window} collectives of {late.group.desc or late.group.name}"
                              f" by {late.late_ms:.0f} ms (threshold {coll.threshold_ms:g} ms)")
    if not blamed:
        return replace(stacks, suspects=stacks.suspects + comm, collectives=coll)
    victims = set(coll.wave.waiting) | {x.rank for x in coll.late if x.victim_of is not None}
    kept = [o for o in stacks.outliers if o.rank in blamed or o.rank not in victims]
    stuck = {r for v in coll.wave.groups if v.verdict != "in_flight" for r in v.group.members}
    unbacked = {o.rank for o in kept if stacks.rounds == 1 and o.reason == "minority"
                and o.rank not in blamed and o.rank in coll.records and o.rank not in stuck}
    kept = [replace(o, detail=(o.detail + "; " if o.detail else "") + "not evicted: its "
                    "recorder answered and shows it neither stuck nor late")
            if o.rank in unbacked else o for o in kept]
    targets = set(blamed) | {o.rank for o in kept if o.rank not in unbacked}
    evidence = {r: why + _frame(samples[r].stack if r in samples else None)
                for r, why in blamed.items()}
    suspects = tuple(
        replace(g, why=g.why + "; " + "; ".join(evidence[r] for r in held[:4]),
                evidence=tuple(evidence[r] for r in held))
        if (held := [r for r in sorted(blamed) if _holds(g, r, topo)]) else g
        for g in minimal_cover(targets, topo, _kinds(topo)))
    have = {o.rank for o in kept}
    outliers = list(kept)
    for r in sorted(set(blamed) - have):
        s = samples.get(r)
        reason = "collective" if any(c.rank == r for c in coll.culprits) else "straggler"
        outliers.append(Outlier(r, s.node if s else topo.machine_of(r),
                                s.pid if s and s.pid > 0 else None, reason, 1, evidence[r]))
    outliers.sort(key=lambda o: o.rank)
    evict = tuple(topo.machines_of(r for g in suspects for gid in g.indices
                                   for r in topo.group_ranks(g.kind, gid)))
    return replace(stacks, outliers=tuple(outliers), suspects=suspects + comm, evict=evict,
                   collectives=coll)


def _holds(g: SuspectGroup, rank: int, topo: Topology) -> bool:
    return topo.group_id(rank, g.kind) in g.indices


def _communicator(v: GroupVerdict, topo: Topology) -> SuspectGroup:
    g = v.group
    members = tuple(topo.machines_of(g.members))
    why = (f"every member of {g.desc or 'group ' + g.name} joined {v.op} #{v.seq} "
           f"{v.age_s:.0f} s ago and none completed: the communicator (GPU, NCCL or network); "
           "checked by the all-gather ladder after the stop, not evicted on this alone")
    return SuspectGroup("communicator", (g.index,) if g.index is not None else (), members,
                        why, (f"{g.desc or g.name} ranks {','.join(map(str, g.members[:16]))}: "
                              f"{v.op} #{v.seq} pending on all, age {v.age_s:.1f} s",))
