"""Probe: one machine's real-time health sample, in one round trip.

Node-side: standard library at top level; ``pynvml`` is imported inside
``sample_nvml`` and its absence (or the driver's) is a reason, never a crash.
The probe only *measures*; thresholds, deltas against the previous sample and
the verdict are the controller's (``brctl.analysis.health``).

Request (JSON on stdin, every key optional)::

    {"root": "/",                        # sysfs, /proc, /dev/kmsg and logs are read under it
     "checks": ["nvml", "kernel_log", "ib", "net", "disk", "process"],
     "kernel_logs": ["/var/log/kern.log", "/var/log/messages"],
     "xid_cursor": {...},                # what the previous sample returned as "xid_cursor"
     "interfaces": ["eth0"], "ib_devices": [], "disk_paths": ["/"],
     "process_match": "pretrain"}

Document: ``boot_id``, ``nvml`` {status: ok|unavailable|error, reason, driver, gpus: [...]},
``kernel_log`` {source, events, cursor, error}, ``ib`` {ports, error},
``net`` {iface: operstate}, ``disk`` {path: {total, free} | {error}},
``process`` {pids} | {error}, ``seconds`` (the probe's own wall time).

``root`` is the only test seam: tests point it at a fixture tree built in a
temporary directory (sysfs files, a kmsg dump, a kern.log).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from typing import Any, Callable, Optional

from brctl.diagnostics.protocol import serve
from brctl.diagnostics.xid import parse_xid_line

ALL = ("nvml", "kernel_log", "ib", "net", "disk", "process")
DEFAULT_KERNEL_LOGS = ("/var/log/kern.log", "/var/log/messages")
_TAIL_BYTES = 4 << 20  # first read of a text log: its last 4 MiB is enough for "this boot"
_MAX_EVENTS = 200  # an Xid storm must not blow up the document
_LINE_MAX = 64 << 10  # a text log line longer than this is read in pieces


def under(root: str, path: str) -> str:
    """``path`` (absolute) inside ``root``."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> Optional[str]:
    """A small file's stripped text, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def read_int(path: str) -> Optional[int]:
    """A sysfs counter, or None."""
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------- NVML


def _nvml_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.decode() if isinstance(text, bytes) else text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(errors: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """Call one NVML getter; an error (e.g. Not Supported on this GPU) is recorded, not raised."""
    try:
        return fn()
    except Exception as exc:  # pynvml raises NVMLError subclasses made at runtime
        errors[key] = _nvml_error(exc)
        return None


def _nvlink(nv: Any, handle: Any) -> Optional[dict[str, Any]]:
    counters = {"replay": nv.NVML_NVLINK_ERROR_DL_REPLAY,
                "recovery": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
                "crc_flit": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                "crc_data": nv.NVML_NVLINK_ERROR_DL_CRC_DATA}
    totals = dict.fromkeys(counters, 0)
    active = 0
    supported = False
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nv.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:  # no such link on this GPU (or no NVLink at all)
            continue
        supported = True
        if not state:
            continue
        active += 1
        for name, counter in counters.items():
            with contextlib.suppress(Exception):  # counter not supported on this link
                totals[name] += int(nv.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
    if not supported:
        return None
    return {"active": active, **totals}


def _recovery_action(nv: Any, handle: Any) -> Optional[int]:
    field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is None:
        return None  # pynvml older than driver 570's field: nothing to read
    try:
        (value,) = nv.nvmlDeviceGetFieldValues(handle, [field])
    except Exception:
        return None
    if getattr(value, "nvmlReturn", 1) != 0:
        return None
    return int(value.value.uiVal)


def _throttle(nv: Any, handle: Any) -> int:
    getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(getter(handle))


def _gpu(nv: Any, index: int) -> dict[str, Any]:
    errors: dict[str, str] = {}
    h = nv.nvmlDeviceGetHandleByIndex(index)
    pci = _try(errors, "pci", lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId))
    unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    ecc_vol = _try(errors, "ecc", lambda: int(
        nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_VOLATILE_ECC)))
    ecc_agg = _try(errors, "ecc", lambda: int(
        nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_AGGREGATE_ECC)))
    pending = _try(errors, "retired_pages", lambda: int(
        nv.nvmlDeviceGetRetiredPagesPendingStatus(h)))
    retired = _try(errors, "retired_pages", lambda: len(nv.nvmlDeviceGetRetiredPages(
        h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
    rows = _try(errors, "remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
    temp = _try(errors, "temperature", lambda: int(
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
    slow = _try(errors, "temperature_slowdown", lambda: int(nv.nvmlDeviceGetTemperatureThreshold(
        h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)))
    shut = _try(errors, "temperature_shutdown", lambda: int(nv.nvmlDeviceGetTemperatureThreshold(
        h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)))
    return {
        "index": index,
        "pci": (pci or "").lower() or None,
        "uuid": _try(errors, "uuid", lambda: _text(nv.nvmlDeviceGetUUID(h))),
        "name": _try(errors, "name", lambda: _text(nv.nvmlDeviceGetName(h))),
        "ecc_volatile_uncorrected": ecc_vol,
        "ecc_aggregate_uncorrected": ecc_agg,
        "retired_pages_pending": None if pending is None else bool(pending),
        "retired_pages_dbe": retired,
        "remapped_rows": None if rows is None else {
            "correctable": int(rows[0]), "uncorrectable": int(rows[1]),
            "pending": bool(rows[2]), "failure": bool(rows[3])},
        "temperature": temp,
        "temperature_slowdown": slow,
        "temperature_shutdown": shut,
        "throttle_reasons": _try(errors, "throttle", lambda: _throttle(nv, h)),
        "power_mw": _try(errors, "power", lambda: int(nv.nvmlDeviceGetPowerUsage(h))),
        "power_limit_mw": _try(errors, "power", lambda: int(
            nv.nvmlDeviceGetEnforcedPowerLimit(h))),
        "nvlink": _nvlink(nv, h),
        "pcie_replay": _try(errors, "pcie", lambda: int(nv.nvmlDeviceGetPcieReplayCounter(h))),
        "recovery_action": _recovery_action(nv, h),
        "errors": errors,
    }


# Why NVML cannot be used: the three reasons a machine with GPUs reports as unknown.
NO_DRIVER = "NVML library missing: no NVIDIA driver (libnvidia-ml not found)"
NOT_LOADED = "NVIDIA driver not loaded (nvmlInit failed)"
NO_MODULE = "pynvml module missing on the node (pip install nvidia-ml-py)"


def sample_nvml() -> dict[str, Any]:
    """Per-GPU NVML values; ``status`` unavailable with the reason when NVML cannot be used.

    The reason names which of the three it is (driver not loaded, library missing,
    module missing): the controller reports it as ``unknown``, never as ok.
    """
    try:
        import pynvml as nv
    except ImportError:
        import ctypes

        try:  # dlopen: the checked library path and ld.so.cache (find_library runs gcc, ld, …)
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return {"status": "unavailable", "reason": NO_DRIVER}
        return {"status": "unavailable", "reason": NO_MODULE}
    try:
        nv.nvmlInit()
    except Exception as exc:
        if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return {"status": "unavailable", "reason": NO_DRIVER}
        if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
            return {"status": "unavailable", "reason": NOT_LOADED}
        return {"status": "error", "reason": f"nvmlInit failed: {_nvml_error(exc)}"}
    try:
        driver = _try({}, "driver", lambda: _text(nv.nvmlSystemGetDriverVersion()))
        count = int(nv.nvmlDeviceGetCount())
        gpus = []
        for i in range(count):
            try:
                gpus.append(_gpu(nv, i))
            except Exception as exc:  # a GPU that cannot even be opened is itself a finding
                gpus.append({"index": i, "error": _nvml_error(exc)})
        return {"status": "ok", "driver": driver, "count": count, "gpus": gpus}
    except Exception as exc:
        return {"status": "error", "reason": f"NVML: {_nvml_error(exc)}"}
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


# ---------------------------------------------------------------- kernel log


def _kmsg_records(path: str) -> list[str]:
    """Every record of ``/dev/kmsg`` (one read per record; EAGAIN ends), or a file's lines."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records: list[str] = []
    if stat.S_ISREG(os.fstat(fd).st_mode):  # a saved dump (tests, offline): plain lines
        with os.fdopen(fd, "rb") as fh:
            return fh.read().decode("utf-8", errors="replace").splitlines()
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the record was overwritten while we read: skip
                    continue
                raise
            if not chunk:
                break
            records.extend(chunk.decode("utf-8", errors="replace").splitlines())
    finally:
        os.close(fd)
    return records


