"""Rendering of ``brctl report``: one self-contained HTML page (inline SVG, a few lines of
inline JS, no network), and the summary on stdout.

Every string that came from a machine, the job or the event log is HTML-escaped
(text and attributes) with its control characters made visible: the page is
meant to be shared, and node answers are hostile.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Optional

from brctl.analysis.report.incident import IncidentReport
from brctl.analysis.report.lost_time import CAUSE_TEXT, CAUSES, INCIDENT_KINDS, Cause
from brctl.core.nodeset import fold
from brctl.operations.report import EttrReport, Written
from brctl.render.output import Output, escape, visible

COLOURS = {"productive": "#2e7d32", "detection": "#f9a825", "diagnosis": "#ef6c00",
           "standby": "#6a1b9a", "restart": "#1565c0", "replay": "#00838f", "human": "#c62828",
           # brctl simulate's causes, in the colour of the report's cause each is part of
           "analysis": "#ef6c00", "swap": "#6a1b9a", "no_standby": "#4a148c",
           "rollback": "#0d47a1", "failed_attempt": "#42a5f5", "lost_work": "#6d4c41"}
LINE_COLOURS = ("#212121", "#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f")
# The chart: plot area [X0, X1] x [Y_TOP (100%), Y_BOTTOM (0%)], the cause band below it.
WIDTH, HEIGHT = 960, 300
X0, X1, Y_TOP, Y_BOTTOM, BAND_Y, BAND_H = 56, 944, 16, 206, 238, 18
_CLASS_SAFE = re.compile(r"[^a-z0-9_-]")

Stamp = Callable[[float], str]


def h(text: object) -> str:
    """``text`` safe in HTML text and in a quoted attribute, controls made visible."""
    return html.escape(visible(str(text)), quote=True)


def duration(seconds: float) -> str:
    """``2d 03h``, ``1h 02m``, ``3m 20s``, ``45s``."""
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"


def page(report: IncidentReport, stamp: Stamp, utc: bool = False) -> str:
    """The whole page."""
    if report.start is None or report.end is None:
        body = (f"<p id=\"empty\">Nothing recorded yet for job {h(report.job)}: "
                "run <code>brctl daemon run</code>.</p>")
    else:
        body = "\n".join([_summary(report, stamp), _chart(report, stamp, utc), _lost(report),
                          _timeline(report, stamp), _machines(report, stamp)])
    return html_page(f"brctl report: {report.job}", body)


def html_page(title: str, body: str) -> str:
    """A self-contained page around ``body`` (its markup already escaped): the styles,
    the one script (by its hash) and nothing loaded from anywhere."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>{h(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{h(title)}</h1>
{body}
<script>{_JS}</script>
</body></html>
"""


def _summary(r: IncidentReport, stamp: Stamp) -> str:
    assert r.start is not None and r.end is not None
    return (f"<section id=\"summary\"><p>From <time>{h(stamp(r.start))}</time> to "
            f"<time>{h(stamp(r.end))}</time> ({h(duration(r.end - r.start))}): "
            f"ETTR <b id=\"ettr\">{_pct(r.cumulative)}</b>, "
            f"{h(duration(r.productive_seconds))} productive of "
            f"{h(duration(r.observed_seconds))} observed; "
            f"<span id=\"lost-total\">{h(duration(r.lost_seconds))}</span> lost; "
            f"<span id=\"incident-count\">{r.incidents}</span> incidents; "
            f"machines now {h(fold(list(r.members)))}.</p></section>")


def _x(t: float, lo: float, hi: float) -> float:
    return X0 + (X1 - X0) * ((t - lo) / (hi - lo) if hi > lo else 0.0)


def _y(v: float) -> float:
    return Y_BOTTOM - (Y_BOTTOM - Y_TOP) * min(max(v, 0.0), 1.0)


def _tick(t: float, span: float, utc: bool) -> str:
    when = (datetime.datetime.fromtimestamp(t, datetime.timezone.utc) if utc
            else datetime.datetime.fromtimestamp(t).astimezone())
    return when.strftime("%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M")


def _chart(r: IncidentReport, stamp: Stamp, utc: bool) -> str:
    assert r.start is not None and r.end is not None
    band = [(seg.start, seg.end, seg.cause or "productive",
             f"{seg.cause or 'productive'}: {stamp(seg.start)} to {stamp(seg.end)} "
             f"({duration(seg.seconds)})") for seg in r.segments]
    marks = [(rec.at, f"{stamp(rec.at)} {rec.kind} {fold(list(rec.nodes))}: {rec.reason}")
             for rec in r.timeline if rec.kind in INCIDENT_KINDS]
    span = r.end - r.start
    svg = chart_svg([("", r.series)], r.start, r.end, lambda t: _tick(t, span, utc),
                    cumulative=r.cumulative, band=band, marks=marks)
    legend = "".join(f"<span class=\"key\"><i style=\"background:{COLOURS[c]}\"></i>{h(c)}</span>"
                     for c in ("productive", *CAUSES))
    return (f"<section id=\"timeline-chart\"><h2>ETTR over time</h2>{svg}"
            f"<p class=\"caption\">Line: ETTR over a sliding {h(duration(r.window))} window; "
            "dashed: cumulative; red marks: incidents detected; band: every observed second, "
            f"productive or lost by cause.</p><p class=\"legend\">{legend}</p></section>")


Series = Sequence[tuple[float, Optional[float]]]


def chart_svg(lines: Sequence[tuple[str, Series]], lo: float, hi: float,
              tick: Callable[[float], str], *, cumulative: Optional[float],
              band: Sequence[tuple[float, float, str, str]] = (),
              marks: Sequence[tuple[float, str]] = ()) -> str:
    """The ETTR chart: 0-100 % up the side, seven ``tick`` labels along [lo, hi].

    ``lines``: (label, series) per ETTR line (a label of its own gets a colour and
    ``data-value``); ``band``: (start, end, cause, title) segments under the plot;
    ``marks``: (at, title) vertical incident marks; ``cumulative``: a dashed level.
    """
    parts = [f"<svg id=\"ettr-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" "
             f"height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" "
             f"aria-label=\"ETTR over time\">"]
    for pct in (0, 25, 50, 75, 100):
        y = _y(pct / 100)
        parts.append(f"<line class=\"grid\" x1=\"{X0}\" x2=\"{X1}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\"/>"
                     f"<text class=\"y-tick\" x=\"{X0 - 6}\" y=\"{y + 4:.1f}\" "
                     f"text-anchor=\"end\">{pct}%</text>")
    ticks = 6
    for i in range(ticks + 1):
        t = lo + (hi - lo) * i / ticks
        x = _x(t, lo, hi)
        anchor = "start" if i == 0 else "end" if i == ticks else "middle"  # inside the picture
        parts.append(f"<line class=\"axis\" x1=\"{x:.1f}\" x2=\"{x:.1f}\" y1=\"{Y_BOTTOM}\" "
                     f"y2=\"{Y_BOTTOM + 4}\"/><text class=\"x-tick\" x=\"{x:.1f}\" "
                     f"y=\"{Y_BOTTOM + 18}\" text-anchor=\"{anchor}\">{h(tick(t))}</text>")
    for start, end, cause, title in band:
        x, w = _x(start, lo, hi), _x(end, lo, hi) - _x(start, lo, hi)
        parts.append(f"<rect class=\"seg seg-{_kind_class(cause)}\" data-cause=\"{h(cause)}\" "
                     f"x=\"{x:.2f}\" y=\"{BAND_Y}\" width=\"{max(w, 0.5):.2f}\" "
                     f"height=\"{BAND_H}\" fill=\"{COLOURS.get(cause, '#9e9e9e')}\">"
                     f"<title>{h(title)}</title></rect>")
    for at, title in marks:
        if lo <= at <= hi:
            x = _x(at, lo, hi)
            parts.append(f"<line class=\"incident-mark\" x1=\"{x:.1f}\" x2=\"{x:.1f}\" "
                         f"y1=\"{Y_TOP}\" y2=\"{BAND_Y + BAND_H}\"><title>{h(title)}</title>"
                         "</line>")
    if cumulative is not None:
        y = _y(cumulative)
        parts.append(f"<line class=\"cumulative\" x1=\"{X0}\" x2=\"{X1}\" y1=\"{y:.1f}\" "
                     f"y2=\"{y:.1f}\"><title>cumulative ETTR {_pct(cumulative)}</title></line>")
    for i, (label, series) in enumerate(lines):
        own = (f" data-value=\"{h(label)}\" style=\"stroke:{LINE_COLOURS[i % len(LINE_COLOURS)]}\""
               if label else "")
        for run in _runs(series):
            points = " ".join(f"{_x(t, lo, hi):.1f},{_y(v):.1f}" for t, v in run)
            parts.append(f"<polyline class=\"ettr-line\"{own} points=\"{points}\"/>")
    if band:
        parts.append(f"<text class=\"band-label\" x=\"{X0 - 6}\" y=\"{BAND_Y + 13}\" "
                     "text-anchor=\"end\">lost</text>")
    parts.append("</svg>")
    return "".join(parts)


def _runs(series: Iterable[tuple[float, Optional[float]]]) -> list[list[tuple[float, float]]]:
    """The series cut where nothing was observed (no line drawn across a gap)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in series:
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((t, v))
    return [run for run in runs if run]


