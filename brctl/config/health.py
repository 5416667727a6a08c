"""``health:``: which checks ``brctl health`` runs, where it looks, and its thresholds.

Every key is optional; the defaults suit an 8-GPU HGX machine with InfiniBand.
Documented in ``inventory.example.yaml`` and ``brctl-inventory(5)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brctl.core.schema import field, non_negative, positive

# Every check brctl health knows, in report order (the names in JSON and in ``checks:``).
CHECKS = (
    "gpu_count", "xid", "ecc", "retired_pages", "remapped_rows", "temperature", "throttle",
    "power", "nvlink", "pcie", "recovery_action", "ib", "net", "disk", "process",
)


def _check_names(value: list[str]) -> list[str]:
    unknown = [v for v in value if v not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}; known: {', '.join(CHECKS)}")
    return value


def _percent(value: float) -> float:
    if not 0 <= value <= 100:
        raise ValueError(f"got {value!r}, expected a percentage between 0 and 100")
    return value


def _absolute(value: list[str]) -> list[str]:
    for path in value:
        if not path.startswith("/"):
            raise ValueError(f"{path!r} is not an absolute path")
    return value


@dataclass(frozen=True)
class HealthSection:
    """Settings of ``brctl health`` (and of the daemon's health polls)."""

    # Which checks run (default: all). Leave one out to silence it fleet-wide.
    checks: list[str] = field(factory=lambda: list(CHECKS), check=_check_names)
    # Where the probe reads sysfs, /proc, /dev/kmsg and logs: "/" on a machine; a host
    # mount such as /host inside a container. "{node}" is replaced by the machine's name.
    root: str = "/"
    # Text kernel logs tried when /dev/kmsg is not readable (non-root ssh user).
    kernel_logs: list[str] = field(factory=lambda: ["/var/log/kern.log", "/var/log/messages"],
                                   check=_absolute)
    # RDMA devices that must be present (default: every device found is checked).
    ib_devices: list[str] = field(factory=list)
    # A port slower than this (e.g. 4X HDR degraded to 1X) warns; 0 turns it off.
    ib_min_rate_gbps: float = 0.0
    # link_downed increments between two samples that fail the port: one flap resets
    # every NCCL connection over it (NVRx's NicHealthCheck uses the same signal).
    ib_link_downed_fail: int = field(1, check=non_negative)
    # symbol_error increments between samples that warn: a marginal cable or transceiver.
    ib_symbol_error_warn: int = field(100, check=non_negative)
    # Ethernet interfaces (RoCE, storage, management) whose operstate must be "up".
    interfaces: list[str] = field(factory=list)
    # Filesystems whose free space is checked (checkpoint and log directories).
    disk_paths: list[str] = field(factory=lambda: ["/"], check=_absolute)
    disk_warn_free_percent: float = field(10.0, check=_percent)
    # Below this a checkpoint write fails mid-save: the machine must not hold a shard.
    disk_fail_free_percent: float = field(3.0, check=_percent)
    # Warn this many degrees below the GPU's own slowdown threshold; at it, fail.
    temperature_margin_c: int = field(5, check=non_negative)
    # Hardware clock slowdown (HW slowdown, HW thermal, power brake) makes the GPU a
    # straggler that slows the whole synchronous job: warn by default, fail if set.
    throttle_status: Literal["warn", "fail"] = "warn"
    # Drawing more than the enforced limit by this much warns (a sensor or VR problem).
    power_over_limit_percent: float = field(5.0, check=_percent)
    # NVLink replay+recovery+CRC errors between two samples that warn (the link retrains
    # but NCCL throughput drops); inactive links on one GPU fail.
    nvlink_errors_warn: int = field(1, check=non_negative)
    # PCIe replays between two samples that warn: a marginal riser or slot.
    pcie_replay_warn: int = field(100, check=non_negative)
    # Aggregate (lifetime) uncorrectable ECC with no volatile error: history, not a fault now.
    ecc_aggregate_status: Literal["ok", "warn", "fail"] = "warn"
    # Seconds one probe may take on a node (multiplied by $BRCTL_TIMEOUT_SCALE).
    timeout: float = field(30.0, check=positive)
