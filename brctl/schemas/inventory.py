"""The inventory's JSON Schema, derived from the dataclasses the loader builds.

The loader (``brctl.core.schema.from_mapping``) reads the field types of
``RawInventory`` and its sections; this walks the same types, so the published
schema and the loader cannot disagree on keys, types or value ranges. Rules that
span keys (job machines exist, address counts) are the loader's alone.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from brctl.core import schema as engine

# Value checks of brctl.core.schema that have a JSON Schema form.
_RANGES: dict[Any, dict[str, Any]] = {
    engine.at_least_one: {"minimum": 1},
    engine.non_negative: {"minimum": 0},
    engine.positive: {"exclusiveMinimum": 0},
    engine.port_number: {"minimum": 1, "maximum": 65535},
}


def _type(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if tp is type(None):
        return {"type": "null"}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (Union, getattr(types, "UnionType", Union)):
        return {"anyOf": [_type(a, defs) for a in get_args(tp)]}
    if origin in (list, tuple):
        return {"type": "array", "items": _type(get_args(tp)[0], defs)}
    if origin in (dict, Mapping):
        return {"type": "object", "additionalProperties": _type(get_args(tp)[1], defs)}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: recursion stops here
            defs[tp.__name__] = _object(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:  # the loader takes a number where a string is expected (port: 22 as "22")
        return {"type": ["string", "number"]}
    raise TypeError(f"inventory schema: unsupported field type {tp!r}")


def _object(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = get_type_hints(cls, vars(sys.modules[cls.__module__]))
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        prop = _type(hints[f.name], defs)
        # minimum/maximum constrain numbers only: null stays valid for an optional key
        props[f.name] = {**prop, **_RANGES.get(f.metadata.get("check"), {})}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    doc = (cls.__doc__ or "").strip().splitlines()
    return {"type": "object", "description": doc[0] if doc else cls.__name__,
            "properties": props, "required": required, "additionalProperties": False}


def inventory_schema() -> dict[str, Any]:
    """``brctl.inventory/1``: the inventory file (YAML) as a JSON Schema."""
    from brctl.analysis.inventory import RawInventory

    defs: dict[str, Any] = {}
    top = _object(RawInventory, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "brctl.inventory/1", "title": "brctl inventory (brctl-inventory(5))",
            **top, "$defs": defs}
