"""Rendering: JSON on stdout, rich tables and folded node output, progress on stderr.

Every command renders the same result dataclasses either way: ``--json`` prints
exactly one document (``--watch``: one compact document per line, NDJSON) that
opens with ``"schema": "brctl.<command>[.<sub>]/<n>"``, ``generated_at`` (UTC) and,
where the command judges, ``status`` (the exit code in words); humans get tables.
Its JSON Schema ships in ``brctl.schemas``. Progress, warnings and errors go to
stderr only.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text


# Width of the stdout console when it is not a terminal (a pipe, a file, cron mail):
# wide enough that rich never wraps or cuts a record; one record stays one line.
NOT_A_TERMINAL_WIDTH = 1 << 20


def stamp(at: float | None, utc: bool = False) -> str:
    """A time people can place: ``2026-11-30 22:52:37Z`` with ``utc``, else local time with
    its offset (``2026-11-30 23:52:37+01:00``); ``-`` for none."""
    import datetime

    if not at:
        return "-"
    if utc:
        return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%SZ")
    return datetime.datetime.fromtimestamp(at).astimezone().isoformat(sep=" ", timespec="seconds")


# ``status`` of a document that judges: the exit code it ends with, in words.
STATUS_WORDS = {0: "ok", 1: "findings", 2: "error", 3: "incomplete", 4: "refused",
                70: "error", 130: "interrupted"}


def utc_stamp(at: float) -> str:
    """``2026-11-30T22:52:37Z``: the zone always written (JSON timestamps are UTC)."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def json_document(schema: str, payload: Mapping[str, Any], version: int = 1, *,
                  status: int | None = None, compact: bool = False,
                  generated_at: float | None = None) -> str:
    """The one JSON document a command prints with ``--json``.

    Args:
        schema: ``<command>[.<sub>]``; the document's ``schema`` is ``brctl.<schema>/<version>``.
        payload: the command's keys.
        version: bumped when a key changes meaning or goes away.
        status: the exit code the command ends with, for documents that judge.
        compact: one line (NDJSON, ``--watch``) instead of indented.
        generated_at: when (default: now).
    """
    import time

    head: dict[str, Any] = {"schema": f"brctl.{schema}/{version}",
                            "generated_at": utc_stamp(time.time() if generated_at is None
                                                      else generated_at)}
    if status is not None:
        head["status"] = STATUS_WORDS[int(status)]
    doc = {**head, **payload}
    try:  # the last guard: NaN and Infinity are not JSON, and no reader but Python's takes them
        if compact:
            return json.dumps(doc, separators=(",", ":"), default=_jsonable, allow_nan=False)
        return json.dumps(doc, indent=2, default=_jsonable, allow_nan=False)
    except ValueError as exc:
        where = _non_finite(payload, "")
        if where is None:
            raise
        from brctl.core.errors import RemoteDataError

        raise RemoteDataError(f"--json: {where[0]} is {where[1]}, not a finite number; JSON has "
                              f"no NaN or Infinity, so the document is refused ({exc})",
                              hint="a value that should have been refused where it entered "
                                   "got this far: please report it") from None


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """The key path of the first non-finite number in ``value`` and the number, or None."""
    import math

    if hasattr(value, "to_json"):
        value = value.to_json()
    if isinstance(value, float) and not math.isfinite(value):
        return path or "(the document)", value
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = ((f"{path}.{k}" if path else str(k), v)
                                            for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((hit for p, v in items if (hit := _non_finite(v, p)) is not None), None)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "value"):
        return obj.value
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@dataclass
class Output:
    """Where a command writes: stdout for results, stderr for everything else."""

    json: bool = False
    verbose: int = 0
    ndjson: bool = False  # --watch: one compact document per line
    quiet: bool = False  # -q: no human output on stdout (JSON still printed with --json)
    utc: bool = False  # --utc: times in UTC, else local time with its offset
    stdout: Any = field(default_factory=lambda: sys.stdout)
    stderr: Any = field(default_factory=lambda: sys.stderr)
    _console: Console | None = None
    _err: Console | None = None

    @property
    def console(self) -> Console:
        """Rich console on stdout (created on first use: keeps --help light); -q: a sink."""
        if self._console is None:
            import io

            from rich.console import Console

            target = io.StringIO() if self.quiet else self.stdout
            # not a terminal: nothing is ever cut or wrapped (one record per line)
            # on a terminal: fit its width (rich wraps at words, cuts only with …)
            tty = _isatty(target)
            # emoji=False: a node's ":smiley:" is text, not a picture
            self._console = Console(file=target, highlight=False, emoji=False, soft_wrap=not tty,
                                    width=None if tty else NOT_A_TERMINAL_WIDTH)
        return self._console

    @property
    def err(self) -> Console:
        """Rich console on stderr."""
        if self._err is None:
            from rich.console import Console

            self._err = Console(file=self.stderr, highlight=False, emoji=False, stderr=True,
                                soft_wrap=True)
        return self._err

    def emit_json(self, schema: str, payload: Mapping[str, Any], version: int = 1, *,
                  status: int | None = None) -> None:
        """Print the command's JSON document on stdout (see ``json_document``)."""
        self.stdout.write(json_document(schema, payload, version=version, status=status,
                                        compact=self.ndjson) + "\n")
        self.stdout.flush()

    @property
    def terminal(self) -> bool:
        """Whether stdout is a terminal (fit its width) or not (never cut, one line each)."""
        return _isatty(self.stdout) and not self.quiet

    @property
    def err_terminal(self) -> bool:
        """Whether stderr is a terminal, asked of the stream as for stdout: a run whose
        stderr is a pipe or a file (cron, the daemon) never builds rich's console only to
        learn it, before its first connection (~10-30 ms of imports)."""
        return _isatty(self.stderr)

    def stamp(self, at: float | None) -> str:
        """``at`` with date and zone (``--utc``: UTC, else local with its offset)."""
        return stamp(at, self.utc)

    def record(self, head: str, text: str = "", style: str = "") -> None:
        """One record: ``head`` (plain text) and its long ``text``.

        On a terminal the head fits the width (cut with ``…``) and the text is a
        paragraph wrapped under it; elsewhere both are one line, in full. A newline in
        either is shown escaped: node text never starts a record of its own.
        """
        from rich.padding import Padding
        from rich.text import Text

        if not self.terminal:
            line = f"{head}  {text}" if text else head
            self.console.print(Text(visible(line, one_line=True), style=style), soft_wrap=True)
            return
        # no_wrap/overflow given to print: rich wraps a Text that only carries them
        self.console.print(Text(visible(head, one_line=True), style=style), no_wrap=True,
                           overflow="ellipsis", soft_wrap=False)
        if text:
            self.console.print(Padding(Text(visible(text, one_line=True)), (0, 0, 0, 4)),
                               soft_wrap=False)

    def plain(self, text: str) -> None:
        """``text`` on stdout as written (no rich: nothing wrapped, cut or read as markup);
        nothing with -q. The caller makes node text ``visible``."""
        if not self.quiet:
            self.stdout.write(text)

    def node_out(self, text: str) -> None:
        """A line a node printed, on stdout: on a terminal through rich; elsewhere written
        as is (rich expands tabs), controls still made visible."""
        if self.terminal:
            self.console.print(node_text(text))
        elif not self.quiet:
            self.stdout.write(visible(text) + "\n")

    def node_err(self, text: str) -> None:
        """A line a node printed on its stderr, on stderr: as ``node_out``."""
        if self.err_terminal:
            self.err.print(node_text(text))
        else:
            self.stderr.write(visible(text) + "\n")

    def warn(self, message: str) -> None:
        """A one-line warning on stderr (a newline in it is shown escaped)."""
        from rich.text import Text

        self.err.print(Text("brctl: warning: ", style="yellow")
                       .append(visible(message, one_line=True)))

    def info(self, message: str) -> None:
        """A progress or context line on stderr (only with -v; one line, as ``warn``)."""
        if self.verbose:
            self.err.print(node_text(message, style="dim", one_line=True))

    @contextmanager
    def progress(self, label: str, total: int,
                 names: Iterable[str] = ()) -> Iterator[Callable[[Any], None]]:
        """A progress bar on stderr when it is a terminal; yields a per-item ``advance``.

        Done/total and the elapsed time; with ``names`` (the machines, in start order)
        also the machines still running, the longest-running first: ``advance(result)``
        drops ``result.node``. Never on stderr that is not a terminal, never with --json.
        """
        if total < 2 or not self._bars:
            yield _ignore
            return
        with self._bar() as bar:
            yield _task(bar, label, total, names)

    @contextmanager
    def stages(self, label: str) -> Iterator[Callable[[str, Sequence[str]], Callable[[Any], None]]]:
        """Progress of a run in stages (diagnose's ladder, replay's rounds, a copy), on the
        same terms as ``progress``: yields ``track(stage, machines)``, which starts a bar
        for that stage (the earlier stages' bars stay, done, with their times) and returns
        its per-machine ``advance``. Nothing when stderr is not a terminal or with --json.
        """
        if not self._bars:
            yield lambda _stage, _names: _ignore
            return
        with self._bar(transient=False) as bar:  # each finished stage's line stays, timed
            yield lambda stage, names: _task(bar, f"{label} {stage}", len(names), names)

    @property
    def _bars(self) -> bool:
        """Progress bars are drawn: stderr is a terminal and no JSON is asked for."""
        return not self.json and self.err_terminal

    def _bar(self, transient: bool = True) -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        return Progress("[progress.description]{task.description}", BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=self.err,
                        transient=transient)


