"""Rendering: JSON on stdout, rich tables and folded node output, progress on stderr.

Every command renders the same result dataclasses either way: ``--json`` prints
exactly one document with ``"schema": "brctl.<command>/1"``; humans get tables.
Progress, warnings and errors go to stderr only.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def json_document(schema: str, payload: Mapping[str, Any], version: int = 1) -> str:
    """The one JSON document a command prints with ``--json``."""
    return json.dumps({"schema": f"brctl.{schema}/{version}", **payload}, indent=2,
                      default=_jsonable)


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
    stdout: Any = field(default_factory=lambda: sys.stdout)
    stderr: Any = field(default_factory=lambda: sys.stderr)
    _console: Console | None = None
    _err: Console | None = None

    @property
    def console(self) -> Console:
        """Rich console on stdout (created on first use: keeps --help light)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stdout, highlight=False, soft_wrap=True)
        return self._console

    @property
    def err(self) -> Console:
        """Rich console on stderr."""
        if self._err is None:
            from rich.console import Console

            self._err = Console(file=self.stderr, highlight=False, stderr=True, soft_wrap=True)
        return self._err

    def emit_json(self, schema: str, payload: Mapping[str, Any], version: int = 1) -> None:
        """Print the command's JSON document on stdout (``version``: the schema's /N)."""
        self.stdout.write(json_document(schema, payload, version) + "\n")
        self.stdout.flush()

    def warn(self, message: str) -> None:
        """A one-line warning on stderr."""
        self.err.print(f"[yellow]brctl: warning:[/] {escape(message)}")

    def info(self, message: str) -> None:
        """A progress or context line on stderr (only with -v)."""
        if self.verbose:
            self.err.print(escape(message), style="dim")

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[Any], None]]:
        """A progress bar on stderr when it is a terminal; yields a per-item ``advance``."""
        if total < 2 or not self.err.is_terminal:
            yield _ignore
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=self.err,
                      transient=True) as bar:
            task = bar.add_task(label, total=total)

            def advance(_item: Any = None) -> None:
                bar.advance(task)

            yield advance


def _ignore(_item: Any = None) -> None:
    """Progress callback when no bar is shown."""


# C0 controls but newline and tab, DEL, C1 controls (0x9b is a one-byte CSI to some
# terminals) and the bidi overrides that reorder what a reader sees ("Trojan source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written as ``\\xNN``/``\\uNNNN``.

    Node bytes never reach the terminal raw: no escape sequences (colours, cursor
    moves, OSC 52 clipboard writes), no carriage returns overwriting a line.
    """
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """Text from nodes or users made safe inside rich markup: tags escaped, controls visible."""
    from rich.markup import escape as markup_escape

    return markup_escape(visible(text))


def table(columns: Iterable[str], rows: Iterable[Iterable[Any]], title: str | None = None) -> Any:
    """A rich Table; plain cells are ``Text`` (never markup) with controls made visible."""
    from rich.table import Table
    from rich.text import Text

    tbl = Table(title=title, show_edge=False, header_style="bold", pad_edge=False)
    for col in columns:
        tbl.add_column(col)
    for row in rows:
        tbl.add_row(*(c if hasattr(c, "__rich__") or isinstance(c, Text) else Text(visible(str(c)))
                      for c in row))
    return tbl
