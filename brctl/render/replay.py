"""Rendering of ``brctl replay``: the plan, one table per round, the verdict; or the JSON."""

from __future__ import annotations

from brctl.analysis.replay.groups import ReplayPlan
from brctl.analysis.replay.judge import JudgedGroup
from brctl.core.errors import ExitCode
from brctl.core.nodeset import fold, fold_in_order
from brctl.operations.replay import ReplayReport, plan_only_json
from brctl.render.output import Output, escape, table

_COLOUR = {"found": "red", "none": "green", "ambiguous": "yellow", "not_reproduced": "yellow",
           "incomplete": "magenta"}


def _summary(p: ReplayPlan) -> str:
    grid = ("round 2 is a grid" if p.grid else "later rounds are adaptive (suspects split "
            f"over up to {len(p.round1)} jobs with known-good machines)")
    if p.thin:
        grid += "; with 3 groups a lone candidate is confirmed against a control job"
    n, nan = p.rounds_single_fault(), p.rounds_single_fault("nan")
    rounds = (f"at most {n} round(s) to name one faulty machine" if n
              else f"one faulty machine is named (in at most {nan} round(s)) only when it "
                   "goes NaN/inf: with 3 machines that each hold the whole model, one "
                   "corrupted value looks the same as the two others corrupting alike"
              if nan else "no majority vote possible")
    return (f"DP'={p.shape.dp} (TP={p.shape.tp}, PP={p.shape.pp}): {len(p.round1)} groups of "
            f"{p.shape.slots} machine(s) per round; {grid}; {rounds}")


def render_plan(out: Output, p: ReplayPlan) -> None:
    """``--plan-only``: the groups of rounds 1 and 2, nothing run."""
    if out.json:
        out.emit_json("replay", plan_only_json(p), status=ExitCode.OK)  # a plan judges nothing
        return
    out.console.print(escape(_summary(p)))
    for title, rnd in (("round 1 (horizontal)", p.round1), ("round 2 (vertical)", p.round2)):
        if rnd is None:
            out.console.print("round 2: adaptive, built from round 1's result")
            continue
        out.console.print(table(["group", "machines"],
                                [(i, fold_in_order(g)) for i, g in enumerate(rnd)],
                                title=title))


def _deviant_cell(g: JudgedGroup) -> str:
    if g.status == "deviant":
        return f"yes (step {g.first_deviant_step})"
    return {"clean": "no", "unconfirmed": "once, not again", "undecided": "no majority",
            "incomplete": "did not run"}[g.status]


def render(out: Output, report: ReplayReport) -> None:
    """A table per round and the verdict, or the JSON document."""
    v = report.verdict
    if out.json:
        out.emit_json("replay", report.to_json(), status=report.exit_code)
        return
    out.console.print(escape(_summary(report.plan)))
    out.console.print(escape(f"workload: {report.workload}"))
    for i, rnd in enumerate(report.rounds, 1):
        rows, notes = [], []
        for gi, g in enumerate(rnd.groups):
            label = (f"{gi} (control)" if rnd.kind == "confirm" and not g.suspects
                     else f"{gi} (tests {fold(g.suspects)})" if g.suspects else f"{gi}")
            rows.append((label, fold_in_order(g.nodes), g.fingerprint or "-", _deviant_cell(g),
                         f"{max(r.seconds for r in g.runs):.1f}s"))
            if g.status == "incomplete" and g.runs[-1].error:
                notes.append((label, g.runs[-1].error))
        out.console.print(table(["group", "machines", "fingerprint", "deviant", "time"],
                                rows, title=f"round {i} ({rnd.kind})"))
        for label, note in notes:  # a long reason: a paragraph under the table, not a column
            out.record(f"group {label}:", note)
    colour = _COLOUR[v.verdict]
    line = f"[bold {colour}]{v.verdict}[/]"
    if v.faulty:
        line += f": faulty {escape(fold(v.faulty))}"
    if v.candidates:
        line += f"; candidates {escape(fold(v.candidates))}"
    if v.cleared:
        line += f"; cleared {escape(fold(v.cleared))}"
    out.console.print(line)
    out.console.print(escape(v.reason), style="dim")
