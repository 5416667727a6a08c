"""Rendering of ``brctl stacks``: the merged prefix tree, outliers, suspect group, eviction,
and, where ranks' flight recorders were read, one line per stuck group instance and the
straggler table."""

from __future__ import annotations

from typing import Any

from brctl.analysis.collective_analysis import CollectiveAnalysis
from brctl.analysis.stacks.tree import TreeNode, fold_ranks, frame_label
from brctl.core.nodeset import fold
from brctl.operations.stacks.ops import StacksReport
from brctl.render.output import Output, escape

_CHAIN_SHOWN = 6  # frames of one tree node shown before eliding its middle


def _ranks_label(ranks: tuple[int, ...]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {fold_ranks(ranks)} ({len(ranks)})"


def _label(frames: list[str], ranks: tuple[int, ...], outlier: bool) -> str:
    if len(frames) > _CHAIN_SHOWN:
        frames = [*frames[:2], f"… {len(frames) - 5} frames …", *frames[-3:]]
    colour = "red" if outlier else "green"
    head = f"[{colour}]{escape(_ranks_label(ranks))}[/]"
    return head + "".join(f"\n  {escape(f)}" for f in frames)


def stack_tree(root: TreeNode, outliers: set[int]) -> Any:
    """A rich Tree of the merged stacks; branches with outlier ranks in red."""
    from rich.tree import Tree

    tree = Tree(escape(_ranks_label(root.ranks)) + " [dim]outermost frame first[/]")

    def add(parent: Any, node: TreeNode) -> None:
        frames = [frame_label(f) for f in node.frames]
        branch = parent.add(_label(frames, node.ranks, not outliers.isdisjoint(node.ranks)))
        for child in node.children:
            add(branch, child)

    for child in root.children:
        add(tree, child)
    return tree


def _where(name: str, desc: str, members: tuple[int, ...]) -> str:
    return f"{desc or 'group ' + name} (ranks {fold_ranks(members)})"


def collective_lines(coll: CollectiveAnalysis) -> list[str]:
    """One line per stuck group instance (who is missing or mismatched, who waits on whom),
    a count of those in flight, and the straggler table."""
    lines: list[str] = []
    blamed = {c.rank: c.why for c in coll.culprits}
    flight = 0
    for v in coll.wave.groups:
        if v.verdict == "in_flight":
            flight += 1
            continue
        g = v.group
        head = f"{v.verdict}: {v.op} #{v.seq} of {_where(g.name, g.desc, g.members)}, {v.age_s:.1f} s"
        parts = []
        if v.mismatched:
            parts.append(f"mismatched {fold_ranks(v.mismatched)}: {v.detail}")
        waits = {r: (n, s) for r, n, s in v.waits}
        for r in v.missing:
            if r in waits:
                n, s = waits[r]
                other = coll.instances.get(n)
                parts.append(f"{r} waits in #{s} of {other.desc or n if other else n}")
            else:
                parts.append(f"{r} never entered" + (" (culprit)" if r in blamed else ""))
        if v.no_answer:
            parts.append(f"no answer from {fold_ranks(v.no_answer)}")
        if v.verdict == "communicator":
            parts.append(v.detail)
        lines.append(head + (": " + "; ".join(parts) if parts else ""))
    if flight:
        lines.append(f"in flight (not stuck, younger than {coll.stuck_after:g} s): {flight} "
                     f"group instance{'s' if flight != 1 else ''}")
    if coll.late:
        lines.append(f"stragglers (arrival: {coll.arrival}, threshold {coll.threshold_ms:g} ms):")
        for x in coll.late:
            role = "straggler" if x.victim_of is None else f"victim of rank {x.victim_of}"
            if not x.trusted:
                role += " (two machines' clocks compared: not evicted)"
            lines.append(f"  rank {x.rank}  {x.group.desc or x.group.name}  last in "
                         f"{x.late_in}/{x.window}  by {x.late_ms:.0f} ms  {role}")
    elif coll.arrival == "unknown" and coll.records:
        lines.append("stragglers: arrival unknown (NCCL without TORCH_NCCL_ENABLE_TIMING)")
    return lines


def render(out: Output, report: StacksReport) -> None:
    """Tree, outliers, suspect group and eviction list; or the JSON document."""
    if out.json:
        out.emit_json("stacks", report.to_json(), version=2, status=report.exit_code)
        return
    a = report.analysis
    outlier_ranks = {o.rank for o in a.outliers}
    out.console.print(stack_tree(a.tree, outlier_ranks))
    if a.collectives is not None:
        for line in collective_lines(a.collectives):
            out.record(line)
    if a.outliers:  # one record each: a long detail is a paragraph under it, not a column
        out.record("outliers:")
        for o in a.outliers:
            pid = o.pid if o.pid is not None else "-"
            out.record(f"  {o.node}  rank {o.rank}  pid {pid}  {o.reason}  "
                       f"in {o.rounds}/{a.rounds} rounds", o.detail)
    if a.suspects:
        for s in a.suspects:
            noun = "group" if len(s.indices) == 1 else "groups"
            which = f"{s.kind} {noun} {','.join(map(str, s.indices))}"
            out.console.print(f"suspect: {escape(which)} on {escape(fold(list(s.members)))}: "
                              f"{escape(s.why)}")
        if a.evict:
            out.console.print(f"[bold red]evict:[/] {escape(fold(list(a.evict)))}")
        else:  # only communicator suspects: the all-gather ladder decides after the stop
            out.console.print("nothing to evict on this evidence: the communicator is tested "
                              "after the stop (brctl diagnose)")
    elif a.unread and len(a.unread) == len(a.tree.ranks):
        out.console.print("[yellow]no evidence: no rank could be read[/]")
    else:
        out.console.print("[green]no outlier: every rank looks like its pipeline stage[/]")
    if a.unread:
        out.warn(f"ranks {fold_ranks(a.unread)} could not be read (see their errors): not "
                 "compared, and the run is incomplete")
    for node, err in sorted(report.node_errors.items()):
        out.warn(f"{node}: no answer ({err}); its ranks were not compared")
