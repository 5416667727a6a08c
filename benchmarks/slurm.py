"""``brctl health`` on every node over ssh and over ``connection: slurm``, side by side.

Starts a real Slurm of N machines (tests/kits/slurm_cluster.py: each machine
runs its sshd and its slurmd in one set of namespaces; needs root and the Debian
packages slurmctld slurmd slurm-client munge), submits a job on all of them, then
runs ``brctl health`` (the CLI's ``run``, in this process: the interpreter's start is
the same for both and would only add noise) over the same machines with two
inventories that differ only in ``connection``. Warm: one run of each first ships the
probe bundle and writes the state rows.

Controller CPU is this process's CPU (paramiko's crypto for ssh) plus
``RUSAGE_CHILDREN`` (every ``srun`` waited for) plus, for Slurm, slurmctld's own CPU
during the run (read from /proc: it creates the step).
The per-node figure is the marginal cost, from a run on 4 machines and one on all
N: (cpu_N - cpu_4) / (N - 4); the extrapolation to 12,000 machines is
cpu_4 + per_node × (12,000 - 4). The machines share the controller's cores here,
so wall time is pessimistic for both; the CPU figures are the fair comparison.

Run: ``python benchmarks/slurm.py [--nodes 16] [--runs 5] [--json]`` (as root).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.kits.slurm_cluster import SlurmCluster, missing_slurm_requirements  # noqa: E402

FLEET = 12_000
SMALL = 4


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _pid_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _inventory(cluster: SlurmCluster, where: Path, job: str, connection: str) -> Path:
    inv: dict[str, Any] = cluster.inventory(job={"nodes": f"node[01-{len(cluster.names):02d}]",
                                                 "slurm": {"job": job}})
    for entry in inv["nodes"]:
        entry["connection"] = connection
        entry["gpus"] = 1
    path = where / f"{connection}.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _health(inv: Path, env: dict[str, str], nodes: str, ctld: int) -> tuple[float, float, float, int]:
    """One ``brctl health -w nodes`` run: wall, controller CPU, slurmctld CPU, exit code."""
    from brctl.cli.app import run

    os.environ.update(env)
    out = io.StringIO()
    cpu0, ctld0, t0 = _children_cpu() + time.process_time(), _pid_cpu(ctld), time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = run(["-i", str(inv), "--json", "health", "-w", nodes])
    wall = time.monotonic() - t0
    cpu = _children_cpu() + time.process_time() - cpu0
    doc = json.loads(out.getvalue())
    answered = sum(1 for n in doc["nodes"].values() if not n.get("error"))
    if answered != len(doc["nodes"]):
        raise SystemExit(f"{inv.stem}: only {answered}/{len(doc['nodes'])} nodes answered: {doc}")
    return wall, cpu, _pid_cpu(ctld) - ctld0, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    why = missing_slurm_requirements()
    if why:
        raise SystemExit(f"cannot start the Slurm cluster: {why}")
    root = Path(tempfile.mkdtemp(prefix="brctl-bench-slurm-"))
    cluster = SlurmCluster(root, args.nodes, gpus=0)
    out: dict[str, Any] = {"nodes": args.nodes, "runs": args.runs}
    try:
        cluster.start()
        job = cluster.sbatch("sleep 3600", "-N", str(args.nodes))
        cluster.wait_job(job, {"RUNNING"})
        assert cluster._ctld is not None
        ctld = cluster._ctld.pid
        every = f"node[01-{args.nodes:02d}]"
        small = f"node[01-{SMALL:02d}]"
        for connection in ("ssh", "slurm"):
            inv = _inventory(cluster, root, job, connection)
            env = {**cluster.slurm_env(), "BRCTL_STATE": str(root / f"state-{connection}")}
            _health(inv, env, every, ctld)  # warm: bundle shipped, state rows written
            rows = {}
            for label, nodes in (("small", small), ("all", every)):
                runs = [_health(inv, env, nodes, ctld) for _ in range(args.runs)]
                rows[label] = {"wall": statistics.median(r[0] for r in runs),
                               "cpu": statistics.median(r[1] + r[2] for r in runs),
                               "ctld_cpu": statistics.median(r[2] for r in runs)}
            per_node = (rows["all"]["cpu"] - rows["small"]["cpu"]) / (args.nodes - SMALL)
            out[connection] = {**rows, "cpu_per_node": per_node,
                               "cpu_at_12000": rows["small"]["cpu"] + per_node * (FLEET - SMALL)}
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    ssh, slurm = out["ssh"], out["slurm"]
    out["ratio_cpu_per_node"] = ssh["cpu_per_node"] / max(slurm["cpu_per_node"], 1e-9)
    out["ratio_wall_all"] = ssh["all"]["wall"] / slurm["all"]["wall"]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"brctl health, {args.nodes} machines, median of {args.runs} (controller CPU = brctl + "
          "srun/ssh + slurmctld)")
    print(f"{'transport':<10} {'wall 4':>8} {'wall all':>9} {'cpu 4':>7} {'cpu all':>8} "
          f"{'ctld all':>9} {'cpu/node':>9} {'cpu @12k':>9}")
    for name in ("ssh", "slurm"):
        r = out[name]
        print(f"{name:<10} {r['small']['wall']:>7.2f}s {r['all']['wall']:>8.2f}s {r['small']['cpu']:>6.2f}s "
              f"{r['all']['cpu']:>7.2f}s {r['all']['ctld_cpu']:>8.2f}s {r['cpu_per_node'] * 1000:>7.1f}ms "
              f"{r['cpu_at_12000']:>8.0f}s")
    print(f"ssh/slurm: controller CPU per node {out['ratio_cpu_per_node']:.1f}x, "
          f"wall on all {out['ratio_wall_all']:.2f}x")


if __name__ == "__main__":
    main()
