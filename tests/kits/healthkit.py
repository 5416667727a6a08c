"""Test helpers for brctl health: fixture machine trees and the fake pynvml.

A "root" tree holds what the health probe reads under its ``root``: sysfs
(``sys/class/infiniband``, ``sys/class/net``), ``proc/sys/kernel/random/boot_id``,
``dev/kmsg`` (a saved dump in /dev/kmsg's record format) and ``var/log/kern.log``.
Used by unit tests (local nodes) and integration tests (sshd nodes) alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "fakenvml"

ACTIVE_PORT = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
               "link_layer": "InfiniBand", "link_downed": 0, "symbol_error": 0}
DOWN_PORT = {**ACTIVE_PORT, "state": "1: DOWN", "phys_state": "3: Disabled",
             "rate": "10 Gb/sec (4X SDR)"}


def make_root(
    path: Path,
    *,
    boot_id: str = "5f1c1e7a-0000-4000-8000-000000000001",
    ib: Optional[Mapping[str, Mapping[str, Mapping[str, Any]]]] = None,
    net: Optional[Mapping[str, str]] = None,
    kmsg: Optional[Sequence[str]] = (),
    kern_log: Optional[str] = None,
    proc_link: bool = False,
) -> Path:
    """Build a fixture machine tree; ``ib`` is {device: {port: {file: value}}}.

    A machine has a kernel log: an empty ``dev/kmsg`` unless ``kmsg`` or ``kern_log``
    is given (``kmsg=None`` and no ``kern_log``: none, the xid check is unknown).
    """
    path.mkdir(parents=True, exist_ok=True)
    if proc_link:  # processes and boot_id are the machine's own; only the rest is a fixture
        (path / "proc").symlink_to("/proc")
    else:
        _write(path / "proc/sys/kernel/random/boot_id", boot_id + "\n")
    for dev, ports in (ib or {}).items():
        for port, values in ports.items():
            set_port(path, dev, port, values)
    for iface, state in (net or {}).items():
        _write(path / f"sys/class/net/{iface}/operstate", state + "\n")
    if kmsg is not None and (kmsg or kern_log is None):
        _write(path / "dev/kmsg", "".join(line + "\n" for line in kmsg))
    if kern_log is not None:
        _write(path / "var/log/kern.log", kern_log)
    return path


def set_port(root: Path, dev: str, port: str, values: Mapping[str, Any]) -> None:
    """Write one RDMA port's sysfs files (state, rate, counters/…)."""
    base = root / f"sys/class/infiniband/{dev}/ports/{port}"
    for key, value in values.items():
        target = base / "counters" / key if key in ("link_downed", "symbol_error") else base / key
        _write(target, f"{value}\n")


def kmsg_record(seq: int, usec: int, message: str, level: int = 3) -> str:
    """One /dev/kmsg record: ``level,seq,usec,flags;message``."""
    return f"{level},{seq},{usec},-;{message}"


def fake_nvml(directory: Path, gpus: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, str]:
    """Script the fake pynvml; returns the node ``env`` that puts it on PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "nvml.json"
    config.write_text(json.dumps({"gpus": [dict(g) for g in gpus], **extra}))
    return {"PYTHONPATH": str(FAKE_NVML_DIR), "FAKE_NVML": str(config)}


def healthy_gpus(n: int) -> list[dict[str, Any]]:
    """``n`` healthy scripted GPUs with distinct PCI addresses."""
    return [{"pci": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "uuid": f"GPU-{i}"} for i in range(n)]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