_KMSG_HEAD = re.compile(r"^\d+,(\d+),\d+,[^;]*;")


def read_kmsg(path: str, boot_id: Optional[str], cursor: dict[str, Any]) -> dict[str, Any]:
    """Xid events of ``/dev/kmsg`` after the cursor's sequence number (same boot only)."""
    after = cursor.get("seq", -1) if cursor.get("boot_id") == boot_id else -1
    last = after
    events = []
    for record in _kmsg_records(path):
        m = _KMSG_HEAD.match(record)
        if m is None:  # continuation lines (" KEY=value") carry no new record
            continue
        seq = int(m.group(1))
        if seq <= after:
            continue
        last = max(last, seq)
        event = parse_xid_line(record)
        if event is not None:
            events.append(event.to_json())
    return {"source": path, "events": events,
            "cursor": {"kind": "kmsg", "boot_id": boot_id, "seq": last}}


def read_text_log(path: str, cursor: dict[str, Any]) -> dict[str, Any]:
    """Xid events appended to a text log since the cursor (inode + offset).

    A rotated (new inode) or truncated log is read from its start; the first read
    takes the tail and keeps only what follows the last boot banner, so events
    of earlier boots are not reported. Read a line at a time: a log that grew by
    gigabytes since the last sweep (an error storm, a week without the daemon) is
    never held in memory on the training machine, and every Xid in it is seen.
    """
    st = os.stat(path)
    same = cursor.get("path") == path and cursor.get("inode") == st.st_ino
    offset = int(cursor.get("offset", 0)) if same and cursor.get("offset", 0) <= st.st_size else 0
    first = not same
    events: list[dict[str, Any]] = []
    dropped = 0
    with open(path, "rb") as fh:
        if first:
            offset = max(0, st.st_size - _TAIL_BYTES)
        fh.seek(offset)
        end = offset
        while True:
            line = fh.readline(_LINE_MAX)
            if not line.endswith(b"\n") and len(line) < _LINE_MAX:
                break  # the end, or a line still being written: read it next time
            end += len(line)
            text = line.decode("utf-8", errors="replace")
            if first and "Linux version " in text:  # a boot: what came before is history
                events, dropped = [], 0
            event = parse_xid_line(text)
            if event is not None:
                events.append(event.to_json())
                if len(events) > _MAX_EVENTS:
                    events, dropped = events[-_MAX_EVENTS:], dropped + len(events) - _MAX_EVENTS
    out: dict[str, Any] = {"source": path, "events": events,
                           "cursor": {"kind": "file", "path": path, "inode": st.st_ino,
                                      "offset": end}}
    if dropped:
        out["dropped"] = dropped
    return out


