"""The health verdict: probe samples + the previous sample + thresholds → checks.

Pure functions on typed data (no I/O, no clock): ``evaluate`` turns one node's
probe document (``brctl.diagnostics.health_probe``) into ``Check``s, each
ok / warn / fail / unknown / skip with a one-line message; ``apply_process_rule`` decides
training-process liveness across the job's machines; ``merge_sample`` builds the
state kept for the next poll (counters for deltas, the kernel-log cursor, the
evict-class Xids seen during the current boot).

A check that fails with ``evict=True`` is a *confident eviction signal*: a
hardware fault that no retry fixes (GPU missing, uncorrectable ECC, pending
retirement or remap, a driver-requested reset, an Xid of the evict class, an
inactive NVLink, an RDMA port down or flapping, a configured NIC down).
Anything else (heat, throttling, disk, a missing process) is a finding but not
a reason to evict by itself.

``unknown`` is a check that should have looked and could not (NVML unusable on a
machine the inventory declares with GPUs, a kernel log or /proc not readable):
never ``ok``, never an eviction reason, and it makes the run incomplete (exit 3).
``skip`` is only for a check that does not apply (``gpus: 0``, no RDMA devices,
nothing configured).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Optional

from brctl.analysis.health.doc import GpuSample, HealthDocument
from brctl.config.health import CHECKS, HealthSection
from brctl.diagnostics.xid import XidEvent, classify

Status = Literal["ok", "warn", "fail", "skip", "unknown"]
OK: Final = "ok"
WARN: Final = "warn"
FAIL: Final = "fail"
SKIP: Final = "skip"
UNKNOWN: Final = "unknown"
_STATUS: dict[str, Status] = {OK: OK, WARN: WARN, FAIL: FAIL, SKIP: SKIP, UNKNOWN: UNKNOWN}
# A node's status is its worst check's: a failure outranks a check that could not look.
_RANK = {OK: 0, SKIP: 0, WARN: 1, UNKNOWN: 2, FAIL: 3}
_MAX_XIDS = 50  # remembered per node and boot: enough evidence, bounded state
# The checks judged from the NVML sample (the probe's "nvml" part), in report order.
GPU_CHECKS = ("gpu_count", "ecc", "retired_pages", "remapped_rows", "temperature", "throttle",
              "power", "nvlink", "pcie", "recovery_action")


@dataclass(frozen=True)
class Check:
    """One check's outcome on one node; ``evict`` marks a confident eviction signal."""

    name: str
    status: Status
    message: str
    evict: bool = False

    def to_json(self) -> dict[str, object]:
        """The JSON contract: ``{name, status, message}`` (+ ``evict`` when true)."""
        out: dict[str, object] = {"name": self.name, "status": self.status,
                                  "message": self.message}
        if self.evict:
            out["evict"] = True
        return out


def _xid_event(data: Mapping[str, Any]) -> XidEvent:
    """Inverse of ``XidEvent.to_json`` (probe documents and stored samples alike)."""
    return XidEvent(pci=str(data.get("pci", "")), code=int(data.get("code", 0)),
                    message=str(data.get("message", "")), timestamp=data.get("timestamp"),
                    pid=data.get("pid"), process=data.get("process"))


