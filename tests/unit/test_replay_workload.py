"""The built-in replay workload on this machine (CPU, gloo): TP and PP paths, repeatability."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _run(request: dict[str, object]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "brctl.diagnostics.replay_workload"],
                         input=json.dumps(request), capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    doc: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def test_tp2_pp2_runs_are_bitwise_equal_and_report_real_losses() -> None:
    port = random.SystemRandom().randrange(40000, 50000)
    request = {"nnodes": 1, "node_rank": 0, "nproc_per_node": 4, "master_addr": "127.0.0.1",
               "ranks": [[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 1]],
               "steps": 2, "device": "cpu", "timeout": 120}
    first = _run({**request, "master_port": port})
    second = _run({**request, "master_port": port + 1})
    assert first.get("probe_error") is None, first
    assert (first["device"], first["backend"], first["world"]) == ("cpu", "gloo", 4)
    assert first["steps"] == second["steps"] and len(first["steps"]) == 2  # type: ignore[arg-type]
    losses = first["losses"]
    assert isinstance(losses, list) and all(3.5 < x < 5.0 for x in losses)  # ~ln(64)
    times = first["step_seconds"]
    assert isinstance(times, list) and len(times) == 2 and all(t > 0 for t in times)


def test_bad_requests_are_reported_not_raised() -> None:
    doc = _run({"nnodes": 2, "node_rank": 0, "nproc_per_node": 1, "master_addr": "127.0.0.1",
                "master_port": 1, "ranks": [[0, 0, 0, 0]]})
    assert "expected nnodes × nproc_per_node" in str(doc["probe_error"])