def sample_kernel_log(root: str, request: dict[str, Any], boot_id: Optional[str]) -> dict[str, Any]:
    """Xid events since the cursor from /dev/kmsg, else the first readable text log."""
    cursor = request.get("xid_cursor") or {}
    tried = []
    kmsg = under(root, "/dev/kmsg")
    if os.path.exists(kmsg):
        try:
            out = read_kmsg(kmsg, boot_id, cursor if cursor.get("kind") == "kmsg" else {})
            return _cap(out)
        except OSError as exc:  # dmesg_restrict: non-root users cannot read the ring buffer
            tried.append(f"{kmsg}: {exc.strerror}")
    for log in request.get("kernel_logs") or DEFAULT_KERNEL_LOGS:
        path = under(root, log)
        if not os.path.exists(path):
            continue
        try:
            return _cap(read_text_log(path, cursor if cursor.get("kind") == "file" else {}))
        except OSError as exc:
            tried.append(f"{path}: {exc.strerror}")
    reason = "; ".join(tried) if tried else "no /dev/kmsg and no kernel log file found"
    return {"source": None, "events": [], "cursor": cursor, "error": reason}


def _cap(out: dict[str, Any]) -> dict[str, Any]:
    events = out["events"]
    if len(events) > _MAX_EVENTS:
        out["dropped"] = len(events) - _MAX_EVENTS
        out["events"] = events[-_MAX_EVENTS:]
    return out


