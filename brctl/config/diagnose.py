"""``diagnose:``: settings of ``brctl diagnose`` (stage levels and per-stage timeouts).

Every key has a default, so ``diagnose: {}`` works. A playbook's stage may override
the level and timeout of a stage; these are the values used when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from brctl.core.schema import at_least_one, positive
from brctl.core.schema import field as sfield


def _ratio(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"got {value!r}, expected a fraction in (0, 1]")
    return value


@dataclass(frozen=True)
class DiagnoseSection:
    """Settings of brctl diagnose."""

    # dcgmi diag -r LEVEL: 1 quick (s), 2 medium (~2 min), 3 long (~15 min), 4 (hours), eud.
    dcgm_level: str = "2"
    dcgm_timeout: float = sfield(900.0, check=positive)
    alltoall_timeout: float = sfield(120.0, check=positive)
    allgather_timeout: float = sfield(120.0, check=positive)
    # The collective stages' timeouts count from the moment every worker is ready
    # (torch imported, all ranks at the rendezvous); getting there has its own,
    # generous limit: importing torch takes seconds, minutes on an overloaded host.
    startup_timeout: float = sfield(300.0, check=positive)
    # Bytes each rank sends to each peer per all-to-all iteration: big enough to measure
    # bandwidth on GPUs, small enough for gloo on CPU.
    alltoall_bytes: int = sfield(1 << 20, check=at_least_one)
    allgather_bytes: int = sfield(1 << 20, check=at_least_one)
    iterations: int = sfield(5, check=at_least_one)
    # A machine is slow when its bus bandwidth is below this fraction of the fleet median.
    # On GPUs (NCCL) 0.5 flags a bad NVLink/PCIe link; gloo on CPUs is noisy, so only a
    # gross slowdown counts there.
    bandwidth_ratio: float = sfield(0.5, check=_ratio)
    cpu_bandwidth_ratio: float = sfield(0.1, check=_ratio)
    # Tail of each job log read as evidence, and the evidence probe's timeout.
    log_tail_lines: int = sfield(400, check=at_least_one)
    collect_timeout: float = sfield(30.0, check=positive)
    # Evidence of a repeat: the same symptom within this many seconds of the last verdict.
    repeat_window: float = sfield(86400.0, check=positive)
    # Network interface for gloo; None: the loopback "lo" for 127.x addresses, else gloo's pick.
    gloo_ifname: Optional[str] = None
