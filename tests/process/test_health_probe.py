"""The node-side health probe on fixture trees (sysfs, kmsg, kern.log) and a fake pynvml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brctl.core.transport import Node
from brctl.diagnostics import health_probe as hp
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner
from tests.kits.healthkit import (
    ACTIVE_PORT,
    DOWN_PORT,
    fake_nvml,
    healthy_gpus,
    kmsg_record,
    make_root,
    set_port,
)
from tests.kits.waiting import wait_for

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2271, name=python3, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:86:00): 13, pid=9001, name=pt.py, Graphics Exception"


def test_ib_ports_state_rate_and_counters(tmp_path: Path) -> None:
    root = make_root(tmp_path, ib={"mlx5_0": {"1": ACTIVE_PORT},
                                   "mlx5_1": {"1": {**DOWN_PORT, "link_downed": 7}}})
    ports = hp.sample_ib(str(root), [])["ports"]
    assert [(p["device"], p["state"], p["phys_state"]) for p in ports] == [
        ("mlx5_0", "ACTIVE", "LinkUp"), ("mlx5_1", "DOWN", "Disabled")]
    assert ports[1]["link_downed"] == 7 and ports[0]["rate"].startswith("400 Gb/sec")
    missing = hp.sample_ib(str(root), ["mlx5_9"])["ports"]
    assert missing == [{"device": "mlx5_9", "port": None, "missing": True}]
    assert hp.sample_ib(str(tmp_path / "nothing"), [])["ports"] == []


def test_net_disk_boot_id(tmp_path: Path) -> None:
    root = make_root(tmp_path, net={"eth0": "up", "ib0": "down"})
    assert hp.sample_net(str(root), ["eth0", "ib0", "eth9"]) == {
        "eth0": "up", "ib0": "down", "eth9": None}
    disk = hp.sample_disk(str(root), ["/", "/no/such/dir"])
    assert disk["/"]["total"] > 0 and 0 <= disk["/"]["free"] <= disk["/"]["total"]
    assert "error" in disk["/no/such/dir"]
    doc = hp.collect({"root": str(root), "checks": ["disk"]})
    assert doc["boot_id"].startswith("5f1c1e7a") and "nvml" not in doc


def test_kmsg_cursor_same_boot_and_new_boot(tmp_path: Path) -> None:
    root = make_root(tmp_path, kmsg=[kmsg_record(1, 5_000_000, "Linux version 6.8"),
                                     kmsg_record(2, 9_000_000, XID79),
                                     " DEVICE=+pci:0000:3b:00.0",
                                     kmsg_record(3, 9_500_000, XID13)])
    first = hp.sample_kernel_log(str(root), {}, "boot-a")
    assert first["source"].endswith("dev/kmsg")
    assert [e["code"] for e in first["events"]] == [79, 13]
    assert first["events"][0]["timestamp"] == "9.000000"
    again = hp.sample_kernel_log(str(root), {"xid_cursor": first["cursor"]}, "boot-a")
    assert again["events"] == [] and again["cursor"]["seq"] == 3
    rebooted = hp.sample_kernel_log(str(root), {"xid_cursor": first["cursor"]}, "boot-b")
    assert len(rebooted["events"]) == 2  # a new boot starts over


def test_text_log_append_rotate_and_boot_banner(tmp_path: Path) -> None:
    log = ("Mar 10 11:00:00 gpu1 kernel: " + XID79 + "\n"
           "Mar 10 11:05:00 gpu1 kernel: Linux version 6.8.0 (buildd@lcy02)\n"
           "Mar 10 11:06:00 gpu1 kernel: " + XID13 + "\n")
    root = make_root(tmp_path, kern_log=log)
    first = hp.sample_kernel_log(str(root), {}, "b")
    assert first["source"].endswith("var/log/kern.log")
    assert [e["code"] for e in first["events"]] == [13]  # the 79 was before this boot
    path = root / "var/log/kern.log"
    with open(path, "a") as fh:
        fh.write("Mar 10 11:07:00 gpu1 kernel: " + XID79 + "\nMar 10 11:07:01 partial")
    second = hp.sample_kernel_log(str(root), {"xid_cursor": first["cursor"]}, "b")
    assert [e["code"] for e in second["events"]] == [79]
    assert second["cursor"]["offset"] < path.stat().st_size  # the partial line waits
    path.rename(root / "var/log/kern.log.1")  # logrotate
    path.write_text("Mar 10 12:00:00 gpu1 kernel: " + XID79.replace("79", "48", 1) + "\n")
    third = hp.sample_kernel_log(str(root), {"xid_cursor": second["cursor"]}, "b")
    assert [e["code"] for e in third["events"]] == [48]


def test_a_text_log_that_grew_by_far_more_than_its_tail_is_read_in_bounded_memory(
        tmp_path: Path) -> None:
    """Between two sweeps the log grew by 24 MiB (an error storm, a daemon down for a
    week): every Xid appended is reported, and the probe (root, on the training
    machine) never holds the whole growth in memory."""
    import tracemalloc

    root = make_root(tmp_path, kern_log="Mar 10 11:00:00 gpu1 kernel: booted\n")
    path = root / "var/log/kern.log"
    first = hp.sample_kernel_log(str(root), {}, "b")
    noise = ("Mar 10 11:01:00 gpu1 kernel: eth0: link flapped " + "x" * 60 + "\n") * (96 << 10)
    with open(path, "a") as fh:
        fh.write(noise + "Mar 10 11:02:00 gpu1 kernel: " + XID79 + "\n")
        fh.write(noise + "Mar 10 11:03:00 gpu1 kernel: " + XID13 + "\n")
    assert path.stat().st_size > 16 << 20
    tracemalloc.start()
    try:
        out = hp.sample_kernel_log(str(root), {"xid_cursor": first["cursor"]}, "b")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e["code"] for e in out["events"]] == [79, 13]
    assert out["cursor"]["offset"] == path.stat().st_size
    assert peak < 2 << 20, f"{peak} bytes held to read {path.stat().st_size} appended bytes"


def test_kernel_log_unreadable_is_a_reason(tmp_path: Path) -> None:
    out = hp.sample_kernel_log(str(make_root(tmp_path, kmsg=None)), {}, "b")
    assert out["events"] == [] and "no /dev/kmsg" in out["error"]


def test_processes_found_by_regex(tmp_path: Path) -> None:
    marker = f"brctl-health-test-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    try:
        wait_for(lambda: marker.encode() in Path(f"/proc/{child.pid}/cmdline").read_bytes(),
                 "the child's exec (until then its cmdline is ours)")
        found = hp.sample_processes("/", marker)["pids"]
        assert found == [child.pid]
        assert hp.sample_processes("/", "no-such-process-xyz")["pids"] == []
    finally:
        child.kill()
        child.wait()
    assert "error" in hp.sample_processes(str(tmp_path), marker)
    assert hp.sample_processes("/", None) == {"error": "no job.process_match"}


def _run_probe(tmp_path: Path, env: dict[str, str], request: dict[str, object]) -> dict[str, object]:
    node = Node("n1", "n1", connection="local", python=sys.executable,
                env={**env, "HOME": str(tmp_path / "home")})
    res = ProbeRunner(LocalTransport()).run([node], "brctl.diagnostics.health_probe", request,
                                            timeout=60)["n1"]
    assert res.document is not None, res.error
    return res.document


def test_nvml_through_the_real_probe_with_fake_pynvml(tmp_path: Path) -> None:
    gpus = healthy_gpus(2)
    gpus[1].update(ecc_volatile=3, remapped_rows=[0, 1, 1, 0], throttle=0x48,
                   nvlink_active=16, recovery=1, retired_pending="NOT_SUPPORTED",
                   retired_dbe="NOT_SUPPORTED")
    env = fake_nvml(tmp_path / "nvml", gpus)
    doc = _run_probe(tmp_path, env, {"root": str(make_root(tmp_path / "root")),
                                     "checks": ["nvml"]})
    nvml = doc["nvml"]
    assert isinstance(nvml, dict) and nvml["status"] == "ok" and nvml["count"] == 2
    g0, g1 = nvml["gpus"]
    assert g0["pci"] == "00000000:18:00.0" and g0["ecc_volatile_uncorrected"] == 0
    assert g1["ecc_volatile_uncorrected"] == 3
    assert g1["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": True,
                                   "failure": False}
    assert g1["throttle_reasons"] == 0x48 and g1["recovery_action"] == 1
    assert g1["nvlink"]["active"] == 16 and g0["nvlink"]["active"] == 18
    assert g1["retired_pages_pending"] is None and "retired_pages" in g1["errors"]
    assert g0["temperature_slowdown"] == 87 and g0["power_limit_mw"] == 700000


def test_nvml_library_missing_or_driver_not_loaded_is_unavailable(tmp_path: Path) -> None:
    env = fake_nvml(tmp_path / "nvml", [], init_error=12)
    doc = _run_probe(tmp_path, env, {"checks": ["nvml"]})
    assert doc["nvml"] == {"status": "unavailable", "reason": hp.NO_DRIVER}
    env = fake_nvml(tmp_path / "nvml", [], init_error=9)
    doc = _run_probe(tmp_path, env, {"checks": ["nvml"]})
    assert doc["nvml"] == {"status": "unavailable", "reason": hp.NOT_LOADED}


def test_lost_gpu_is_reported_per_index(tmp_path: Path) -> None:
    gpus = healthy_gpus(2)
    gpus[0]["lost"] = True
    env = fake_nvml(tmp_path / "nvml", gpus)
    doc = _run_probe(tmp_path, env, {"checks": ["nvml"]})
    nvml = doc["nvml"]
    assert isinstance(nvml, dict)
    assert nvml["gpus"][0] == {"index": 0, "error": "GPU is lost"}


def test_probe_bad_request_is_a_probe_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "brctl.diagnostics.health_probe"],
                          input=b"[1]", capture_output=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(hp.__file__).parents[2])})
    assert proc.returncode == 1 and "probe_error" in json.loads(proc.stdout)


@pytest.mark.parametrize("port", [ACTIVE_PORT])
def test_set_port_updates_counters(tmp_path: Path, port: dict[str, object]) -> None:
    set_port(tmp_path, "mlx5_0", "1", {**port, "link_downed": 2})
    assert hp.read_int(str(tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/link_downed")) == 2
