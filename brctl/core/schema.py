"""Build frozen dataclasses from parsed YAML/JSON, loudly.

Every section of the inventory and of a playbook is a frozen dataclass; this module
turns a mapping into one, checking types from the annotations. Errors name the
file, the key path and the expected form. Supported field types: str, int, float,
bool, Literal[...], Optional[X], list[X], tuple[X, ...], dict[str, X] and nested
dataclasses. A field's metadata may carry ``check`` (a callable raising ValueError)
for value rules beyond the type.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from brctl.core.errors import InputError

T = TypeVar("T")


class SchemaError(InputError):
    """A value does not fit the schema; carries the source file, key path and (once the
    file's text is known) the line, as a compiler does: ``inv.yaml:12: nodes[2].gpus: …``."""

    def __init__(self, source: str, path: str, message: str, hint: str | None = None,
                 line: int | None = None) -> None:
        at = f"{source}:{line}" if line is not None else source
        where = f"{at}: {path}" if path else at
        super().__init__(f"{where}: {message}", hint=hint, file=source, key=path or None,
                         line=line)
        self.source = source
        self.path = path
        self.detail = message

    def at_line(self, line: int) -> SchemaError:
        """The same error, placed on ``line`` of its file."""
        return SchemaError(self.source, self.path, self.detail, self.hint, line)


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, getattr(types, "UnionType", Union)):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {_describe(get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return f"a mapping of {_describe(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _convert(value: Any, tp: Any, source: str, path: str) -> Any:  # noqa: C901 - one branch per type
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise SchemaError(source, path, f"got {value!r}, expected one of {_describe(tp)}")
        return value
    if origin in (Union, getattr(types, "UnionType", Union)):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors: list[tuple[Any, SchemaError]] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, source, path)
            except SchemaError as err:
                errors.append((arg, err))
        # Report the arm the value was clearly meant for (a mapping for a section, …).
        for arg, arm_error in errors:
            if len(errors) == 1 or _same_shape(value, arg):
                raise arm_error
        raise SchemaError(source, path, f"got {value!r}, expected {_describe(tp)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise SchemaError(source, path, f"got {_typename(value)}, expected {_describe(tp)}")
        item_tp = get_args(tp)[0]
        items = [_convert(v, item_tp, source, _join(path, i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise SchemaError(source, path, f"got {_typename(value)}, expected {_describe(tp)}")
        _, val_tp = get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(source, _join(path, str(k)), "keys must be strings")
            out[k] = _convert(v, val_tp, source, _join(path, k))
        return types.MappingProxyType(out) if origin is Mapping else out
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_mapping(tp, value, source, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SchemaError(source, path, f"got {value!r}, expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(source, path, f"got {value!r}, expected a whole number")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(source, path, f"got {value!r}, expected a number")
        try:
            number = float(value)  # a YAML integer of 400 digits is too large for one
        except OverflowError:
            raise SchemaError(source, path, f"got a {len(str(abs(value)))}-digit number, "
                                            "expected a finite number") from None
        if not math.isfinite(number):  # YAML's .nan and .inf: no setting means one
            raise SchemaError(source, path, f"got {value!r}, expected a finite number")
        return number
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SchemaError(source, path, f"got {_typename(value)}, expected a string")
        return str(value)
    raise TypeError(f"schema: unsupported field type {tp!r}")  # a bug in brctl, not in input


def _same_shape(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if isinstance(value, dict):
        return origin in (dict, Mapping) or dataclasses.is_dataclass(tp)
    if isinstance(value, list):
        return origin in (list, tuple)
    return False


def _typename(value: Any) -> str:
    if value is None:
        return "null"
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(value), repr(value))


def from_mapping(cls: type[T], data: Any, source: str, path: str = "") -> T:
    """Build ``cls`` (a dataclass) from ``data``; unknown keys and wrong types are errors.

    Args:
        cls: the frozen dataclass to build.
        data: the parsed mapping (None means "all defaults").
        source: the file name used in error messages.
        path: the key path of ``data`` inside ``source``.

    Raises:
        SchemaError: naming ``source``, the key path and the expected form.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SchemaError(source, path, f"got {_typename(data)}, expected a mapping")
    assert dataclasses.is_dataclass(cls)
    module = sys.modules[cls.__module__]
    hints = get_type_hints(cls, vars(module))
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        import difflib

        near = difflib.get_close_matches(str(unknown[0]), list(fields), n=1, cutoff=0.6)
        guess = f"did you mean {near[0]}? " if near else ""
        raise SchemaError(
            source,
            _join(path, str(unknown[0])),
            "unknown key",
            hint=f"{guess}known keys here: {', '.join(sorted(fields))}",
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in data:
            no_default = field.default is dataclasses.MISSING
            if no_default and field.default_factory is dataclasses.MISSING:
                raise SchemaError(source, _join(path, name), "required key is missing")
            continue
        value = _convert(data[name], hints[name], source, _join(path, name))
        check = field.metadata.get("check")
        if check is not None and value is not None:  # null: an optional key left unset
            try:
                value = check(value)
            except ValueError as exc:
                raise SchemaError(source, _join(path, name), str(exc)) from None
        kwargs[name] = value
    return cls(**kwargs)


def non_negative(value: Any) -> Any:
    """Field check: a whole number >= 0 (a count or threshold where 0 means "any")."""
    if value < 0:
        raise ValueError(f"got {value!r}, expected a whole number >= 0")
    return value


def port_number(value: Any) -> Any:
    """Field check: a TCP port, 1-65535."""
    if not 1 <= value <= 65535:
        raise ValueError(f"got {value!r}, expected a port number from 1 to 65535")
    return value


def positive(value: Any) -> Any:
    """Field check: the number must be > 0."""
    if value <= 0:
        raise ValueError(f"got {value!r}, expected a number greater than 0")
    return value


def regex(value: str) -> str:
    """Field check: the string must compile as a Python regular expression."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


def at_least_one(value: Any) -> Any:
    """Field check: a whole number >= 1."""
    if value < 1:
        raise ValueError(f"got {value!r}, expected a whole number >= 1")
    return value


def field(default: Any = dataclasses.MISSING, *, check: typing.Callable[[Any], Any] | None = None,
          factory: typing.Callable[[], Any] | None = None) -> Any:
    """A dataclass field with an optional value check."""
    meta = {"check": check} if check else {}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