# ---------------------------------------------------------------- network, disk, processes


def _state_word(text: Optional[str]) -> Optional[str]:
    """``4: ACTIVE`` → ``ACTIVE`` (sysfs prefixes the numeric value)."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip()


def sample_ib(root: str, devices: list[str]) -> dict[str, Any]:
    """Every port of every (or each listed) RDMA device under /sys/class/infiniband."""
    base = under(root, "/sys/class/infiniband")
    try:
        present = sorted(os.listdir(base))
    except OSError:
        present = []
    ports: list[dict[str, Any]] = []
    for dev in devices or present:
        pdir = os.path.join(base, dev, "ports")
        try:
            names = sorted(os.listdir(pdir), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            ports.append({"device": dev, "port": None, "missing": True})
            continue
        for port in names:
            p = os.path.join(pdir, port)
            ports.append({
                "device": dev,
                "port": port,
                "state": _state_word(read_text(os.path.join(p, "state"))),
                "phys_state": _state_word(read_text(os.path.join(p, "phys_state"))),
                "rate": read_text(os.path.join(p, "rate")),
                "link_layer": read_text(os.path.join(p, "link_layer")),
                "link_downed": read_int(os.path.join(p, "counters", "link_downed")),
                "symbol_error": read_int(os.path.join(p, "counters", "symbol_error")),
            })
    return {"ports": ports}


def sample_net(root: str, interfaces: list[str]) -> dict[str, Optional[str]]:
    """``operstate`` of each configured interface (None: no such interface)."""
    return {i: read_text(under(root, f"/sys/class/net/{i}/operstate")) for i in interfaces}


def sample_disk(root: str, paths: list[str]) -> dict[str, dict[str, Any]]:
    """Total and free (for unprivileged users) bytes of each path's filesystem."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            st = os.statvfs(under(root, path))
        except OSError as exc:
            out[path] = {"error": exc.strerror or str(exc)}
            continue
        out[path] = {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    return out


def sample_processes(root: str, pattern: Optional[str]) -> dict[str, Any]:
    """PIDs whose command line matches ``pattern`` (this probe and its parents excluded)."""
    if not pattern:
        return {"error": "no job.process_match"}
    proc = under(root, "/proc")
    try:
        entries = os.listdir(proc)
    except OSError as exc:
        return {"error": f"{proc}: {exc.strerror}"}
    regex = re.compile(pattern)
    mine = {os.getpid(), os.getppid()}
    pids = []
    for entry in entries:
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", errors="replace")
        except OSError:  # exited while we looked
            continue
        if cmdline and regex.search(cmdline):
            pids.append(int(entry))
    return {"pids": sorted(pids)}


# ---------------------------------------------------------------- the probe


def collect(request: dict[str, Any]) -> dict[str, Any]:
    """One health sample of this machine (see the module docstring for keys)."""
    start = time.monotonic()
    root = str(request.get("root") or "/")
    checks = set(request.get("checks") or ALL)
    boot_id = read_text(under(root, "/proc/sys/kernel/random/boot_id"))
    doc: dict[str, Any] = {"boot_id": boot_id, "root": root, "time": time.time()}
    if "nvml" in checks:
        doc["nvml"] = sample_nvml()
    if "kernel_log" in checks:
        doc["kernel_log"] = sample_kernel_log(root, request, boot_id)
    if "ib" in checks:
        doc["ib"] = sample_ib(root, list(request.get("ib_devices") or []))
    if "net" in checks:
        doc["net"] = sample_net(root, list(request.get("interfaces") or []))
    if "disk" in checks:
        doc["disk"] = sample_disk(root, list(request.get("disk_paths") or ["/"]))
    if "process" in checks:
        doc["process"] = sample_processes(root, request.get("process_match"))
    doc["seconds"] = round(time.monotonic() - start, 4)
    return doc


if __name__ == "__main__":
    serve(collect)
