"""Rendering of ``brctl stacks``: the merged prefix tree, outliers, suspect group, eviction."""

from __future__ import annotations

from typing import Any

from brctl.analysis.stacks import TreeNode, fold_ranks, frame_label
from brctl.core.nodeset import fold
from brctl.operations.stacks import StacksReport
from brctl.render import Output, escape

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


def render(out: Output, report: StacksReport) -> None:
    """Tree, outliers, suspect group and eviction list; or the JSON document."""
    if out.json:
        out.emit_json("stacks", report.to_json(), version=2, status=report.exit_code)
        return
    a = report.analysis
    outlier_ranks = {o.rank for o in a.outliers}
    out.console.print(stack_tree(a.tree, outlier_ranks))
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
        out.console.print(f"[bold red]evict:[/] {escape(fold(list(a.evict)))}")
    else:
        out.console.print("[green]no outlier: every rank looks like its pipeline stage[/]")
    for node, err in sorted(report.node_errors.items()):
        out.warn(f"{node}: no answer ({err}); its ranks were not compared")
