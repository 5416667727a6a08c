"""brctl health: the probe's own cost on a node, and the controller's cost per node of a sweep.

Run: .venv/bin/python benchmarks/health.py [--runs N] [--nodes 64]

1. Probe: ``python -m brctl.diagnostics.health_probe`` as a fresh process (as on a
   node), wall and CPU (user+sys of the child) per run, median of N. Two setups:
   the real host (``root: /``: /dev/kmsg, /proc, disk; no NVIDIA driver here) and a
   fixture machine (8 GPUs through the fake pynvml, 8 IB ports, a 5,000-record kmsg).
2. Sweep: ``operations.health.sweep`` over N nodes whose transport answers at once
   with a recorded 8-GPU probe document (a FakeTransport: the connections are
   "open", no ssh crypto), controller CPU (process_time) per node, warm (second
   and later sweeps: state rows exist, deltas computed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brctl.analysis.inventory import from_document  # noqa: E402
from brctl.remote.fake import FakeTransport, Reply  # noqa: E402
from brctl.remote.probes import ProbeRunner  # noqa: E402
from tests.kits.healthkit import (  # noqa: E402
    ACTIVE_PORT,
    fake_nvml,
    healthy_gpus,
    kmsg_record,
    make_root,
)

PROBE = [sys.executable, "-m", "brctl.diagnostics.health_probe"]


def probe_cost(request: dict[str, object], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one probe process."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(PROBE, input=json.dumps(request).encode(), capture_output=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [env.get("PYTHONPATH", ""), str(ROOT)]), **{
                                     k: v for k, v in env.items() if k != "PYTHONPATH"}},
                             check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert b"probe_error" not in out.stdout, out.stdout
    return statistics.median(walls), statistics.median(cpus)


def fixture_machine(tmp: Path) -> tuple[dict[str, object], dict[str, str]]:
    """An 8-GPU, 8-port machine with a full kmsg buffer."""
    ib = {f"mlx5_{i}": {"1": ACTIVE_PORT} for i in range(8)}
    kmsg = [kmsg_record(i, i * 1000, f"usb 1-{i % 9}: some ordinary kernel message {i}")
            for i in range(5000)]
    root = make_root(tmp / "root", ib=ib, kmsg=kmsg, net={"eth0": "up"})
    env = fake_nvml(tmp / "nvml", healthy_gpus(8))
    request = {"root": str(root), "interfaces": ["eth0"], "disk_paths": ["/"],
               "process_match": "pretrain"}
    return request, env


def sweep_cost(nodes: int, sweeps: int, tmp: Path) -> float:
    """Controller CPU seconds per node of a warm sweep over ``nodes`` open connections."""
    from brctl.operations.health import sweep

    request, env = fixture_machine(tmp / "machine")
    request["root"] = str(tmp / "machine" / "root")
    document = subprocess.run(PROBE, input=json.dumps(request).encode(), capture_output=True,
                              env={**os.environ, **env,
                                   "PYTHONPATH": f"{env['PYTHONPATH']}:{ROOT}"},
                              check=True).stdout.decode()
    transport = FakeTransport(lambda node, argv, stdin: Reply(stdout=document))
    inv = from_document({
        "nodes": [{"name": f"gpu[001-{nodes:03d}]", "gpus": 8}],
        "job": {"nodes": f"gpu[001-{nodes:03d}]", "tp": 8},
    }, "bench")
    runner = ProbeRunner(transport)
    targets = list(inv.nodes.values())
    sweep(inv, transport, targets, tmp / "state", runner=runner)  # cold: baselines
    costs = []
    for _ in range(sweeps):
        start = time.process_time()
        report = sweep(inv, transport, targets, tmp / "state", runner=runner)
        costs.append((time.process_time() - start) / nodes)
        assert len(report.nodes) == nodes
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        host = {"root": "/", "disk_paths": ["/"], "process_match": "pretrain"}
        wall, cpu = probe_cost(host, {}, args.runs)
        print(f"probe, this host (root /, no GPU): wall {wall:.3f} s  CPU {cpu:.3f} s")
        request, env = fixture_machine(tmp)
        wall, cpu = probe_cost(request, env, args.runs)
        print(f"probe, 8 fake GPUs + 8 IB ports + 5k kmsg: wall {wall:.3f} s  CPU {cpu:.3f} s")
        per_node = sweep_cost(args.nodes, 5, tmp)
        print(f"sweep of {args.nodes} open nodes: controller CPU {per_node * 1000:.2f} ms/node")


if __name__ == "__main__":
    main()
