"""The shape of the health probe's answer, checked once where it arrives.

A node's document is untrusted bytes: a compromised or broken machine may send any
JSON. ``malformed`` compares it with ``DOCUMENT`` (the fields ``brctl.analysis.health``
reads, each with the JSON types it may have; unknown keys are ignored, every key may
be absent) and names the first thing out of shape, so that node gets an error of its
own instead of the whole sweep failing on a type error. The checker is
``brctl.analysis.probe_doc``'s, shared with the other probes' answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brctl.analysis import probe_doc
from brctl.analysis.probe_doc import NUMBER, OPT_INT, OPT_STR, MapOf

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
_DISK = ({"total": NUMBER, "free": NUMBER, "error": OPT_STR}, None)

DOCUMENT: dict[str, Any] = {
    "boot_id": OPT_STR,
    "nvml": ({"status": OPT_STR, "count": OPT_INT, "gpus": ([_GPU], None)}, None),
    "kernel_log": ({"source": OPT_STR, "events": ([_XID], None), "cursor": ({}, None),
                    "error": OPT_STR}, None),
    "ib": ({"ports": ([_PORT], None), "error": OPT_STR}, None),
    "net": ({}, None),
    "disk": (MapOf(_DISK), None),  # path → its entry
    "process": ({"pids": ([int], None), "error": OPT_STR}, None),
}


def malformed(doc: Mapping[str, Any]) -> str | None:
    """Why the health document cannot be judged (the first field out of shape), or None."""
    return probe_doc.malformed(doc, DOCUMENT)
