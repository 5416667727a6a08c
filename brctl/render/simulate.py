"""Rendering of ``brctl simulate``: one row per sweep value, lost time by cause, and
(``-o FILE.html``) the incident report's picture: the ETTR chart and lost-time table."""

from __future__ import annotations

from collections.abc import Mapping

from brctl.analysis.daemon.simulate import CAUSES, RESOLUTIONS, Summary
from brctl.operations.simulate import SimulateReport
from brctl.render.output import Output, escape, table
from brctl.render.report import (
    LINE_COLOURS,
    chart_svg,
    duration,
    h,
    html_page,
    lost_table,
)

# what each simulated cause is, beside the report's cause it belongs to
CAUSE_TEXT: Mapping[str, str] = {
    "detection": "detection (stopped, not yet detected)",
    "analysis": "diagnosis (diagnose ladder, stack analysis)",
    "swap": "standby (swapping a standby in)",
    "no_standby": "standby: none ready (refused, paged, waiting for a human)",
    "rollback": "restart: rolling the code back",
    "replay": "replay (hunting silent data corruption)",
    "restart": "restart (stop, relaunch)",
    "lost_work": "lost work (steps since the last checkpoint)",
    "failed_attempt": "restart: an attempt that did not fix it",
    "human": "waiting for a human (a cap refused, replay proved nobody)",
}


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
        rows.append([_value(value), f"{s.ettr:.2%}",
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
        lost_rows.append([_value(value),
                          *(_hours(float(lost[c])) for c in CAUSES)])
    out.console.print(table([key, *CAUSES], lost_rows, title="lost time by cause (mean per run)"))
    out.console.print(table([key, *RESOLUTIONS, "human"], _resolved_rows(report),
                            title="resolved by (mean incidents per run)"))


def _resolved_rows(report: SimulateReport) -> list[list[str]]:
    """Per sweep value, how many incidents each rung (or a paged human) fixed."""
    return [[_value(v), *(f"{sum(r.resolved_by[k] for r in s.runs) / len(s.runs):.1f}"
                          for k in (*RESOLUTIONS, "human"))] for v, s in report.rows]


def _value(value: float | None) -> str:
    return f"{value:g}" if value is not None else "-"


def simulate_page(report: SimulateReport) -> str:
    """The HTML page: the scenario, one row per sweep value, the windowed ETTR chart
    (one line per value) and lost time by cause per value."""
    sc = report.scenario
    key = report.sweep_key or "scenario"
    head = (f"<section id=\"summary\"><p>{sc.machines} machines, {sc.days:g} days, "
            f"standby {sc.standby}, checkpoint every {h(duration(sc.ckpt_interval))}, mix "
            f"{h(report.mix_name)}, {len(report.rows[0][1].runs)} run(s) from seed "
            f"{report.seed}; ETTR over {h(duration(sc.window))} windows.</p></section>")
    rows = "".join(
        f"<tr class=\"sweep\" data-value=\"{h(_value(v))}\"><td>{h(_value(v))}</td>"
        f"<td class=\"num ettr\">{s.ettr:.2%}</td><td class=\"num\">{s.percentile(0.1):.2%}</td>"
        f"<td class=\"num\">{s.percentile(0.9):.2%}</td>"
        f"<td class=\"num\">{s.mean('worst_day_ettr'):.2%}</td>"
        f"<td class=\"num\">{s.mean('incidents'):.0f}</td>"
        f"<td class=\"num\">{s.mean('standby_exhausted'):.1f}</td>"
        f"<td class=\"num\">{s.mean('cap_refusals'):.1f}</td>"
        f"<td class=\"num\">{s.mean('pages'):.1f}</td></tr>" for v, s in report.rows)
    sweep = (f"<section id=\"sweep-rows\"><h2>One row per {h(key)}</h2><table id=\"sweep\">"
             f"<thead><tr><th>{h(key)}</th><th>ETTR</th><th>p10</th><th>p90</th>"
             "<th>worst day</th><th>incidents</th><th>standby exhausted</th><th>refused</th>"
             f"<th>pages</th></tr></thead><tbody>{rows}</tbody></table></section>")
    horizon = sc.days * 86400.0
    lines = [(_value(v) if report.sweep_key else "", _points(s, sc.window, horizon))
             for v, s in report.rows]
    single = report.rows[0][1].ettr if len(report.rows) == 1 else None
    svg = chart_svg(lines, 0.0, horizon, lambda t: f"day {t / 86400:g}" if t % 86400 == 0
                    else f"day {t / 86400:.1f}", cumulative=single)
    legend = "".join(f"<span class=\"key\" data-value=\"{h(label)}\"><i style=\"background:"
                     f"{LINE_COLOURS[i % len(LINE_COLOURS)]}\"></i>{h(key)} {h(label)}</span>"
                     for i, (label, _) in enumerate(lines) if label)
    chart = (f"<section id=\"timeline-chart\"><h2>ETTR over time</h2>{svg}"
             f"<p class=\"caption\">Line: mean ETTR of each {h(duration(sc.window))} window over "
             "the runs" + ("; dashed: cumulative" if single is not None else "") +
             f".</p><p class=\"legend\">{legend}</p></section>")
    lost = "".join(
        f"<h3>{h(key)} {h(_value(v))}</h3>" * bool(report.sweep_key)
        + lost_table([(c, CAUSE_TEXT[c], sum(r.lost[c] for r in s.runs) / len(s.runs))
                      for c in CAUSES], value=_value(v))
        for v, s in report.rows)
    lost_section = ("<section id=\"lost-time\"><h2>Lost time by cause (mean per run)</h2>"
                    f"{lost}</section>")
    resolved = "".join(f"<tr class=\"resolved\" data-value=\"{h(row[0])}\">"
                       + "".join(f"<td>{h(c)}</td>" for c in row) + "</tr>"
                       for row in _resolved_rows(report))
    resolved_section = ("<section id=\"resolved-by\"><h2>Resolved by (mean incidents per run)"
                        f"</h2><table id=\"resolved\"><thead><tr><th>{h(key)}</th>"
                        + "".join(f"<th>{h(k)}</th>" for k in (*RESOLUTIONS, "human"))
                        + f"</tr></thead><tbody>{resolved}</tbody></table></section>")
    return html_page(f"brctl simulate: {report.mix_name}",
                     "\n".join([head, sweep, chart, lost_section, resolved_section]))


def _points(s: Summary, window: float, horizon: float) -> list[tuple[float, float | None]]:
    """Each window's mean ETTR held across the window (a step line)."""
    return [p for i, v in enumerate(s.series())
            for p in ((i * window, v), (min((i + 1) * window, horizon), v))]