@dataclass(frozen=True)
class Sample:
    """What is kept per node between polls (the state directory)."""

    boot_id: Optional[str] = None
    counters: Mapping[str, int] = field(default_factory=dict)
    xid_cursor: Mapping[str, Any] = field(default_factory=dict)
    xids: tuple[XidEvent, ...] = ()  # this boot's Xids, oldest first

    def to_json(self) -> dict[str, Any]:
        """Serialisable form (stored as JSON)."""
        return {"boot_id": self.boot_id, "counters": dict(self.counters),
                "xid_cursor": dict(self.xid_cursor), "xids": [x.to_json() for x in self.xids]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        """Inverse of ``to_json`` (tolerant: unknown keys ignored)."""
        xids = tuple(_xid_event(x) for x in data.get("xids") or [])
        return cls(boot_id=data.get("boot_id"), counters=dict(data.get("counters") or {}),
                   xid_cursor=dict(data.get("xid_cursor") or {}), xids=xids)


# ---------------------------------------------------------------- counters and deltas


def counters_of(doc: HealthDocument) -> dict[str, int]:
    """Monotonic counters in a probe document, flattened to ``kind:where:counter`` keys."""
    out: dict[str, int] = {}
    for gpu in (doc.get("nvml") or {}).get("gpus") or []:
        where = gpu.get("pci") or f"gpu{gpu.get('index')}"
        for key in ("replay", "recovery", "crc_flit", "crc_data"):
            value = (gpu.get("nvlink") or {}).get(key)
            if isinstance(value, int):
                out[f"nvlink:{where}:{key}"] = value
        replay = gpu.get("pcie_replay")
        if isinstance(replay, int):
            out[f"pcie:{where}:replay"] = replay
    for port in (doc.get("ib") or {}).get("ports") or []:
        for key in ("link_downed", "symbol_error"):
            count = port.get(key)
            if isinstance(count, int):
                out[f"ib:{port['device']}/{port['port']}:{key}"] = count
    return out


def delta(now: Mapping[str, int], before: Optional[Sample], boot_id: Optional[str],
          key: str) -> Optional[int]:
    """Increase of counter ``key`` since the previous sample; None without a usable baseline.

    A reboot (new boot_id) or a counter that went down (driver reload, reset) has
    no baseline: the new value becomes the baseline, never a false alarm.
    """
    if before is None or before.boot_id != boot_id or key not in now:
        return None
    old = before.counters.get(key)
    if old is None or now[key] < old:
        return None
    return now[key] - old


def merge_sample(doc: HealthDocument, before: Optional[Sample]) -> Sample:
    """The state to keep after this poll: new counters, new cursor, this boot's Xids."""
    boot_id = doc.get("boot_id")
    kept = before.xids if before is not None and before.boot_id == boot_id else ()
    log = doc.get("kernel_log") or {}
    new = tuple(_xid_event(e) for e in log.get("events") or [])
    cursor = log.get("cursor") if "kernel_log" in doc else (before.xid_cursor if before else {})
    return Sample(boot_id=boot_id, counters=counters_of(doc), xid_cursor=dict(cursor or {}),
                  xids=(kept + new)[-_MAX_XIDS:])


# ---------------------------------------------------------------- per-GPU checks


def _gpu_label(gpu: GpuSample) -> str:
    pci = gpu.get("pci")
    return f"GPU{gpu.get('index')} ({pci})" if pci else f"GPU{gpu.get('index')}"


def _worst(checks: Iterable[tuple[str, str, bool]], name: str, ok_message: str) -> Check:
    """Fold per-GPU findings ``(status, text, evict)`` into one check line, worst first."""
    found = sorted(checks, key=lambda c: -_RANK[c[0]])
    if not found:
        return Check(name, OK, ok_message)
    status = _STATUS[found[0][0]]
    return Check(name, status, "; ".join(t for _, t, _ in found),
                 evict=status == FAIL and any(e for s, _, e in found if s == FAIL))


def _unsupported(gpus: Sequence[GpuSample], key: str) -> bool:
    return all(key in (g.get("errors") or {}) for g in gpus)


def check_gpu_count(gpus: Sequence[GpuSample], expected: int) -> Check:
    """Visible GPUs vs ``gpus`` in the inventory; a GPU NVML cannot open counts as missing."""
    usable = [g for g in gpus if "error" not in g]
    broken = [f"GPU{g.get('index')}: {g['error']}" for g in gpus if "error" in g]
    if len(usable) < expected:
        detail = f" ({'; '.join(broken)})" if broken else ""
        return Check("gpu_count", FAIL, f"{len(usable)} of {expected} GPUs usable{detail}",
                     evict=True)
    if len(usable) > expected:
        return Check("gpu_count", WARN, f"{len(usable)} GPUs, inventory says {expected}")
    return Check("gpu_count", OK, f"{expected} GPUs")


def check_ecc(gpus: Sequence[GpuSample], cfg: HealthSection) -> Check:
    """Volatile uncorrectable ECC fails (memory corrupt now); aggregate per config."""
    if _unsupported(gpus, "ecc"):
        return Check("ecc", SKIP, "ECC not supported or disabled on these GPUs")
    found = []
    for g in gpus:
        vol, agg = g.get("ecc_volatile_uncorrected"), g.get("ecc_aggregate_uncorrected")
        if vol:
            found.append((FAIL, f"{_gpu_label(g)}: {vol} volatile uncorrectable ECC errors", True))
        elif agg and cfg.ecc_aggregate_status != OK:
            text = f"{_gpu_label(g)}: {agg} uncorrectable ECC errors in its lifetime"
            found.append((cfg.ecc_aggregate_status, text, False))
    return _worst(found, "ecc", "no uncorrectable ECC errors")


def check_retired_pages(gpus: Sequence[GpuSample]) -> Check:
    """Pages pending retirement fail (a reset is needed); retired DBE pages are history."""
    if _unsupported(gpus, "retired_pages"):
        return Check("retired_pages", SKIP, "page retirement not used on these GPUs "
                     "(A100 and later remap rows instead)")
    found = []
    for g in gpus:
        if g.get("retired_pages_pending"):
            found.append((FAIL, f"{_gpu_label(g)}: page retirement pending (GPU reset needed)",
                          True))
        elif g.get("retired_pages_dbe"):
            found.append((WARN, f"{_gpu_label(g)}: {g['retired_pages_dbe']} pages retired "
                          "after double-bit errors", False))
    return _worst(found, "retired_pages", "no pages pending retirement")


def check_remapped_rows(gpus: Sequence[GpuSample]) -> Check:
    """Remapping failure (replace the GPU) or pending (reset it) fail."""
    if _unsupported(gpus, "remapped_rows"):
        return Check("remapped_rows", SKIP, "row remapping not supported on these GPUs")
    found = []
    for g in gpus:
        rows = g.get("remapped_rows")
        if not rows:
            continue
        if rows.get("failure"):
            found.append((FAIL, f"{_gpu_label(g)}: row remapping failed (replace the GPU)", True))
        elif rows.get("pending"):
            found.append((FAIL, f"{_gpu_label(g)}: row remap pending (GPU reset needed)", True))
        elif rows.get("uncorrectable"):
            found.append((WARN, f"{_gpu_label(g)}: {rows['uncorrectable']} rows remapped after "
                          "uncorrectable errors", False))
    return _worst(found, "remapped_rows", "no pending or failed row remaps")


def check_temperature(gpus: Sequence[GpuSample], cfg: HealthSection) -> Check:
    """At the GPU's slowdown threshold: fail; within the margin below it: warn."""
    found = []
    seen = [t for t in (g.get("temperature") for g in gpus) if isinstance(t, int)]
    if not seen:
        return Check("temperature", SKIP, "no temperature readings")
    for g in gpus:
        temp, slow, shut = g.get("temperature"), g.get("temperature_slowdown"), \
            g.get("temperature_shutdown")
        if not isinstance(temp, int):
            continue
        if isinstance(shut, int) and temp >= shut:
            found.append((FAIL, f"{_gpu_label(g)}: {temp} C at shutdown threshold {shut} C", False))
        elif isinstance(slow, int) and temp >= slow:
            found.append((FAIL, f"{_gpu_label(g)}: {temp} C at slowdown threshold {slow} C", False))
        elif isinstance(slow, int) and temp >= slow - cfg.temperature_margin_c:
            found.append((WARN, f"{_gpu_label(g)}: {temp} C, slowdown at {slow} C", False))
    return _worst(found, "temperature", f"max {max(seen)} C")


# Clock event reason bits (nvml.h nvmlClocksEventReason*) that mean the hardware slowed the GPU.
THROTTLE_BITS = {
    0x8: "HW slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
    0x20: "SW thermal slowdown",
}


def check_throttle(gpus: Sequence[GpuSample], cfg: HealthSection) -> Check:
    """Active hardware/thermal clock slowdowns (power capping under load is normal, ignored)."""
    if _unsupported(gpus, "throttle"):
        return Check("throttle", SKIP, "clock event reasons not supported")
    found = []
    for g in gpus:
        bits = g.get("throttle_reasons")
        if not isinstance(bits, int):
            continue
        names = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
        if names:
            found.append((cfg.throttle_status, f"{_gpu_label(g)}: {', '.join(names)}", False))
    return _worst(found, "throttle", "no hardware or thermal slowdown")


def check_power(gpus: Sequence[GpuSample], cfg: HealthSection) -> Check:
    """Drawing more than the enforced power limit (plus a margin) warns."""
    readings = [(g, mw) for g in gpus if isinstance(mw := g.get("power_mw"), int)]
    if not readings:
        return Check("power", SKIP, "no power readings")
    found = []
    for g, mw in readings:
        limit = g.get("power_limit_mw")
        if isinstance(limit, int) and limit > 0 and \
                mw > limit * (1 + cfg.power_over_limit_percent / 100):
            found.append((WARN, f"{_gpu_label(g)}: {mw / 1000:.0f} W over its "
                          f"{limit / 1000:.0f} W limit", False))
    total = sum(mw for _, mw in readings) / 1000
    return _worst(found, "power", f"{total:.0f} W total, within limits")


def check_nvlink(gpus: Sequence[GpuSample], now: Mapping[str, int],
                 before: Optional[Sample], boot_id: Optional[str], cfg: HealthSection) -> Check:
    """Inactive links (fewer than the node's best GPU) fail; error-counter deltas warn."""
    linked = [(g, link) for g in gpus if (link := g.get("nvlink"))]
    if not linked:
        return Check("nvlink", SKIP, "no NVLink on these GPUs")
    best = max(link["active"] for _, link in linked)
    found = []
    baseline = False
    for g, link in linked:
        if link["active"] < best:
            found.append((FAIL, f"{_gpu_label(g)}: {link['active']} of {best} NVLinks "
                          "active", True))
        where = g.get("pci") or f"gpu{g.get('index')}"
        parts = []
        total = 0
        for key in ("replay", "recovery", "crc_flit", "crc_data"):
            d = delta(now, before, boot_id, f"nvlink:{where}:{key}")
            baseline = baseline or d is not None
            if d:
                parts.append(f"+{d} {key}")
                total += d
        if parts and total >= max(1, cfg.nvlink_errors_warn):
            found.append((WARN, f"{_gpu_label(g)}: NVLink errors {' '.join(parts)}", False))
    note = "" if baseline else " (error baseline recorded)"
    return _worst(found, "nvlink", f"{best} links active per GPU{note}")


def check_pcie(gpus: Sequence[GpuSample], now: Mapping[str, int],
               before: Optional[Sample], boot_id: Optional[str], cfg: HealthSection) -> Check:
    """PCIe replay counter deltas above the threshold warn (a marginal link)."""
    if _unsupported(gpus, "pcie"):
        return Check("pcie", SKIP, "PCIe replay counter not supported")
    found = []
    baseline = False
    for g in gpus:
        where = g.get("pci") or f"gpu{g.get('index')}"
        d = delta(now, before, boot_id, f"pcie:{where}:replay")
        baseline = baseline or d is not None
        if d and d >= max(1, cfg.pcie_replay_warn):
            found.append((WARN, f"{_gpu_label(g)}: +{d} PCIe replays", False))
    return _worst(found, "pcie", "PCIe replays normal" if baseline
                  else "PCIe replay baseline recorded")


# NVML_GPU_RECOVERY_ACTION_* (driver >= 570): what the driver says the GPU needs.
RECOVERY_ACTIONS = {
    1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer traffic", 4: "drain and reset",
    5: "recover the IMEX domain", 6: "PCIe bus reset", 7: "system reboot",
}


def check_recovery_action(gpus: Sequence[GpuSample]) -> Check:
    """Any recovery action the driver asks for fails: the GPU cannot be trusted until done."""
    known = [(g, act) for g in gpus if isinstance(act := g.get("recovery_action"), int)]
    if not known:
        return Check("recovery_action", SKIP, "recovery action not reported (driver < 570)")
    found = [(FAIL, f"{_gpu_label(g)}: driver requests "
              f"{RECOVERY_ACTIONS.get(act, str(act))}", True)
             for g, act in known if act]
    return _worst(found, "recovery_action", "no recovery action pending")


# ---------------------------------------------------------------- node-level checks


def check_xid(doc: HealthDocument, sample: Sample) -> Check:
    """Evict-class Xids this boot fail; unknown ones warn; application ones are noted."""
    log = doc.get("kernel_log") or {}
    if log.get("error") and not sample.xids:
        return Check("xid", UNKNOWN, f"kernel log not readable: {log['error']}")
    by_kind: dict[str, list[XidEvent]] = {"evict": [], "unknown": [], "application": []}
    for event in sample.xids:
        by_kind[classify(event.code).kind].append(event)

    def describe(events: list[XidEvent]) -> str:
        parts: dict[tuple[int, str], int] = {}
        for e in events:
            parts[(e.code, e.pci)] = parts.get((e.code, e.pci), 0) + 1
        return ", ".join(f"Xid {code} on {pci} ({classify(code).name})" + (f" x{n}" if n > 1
                         else "") for (code, pci), n in parts.items())

    if by_kind["evict"]:
        return Check("xid", FAIL, describe(by_kind["evict"]) + " this boot", evict=True)
    if by_kind["unknown"]:
        return Check("xid", WARN, describe(by_kind["unknown"]) + " this boot")
    if by_kind["application"]:
        return Check("xid", OK, "only application Xids (not a machine fault): "
                     + describe(by_kind["application"]))
    return Check("xid", OK, f"no Xid this boot ({log.get('source') or 'kernel log'})")


def _rate_gbps(rate: Optional[str]) -> Optional[float]:
    try:
        return float((rate or "").split()[0])
    except (ValueError, IndexError):
        return None


def check_ib(doc: HealthDocument, now: Mapping[str, int], before: Optional[Sample],
             boot_id: Optional[str], cfg: HealthSection) -> Check:
    """Every RDMA port ACTIVE and LinkUp, at rate, with no link_downed/symbol_error surge."""
    ports = (doc.get("ib") or {}).get("ports") or []
    if not ports:
        return Check("ib", SKIP, "no InfiniBand/RoCE devices")
    found = []
    for p in ports:
        where = f"{p['device']}/{p['port']}" if p.get("port") else p["device"]
        if p.get("missing"):
            found.append((FAIL, f"{where}: device missing", True))
            continue
        if p.get("state") != "ACTIVE":
            found.append((FAIL, f"{where}: {p.get('state')} ({p.get('phys_state')})", True))
            continue
        downed = delta(now, before, boot_id, f"ib:{where}:link_downed")
        if downed and downed >= max(1, cfg.ib_link_downed_fail):
            found.append((FAIL, f"{where}: link went down {downed}x since the last sample", True))
        symbols = delta(now, before, boot_id, f"ib:{where}:symbol_error")
        if symbols and symbols >= max(1, cfg.ib_symbol_error_warn):
            found.append((WARN, f"{where}: +{symbols} symbol errors", False))
        rate = _rate_gbps(p.get("rate"))
        if cfg.ib_min_rate_gbps and rate is not None and rate < cfg.ib_min_rate_gbps:
            found.append((WARN, f"{where}: {p.get('rate')}, expected >= "
                          f"{cfg.ib_min_rate_gbps:g} Gb/sec", False))
    return _worst(found, "ib", f"{len(ports)} ports active")


def check_net(doc: HealthDocument, cfg: HealthSection) -> Check:
    """Each configured interface's operstate is ``up``; one the probe did not report
    is unknown (nothing seen is never ok, nor skipped)."""
    states = doc.get("net") or {}
    if not states and not cfg.interfaces:
        return Check("net", SKIP, "no interfaces configured (health.interfaces)")
    if not states:
        return Check("net", UNKNOWN, f"the probe reported no interface state "
                                     f"({', '.join(cfg.interfaces)} configured)")
    bad = [(i, s) for i, s in states.items() if s != "up"]
    found = [(FAIL, f"{i}: {'no such interface' if s is None else s}", True) for i, s in bad]
    found += [(UNKNOWN, f"{i}: not reported", False) for i in cfg.interfaces if i not in states]
    return _worst(found, "net", f"{', '.join(states)} up")


def check_disk(doc: HealthDocument, cfg: HealthSection) -> Check:
    """Free space of each configured path against the warn/fail percentages."""
    disks = doc.get("disk") or {}
    if not disks and not cfg.disk_paths:
        return Check("disk", SKIP, "no disk paths configured")
    if not disks:  # configured, and the probe sent nothing back: not seen, not skipped
        return Check("disk", UNKNOWN, f"the probe reported no free space "
                                      f"({', '.join(cfg.disk_paths)} configured)")
    found: list[tuple[str, str, bool]] = [(UNKNOWN, f"{p}: not reported", False)
                                          for p in cfg.disk_paths if p not in disks]
    free = []
    for path, d in disks.items():
        if "error" in d:
            found.append((FAIL, f"{path}: {d['error']}", False))
            continue
        pct = 100.0 * d["free"] / d["total"] if d["total"] else 0.0
        text = f"{path}: {pct:.1f}% free ({d['free'] / 2**30:.1f} GiB)"
        free.append(f"{path} {pct:.0f}%")
        if pct < cfg.disk_fail_free_percent:
            found.append((FAIL, text, False))
        elif pct < cfg.disk_warn_free_percent:
            found.append((WARN, text, False))
    return _worst(found, "disk", "free: " + ", ".join(free))


# ---------------------------------------------------------------- one node


def evaluate(doc: HealthDocument, before: Optional[Sample], cfg: HealthSection,
             expected_gpus: int) -> tuple[list[Check], Sample]:
    """All enabled checks of one node's probe document, and the sample to keep.

    The ``process`` check is left as a placeholder: it needs every node
    (``apply_process_rule``).

    Args:
        doc: the probe's document.
        before: the previous sample of this node (None on the first poll).
        cfg: the inventory's health section.
        expected_gpus: the node's ``gpus`` in the inventory.

    Returns:
        The checks in ``CHECKS`` order and the new sample.
    """
    sample = merge_sample(doc, before)
    now = sample.counters
    boot_id = doc.get("boot_id")
    enabled = set(cfg.checks)
    out: dict[str, Check] = {}
    nvml = doc.get("nvml") or {}
    if expected_gpus == 0:
        for name in GPU_CHECKS:
            out[name] = Check(name, SKIP, "no GPUs on this machine (gpus: 0)")
    elif nvml.get("status") != "ok":
        # NVML unusable where the inventory says there are GPUs: nothing was seen, so
        # nothing is ok (driver not loaded, library or module missing: unknown, exit 3);
        # an NVML that loads and then errors is a finding about the machine.
        status: Status = FAIL if nvml.get("status") == "error" else UNKNOWN
        reason = str(nvml.get("reason", "NVML not sampled"))
        for name in GPU_CHECKS:
            out[name] = Check(name, status, reason)
    else:
        gpus = nvml.get("gpus") or []
        usable = [g for g in gpus if "error" not in g]
        out["gpu_count"] = check_gpu_count(gpus, expected_gpus)
        out["ecc"] = check_ecc(usable, cfg)
        out["retired_pages"] = check_retired_pages(usable)
        out["remapped_rows"] = check_remapped_rows(usable)
        out["temperature"] = check_temperature(usable, cfg)
        out["throttle"] = check_throttle(usable, cfg)
        out["power"] = check_power(usable, cfg)
        out["nvlink"] = check_nvlink(usable, now, before, boot_id, cfg)
        out["pcie"] = check_pcie(usable, now, before, boot_id, cfg)
        out["recovery_action"] = check_recovery_action(usable)
    out["xid"] = check_xid(doc, sample)
    out["ib"] = check_ib(doc, now, before, boot_id, cfg)
    out["net"] = check_net(doc, cfg)
    out["disk"] = check_disk(doc, cfg)
    out["process"] = Check("process", SKIP, "pending")
    return [out[name] for name in CHECKS if name in enabled], sample


def process_pids(doc: HealthDocument) -> Optional[list[int]]:
    """The training PIDs the probe found, or None when it could not look."""
    proc = doc.get("process") or {}
    pids = proc.get("pids")
    return list(pids) if isinstance(pids, list) else None


def apply_process_rule(pids: Mapping[str, Optional[list[int]]], errors: Mapping[str, str],
                       job_nodes: Iterable[str]) -> dict[str, Check]:
    """Training-process liveness per node, judged against the other job machines.

    A job machine with no training process fails when the job runs elsewhere (its
    ranks died here); when no job machine has one, the job is simply not running:
    a warning, not a machine fault. Machines outside the job are skipped.

    Args:
        pids: node → matching PIDs (None: the probe could not look).
        errors: node → why it could not look.
        job_nodes: the job's machines.
    """
    job = set(job_nodes)
    running = [n for n in pids if n in job and pids[n]]
    out: dict[str, Check] = {}
    for node, found in pids.items():
        if node not in job:
            out[node] = Check("process", SKIP, "not a job machine")
        elif found is None:
            out[node] = Check("process", UNKNOWN, errors.get(node, "process list not read"))
        elif found:
            out[node] = Check("process", OK, f"{len(found)} training processes")
        elif running:
            out[node] = Check("process", FAIL, f"no training process here; alive on "
                              f"{len(running)} other job machines")
        else:
            out[node] = Check("process", WARN, "no training process on any job machine "
                              "(job not running?)")
    return out


def node_status(checks: Sequence[Check]) -> Status:
    """fail if any check failed, else unknown if one could not look, else warn, else ok."""
    worst = max((_RANK[c.status] for c in checks), default=0)
    by_rank: dict[int, Status] = {0: OK, 1: WARN, 2: UNKNOWN, 3: FAIL}
    return by_rank[worst]


def eviction_reason(checks: Sequence[Check]) -> Optional[str]:
    """The confident eviction signal among ``checks`` (joined), or None."""
    reasons = [f"{c.name}: {c.message}" for c in checks if c.status == FAIL and c.evict]
    return "; ".join(reasons) or None