def _task(bar: Any, label: str, total: int, names: Iterable[str]) -> Callable[[Any], None]:
    """A bar of ``total`` items on ``bar``: done/total, elapsed, and the machine running
    longest of ``names``; returns its ``advance(result)``, which drops ``result.node``."""
    left = dict.fromkeys(names)
    task = bar.add_task(escape(_waiting(label, list(left))), total=max(total, 1))

    def advance(item: Any = None) -> None:
        left.pop(getattr(item, "node", None), None)  # type: ignore[arg-type]
        bar.update(task, advance=1, description=escape(_waiting(label, list(left))))

    return advance


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False


def _waiting(label: str, left: list[str]) -> str:
    """``exec: waiting on gpu007 +2``: the machine running longest, and how many more."""
    if not left:
        return label
    return f"{label}: waiting on {left[0]}" + (f" +{len(left) - 1}" if len(left) > 1 else "")


def _ignore(_item: Any = None) -> None:
    """Progress callback when no bar is shown."""


# What node text may not send to a terminal raw; each is shown as ``\\xNN``, ``\\uNNNN`` or
# ``\\UNNNNNNNN`` and every other character as itself (Japanese or accented names too):
# - C0 controls but newline and tab, DEL, C1 controls: escape sequences (colours, cursor
#   moves, OSC 52 clipboard writes; 0x9b is a one-byte CSI to some terminals), a carriage
#   return that overwrites the start of the line;
# - format characters (Unicode Cf): bidi marks, embeddings, overrides and isolates reorder
#   what a reader sees ("Trojan Source": a line that lies about which machine failed);
#   zero-width spaces and joiners, the soft hyphen and tag characters hide text or make two
#   names look alike (an emoji joined with U+200D shows its joiners: the price of that);
# - the letters and marks that are drawn as nothing (Hangul fillers U+115F, U+1160, U+3164,
#   U+FFA0; the combining grapheme joiner U+034F; Khmer U+17B4/5): a blank "name" that
#   is not one, or a space that is not a space;
# - the line and paragraph separators U+2028/U+2029: a line break to some terminals;
# - lone surrogates: a node's file name that is not UTF-8, as Python decodes it (a
#   terminal write of one raises).
# In code point order; the Cf ranges are Unicode 15's (a unit test checks them against
# ``unicodedata``).
_INVISIBLE = ("\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
              "\u08e2\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
              "\u2066-\u206f\u3164\ud800-\udfff\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
              "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
_CONTROL = re.compile(f"[{_INVISIBLE}]")
# A line of brctl's own (a warning, an error, a table cell, a record) holds node text
# on one line: a newline in it would start a line the node wrote, naming any machine.
_CONTROL_OR_NEWLINE = re.compile(f"[\\n{_INVISIBLE}]")


def visible(text: str, *, one_line: bool = False) -> str:
    """``text`` with every control and invisible format character but newline and tab
    written as ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN`` (the classes are listed above).

    Node bytes never reach the terminal raw: no escape sequences (colours, cursor
    moves, OSC 52 clipboard writes), no carriage returns overwriting a line, no
    reordered or hidden text. ``one_line``: newline too (``\\x0a``), for node text inside
    one line of brctl's (a node's multi-line output keeps its lines).
    """
    return (_CONTROL_OR_NEWLINE if one_line else _CONTROL).sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
            else f"\\U{code:08x}")


