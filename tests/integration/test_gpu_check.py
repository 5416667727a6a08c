"""scripts/gpu-check read end to end on CPU stand-ins: every stage's logic, no GPU needed.

``GPU_CHECK_TEST_GPUS`` (test-only) makes the script run as on a machine with that many
GPUs, with gloo and ``device: cpu`` in place of NCCL and CUDA; the fake pynvml
(``GPU_CHECK_TEST_PYTHONPATH`` + ``$FAKE_NVML``) answers NVML and the suite's fake
``dcgmi`` answers DCGM. The private venv is really built (from this interpreter, itself
a venv: the path a GPU image's /opt/torch/.venv python takes) once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.kits.healthkit import fake_nvml, healthy_gpus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"
FAKE_DCGMI = ROOT / "tests" / "integration" / "diagnose_faults" / "bin"
pytest.importorskip("torch")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-check-venv") / "venv"


class Run:
    """One run of the script: its output lines, summary.json and unpacked raw outputs."""

    def __init__(self, proc: subprocess.CompletedProcess[str], out: Path) -> None:
        self.rc, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        self.lines = proc.stdout.splitlines()
        self.summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        self.raw = out / "raw"
        with tarfile.open(out / "raw.tar.gz") as tar:
            tar.extractall(self.raw)
        self.log = (out / "gpu-check.log").read_text()

    def stage(self, n: int) -> dict[str, Any]:
        got: dict[str, Any] = self.summary["stages"][str(n)]
        return got

    def line(self, n: int) -> str:
        return next(ln for ln in self.lines if ln.startswith(f"[{n}] "))


def gpu_check(tmp: Path, venv: Path, *args: str, gpus: list[dict[str, Any]] | None = None,
              env: Mapping[str, str] | None = None) -> Run:
    nvml = fake_nvml(tmp / "nvml", gpus if gpus is not None else healthy_gpus(2))
    out = tmp / "out"
    proc = subprocess.run(
        [str(SCRIPT), "--python", sys.executable, "--venv", str(venv), "--out", str(out), *args],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "GPU_CHECK_TEST_GPUS": str(len(gpus or [0, 1])),
             "GPU_CHECK_TEST_PYTHONPATH": nvml["PYTHONPATH"], "FAKE_NVML": nvml["FAKE_NVML"],
             "TMPDIR": str(tmp), "HOME": str(tmp / "home"), **(env or {})})
    assert proc.stderr == "", proc.stderr
    return Run(proc, out)


@pytest.mark.timeout(900)
def test_every_stage_reads_its_stand_in_end_to_end(tmp_path: Path, venv: Path) -> None:
    # Hopper-like: no page retirement (NVML: Not Supported); GPU0 has a real fault to report
    gpus = [{**g, "retired_pending": "NOT_SUPPORTED", "retired_dbe": "NOT_SUPPORTED"}
            for g in healthy_gpus(2)]
    gpus[0]["ecc_volatile"] = 3
    run = gpu_check(tmp_path, venv, gpus=gpus, env={"PATH": f"{FAKE_DCGMI}:{os.environ['PATH']}"})
    assert run.rc == 0, run.stdout
    assert run.lines[0].startswith("machine: ") and "torch " in run.lines[0]
    assert run.line(1).startswith("[1] health: pass: 10 GPU checks on 2 GPU(s), driver 570.86.15: "
                                  "8 ok, 0 warn, 1 fail (ecc: GPU0 (00000000:18:00.0): 3 volatile "
                                  "uncorrectable ECC errors); 1 not supported by the GPU: "
                                  "retired_pages; probe ")
    assert run.line(2).startswith("[2] replay: pass: 8 steps bitwise equal in two runs "
                                  "(nproc 2, TP=2, gloo); ")
    assert run.line(3).startswith("[3] collective: pass: all-to-all ")
    assert "gloo, 2 rank(s), 1 MiB a peer, data verified" in run.line(3)
    assert run.line(4).startswith("[4] stacks: pass: hung rank 2 of 5 named (evict ['gpucheck']), "
                                  "also with native frames")
    assert run.line(5).startswith("[5] dcgm: pass: dcgmi diag -r 1 read in ")
    assert "DCGM says fail" in run.line(5) and "GPU 1" in run.line(5)
    assert run.line(6).startswith("[6] gpu-tests: skip: 0 passed, 3 skipped, 0 failed in ")
    assert run.line(6).endswith("needs CUDA and BRCTL_TEST_GPU=1")
    assert run.lines[-1].startswith("gpu-check: 5 pass, 1 skip, 0 fail in ")
    assert run.log == run.stdout

    doc = run.summary
    assert doc["schema"] == "brctl.gpu-check/1" and doc["status"] == "pass"
    assert doc["machine"]["torch"].startswith("2.") and doc["machine"]["cuda_available"] is False
    health = run.stage(1)["figures"]
    temperature = health["gpu_checks"]["temperature"]
    assert temperature == {"status": "ok", "message": "max 40 C", "raw": {
        f"gpu{i}": {"temperature": 40, "temperature_slowdown": 87, "temperature_shutdown": 92}
        for i in (0, 1)}}
    ecc = health["gpu_checks"]["ecc"]
    assert ecc["status"] == "fail"
    assert ecc["raw"]["gpu0"] == {"ecc_volatile_uncorrected": 3, "ecc_aggregate_uncorrected": 0}
    assert health["probe_cpu_seconds"] > 0 and health["brctl_exit"] == 1
    replay = run.stage(2)["figures"]
    assert len(replay["steps"]) == 8 and replay["backend"] == "gloo"
    assert replay["step_seconds_median"] > 0
    collective = run.stage(3)["figures"]
    assert collective["alltoall_busbw_gbps"] > 0 and collective["allgather_busbw_gbps"] > 0
    stacks = run.stage(4)["figures"]
    # the hung rank, in both dumps; a healthy one caught mid-step may be flagged beside it
    hung = stacks["hung_rank"]
    assert (stacks["world"], hung) == (5, 2)
    assert hung in stacks["outliers"] and hung in stacks["native_outliers"]
    assert run.stage(5)["figures"]["status"] == "fail"

    # every raw output is kept: brctl's own answers, the probes', py-spy's dumps, pytest's
    for path in ("machine.json", "1-health/health.out", "1-health/nvml-raw.json",
                 "1-health/inventory.yaml", "2-replay/replay-2.out", "3-collective/alltoall.out",
                 "3-collective/allgather.json", "4-stacks/dumps/job.json",
                 "4-stacks/dumps-native/job.json", "4-stacks/stacks.out",
                 "5-dcgm/dcgmi-diag.json", "6-gpu-tests/junit.xml"):
        assert (run.raw / path).is_file(), path
    assert json.loads((run.raw / "1-health/health.out").read_text())["schema"] == "brctl.health/1"
    native = list((run.raw / "4-stacks/dumps-native/gpucheck").glob("1-*.json"))
    assert native and "libc" in native[0].read_text()  # py-spy --native frames were taken


def test_a_gpu_check_that_could_not_read_fails_the_stage(tmp_path: Path, venv: Path) -> None:
    # NVML's own "Not Supported" (no NVLink, no PCIe counter) is a reading; a recovery action
    # the probe could not get (an old pynvml, say) is not: brctl did not look.
    gpus = [{**g, "nvlink_links": 0, "pcie_replay": "NOT_SUPPORTED", "recovery": "NOT_SUPPORTED"}
            for g in healthy_gpus(2)]
    run = gpu_check(tmp_path, venv, "--stage", "1", gpus=gpus)
    assert run.rc == 1
    assert run.line(1) == ("[1] health: fail: 1 GPU checks without a reading: recovery_action "
                           "(skip: recovery action not reported (driver < 570)); 2 not supported "
                           "by the GPU: nvlink, pcie")
    pcie = run.stage(1)["figures"]["gpu_checks"]["pcie"]["raw"]["gpu1"]
    assert pcie == {"pcie_replay": None, "nvml_error": "Not Supported"}
    assert run.summary["status"] == "fail" and list(run.summary["stages"]) == ["1"]


def _processes_of(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if entry.isdigit() and marker.encode() in environ:
            found.append(int(entry))
    return found


def test_a_stage_past_its_limit_is_stopped_with_all_it_started(tmp_path: Path, venv: Path) -> None:
    gpu_check(tmp_path / "warm", venv, "--stage", "5")  # the venv is built outside the limit
    # 90 s x 0.01: a 1 s limit, far below what two replay rounds of torch processes take
    # (0.05 gave 5 s, which a fast machine's replay once finished within)
    run = gpu_check(tmp_path, venv, "--stage", "2", env={"BRCTL_TIMEOUT_SCALE": "0.01"})
    assert run.rc == 1
    assert run.line(2).startswith("[2] replay: fail: ") and "timed out after" in run.line(2)
    assert run.stage(2)["verdict"] == "fail"
    deadline = time.monotonic() + 10
    while _processes_of(str(tmp_path / "gpu-check.")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(str(tmp_path / "gpu-check.")) == []  # no rank outlives the stage
