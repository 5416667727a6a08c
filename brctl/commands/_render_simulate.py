"""Rendering of ``brctl simulate``: one row per sweep value, lost time by cause."""

from __future__ import annotations

from brctl.analysis.simulate import CAUSES
from brctl.operations.simulate import SimulateReport
from brctl.render import Output, escape, table


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h"


def render_simulate(out: Output, report: SimulateReport) -> None:
    """The table (or ``brctl.simulate/1``)."""
    if out.json:
        out.emit_json("simulate", report.to_json())
        return
    sc = report.scenario
    out.console.print(escape(
        f"{sc.machines} machines, {sc.days:g} days, standby {sc.standby}, checkpoint every "
        f"{sc.ckpt_interval:g}s, mix {report.mix_name}, {len(report.rows[0][1].runs)} run(s) "
        f"from seed {report.seed} ({report.seconds:.1f}s)"))
    key = report.sweep_key or "scenario"
    percentiles = len(report.rows[0][1].runs) > 1
    columns = [key, "ETTR", *(["p10", "p90"] if percentiles else []), "worst day", "incidents",
               "exhausted", "refused", "pages"]
    rows = []
    for value, s in report.rows:
        rows.append([f"{value:g}" if value is not None else "-", f"{s.ettr:.2%}",
                     *([f"{s.percentile(0.1):.2%}", f"{s.percentile(0.9):.2%}"] if percentiles
                       else []),
                     f"{s.mean('worst_day_ettr'):.2%}", f"{s.mean('incidents'):.0f}",
                     f"{s.mean('standby_exhausted'):.1f}", f"{s.mean('cap_refusals'):.1f}",
                     f"{s.mean('pages'):.1f}"])
    out.console.print(table(columns, rows))
    lost_rows = []
    for value, s in report.rows:
        lost = s.to_json()["lost_seconds"]
        assert isinstance(lost, dict)
        lost_rows.append([f"{value:g}" if value is not None else "-",
                          *(_hours(float(lost[c])) for c in CAUSES)])
    out.console.print(table([key, *CAUSES], lost_rows, title="lost time by cause (mean per run)"))
