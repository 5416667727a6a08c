"""Benchmark of ``brctl diagnose``: time to verdict on 8/16/32 sshd machines and the ladder's overhead.

Each size gets a fresh cluster of real sshd machines (tests/kits/cluster.py:
one sshd per machine on 127.0.0.N, own PID namespace). Every machine has a fake
``dcgmi`` on its PATH that prints a real-format passing ``dcgmi diag -j`` tree at once,
and the job's logs (``--logs``) show an NCCL watchdog timeout on the first machine,
so the ``nccl`` playbook runs the whole ladder: evidence → eud → alltoall →
allgather (wide group). The ladder runs in-process (``operations.diagnose``) over
``SshTransport``; the first run of a size ships the probe bundle and is reported
apart, then ``--runs`` warm runs (connections reused, bundle cached).

Two modes:

- ``overhead`` (default): the machines run probes with a bare ``/usr/bin/python3``
  (no torch), so the collective stages skip at once and the fake dcgmi returns at
  once: what remains is the ladder's own cost (ssh round trips, probe start-up,
  fan-out, classification, decision, the state database). Reported: wall time to
  verdict, controller CPU (``process_time``: paramiko, JSON, analysis) and the sum
  of the stage tests' own seconds as the probes measured them.
- ``torch``: the machines use this interpreter (torch, gloo on CPU, one process per
  machine), so the all-to-all and the all-gather really run; overhead = wall minus
  the stages' critical path (the slowest machine's test in each stage).

All machines share this host's CPUs, so node-side work (one Python start per probe
per machine) adds up with N here, where on a real fleet every machine has its own.

Run: ``python benchmarks/diagnose.py --sizes 8 16 32 --runs 3`` (needs root, sshd,
unshare; a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NCCL_LOG = ROOT / "tests" / "unit" / "data" / "logs_nccl_timeout.log"
PASS_TREE = {
    "DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "software", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                          "entity_id": 0, "status": "Pass"}],
         "test_summary": {"status": "Pass"}}]}]},
    "metadata": {"version": "4.1.1", "Driver Version Detected": "570.124.06"},
}


def _fake_dcgmi(bindir: Path) -> None:
    bindir.mkdir()
    (bindir / "dcgm_pass.json").write_text(json.dumps(PASS_TREE))
    script = bindir / "dcgmi"
    script.write_text('#!/bin/sh\ncat "$(dirname "$0")/dcgm_pass.json"\n')
    script.chmod(0o755)


def _stage_test_seconds(report: Any) -> float:
    """The stages' critical path: per stage, the slowest machine's own test time."""
    total = 0.0
    for stage in report.stages:
        secs = [float(v.details.get("seconds") or 0.0) for v in stage.verdicts]
        total += max(secs, default=0.0)
    return total


def run_size(n: int, runs: int, mode: str) -> dict[str, Any]:
    """Time the ladder on ``n`` fresh sshd machines."""
    import yaml

    from brctl.load.inventory import load_inventory
    from brctl.load.playbooks import load_playbooks, playbook_dirs
    from brctl.operations.diagnose import Options, diagnose
    from brctl.remote.ssh.transport import SshTransport
    from tests.kits.cluster import SshCluster

    books = load_playbooks(playbook_dirs(None, {}))
    with tempfile.TemporaryDirectory() as tmp_s, SshCluster(Path(tmp_s), n) as cluster:
        tmp = Path(tmp_s)
        _fake_dcgmi(tmp / "bin")
        python = "/usr/bin/python3" if mode == "overhead" else sys.executable
        env = {name: {"PATH": f"{tmp / 'bin'}:{NODE_PATH}"} for name in cluster.names}
        doc = cluster.inventory(job={"name": "bench", "process_match": "brctl-bench-never"},
                                node_env=env, python=python,
                                extra={"diagnose": {"alltoall_bytes": 65536,
                                                    "allgather_bytes": 4096, "iterations": 2}})
        for entry in doc["nodes"]:
            entry["gpus"] = 1
        (tmp / "inv.yaml").write_text(yaml.safe_dump(doc))
        inv = load_inventory(tmp / "inv.yaml")
        logs = tmp / "logs"
        logs.mkdir()
        for i, name in enumerate(cluster.names):
            (logs / f"{name}.log").write_text(NCCL_LOG.read_text() if i == 0 else "ok\n")
        transport = SshTransport()
        walls, cpus, tests = [], [], []
        first = 0.0
        try:
            for r in range(runs + 1):
                cpu0, t0 = time.process_time(), time.perf_counter()
                report = diagnose(inv, transport, books, Options(logs_dir=logs))
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                assert report.faulty == () and [s.name for s in report.stages] == [
                    "eud", "alltoall", "allgather"], report.to_json()
                if r == 0:
                    first = wall
                    continue
                walls.append(wall)
                cpus.append(cpu)
                tests.append(_stage_test_seconds(report))
        finally:
            transport.close()
    wall = statistics.median(walls)
    test = statistics.median(tests)
    return {"n": n, "first": first, "wall": wall, "cpu": statistics.median(cpus),
            "tests": test, "overhead": wall - test, "decision": report.decision,
            "exit": int(report.exit_code)}


def main() -> None:
    """Run the sizes and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--runs", type=int, default=3, help="warm runs per size (median)")
    ap.add_argument("--mode", choices=["overhead", "torch"], default="overhead")
    args = ap.parse_args()
    from tests.kits.cluster import missing_requirements

    why = missing_requirements()
    if why is not None:
        sys.exit(f"cannot run: {why}")
    load = os.getloadavg()[0]
    print(f"mode {args.mode}, median of {args.runs} warm runs, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the start")
    print("| machines | first run (ships bundle) | time to verdict | stage tests | "
          "ladder overhead | controller CPU | per machine | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        r = run_size(n, args.runs, args.mode)
        print(f"| {r['n']} | {r['first']:.2f} s | {r['wall']:.2f} s | {r['tests']:.2f} s | "
              f"{r['overhead']:.2f} s | {r['cpu']:.2f} s | {1000 * r['cpu'] / r['n']:.1f} ms | "
              f"{r['exit']} |", flush=True)


if __name__ == "__main__":
    main()