def escape(text: str) -> str:
    """Text from nodes or users made safe inside a line of rich markup: tags escaped,
    controls (newline too: ``visible(one_line=True)``) visible."""
    from rich.markup import escape as markup_escape

    shown = visible(text, one_line=True)
    body = shown.rstrip("\\")
    if len(body) == len(shown):
        return markup_escape(shown)
    # Trailing backslashes escape a tag that follows, and are literal where none does:
    # rich.markup.escape cannot know which (``dir C:\`` showed as ``dir C:\\`` at the end
    # of a line). Inside a tag of the null style they are always followed by one.
    slashes = "\\" * 2 * (len(shown) - len(body))
    return f"{markup_escape(body)}[none]{slashes}[/none]"


def node_text(text: str, style: str = "", *, one_line: bool = False) -> Text:
    """``text`` as a rich ``Text`` with controls made visible (``visible``): printed
    exactly, never read as markup (``rich.markup.escape`` doubles a backslash that ends a
    string)."""
    from rich.text import Text

    return Text(visible(text, one_line=one_line), style=style)


def table(columns: Iterable[str], rows: Iterable[Iterable[Any]], title: str | None = None) -> Any:
    """A rich Table; plain cells and the title are ``Text`` (never markup) with controls made
    visible, each on one line (a newline in a cell is shown escaped, as in a record)."""
    from rich.table import Table
    from rich.text import Text

    # a title names a job or an inventory file: the operator's words, not markup either
    shown = None if title is None else Text(visible(title, one_line=True), style="table.title")
    tbl = Table(title=shown, show_edge=False, header_style="bold", pad_edge=False)
    for col in columns:
        tbl.add_column(col)
    for row in rows:
        tbl.add_row(*(c if hasattr(c, "__rich__") or isinstance(c, Text)
                      else Text(visible(str(c), one_line=True)) for c in row))
    return tbl