def _lost(r: IncidentReport) -> str:
    table = lost_table([(c, CAUSE_TEXT[c], r.lost[c]) for c in CAUSES], table_id="lost")
    return f"<section id=\"lost-time\"><h2>Lost time by cause</h2>{table}</section>"


def lost_table(rows: Sequence[tuple[str, str, float]], *, table_id: str = "",
               value: str = "") -> str:
    """Lost time by cause: (cause, what it means, seconds) per row, with its share and
    a bar in the cause's colour; ``value``: the sweep value the table is for."""
    total = sum(sec for _, _, sec in rows)
    out = []
    for cause, text, sec in rows:
        share = sec / total if total > 0 else 0.0
        out.append(f"<tr data-cause=\"{h(cause)}\"><td>{h(text)}</td>"
                   f"<td class=\"num\" data-seconds=\"{sec:.0f}\">{h(duration(sec))}</td>"
                   f"<td class=\"num\">{share:.0%}</td><td class=\"bar\"><i style=\"width:"
                   f"{share * 100:.1f}%;background:{COLOURS.get(cause, '#9e9e9e')}\"></i></td></tr>")
    ident = f" id=\"{h(table_id)}\"" if table_id else ""
    data = f" data-value=\"{h(value)}\"" if value else ""
    return (f"<table class=\"lost\"{ident}{data}>"
            "<thead><tr><th>cause</th><th>lost</th><th>share</th><th></th></tr></thead>"
            f"<tbody>{''.join(out)}</tbody></table>")


