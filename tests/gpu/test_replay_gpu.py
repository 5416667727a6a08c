"""The built-in replay workload on a real GPU: two runs give bitwise-equal fingerprints.

Skipped without CUDA (run with ``BRCTL_TEST_GPU=1`` on a GPU machine). Runs the
node-side probe directly on this machine, one rank per GPU (1 GPU is enough),
NCCL with the pinned deterministic environment, twice, and compares every step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("BRCTL_TEST_GPU") != "1",
    reason="needs CUDA and BRCTL_TEST_GPU=1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(nproc: int, tp: int) -> dict[str, object]:
    pp = nproc // tp
    ranks = [[r % tp, 0, 0, r // tp] for r in range(nproc)]  # tp fastest, then pp
    request = {"nnodes": 1, "node_rank": 0, "nproc_per_node": nproc,
               "master_addr": "127.0.0.1", "master_port": _free_port(), "ranks": ranks,
               "steps": 6, "device": "cuda", "timeout": 300}
    assert pp >= 1
    out = subprocess.run([sys.executable, "-m", "brctl.diagnostics.replay_workload"],
                         input=json.dumps(request), capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    doc: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    assert "probe_error" not in doc, doc
    return doc


@pytest.mark.parametrize("nproc,tp", [(1, 1), (2, 1), (2, 2)])
def test_two_runs_are_bitwise_equal(nproc: int, tp: int) -> None:
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    first, second = _run(nproc, tp), _run(nproc, tp)
    assert first["device"] == "cuda" and first["backend"] == "nccl"
    assert first["steps"] == second["steps"]
    assert first["losses"] == second["losses"]
    print(json.dumps({"nproc": nproc, "tp": tp, "steps": first["steps"]}))
