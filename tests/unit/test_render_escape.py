"""Node text inside rich markup: never parsed as markup, never sent to the terminal raw."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from brctl.render.output import Output, escape, table, visible

HOSTILE = [
    "a \\[/] b", "x\\", "\\", "[/]", "[bold red]no[/]", "[link=file:///etc/passwd]x[/link]",
    "\x1b[31mred\x1b[0m", "\x1b]52;c;SGVsbG8=\x07", "\x9b31m", "cr\rover", "del\x7f",
    "nul\x00", "bidi \u202eevil\u202c", "bad \ufffd utf-8", "tab\tand\nnewline",
]


def _render(markup: str) -> str:
    buf = io.StringIO()
    Console(file=buf, highlight=False, emoji=False, soft_wrap=True, width=200).print(markup)
    return buf.getvalue().removesuffix("\n")


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_renders_as_itself_with_controls_visible(text: str) -> None:
    shown = _render(f"[dim]{escape(text)}[/]")  # inside the markup brctl wraps it in
    # one line (a newline too is spelled); rich expands tabs, as a terminal would
    assert shown == visible(text, one_line=True).expandtabs(8)
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in shown)


def test_visible_spells_controls_and_keeps_newline_and_tab() -> None:
    assert visible("\x1b[1A\rx\ty\n\x07\x9b\u202e") == "\\x1b[1A\\x0dx\ty\n\\x07\\x9b\\u202e"
    assert visible("plain [text] ünïcode") == "plain [text] ünïcode"


def test_table_cells_show_controls_escaped() -> None:
    buf = io.StringIO()
    Console(file=buf, width=200).print(table(["node", "message"], [["n1", "\x1b]0;title\x07 [/]"]]))
    assert "\\x1b]0;title\\x07 [/]" in buf.getvalue() and "\x1b" not in buf.getvalue()


def test_error_messages_show_controls_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from brctl.cli.app import _print_error

    _print_error(Output(), "node said \x1b[2J", "hint \x07")
    assert capsys.readouterr().err == "brctl: error: node said \\x1b[2J\nhint: hint \\x07\n"


def test_a_file_name_that_is_not_utf8_is_shown_escaped_and_can_be_written() -> None:
    """Python decodes a non-UTF-8 byte of a node's file name as a lone surrogate; written
    raw, a UTF-8 terminal raises instead of showing the line."""
    name = b"step_\xff".decode("utf-8", "surrogateescape")
    shown = visible(name)
    assert shown == "step_\\udcff"
    shown.encode("utf-8")  # strict: what a UTF-8 terminal does


# Node text that rich would change if it reached the console as markup: a line that
# ends in a backslash (rich.markup.escape doubles it), an emoji shortcode, and text
# after the last tag.
PLAIN_HOSTILE = ["dir C:\\", "end \\\\", ":smiley: :thumbs_up:", "after [/] tag \\", "x"]


def _exec_report(stdout: str, stderr: str) -> object:
    from brctl.core.transport import NodeState, Results, RunResult
    from brctl.operations.exec_ import ExecReport

    results = Results([RunResult("n1", NodeState.OK, 0, stdout, stderr, 0.1)])
    return ExecReport(("sh", "-c", "x"), results)


@pytest.mark.parametrize("lines", [False, True])
@pytest.mark.parametrize("text", PLAIN_HOSTILE)
def test_exec_output_is_printed_exactly(text: str, lines: bool) -> None:
    from brctl.render.exec import render
    from brctl.render.output import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    render(out, _exec_report(text + "\n", text + "\n"), lines=lines)  # type: ignore[arg-type]
    shown_out = out.stdout.getvalue().splitlines()
    shown_err = out.stderr.getvalue().splitlines()
    assert shown_out[-1] == (f"n1: {text}" if lines else text)
    assert shown_err == [f"n1: {text}"]


@pytest.mark.parametrize("text", PLAIN_HOSTILE)
def test_warnings_and_info_show_node_text_exactly(text: str) -> None:
    from brctl.render.output import Output

    out = Output(stderr=io.StringIO(), verbose=1)
    out.warn(text)
    out.info(text)
    assert out.stderr.getvalue().splitlines() == [f"brctl: warning: {text}", text]


def test_consoles_render_no_emoji_shortcodes() -> None:
    from brctl.render.output import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    out.console.print("[bold]:smiley:[/]")
    out.err.print(":smiley:")
    assert out.stdout.getvalue() == ":smiley:\n" and out.stderr.getvalue() == ":smiley:\n"


@pytest.mark.parametrize("text", [*HOSTILE, *PLAIN_HOSTILE, "two \\\\", "\\\\\\"])
@pytest.mark.parametrize("template", ["{}", "x: {}", "[red]a[/] {}", "[dim]{}[/]", "[b]{}[/b] y"])
def test_escaped_text_renders_as_itself_wherever_it_sits(text: str, template: str) -> None:
    """At the end of a markup string too: rich.markup.escape doubles a trailing backslash
    (needed only when a tag follows), and leaves two as two (one is lost before a tag)."""
    shown = _render(template.format(escape(text)))
    expected = Console(file=io.StringIO()).render_str(template.format("\0")).plain
    assert shown == expected.replace("\0", visible(text, one_line=True)).expandtabs(8)
