"""Option values read without pydantic: ``--timeout 30`` costs no 100 ms import.

typer 0.29 coerces every parameter it parses through a pydantic ``TypeAdapter``
built on first use (``_TyperParameter.get_runtime_param``): a ``brctl exec``
imported pydantic and built adapters (~0.17 s of CPU on a small machine) before
its first connection. ``install`` has typer give each parameter of the
annotations brctl uses (str, bool, int, float, Path, an Enum, lists of those) a
light coercion that answers only where its answer is certainly typer's (``30``,
``2.5``, ``gpu[1-4]``); any other value (``abc``, ``1e3``, ``+5``) and any error
go to typer's own coercion, built then, so every error message and every odd
accepted form stay typer's. tests/unit/test_cliparams.py holds the two equal on
a corpus of values.

This leans on typer internals (pyproject pins typer to the tested minor): when
they are not there, ``install`` does nothing and typer's normal path runs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, get_args

try:
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
except ImportError:  # another typer: its own coercion runs
    RuntimeParam = None  # type: ignore[assignment,misc]

# Forms every parser agrees on; typer (pydantic) also takes "+5", " 5", "1_000",
# "1e3", "inf", ... which go to it. ASCII digits only: pydantic refuses "٣".
_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")
_UNSURE = object()  # the light path has no answer: typer's decides


def _kind(annotation: Any, descriptor: Any) -> str | None:
    """What the light path reads for a leaf annotation, or None: typer only."""
    info = descriptor.parameter_info
    if info.parser is not None:
        return None
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "choice"
    if annotation is str or annotation is bool:
        return annotation.__name__
    if annotation is int or annotation is float:
        return None if info.clamp else annotation.__name__
    if annotation is Path and info.path_type is None:
        return "path"
    return None


def _light(descriptor: Any) -> Any:
    """The light coercion for a parameter, or None where typer's must run."""
    if RuntimeParam is None or not isinstance(descriptor, TypeDescriptor):
        return None
    if descriptor.file_annotation is not None:
        return None
    annotation = descriptor.annotation
    many = bool(descriptor.is_list)
    if many and len(get_args(annotation)) != 1:
        return None
    kind = _kind(get_args(annotation)[0] if many else annotation, descriptor)
    if kind is None:
        return None
    return _Light(parameter_info=descriptor.parameter_info, annotation=annotation,
                  descriptor=descriptor, kind=kind, many=many)


def install() -> None:
    """Have typer build brctl's parameters' coercions here (once; a no-op when typer's
    internals are not the tested ones). typer calls ``core.build_runtime_param``
    lazily, on a parameter's first value: every parameter it makes (the help option
    ``click`` adds at parse time too) comes here."""
    import typer.core

    if RuntimeParam is not None and getattr(typer.core, "build_runtime_param",
                                            None) is build_runtime_param:
        typer.core.build_runtime_param = _build  # type: ignore[attr-defined]


def _build(descriptor: Any) -> Any:
    light = _light(descriptor)
    return light if light is not None else build_runtime_param(descriptor)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _Light(RuntimeParam):
        """typer's coercion for the usual values, typer's own for the rest.

        ``RuntimeParam.coerce`` (None, a lone string for a list) runs first, as for
        typer's; ``_coerce_value`` answers or hands the value to typer's.
        """

        descriptor: TypeDescriptor
        kind: str
        many: bool

        @functools.cached_property
        def own(self) -> RuntimeParam:
            return build_runtime_param(self.descriptor)  # imports pydantic

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if self.many:
                out: Any = _UNSURE
                if isinstance(value, (list, tuple)):
                    items = [self._leaf(item, param, ctx) for item in value]
                    out = _UNSURE if any(i is _UNSURE for i in items) else items
            else:
                out = self._leaf(value, param, ctx)
            if out is _UNSURE:
                return self.own._coerce_value(value, param=param, ctx=ctx)
            return out

        def _leaf(self, value: Any, param: Any, ctx: Any) -> Any:
            kind, info = self.kind, self.parameter_info
            if kind == "str" or kind == "bool":  # typer's bool takes "yes", "0", ...
                return value if type(value) is (str if kind == "str" else bool) else _UNSURE
            if kind == "int" or kind == "float":
                return _number(value, kind == "int", info.min, info.max)
            try:  # any error is typer's to report, in its words (it checks again)
                if kind == "choice":
                    return coerce_cli_choice(value, choices=self.descriptor.choices or (),
                                             case_sensitive=info.case_sensitive, ctx=ctx)
                if kind == "path" and type(value) is str:
                    return coerce_cli_path(Path(value), info, path_type=Path,
                                           param=param, ctx=ctx)
            except Exception:
                pass
            return _UNSURE


def _number(value: Any, integer: bool, low: Any, high: Any) -> Any:
    """``value`` as an int (or float) where typer would read the same, else _UNSURE."""
    number: Any = _UNSURE
    if integer:
        if type(value) is int:
            number = value
        elif type(value) is str and _INT.fullmatch(value):
            number = int(value)
    elif type(value) is float:
        number = value
    elif (type(value) is int and abs(value) <= 2**53) or (
            type(value) is str and _FLOAT.fullmatch(value)):
        number = float(value)
    if number is _UNSURE or (low is not None and not number >= low) or (
            high is not None and not number <= high):  # NaN and out of range: typer says
        return _UNSURE
    return number
