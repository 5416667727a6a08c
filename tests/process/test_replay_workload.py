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


SPAWNED = r'''
import json, multiprocessing as mp, sys
from brctl.diagnostics import isolate, replay_workload

if __name__ == "__main__":
    sys.path.insert(1, sys.argv[1])  # a declared entry, as enter() puts it
    isolate.guard_imports((0,), None, [sys.argv[1]])  # as launch() leaves a probe run as root
    cfg = replay_workload._config({"nnodes": 1, "node_rank": 0, "nproc_per_node": 1,
                                   "master_addr": "127.0.0.1", "master_port": 1,
                                   "ranks": [[0, 0, 0, 0]], "timeout": 60})
    print(json.dumps(replay_workload._run_ranks(mp.get_context("spawn"), cfg, "cpu", 1, 0)))
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_spawned_rank_checks_its_imports_as_the_probe_does(tmp_path: Path) -> None:
    """CUDA ranks are spawned: a fresh interpreter without the probe's import guard, which
    imported torch's lazily loaded modules (torch.distributed, CUDA's) unchecked, as root. A
    job-owned torch.py in a root-owned declared entry stands in for such a module here: the
    rank must refuse it before it runs, and the probe pass the refusal on."""
    site = tmp_path / "site"
    site.mkdir()
    ran = tmp_path / "ran"
    planted = site / "torch.py"
    planted.write_text(f"open({str(ran)!r}, 'w')\n")
    os.chown(planted, 65534, 65534)
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    out = subprocess.run([sys.executable, str(script), str(site)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 96 and not ran.exists(), (out.returncode, out.stdout, out.stderr)
    first = out.stdout.splitlines()[0]
    assert first.startswith("brctl-refused ") and f"{planted} is owned by nobody" in first, out.stdout
