"""The shape of the health probe's answer, checked once where it arrives.

A node's document is untrusted bytes: a compromised or broken machine may send any
JSON. ``malformed`` compares it with ``DOCUMENT`` (the fields ``brctl.analysis.health``
reads, each with the JSON types it may have; unknown keys are ignored, every key may
be absent) and names the first thing out of shape, so that node gets an error of its
own instead of the whole sweep failing on a type error. The checker is
``brctl.analysis.probe_doc``'s, shared with the other probes' answers.

``parse`` is that check with its proof kept: a document that fits comes back as a
``HealthDocument``, the TypedDicts below that say in types what ``DOCUMENT`` says in
shapes (every key ``NotRequired``: DOCUMENT lets any be absent), so mypy checks every
lookup ``brctl.analysis.health`` makes. A test walks both and fails when they drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, TypedDict, Union, cast

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
# Not null: the probe never sends one, and check_disk reads each entry as an object.
_DISK = {"total": NUMBER, "free": NUMBER, "error": OPT_STR}

DOCUMENT: dict[str, Any] = {
    "boot_id": OPT_STR,
    # nvml.reason is only ever shown through str(): any JSON value will do (object).
    "nvml": ({"status": OPT_STR, "reason": object, "count": OPT_INT, "gpus": ([_GPU], None)},
             None),
    "kernel_log": ({"source": OPT_STR, "events": ([_XID], None), "cursor": ({}, None),
                    "error": OPT_STR}, None),
    "ib": ({"ports": ([_PORT], None), "error": OPT_STR}, None),
    "net": ({}, None),
    "disk": (MapOf(_DISK), None),  # path → its entry
    "process": ({"pids": ([int], None), "error": OPT_STR}, None),
}

# OPT_INT in types: a JSON number (an int, or a float) or null.
_OptNumber = Union[int, float, None]


class RemappedRows(TypedDict, total=False):
    """A GPU's row-remapping counters and flags."""

    correctable: _OptNumber
    uncorrectable: _OptNumber
    pending: Optional[bool]
    failure: Optional[bool]


class NvLink(TypedDict, total=False):
    """A GPU's active link count and its NVLink error counters."""

    active: int
    replay: _OptNumber
    recovery: _OptNumber
    crc_flit: _OptNumber
    crc_data: _OptNumber


class GpuSample(TypedDict, total=False):
    """One GPU as NVML saw it (``error``: NVML could not open it)."""

    index: _OptNumber
    pci: Optional[str]
    error: Optional[str]
    ecc_volatile_uncorrected: _OptNumber
    ecc_aggregate_uncorrected: _OptNumber
    retired_pages_pending: Union[bool, int, None]
    retired_pages_dbe: _OptNumber
    remapped_rows: Optional[RemappedRows]
    temperature: _OptNumber
    temperature_slowdown: _OptNumber
    temperature_shutdown: _OptNumber
    throttle_reasons: _OptNumber
    power_mw: _OptNumber
    power_limit_mw: _OptNumber
    nvlink: Optional[NvLink]
    pcie_replay: _OptNumber
    recovery_action: _OptNumber
    errors: Optional[Mapping[str, object]]  # the reading that failed → why


class Nvml(TypedDict, total=False):
    """The NVML part: ``status`` ok | unavailable | error, and the GPUs."""

    status: Optional[str]
    reason: object
    count: _OptNumber
    gpus: Optional[list[GpuSample]]


class XidEntry(TypedDict, total=False):
    """One Xid from the kernel log (its other fields are copied, see ``XidEvent``)."""

    code: Union[int, float]


class KernelLog(TypedDict, total=False):
    """The kernel-log part: the new Xids and where to read from next time."""

    source: Optional[str]
    events: Optional[list[XidEntry]]
    cursor: Optional[Mapping[str, object]]
    error: Optional[str]


class IbPort(TypedDict, total=False):
    """One RDMA port (``missing``: a configured device that is not there)."""

    device: str
    port: Optional[str]
    missing: Optional[bool]
    state: Optional[str]
    phys_state: Optional[str]
    rate: Optional[str]
    link_downed: _OptNumber
    symbol_error: _OptNumber


class Ib(TypedDict, total=False):
    """The RDMA part."""

    ports: Optional[list[IbPort]]
    error: Optional[str]


class DiskEntry(TypedDict, total=False):
    """One path's space in bytes, or why it could not be read."""

    total: Union[int, float]
    free: Union[int, float]
    error: Optional[str]


class ProcessSection(TypedDict, total=False):
    """The training processes found, or why /proc could not be read."""

    pids: Optional[list[int]]
    error: Optional[str]


class HealthDocument(TypedDict, total=False):
    """The health probe's answer, once ``parse`` has checked it."""

    boot_id: Optional[str]
    nvml: Optional[Nvml]
    kernel_log: Optional[KernelLog]
    ib: Optional[Ib]
    net: Optional[Mapping[str, object]]  # interface → operstate (null: no such interface)
    disk: Optional[Mapping[str, DiskEntry]]  # path → its entry
    process: Optional[ProcessSection]


def malformed(doc: Mapping[str, Any]) -> str | None:
    """Why the health document cannot be judged (the first field out of shape), or None."""
    return probe_doc.malformed(doc, DOCUMENT)


def parse(doc: Mapping[str, Any]) -> HealthDocument | str:
    """The document typed, or why it cannot be judged (``malformed``'s text).

    The cast is safe because the shape check just passed: ``HealthDocument`` declares
    exactly ``DOCUMENT``'s keys and types (``tests/unit/test_health_doc.py`` holds them
    together)."""
    why = malformed(doc)
    return why if why is not None else cast(HealthDocument, doc)
