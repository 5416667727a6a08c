"""The health verdict: thresholds, deltas, Xid stickiness, process rule, eviction signals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from brctl.analysis.health.checks import (
    GPU_CHECKS,
    Check,
    Sample,
    apply_process_rule,
    evaluate,
    eviction_reason,
    node_status,
)
from brctl.config.health import HealthSection

CFG = HealthSection()


def gpu(i: int, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "index": i, "pci": f"00000000:{i:02x}:00.0", "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_uncorrected": 0, "retired_pages_pending": None, "retired_pages_dbe": None,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False,
                          "failure": False},
        "temperature": 40, "temperature_slowdown": 87, "temperature_shutdown": 92,
        "throttle_reasons": 0, "power_mw": 300000, "power_limit_mw": 700000,
        "nvlink": {"active": 18, "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
        "pcie_replay": 0, "recovery_action": 0,
        "errors": {"retired_pages": "Not Supported"},
    }
    base.update(kw)
    return base


def doc(gpus: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "boot_id": "b1",
        "nvml": {"status": "ok", "count": len(gpus or []), "gpus": gpus if gpus is not None
                 else [gpu(i) for i in range(8)]},
        "kernel_log": {"source": "/dev/kmsg", "events": [], "cursor": {"kind": "kmsg", "seq": 9}},
        "ib": {"ports": [{"device": "mlx5_0", "port": "1", "state": "ACTIVE",
                          "phys_state": "LinkUp", "rate": "400 Gb/sec (4X NDR)",
                          "link_downed": 0, "symbol_error": 0}]},
        "net": {}, "disk": {"/": {"total": 100, "free": 50}},
    }
    d.update(kw)
    return d


def checks_of(d: dict[str, Any], before: Sample | None = None, cfg: HealthSection = CFG,
              gpus: int = 8) -> dict[str, Any]:
    checks, _ = evaluate(d, before, cfg, gpus)
    return {c.name: c for c in checks}


def test_healthy_node_is_ok_and_has_no_eviction() -> None:
    checks, sample = evaluate(doc(), None, CFG, 8)
    assert node_status(checks) == "ok"
    assert eviction_reason(checks) is None
    by = {c.name: c for c in checks}
    assert by["gpu_count"].message == "8 GPUs"
    assert by["retired_pages"].status == "skip"  # A100+: remapping replaces retirement
    assert sample.xid_cursor == {"kind": "kmsg", "seq": 9}


@pytest.mark.parametrize("fault,check,status,evict", [
    ({"ecc_volatile_uncorrected": 2}, "ecc", "fail", True),
    ({"ecc_aggregate_uncorrected": 2}, "ecc", "warn", False),
    ({"retired_pages_pending": True, "errors": {}}, "retired_pages", "fail", True),
    ({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True,
                        "failure": False}}, "remapped_rows", "fail", True),
    ({"remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False,
                        "failure": True}}, "remapped_rows", "fail", True),
    ({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": False,
                        "failure": False}}, "remapped_rows", "warn", False),
    ({"temperature": 84}, "temperature", "warn", False),
    ({"temperature": 87}, "temperature", "fail", False),
    ({"throttle_reasons": 0x80}, "throttle", "warn", False),
    ({"throttle_reasons": 0x4 | 0x1}, "throttle", "ok", False),  # power cap and idle: normal
    ({"power_mw": 800000}, "power", "warn", False),
    ({"nvlink": {"active": 16, "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}},
     "nvlink", "fail", True),
    ({"recovery_action": 2}, "recovery_action", "fail", True),
])
def test_gpu_faults(fault: dict[str, Any], check: str, status: str, evict: bool) -> None:
    gpus = [gpu(i) for i in range(8)]
    gpus[3] = gpu(3, **fault)
    c = checks_of(doc(gpus))[check]
    assert (c.status, c.evict) == (status, evict), c
    if status != "ok":
        assert c.message.startswith("GPU3 (00000000:03:00.0)")


def test_missing_and_lost_gpus() -> None:
    c = checks_of(doc([gpu(i) for i in range(7)]))["gpu_count"]
    assert (c.status, c.evict, c.message) == ("fail", True, "7 of 8 GPUs usable")
    lost = [gpu(i) for i in range(7)] + [{"index": 7, "error": "GPU is lost"}]
    c = checks_of(doc(lost))["gpu_count"]
    assert c.message == "7 of 8 GPUs usable (GPU7: GPU is lost)"


@pytest.mark.parametrize("reason", [
    "NVML library missing: no NVIDIA driver (libnvidia-ml not found)",
    "NVIDIA driver not loaded (nvmlInit failed)",
    "pynvml module missing on the node (pip install nvidia-ml-py)"])
def test_gpus_nvml_cannot_see_are_unknown_never_ok(reason: str) -> None:
    d = doc(nvml={"status": "unavailable", "reason": reason})
    checks, _ = evaluate(d, None, CFG, 8)
    gpu_checks = [c for c in checks if c.name in GPU_CHECKS]
    assert len(gpu_checks) == len(GPU_CHECKS)
    assert {(c.status, c.message, c.evict) for c in gpu_checks} == {("unknown", reason, False)}
    assert node_status(checks) == "unknown"
    assert eviction_reason(checks) is None  # could not look: never a reason to evict


def test_cpu_only_machine_skips_gpu_checks() -> None:
    checks, _ = evaluate(doc(nvml=None), None, CFG, 0)
    gpu_checks = [c for c in checks if c.name in GPU_CHECKS]
    assert {(c.status, c.message) for c in gpu_checks} == {
        ("skip", "no GPUs on this machine (gpus: 0)")}
    assert node_status(checks) == "ok"


def test_a_failure_outranks_unknown() -> None:
    fail = Check("ecc", "fail", "x", evict=True)
    assert node_status([Check("xid", "unknown", "y"), fail]) == "fail"
    assert node_status([Check("xid", "unknown", "y"), Check("disk", "warn", "z")]) == "unknown"


def test_counter_deltas_need_a_baseline_of_the_same_boot() -> None:
    _, first = evaluate(doc(), None, CFG, 8)
    flapped = doc()
    flapped["ib"]["ports"][0].update(link_downed=2, symbol_error=500)
    gpus = [gpu(i) for i in range(8)]
    gpus[0]["pcie_replay"] = 1000
    gpus[0]["nvlink"] = {**gpus[0]["nvlink"], "replay": 5, "recovery": 1}
    flapped["nvml"]["gpus"] = gpus
    by = checks_of(flapped, first)
    assert by["ib"].status == "fail" and by["ib"].evict
    assert "link went down 2x" in by["ib"].message and "+500 symbol errors" in by["ib"].message
    assert by["pcie"].status == "warn" and "+1000 PCIe replays" in by["pcie"].message
    assert by["nvlink"].status == "warn" and "+5 replay +1 recovery" in by["nvlink"].message
    # the same counters after a reboot (new boot_id) or a reset (lower values): new baseline
    assert checks_of({**flapped, "boot_id": "b2"}, first)["ib"].status == "ok"
    _, high = evaluate(flapped, first, CFG, 8)
    assert checks_of(doc(), high)["ib"].status == "ok"
    # first sample: no delta, no alarm
    assert checks_of(flapped)["ib"].status == "ok"


def test_ib_port_down_missing_and_slow() -> None:
    d = doc()
    d["ib"]["ports"] = [{"device": "mlx5_0", "port": "1", "state": "DOWN",
                         "phys_state": "Polling", "rate": "10 Gb/sec"},
                        {"device": "mlx5_3", "port": None, "missing": True}]
    c = checks_of(d)["ib"]
    assert c.status == "fail" and c.evict
    assert c.message == "mlx5_0/1: DOWN (Polling); mlx5_3: device missing"
    slow = doc()
    slow["ib"]["ports"][0]["rate"] = "100 Gb/sec (4X EDR)"
    cfg = replace(CFG, ib_min_rate_gbps=400.0)
    assert checks_of(slow, cfg=cfg)["ib"].status == "warn"
    assert checks_of(doc(ib={"ports": []}))["ib"].status == "skip"


def test_net_and_disk() -> None:
    c = checks_of(doc(net={"eth0": "up", "ens3": "down", "eth9": None}))["net"]
    assert (c.status, c.message) == ("fail", "ens3: down; eth9: no such interface")
    assert checks_of(doc(disk={"/": {"total": 100, "free": 5}}))["disk"].status == "warn"
    assert checks_of(doc(disk={"/": {"total": 100, "free": 1}}))["disk"].status == "fail"
    assert checks_of(doc(disk={"/x": {"error": "No such file"}}),
                     cfg=replace(CFG, disk_paths=["/x"]))["disk"].message == "/x: No such file"


def xid_doc(*codes: int, boot: str = "b1") -> dict[str, Any]:
    events = [{"pci": "0000:3b:00", "code": c, "message": "m", "timestamp": None}
              for c in codes]
    return doc(boot_id=boot, kernel_log={"source": "/dev/kmsg", "events": events,
                                         "cursor": {"kind": "kmsg", "seq": 1}})


def test_evict_class_xid_stays_failed_for_the_boot() -> None:
    checks, sample = evaluate(xid_doc(79), None, CFG, 8)
    xid = {c.name: c for c in checks}["xid"]
    assert xid.status == "fail" and xid.evict
    assert "Xid 79 on 0000:3b:00 (GPU has fallen off the bus)" in xid.message
    checks, sample = evaluate(xid_doc(), sample, CFG, 8)  # nothing new, same boot
    assert {c.name: c for c in checks}["xid"].status == "fail"
    checks, _ = evaluate(xid_doc(boot="b2"), sample, CFG, 8)  # rebooted
    assert {c.name: c for c in checks}["xid"].status == "ok"


def test_application_xids_never_evict_unknown_ones_warn() -> None:
    app = checks_of(xid_doc(13, 31, 13))["xid"]
    assert app.status == "ok" and "Xid 13 on 0000:3b:00 (Graphics Engine Exception) x2" in \
        app.message
    assert checks_of(xid_doc(8))["xid"].status == "warn"
    unreadable = doc(kernel_log={"source": None, "events": [], "cursor": {},
                                 "error": "/dev/kmsg: Permission denied"})
    assert checks_of(unreadable)["xid"].status == "unknown"


def test_sample_round_trips_through_json() -> None:
    _, sample = evaluate(xid_doc(48), None, CFG, 8)
    again = Sample.from_json(sample.to_json())
    assert again == sample


def test_checks_section_limits_what_is_reported() -> None:
    cfg = replace(CFG, checks=["ecc", "disk"])
    assert list(checks_of(doc(), cfg=cfg)) == ["ecc", "disk"]


def test_process_rule() -> None:
    job = ["a", "b", "c"]
    out = apply_process_rule({"a": [11, 12], "b": [], "c": None, "s": None},
                             {"c": "no /proc"}, job)
    assert (out["a"].status, out["b"].status, out["c"].status, out["s"].status) == (
        "ok", "fail", "unknown", "skip")
    assert out["b"].message == "no training process here; alive on 1 other job machines"
    assert not out["b"].evict  # a dead process is a finding, not a hardware signal
    idle = apply_process_rule({"a": [], "b": []}, {}, job)
    assert {c.status for c in idle.values()} == {"warn"}


def test_configured_net_and_disk_the_probe_did_not_report_are_unknown_not_skipped() -> None:
    cfg = replace(CFG, interfaces=["eth0", "ens3"], disk_paths=["/", "/scratch"])
    for d in (doc(disk={}), doc(disk=None, net=None)):  # the probe sent nothing back
        c = checks_of(d, cfg=cfg)
        assert (c["net"].status, c["disk"].status) == ("unknown", "unknown"), c
        assert "eth0" in c["net"].message and "/scratch" in c["disk"].message
        assert node_status(list(c.values())) == "unknown" and not c["disk"].evict
    part = checks_of(doc(net={"eth0": "up"}, disk={"/": {"total": 100, "free": 50}}), cfg=cfg)
    assert (part["net"].status, part["net"].message) == ("unknown", "ens3: not reported")
    assert (part["disk"].status, part["disk"].message) == ("unknown", "/scratch: not reported")
    none = checks_of(doc(net={}, disk={}), cfg=replace(CFG, disk_paths=[]))
    assert (none["net"].status, none["disk"].status) == ("skip", "skip")  # nothing configured
