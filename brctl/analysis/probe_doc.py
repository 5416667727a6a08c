"""The shape of a probe's answer, checked once where it arrives.

A node's document is untrusted bytes: a compromised or broken machine may send any
JSON (``json.loads`` also reads ``NaN``, ``Infinity`` and integers of thousands of
digits). ``malformed(doc, shape)`` compares it with a declared shape (the fields the
controller reads, each with the JSON types it may have; unknown keys are ignored)
and names the first thing out of shape, so that node gets an error of its own
instead of the whole operation failing on a type error.

A shape is a JSON type (or a tuple of alternatives), ``FINITE`` (a number that is
neither NaN nor infinite and fits a float) or ``REAL`` (any number ``float()`` takes),
a dict of shapes (an object whose listed
keys have those shapes; a key may be absent unless its shape is ``Required``), a
one-element list (an array of that shape) or ``MapOf`` (an object whose every value
has that shape: keys the node chose, such as file paths).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = Any

NUMBER = (int, float)  # any JSON number, NaN and infinities included
OPT_INT = (int, float, None)
OPT_STR = (str, None)
_KEY_SHOWN = 60  # characters of a node-chosen key quoted in a message


@dataclass(frozen=True)
class _Float:
    """A JSON number ``float()`` takes (not bool, not an integer past a float's range);
    ``finite``: not NaN or infinite either (what arithmetic and ``format`` can take)."""

    finite: bool


FINITE = _Float(finite=True)
REAL = _Float(finite=False)  # NaN and infinities allowed (a diverged loss is one)
OPT_FINITE = (FINITE, None)
# A leaf that is only printed or copied into brctl's own JSON: no nested garbage, no NaN.
SCALAR = (str, FINITE, bool, None)


@dataclass(frozen=True)
class Required:
    """A key that must be present, with this shape."""

    shape: Shape


@dataclass(frozen=True)
class MapOf:
    """An object whose every value has ``shape``."""

    shape: Shape


def finite(value: Any) -> bool:
    """A JSON number that is not NaN or infinite and converts to float (bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _float(value: Any, shape: _Float) -> bool:
    if shape.finite or not isinstance(value, float):
        return finite(value)
    return True  # a float: NaN and infinities included


def _fits(value: Any, shape: Shape) -> bool:
    if isinstance(shape, Required):
        return _fits(value, shape.shape)
    if shape is None:
        return value is None
    if isinstance(shape, _Float):
        return _float(value, shape)
    if isinstance(shape, type):
        return isinstance(value, shape)
    if isinstance(shape, (dict, MapOf)):
        return isinstance(value, Mapping)
    if isinstance(shape, list):
        return isinstance(value, list)
    return any(_fits(value, one) for one in shape)


def _chosen(value: Any, shape: Shape) -> Shape:
    """The alternative of ``shape`` that ``value`` fits (the container to descend into)."""
    if isinstance(shape, Required):
        return _chosen(value, shape.shape)
    if isinstance(shape, tuple):
        return next(one for one in shape if _fits(value, one))
    return shape


def _name(shape: Shape) -> str:
    if isinstance(shape, Required):
        return _name(shape.shape)
    if shape is None:
        return "null"
    if isinstance(shape, _Float):
        return "a finite number" if shape.finite else "a number"
    if isinstance(shape, type):
        return {str: "a string", int: "a number", float: "a number", bool: "true or false"}[shape]
    if isinstance(shape, (dict, MapOf)):
        return "an object"
    if isinstance(shape, list):
        return "an array"
    return " or ".join(dict.fromkeys(_name(one) for one in shape))


def _got(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not finite(value):
        return "a number too large for a float" if isinstance(value, int) else repr(value)
    return type(value).__name__


def _walk(value: Any, shape: Shape, path: str) -> str | None:
    if not _fits(value, shape):
        return f"{path}: expected {_name(shape)}, got {_got(value)}"
    shape = _chosen(value, shape)
    if isinstance(shape, dict):
        for key, sub in shape.items():
            if key in value:
                why = _walk(value[key], sub, f"{path}.{key}")
                if why:
                    return why
            elif isinstance(sub, Required):
                return f"{path}.{key}: missing"
    elif isinstance(shape, MapOf):
        for key, item in value.items():
            shown = str(key)
            shown = shown if len(shown) <= _KEY_SHOWN else shown[:_KEY_SHOWN] + "..."
            why = _walk(item, shape.shape, f"{path}[{shown!r}]")
            if why:
                return why
    elif isinstance(shape, list):
        for i, item in enumerate(value):
            why = _walk(item, shape[0], f"{path}[{i}]")
            if why:
                return why
    return None


def malformed(doc: Any, shape: Shape, path: str = "document") -> str | None:
    """Why ``doc`` is out of ``shape`` (the first field, by path), or None when it fits."""
    return _walk(doc, shape, path)
