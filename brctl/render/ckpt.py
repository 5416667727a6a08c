"""Rendering of ``brctl ckpt``: placement tables, eviction violations, copy summaries."""

from __future__ import annotations

from brctl.analysis.placement.plan import Verification
from brctl.core.nodeset import fold
from brctl.operations.ckpt.ops import CopyReport, PlanReport
from brctl.render.output import Output, escape, table


def render_plan(out: Output, report: PlanReport, fmt: str) -> None:
    """A table of node → backup, the document as JSON, or YAML for training code."""
    plan = report.plan
    if fmt == "json":
        out.emit_json("ckpt.plan", report.to_json(), status=report.exit_code)
        return
    if fmt == "yaml":
        out.stdout.write(report.to_yaml())
        return
    rows = [(p.node, p.backup_node, p.how,
             "yes" if p.meets_rule else f"no (shares {'/'.join(p.shared_kinds)})",
             "same" if p.same_domain else "")
            for p in plan.placements]
    out.console.print(table(("node", "backup", "how", "meets rule", "domain"), rows))
    for note in plan.notes:
        out.warn(note)


def render_verify(out: Output, result: Verification) -> None:
    """Violations folded by machine set, then the loss probabilities."""
    if out.json:
        out.emit_json("ckpt.verify", result.to_json(), status=result.exit_code)
        return
    probs = {str(k): p for k, p in result.loss_probability.items()}
    merged: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
    for v in result.violations:
        key = (v.kind, v.nodes, v.lost)
        merged[key] = merged.get(key, 0) + 1
    if merged:
        rows = [(kind, count, fold(nodes) or "-", fold(lost))
                for (kind, nodes, lost), count in merged.items()]
        out.console.print(table(("evicted kind", "groups", "evicted machines", "shards lost of"),
                                rows, title="evictions that lose a shard"))
    else:
        out.console.print(f"ok: {result.evictions} single-group and single-machine evictions, "
                          "no shard loses both copies")
    line = ", ".join(f"k={k}: {p:.3g}" if p is not None else f"k={k}: -" for k, p in probs.items())
    out.console.print(f"P(some shard lost | k random machines of {result.machines} fail): "
                      f"{escape(line)}")


def render_copies(out: Output, schema: str, report: CopyReport) -> None:
    """One row per copy; errors and notes on stderr."""
    if out.json:
        out.emit_json(schema, report.to_json(), status=report.exit_code)
        return
    rows = [(c.owner, f"{c.source} → {c.dest}", c.state, c.step or "-",
             f"{len(c.send) if c.state == 'planned' else c.copied}/{c.files}", _size(c.bytes),
             f"{c.seconds:.1f}s") for c in report.copies]
    out.console.print(table(("shards of", "copy", "state", "step", "sent", "bytes", "time"), rows))
    for c in report.copies:
        if c.state == "planned":  # a dry run: exactly what the real run would do
            out.console.print(f"{escape(c.owner)}: would copy {escape(c.step or '-')} from "
                              f"{escape(c.from_path or '-')} to {escape(c.to_path or '-')}: "
                              f"{len(c.send)} of {c.files} files, {_size(c.bytes)}")
            for rel in c.send:
                out.console.print(f"  {escape(rel)}")
    if any(c.state == "planned" for c in report.copies):
        out.console.print("dry run: nothing was created, sent or renamed")
    for c in report.copies:
        if c.error:
            out.warn(f"{c.owner}: {c.error}")
        for warning in c.warnings:
            out.warn(f"{c.owner}: {warning}")
        for note in c.notes:
            out.info(f"{c.owner}: {note}")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