def _kind_class(kind: str) -> str:
    return _CLASS_SAFE.sub("_", kind.lower())


def _timeline(r: IncidentReport, stamp: Stamp) -> str:
    rows = []
    for rec in r.timeline:
        nodes = " ".join(rec.nodes)
        rows.append(f"<tr class=\"ev ev-{_kind_class(rec.kind)}\" data-nodes=\"{h(nodes)}\">"
                    f"<td><time>{h(stamp(rec.at))}</time></td><td>{h(rec.kind)}</td>"
                    f"<td>{h(fold(list(rec.nodes)))}</td><td>{h(rec.state)}</td>"
                    f"<td class=\"reason\">{h(rec.reason)}</td></tr>")
    older = (f"<p class=\"note\">{r.left_out} older entries are not shown.</p>"
             if r.left_out else "")
    empty = "" if rows else "<p class=\"note\">No incident recorded.</p>"
    return ("<section id=\"incident-timeline\"><h2>Incident timeline</h2>"
            "<p class=\"note\" id=\"filter-note\"></p>"
            "<table id=\"incidents\"><thead><tr><th>when</th><th>what</th><th>machines</th>"
            f"<th>outcome</th><th>why</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f"{empty}{older}</section>")


def _machines(r: IncidentReport, stamp: Stamp) -> str:
    rows = []
    for m in r.machines:
        ev = m.eviction
        rows.append(f"<tr class=\"machine\" data-node=\"{h(m.node)}\"><td>{h(m.node)}</td>"
                    f"<td>{h(', '.join(m.roles) or '-')}</td><td class=\"num\">{m.events}</td>"
                    f"<td>{h(stamp(ev.at)) if ev else '-'}</td>"
                    f"<td>{h(ev.source + (' ' + ev.operator if ev.operator else '')) if ev else '-'}"
                    f"</td><td class=\"reason\">{h(ev.reason) if ev else ''}</td>"
                    f"<td>{h(stamp(ev.released)) if ev and ev.released else '-'}</td></tr>")
    empty = "" if rows else "<p class=\"note\">No machine was involved.</p>"
    return ("<section id=\"machines-involved\"><h2>Machines involved</h2>"
            "<p class=\"note\">Click a machine to show only its entries in the timeline.</p>"
            "<table id=\"machines\"><thead><tr><th>machine</th><th>now</th><th>events</th>"
            "<th>evicted</th><th>by</th><th>why</th><th>released</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{empty}</section>")


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212121;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 8px;
border-bottom:1px solid #e0e0e0;vertical-align:top}td.num{text-align:right}
td.reason{white-space:pre-wrap;word-break:break-word}td.bar{width:35%}
td.bar i{display:block;height:12px}.note,.caption{color:#616161}
.key{margin-right:14px}.key i{display:inline-block;width:12px;height:12px;margin-right:4px;
vertical-align:middle}svg text{font-size:11px;fill:#424242}
.grid{stroke:#e0e0e0}.axis{stroke:#9e9e9e}.ettr-line{fill:none;stroke:#212121;stroke-width:2}
.cumulative{stroke:#757575;stroke-dasharray:5 4}.incident-mark{stroke:#c62828;stroke-width:1.5}
tr.machine{cursor:pointer}tr.machine.chosen{background:#fff3e0}
tr.ev-crash,tr.ev-gpu_fault,tr.ev-hang,tr.ev-hand_evict,tr.ev-fail_slow{background:#ffebee}
tr.ev-decision{font-weight:600}tr.ev-refused,tr.ev-halted{color:#c62828}
"""

# Clicking a machine keeps only its rows in the incident timeline (click again: all).
_JS = """
(function(){
  var rows=document.querySelectorAll('#incidents tr.ev');
  var note=document.getElementById('filter-note');
  var chosen=null;
  function show(node){
    var n=0;
    rows.forEach(function(r){
      var hit=!node||r.dataset.nodes.split(' ').indexOf(node)>=0;
      r.hidden=!hit; if(hit){n++;}
    });
    if(note){note.textContent=node?(n+' entries name '+node):(n+' entries');}
  }
  document.querySelectorAll('#machines tr.machine').forEach(function(m){
    m.addEventListener('click',function(){
      chosen=(chosen===m.dataset.node)?null:m.dataset.node;
      document.querySelectorAll('#machines tr.machine').forEach(function(o){
        o.classList.toggle('chosen',o.dataset.node===chosen);});
      show(chosen);
    });
  });
  show(null);
  document.documentElement.dataset.ready='1';
})();
"""

# The page's own script is the only one that may run (even an injected one would not).
_JS_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()
# Nothing loads from anywhere; styles inline; the one script by its hash.
_CSP = f"default-src 'none'; style-src 'unsafe-inline'; script-src '{_JS_HASH}'"


def warn_skipped(out: Output, skipped: Sequence[Mapping[str, str]]) -> None:
    """One warning per state database row left out because it did not decode (exit 3)."""
    for d in skipped:
        out.warn(f"state database: skipped {d['table']} row {d['key']}: {d['why']}")


def render_report(out: Output, written: Written) -> None:
    """Where the page went, and its headline numbers."""
    r = written.report
    warn_skipped(out, written.skipped)
    if out.json:
        out.emit_json("report", written.to_json())
        return
    out.console.print(f"wrote {escape(str(written.html))}"
                      + (f" and {escape(str(written.png))}" if written.png else ""))
    if r.cumulative is None:
        out.console.print(f"job {escape(r.job)}: nothing recorded yet (run brctl daemon run)")
        return
    lost = ", ".join(f"{c} {duration(s)}" for c, s in r.lost.items() if s > 0) or "none"
    out.console.print(f"job {escape(r.job)}: ETTR {_pct(r.cumulative)}; {r.incidents} "
                      f"incidents; lost {duration(r.lost_seconds)} ({lost})")


def render_ettr(out: Output, job: str, report: EttrReport) -> None:
    """Cumulative and windowed ETTR, the chart with its axes, lost time by cause."""
    warn_skipped(out, report.skipped)
    if out.json:
        out.emit_json("ettr", {"job": job, **report.to_json()})
        return
    if report.cumulative is None or not report.series:
        out.console.print(f"job {escape(job)}: nothing recorded yet (run brctl daemon run)")
        return
    lost = sum(report.lost.values())
    out.console.print(f"job {escape(job)}: ETTR {_pct(report.cumulative)} cumulative "
                      f"({duration(report.productive_seconds)} productive of "
                      f"{duration(report.observed_seconds)} observed, {duration(lost)} lost); "
                      f"last {duration(report.window)}: {_pct(report.window_ettr)}")
    out.console.print(f"ETTR over a sliding {duration(report.window)} window:")
    for line in ettr_chart(report.series, out.stamp):
        out.console.print(escape(line), soft_wrap=True)
    out.console.print(f"lost time by cause ({duration(lost)}):")
    for line in lost_lines(report.lost):
        out.console.print(escape(line), soft_wrap=True)


BLOCKS = " ▁▂▃▄▅▆▇█"
CHART_ROWS = 4  # 25 % per row


def ettr_chart(series: Sequence[tuple[float, Optional[float]]], stamp: Stamp,
               rows: int = CHART_ROWS) -> list[str]:
    """The windowed ETTR as columns of eighth blocks, 0-100 % up the side, time along the
    bottom (each tick's age before the last sample, the range in words under it)."""
    values = [v for _, v in series]
    lines = []
    for row in range(rows - 1, -1, -1):
        label = f"{(row + 1) * 100 // rows:>4}% ┤" if row in (rows - 1, rows // 2 - 1) else \
            "      │"
        cells = "".join(" " if v is None else
                        BLOCKS[round(min(max(v * rows - row, 0.0), 1.0) * (len(BLOCKS) - 1))]
                        for v in values)
        lines.append(label + cells)
    width = len(values)
    ticks = sorted({0, width - 1, *range(0, width, 10)})
    axis = "".join("┬" if i in ticks else "─" for i in range(width))
    lines.append("   0% └" + axis)
    labels = [" "] * (width + 12)
    end = series[-1][0]
    for i in ticks:
        text = "end" if i == width - 1 else f"-{duration(end - series[i][0])}"
        if all(c == " " for c in labels[max(i + 6, 0):i + 7 + len(text)]):
            labels[i + 7:i + 7 + len(text)] = text
    lines.append("".join(labels).rstrip())
    lines.append(f"       from {stamp(series[0][0])} to {stamp(end)}")
    return lines


def lost_lines(lost: Mapping[Cause, float], width: int = 30) -> list[str]:
    """``  restart       1h 02m  41% ████████`` per cause, the bar its share of the lost time."""
    total = sum(lost.values())
    out = []
    for cause in CAUSES:
        sec = lost.get(cause, 0.0)
        share = sec / total if total > 0 else 0.0
        out.append(f"  {cause:<10} {duration(sec):>8} {share:>4.0%} {'█' * round(share * width)}")
    return out
