"""The shape of the health probe's answer, checked once where it arrives.

A node's document is untrusted bytes: a compromised or broken machine may send any
JSON. ``malformed`` compares it with ``DOCUMENT`` (the fields ``brctl.analysis.health``
reads, each with the JSON types it may have; unknown keys are ignored, every key may
be absent) and names the first thing out of shape, so that node gets an error of its
own instead of the whole sweep failing on a type error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

# A shape is a JSON type (or a tuple of them), a dict of shapes (an object whose
# listed keys have those shapes), or a one-element list (an array of that shape).
Shape = Union[type, None, tuple[Any, ...], dict[str, Any], list[Any]]

NUMBER = (int, float)
OPT_INT = (int, float, None)  # counts and readings: what the checks compare and add up
OPT_STR = (str, None)

_XID = {"code": NUMBER}
_GPU = {
    "index": OPT_INT, "pci": OPT_STR, "error": OPT_STR,
    "ecc_volatile_uncorrected": OPT_INT, "ecc_aggregate_uncorrected": OPT_INT,
    "retired_pages_pending": (bool, int, None), "retired_pages_dbe": OPT_INT,
    "remapped_rows": ({"correctable": OPT_INT, "uncorrectable": OPT_INT,
                       "pending": (bool, None), "failure": (bool, None)}, None),
    "temperature": OPT_INT, "temperature_slowdown": OPT_INT, "temperature_shutdown": OPT_INT,
    "throttle_reasons": OPT_INT, "power_mw": OPT_INT, "power_limit_mw": OPT_INT,
    "nvlink": ({"active": int, "replay": OPT_INT, "recovery": OPT_INT, "crc_flit": OPT_INT,
                "crc_data": OPT_INT}, None),
    "pcie_replay": OPT_INT, "recovery_action": OPT_INT, "errors": ({}, None),
}
_PORT = {"device": str, "port": OPT_STR, "missing": (bool, None), "state": OPT_STR,
         "phys_state": OPT_STR, "rate": OPT_STR, "link_downed": OPT_INT, "symbol_error": OPT_INT}

DOCUMENT: dict[str, Any] = {
    "boot_id": OPT_STR,
    "nvml": ({"status": OPT_STR, "count": OPT_INT, "gpus": ([_GPU], None)}, None),
    "kernel_log": ({"source": OPT_STR, "events": ([_XID], None), "cursor": ({}, None),
                    "error": OPT_STR}, None),
    "ib": ({"ports": ([_PORT], None), "error": OPT_STR}, None),
    "net": ({}, None),
    "disk": ({}, None),
    "process": ({"pids": ([int], None), "error": OPT_STR}, None),
}
_DISK = ({"total": NUMBER, "free": NUMBER, "error": OPT_STR}, None)


def _fits(value: Any, shape: Any) -> bool:
    if shape is None:
        return value is None
    if isinstance(shape, type):
        return isinstance(value, shape)
    if isinstance(shape, dict):
        return isinstance(value, Mapping)
    if isinstance(shape, list):
        return isinstance(value, list)
    return any(_fits(value, one) for one in shape)


def _chosen(value: Any, shape: Any) -> Any:
    """The alternative of ``shape`` that ``value`` fits (the container to descend into)."""
    if isinstance(shape, tuple):
        return next(one for one in shape if _fits(value, one))
    return shape


def _name(shape: Any) -> str:
    if shape is None:
        return "null"
    if isinstance(shape, type):
        return {str: "a string", int: "a number", float: "a number", bool: "true or false"}[shape]
    if isinstance(shape, dict):
        return "an object"
    if isinstance(shape, list):
        return "an array"
    return " or ".join(dict.fromkeys(_name(one) for one in shape))


def _walk(value: Any, shape: Any, path: str) -> str | None:
    if not _fits(value, shape):
        return f"{path}: expected {_name(shape)}, got {type(value).__name__}"
    shape = _chosen(value, shape)
    if isinstance(shape, dict):
        for key, sub in shape.items():
            if key in value:
                why = _walk(value[key], sub, f"{path}.{key}")
                if why:
                    return why
    elif isinstance(shape, list):
        for i, item in enumerate(value):
            why = _walk(item, shape[0], f"{path}[{i}]")
            if why:
                return why
    return None


def malformed(doc: Mapping[str, Any]) -> str | None:
    """Why the health document cannot be judged (the first field out of shape), or None."""
    why = _walk(doc, DOCUMENT, "document")
    if why:
        return why
    for path, entry in (doc.get("disk") or {}).items():
        why = _walk(entry, _DISK, f"document.disk[{path!r}]")
        if why:
            return why
    return None
