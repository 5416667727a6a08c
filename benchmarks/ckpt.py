"""Benchmark ``brctl ckpt``: plan + verify at scale, and backup throughput over sshd vs scp.

``python benchmarks/ckpt.py [--ranks 1024,16384,102400] [--runs 3] [--mib 256]``

Placement: 8-GPU machines, TP=8 inside a machine, PP=8 (DP = ranks / 64), racks
of 32 machines as failure domains. Timed separately (CPU seconds, median of
``--runs``) and together (CPU and wall): the topology, the ``ConflictIndex`` (shared
by both steps, as ``brctl ckpt verify`` does), ``plan_backups`` (peer search) and
``verify_plan`` (evicting every group instance of every kind, and the exact loss
probabilities for k = 1..4). Also the PP=1 shape (no valid peer: the fallback path) at the largest size.

Copies (``--mib N``, needs root, sshd and ``brctl.remote.ssh``): two real sshd
machines (tests/kits/cluster.py, own mount namespaces, private
/local/ckpt and /local/ckpt.brctl-backup); node01 holds one step of 4 shard files
totalling N MiB. Timed, interleaved, median of ``--runs``: ``brctl ckpt backup`` of
node01 → node02 through the controller (cold: the peer has nothing; node01 hashes,
streams into node02's receiver, which checks each sha256 as it lands, commits),
the same again (resume: nothing to send), and ``scp -3`` of the same files node01 →
node02 (OpenSSH's own remote-to-remote copy through the local host, no checksums)
as the baseline. Then the way back: ``brctl ckpt restore --to node01 --for node01``
(node02 re-hashes its copy against the manifest, streams it into a staging dir on
node01 checked as it lands, hands it over and renames it into place; the step
already there is moved aside, and deleted before the next run) beside ``scp -3``
of the backed-up files node02 → node01.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brctl.analysis.placement.plan import ConflictIndex, plan_backups, verify_plan
from brctl.analysis.topology import Topology


def bench_placement(ranks: int, runs: int, pp: int = 8) -> dict[str, float]:
    """Median CPU seconds of each phase for a job of ``ranks`` ranks (and the wall total)."""
    machines = [f"gpu{i:05d}" for i in range(ranks // 8)]
    racks = {m: f"r{i // 32}" for i, m in enumerate(machines)}
    times: dict[str, list[float]] = {"topology": [], "index": [], "plan": [], "verify": [],
                                     "total": [], "wall": []}
    ok, p4 = True, 0.0
    clock = time.process_time  # CPU time: the shared 2-core machine makes wall time noisy
    for _ in range(runs):
        w0 = time.perf_counter()
        t0 = clock()
        topo = Topology.build(machines, 8, tp=8, pp=pp)
        t1 = clock()
        index = ConflictIndex.build(topo)
        t2 = clock()
        plan = plan_backups(topo, racks, index)
        t3 = clock()
        result = verify_plan(topo, plan.backups(), index)
        t4 = clock()
        wall = time.perf_counter() - w0
        ok, p4 = plan.ok and result.ok, float(result.loss_probability[4] or 0.0)
        for key, value in (("topology", t1 - t0), ("index", t2 - t1), ("plan", t3 - t2),
                           ("verify", t4 - t3), ("total", t4 - t0), ("wall", wall)):
            times[key].append(value)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["ok"], out["p4"] = float(ok), p4
    return out


def _ssh_base(cluster: object) -> list[str]:
    c = cluster  # an SshCluster
    return ["-F", "/dev/null", "-i", str(c.client_key),  # type: ignore[attr-defined]
            "-o", f"UserKnownHostsFile={c.known_hosts}", "-o", "BatchMode=yes",  # type: ignore[attr-defined]
            "-P", str(c.port)]  # type: ignore[attr-defined]


def bench_copies(mib: int, runs: int) -> dict[str, float]:
    """Median seconds of brctl backup (cold, resumed) and scp -3 of the same ``mib`` MiB.

    The runs interleave (brctl cold, brctl rerun, scp -3, and again) so that the
    shared machine's load hits all three alike; before each cold run the peer's copy
    is deleted. One untimed ``ckpt plan`` first: Python's imports are not the copy.
    """
    import shutil

    import yaml

    from brctl.cli.app import run
    from tests.kits.cluster import SshCluster, missing_requirements

    why = missing_requirements()
    if why:
        raise SystemExit(f"copies: cannot run: {why}")
    with tempfile.TemporaryDirectory() as tmp, \
            SshCluster(Path(tmp), 2, private_dirs=("/local/ckpt", "/local/ckpt.brctl-backup")) as cluster:
        step = cluster.node_path("node01", "/local/ckpt/step_1")
        step.mkdir(parents=True)
        for i in range(4):
            (step / f"shard{i}.bin").write_bytes(os.urandom(mib * (1 << 20) // 4))
        inv = cluster.inventory(job={"nodes": "node[01-02]", "tp": 1, "pp": 2},
                                python="/usr/bin/python3")
        inv["ckpt"] = {"dir": "/local/ckpt", "parallel": 4}
        path = Path(tmp) / "inv.yaml"
        path.write_text(yaml.safe_dump(inv))
        a, b = cluster.address("node01"), cluster.address("node02")
        scp = ["scp", "-3", "-q", "-r", *_ssh_base(cluster)]
        subprocess.run(["ssh", *[x if x != "-P" else "-p" for x in _ssh_base(cluster)],
                        f"root@{b}", "mkdir -p /local/ckpt/scp"], check=True)
        copy = cluster.node_path("node02", "/local/ckpt.brctl-backup/node01")
        devnull = open(os.devnull, "w")  # noqa: SIM115 - brctl's JSON is not needed here
        saved = sys.stdout
        times: dict[str, list[float]] = {"brctl_cold": [], "brctl_resume": [], "scp3": [],
                                         "brctl_restore": [], "scp3_restore": []}
        subprocess.run(["ssh", *[x if x != "-P" else "-p" for x in _ssh_base(cluster)],
                        f"root@{a}", "mkdir -p /local/ckpt/scp-back"], check=True)
        ckpt_a = cluster.node_path("node01", "/local/ckpt")
        try:
            sys.stdout = devnull
            run(["-i", str(path), "ckpt", "plan"])
            for _ in range(runs):
                shutil.rmtree(copy, ignore_errors=True)
                for label in ("brctl_cold", "brctl_resume"):
                    t0 = time.perf_counter()
                    code = run(["-i", str(path), "ckpt", "backup", "-w", "node01"])
                    times[label].append(time.perf_counter() - t0)
                    if code != 0:
                        raise SystemExit(f"brctl ckpt backup exited {code}")
                t0 = time.perf_counter()
                subprocess.run([*scp, f"root@{a}:/local/ckpt/step_1", f"root@{b}:/local/ckpt/scp/"],
                               check=True)
                times["scp3"].append(time.perf_counter() - t0)
                for old in ckpt_a.glob(".brctl-replaced-*"):  # the previous run's moved-aside step
                    shutil.rmtree(old)
                t0 = time.perf_counter()
                code = run(["-i", str(path), "ckpt", "restore", "--to", "node01", "--for", "node01"])
                times["brctl_restore"].append(time.perf_counter() - t0)
                if code != 0:
                    raise SystemExit(f"brctl ckpt restore exited {code}")
                t0 = time.perf_counter()
                subprocess.run([*scp, f"root@{b}:/local/ckpt.brctl-backup/node01/step_1/step_1",
                                f"root@{a}:/local/ckpt/scp-back/"], check=True)
                times["scp3_restore"].append(time.perf_counter() - t0)
        finally:
            sys.stdout = saved
            devnull.close()
        return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1024,16384,102400")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256, help="MiB to copy (0: skip the copy benchmark)")
    args = ap.parse_args(argv)
    print("| ranks | machines | index | plan | verify | total CPU | total wall | all peers valid | P(loss), k=4 |")
    print("|---|---|---|---|---|---|---|---|---|")
    sizes = [int(r) for r in args.ranks.split(",")]

    def row(label: str, r: dict[str, float]) -> None:
        print(f"| {label} | {r['index']:.3f} s | {r['plan']:.3f} s | {r['verify']:.3f} s | "
              f"{r['total']:.3f} s | {r['wall']:.3f} s | {bool(r['ok'])} | {r['p4']:.2e} |")

    for ranks in sizes:
        row(f"{ranks} | {ranks // 8}", bench_placement(ranks, args.runs))
    row(f"{sizes[-1]} (PP=1: fallback) | {sizes[-1] // 8}", bench_placement(sizes[-1], 1, pp=1))
    if args.mib:
        c = bench_copies(args.mib, args.runs)
        print()
        print(f"| copy of {args.mib} MiB node01 → node02 | seconds | MiB/s |")
        print("|---|---|---|")
        for label, name in (("brctl_cold", "brctl ckpt backup (cold, checksummed)"),
                            ("brctl_resume", "brctl ckpt backup (rerun: resumed, nothing sent)"),
                            ("scp3", "scp -3 (through this host, no checksums)")):
            print(f"| {name} | {c[label]:.2f} | {args.mib / c[label]:.0f} |")
        print(f"\nbrctl / scp -3 time ratio: {c['brctl_cold'] / c['scp3']:.2f}")
        print()
        print(f"| restore of {args.mib} MiB node02 → node01 | seconds | MiB/s |")
        print("|---|---|---|")
        for label, name in (("brctl_restore", "brctl ckpt restore (verified, staged, renamed)"),
                            ("scp3_restore", "scp -3 (through this host, no checksums)")):
            print(f"| {name} | {c[label]:.2f} | {args.mib / c[label]:.0f} |")
        print(f"\nbrctl restore / scp -3 time ratio: {c['brctl_restore'] / c['scp3_restore']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
