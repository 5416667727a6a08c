"""Fan-out benchmark: brctl's SshTransport against clush and pdsh on real sshd nodes.

Starts N (default 64) real sshd "machines" with the integration tier's cluster
(tests/kits/cluster.py: needs root, openssh-server, util-linux), then times,
side by side in one run, ``true`` on every node:

- brctl, in process: ``fanout.run_all`` over ``SshTransport`` with fresh
  connections, on already-open connections, and sharded over 2 worker processes;
- ``brctl exec true`` as a whole CLI process (interpreter start included);
- ``clush -b`` (ClusterShell) and ``pdsh`` (Debian, ssh rcmd), each at its own
  defaults and with ``KexAlgorithms=curve25519-sha256`` pinned.

Client CPU per host is the fair figure: the local sshds share the machine's cores,
so wall time is capped by the server side whatever the client does. In-process
CPU is ``time.process_time()`` (+ ``RUSAGE_CHILDREN`` for spawned workers);
CLI tools are measured with ``RUSAGE_CHILDREN`` (the tool and every ssh it
waited for). Then it loads a 12,000-entry known_hosts with brctl's parser and
with paramiko's ``HostKeys.load`` (quadratic: measured up to ``--paramiko-max``
entries and extrapolated as c·n², unless ``--paramiko-max 12000``).

Run: ``python benchmarks/fanout.py [--nodes 64] [--runs 3] [--json]`` (as root).

``--whole ROUNDS`` races the whole ``brctl exec true`` process against ``pdsh`` with
curve25519 pinned instead, interleaved round by round on the same machines (the load
of a shared machine moves too much between one tool's runs and the next's), and adds
node CPU per host: what the sshds and everything they started used (each listener's
own and its reaped children's CPU, from ``/proc``), since here the "nodes" share the
controller's cores. ``--before DIR`` (repeatable) adds another brctl checkout (e.g. a
``git worktree`` of the previous main, or of an experiment) to the race, labelled by
its folder's name. A calibration loop is timed each round
so runs on differently loaded machines can be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from brctl.analysis.inventory import SshSection  # noqa: E402
from brctl.core.transport import Node, NodeState  # noqa: E402
from brctl.remote.fanout import run_all  # noqa: E402
from brctl.remote.shard import run_sharded  # noqa: E402
from brctl.remote.ssh.known_hosts import KnownHostsCache  # noqa: E402
from brctl.remote.ssh.transport import SshTransport  # noqa: E402
from brctl.remote.wrap import shell_line  # noqa: E402
from tests.kits.cluster import SshCluster, missing_requirements, running_cluster  # noqa: E402

CURVE = "curve25519-sha256"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(fn: Callable[[], bool], runs: int) -> dict[str, float]:
    """Median wall and client CPU (this process + waited-for children) of ``fn``."""
    walls, cpus = [], []
    for _ in range(runs):
        c0, k0, w0 = time.process_time(), _children_cpu(), time.perf_counter()
        ok = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0 + _children_cpu() - k0)
        if not ok:
            raise SystemExit("a run did not succeed on every node; see above")
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}


def ssh_config(cluster: SshCluster, path: Path, kex: str | None) -> Path:
    lines = [
        "Host 127.0.0.*",
        f"  Port {cluster.port}",
        "  User root",
        f"  IdentityFile {cluster.client_key}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {cluster.known_hosts}",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
    ]
    if kex:
        lines.append(f"  KexAlgorithms {kex}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(argv: list[str], env: dict[str, str] | None = None, expect_lines: int = 0,
            cwd: Path | None = None) -> bool:
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=cwd)
    if r.returncode != 0:
        print(f"  {argv[0]} exited {r.returncode}: {r.stderr.strip()[:400]}", file=sys.stderr)
        return False
    return True


def bench_fanout(cluster: SshCluster, runs: int, work: Path) -> list[dict[str, Any]]:
    n = len(cluster.names)
    nodes = [
        Node(
            name=name, address=cluster.address(name), port=cluster.port,
            identity_file=str(cluster.client_key), known_hosts=str(cluster.known_hosts),
        )
        for name in cluster.names
    ]
    hosts = f"127.0.0.[2-{n + 1}]"
    rows: list[dict[str, Any]] = []

    def add(label: str, fig: dict[str, float]) -> None:
        rows.append({"tool": label, "wall_s": fig["wall"], "cpu_ms_per_host": fig["cpu"] / n * 1000})
        print(f"  {label:<48} wall {fig['wall']:6.2f} s   CPU/host {fig['cpu'] / n * 1000:6.1f} ms",
              file=sys.stderr)  # fmt: skip

    def all_ok(results: dict[str, Any]) -> bool:
        bad = [r for r in results.values() if r.state is not NodeState.OK]
        for r in bad[:3]:
            print(f"  {r.node}: {r.state.value} {r.stderr.strip()}", file=sys.stderr)
        return not bad

    def fresh() -> bool:
        t = SshTransport(ssh_config=os.devnull)
        try:
            return all_ok(run_all(t, nodes, ["true"], timeout=60, concurrency=64))
        finally:
            t.close()

    add("brctl SshTransport, fresh connections", measure(fresh, runs))

    pooled = SshTransport(ssh_config=os.devnull)
    try:
        all_ok(run_all(pooled, nodes, ["true"], timeout=60, concurrency=64))  # open them
        add("brctl SshTransport, open connections",
            measure(lambda: all_ok(run_all(pooled, nodes, ["true"], timeout=60, concurrency=64)), runs))  # fmt: skip
    finally:
        pooled.close()

    def sharded() -> bool:
        # Directly: run_all would not shard 64 nodes (fewer than 128 per worker).
        t = SshTransport(ssh_config=os.devnull)
        try:
            results = run_sharded(t.process_factory(2), nodes, ["true"], processes=2, timeout=60)
            return all_ok(results)
        finally:
            t.close()

    add("brctl SshTransport, fresh, processes=2", measure(sharded, runs))

    inv = work / "inventory.yaml"
    inv.write_text(yaml.safe_dump(cluster.inventory(), sort_keys=False))
    brctl = [sys.executable, "-m", "brctl", "-i", str(inv), "exec", "--", "true"]
    # As installed: .pyc files present (a PYTHONDONTWRITEBYTECODE environment would
    # compile brctl anew on every run, ~0.2 s), kept out of the tree; one warm-up run.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    run_cli(brctl, env)
    add("brctl exec true (whole CLI process)", measure(lambda: run_cli(brctl, env), runs))

    clush = shutil.which("clush") or str(Path(sys.executable).parent / "clush")
    for kex in (None, CURVE):
        cfg = ssh_config(cluster, work / f"ssh_config_{kex or 'default'}", kex)
        label = "pinned curve25519" if kex else "defaults"
        if Path(clush).exists():
            add(f"clush -b ({label})",
                measure(lambda cfg=cfg: run_cli([clush, "-b", "-w", hosts, "-o", f"-F {cfg}", "true"]), runs))  # fmt: skip
        else:
            print("  clush: not installed (pip install clustershell): skipped", file=sys.stderr)
        pdsh_env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {cfg}"}
        if shutil.which("pdsh"):
            add(f"pdsh ({label})",
                measure(lambda e=pdsh_env: run_cli(["pdsh", "-S", "-w", hosts, "true"], e), runs))  # fmt: skip
    return rows


_TICK = os.sysconf("SC_CLK_TCK")


def node_cpu(cluster: SshCluster) -> float:
    """CPU seconds the cluster's sshds used so far, with every session they reaped."""
    total = 0
    for name in cluster.names:
        for pid in cluster.node_pids(name, r"sshd -D"):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


def _settle(cluster: SshCluster, seconds: float = 10.0) -> None:
    """Wait until no node has a session left (``sshd: ...``), so its listener reaped them all."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(cluster.node_pids(n, r"^sshd: ") for n in cluster.names):
        time.sleep(0.05)
    time.sleep(0.1)


def _calibration() -> float:
    t0 = time.process_time()
    sum(range(10**7))
    return time.process_time() - t0


def bench_whole(cluster: SshCluster, rounds: int, work: Path, before: list[Path]) -> list[dict[str, Any]]:
    """The whole ``brctl exec true`` against pdsh pinned, interleaved: medians of ``rounds``."""
    n = len(cluster.names)
    inv = work / "inventory.yaml"
    inv.write_text(yaml.safe_dump(cluster.inventory(), sort_keys=False))
    cfg = ssh_config(cluster, work / "ssh_config_pinned", CURVE)
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # (label, argv, env, cwd): each brctl runs from its own tree (``-m`` puts the cwd first)
    contenders: list[tuple[str, list[str], dict[str, str], Path | None]] = []
    for label, tree in (("brctl exec true", ROOT), *((f"brctl exec true, {b.name}", b) for b in before)):
        env = {**base_env, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(work / f"pycache-{len(contenders)}")}
        contenders.append((label, [sys.executable, "-m", "brctl", "-i", str(inv), "exec", "--", "true"],
                           env, tree))
    if shutil.which("pdsh"):
        pdsh_env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {cfg}"}
        hosts = f"127.0.0.[2-{n + 1}]"
        contenders.append(("pdsh, curve25519 pinned", ["pdsh", "-S", "-w", hosts, "true"], pdsh_env, None))
        # The same node-side work as brctl's: pdsh sending brctl's supervised command line
        # (pdsh reads % in a command as its own: %% is one %).
        line = shell_line("python3", ["true"], SshSection().command_timeout)  # brctl exec's default
        contenders.append(("pdsh pinned, brctl's supervised command",
                           ["pdsh", "-S", "-w", hosts, line.replace("%", "%%")], pdsh_env, None))
    for _, argv, env, cwd in contenders:  # warm-up: .pyc files written, pages cached
        run_cli(argv, env, cwd=cwd)
    figures: dict[str, dict[str, list[float]]] = {c[0]: {"wall": [], "cpu": [], "node": []} for c in contenders}
    calibration = []
    for _ in range(rounds):
        calibration.append(_calibration())
        for label, argv, env, cwd in contenders:
            k0, c0, w0 = _children_cpu(), node_cpu(cluster), time.perf_counter()
            if not run_cli(argv, env, cwd=cwd):
                raise SystemExit(f"{label}: a run did not succeed on every node; see above")
            wall = time.perf_counter() - w0
            _settle(cluster)  # every session reaped: its CPU is this contender's, not the next's
            figures[label]["wall"].append(wall)
            figures[label]["cpu"].append(_children_cpu() - k0)
            figures[label]["node"].append(node_cpu(cluster) - c0)
    rows = []
    for label, fig in figures.items():
        row = {"tool": label, "wall_s": statistics.median(fig["wall"]),
               "cpu_ms_per_host": statistics.median(fig["cpu"]) / n * 1000,
               "node_cpu_ms_per_host": statistics.median(fig["node"]) / n * 1000,
               "calibration_s": statistics.median(calibration)}
        rows.append(row)
        print(f"  {label:<32} wall {row['wall_s']:6.2f} s   client CPU/host {row['cpu_ms_per_host']:6.1f} ms"
              f"   node CPU/host {row['node_cpu_ms_per_host']:6.1f} ms", file=sys.stderr)
    return rows


def bench_known_hosts(work: Path, entries: int, paramiko_max: int) -> dict[str, Any]:
    import paramiko
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keys = [
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        for _ in range(64)
    ]
    lines = [f"gpu{i:05d},10.{i // 65536}.{i // 256 % 256}.{i % 256} {keys[i % 64]}" for i in range(entries)]
    path = work / "known_hosts_big"
    path.write_text("\n".join(lines) + "\n")
    # CPU time: wall time on a shared machine measures the neighbours.
    t0, w0 = time.process_time(), time.perf_counter()
    kh = KnownHostsCache().load(str(path))
    ours, ours_wall = time.process_time() - t0, time.perf_counter() - w0
    assert kh.exact.get("gpu00042")

    sizes = sorted({min(paramiko_max, entries), min(paramiko_max, entries) // 2})
    timings = {}
    for size in sizes:
        small = work / f"known_hosts_{size}"
        small.write_text("\n".join(lines[:size]) + "\n")
        t0 = time.process_time()
        paramiko.HostKeys(str(small))
        timings[size] = time.process_time() - t0
    top = max(timings)
    extrapolated = timings[top] * (entries / top) ** 2
    return {
        "entries": entries,
        "brctl_s": ours,
        "brctl_wall_s": ours_wall,
        "paramiko_measured": {str(k): v for k, v in timings.items()},
        "paramiko_s": timings[top] if top == entries else extrapolated,
        "paramiko_extrapolated": top != entries,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--known-hosts", type=int, default=12000)
    ap.add_argument("--paramiko-max", type=int, default=3000, help="largest file paramiko loads")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--known-hosts-only", action="store_true", help="skip the fan-out part")
    ap.add_argument("--whole", type=int, metavar="ROUNDS", default=0,
                    help="only the whole brctl exec against pdsh pinned, interleaved ROUNDS times")
    ap.add_argument("--before", type=Path, action="append", default=[],
                    help="with --whole: another brctl checkout to race too (repeatable)")
    args = ap.parse_args()
    why = missing_requirements()
    if why and not args.known_hosts_only:
        print(f"fanout benchmark: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="brctl-bench-"))
    if args.whole:
        try:
            print(f"starting {args.nodes} sshd nodes...", file=sys.stderr)
            with running_cluster(args.nodes) as cluster:
                rows = bench_whole(cluster, args.whole, work, args.before)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if args.json:
            print(json.dumps({"nodes": args.nodes, "rounds": args.whole, "whole": rows}, indent=2))
            return 0
        print(f"\n{args.nodes} nodes, `true`, interleaved, median of {args.whole} rounds "
              f"(calibration {rows[0]['calibration_s']:.2f} s)\n")
        print("| client | wall | client CPU / host | node CPU / host |")
        print("|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['tool']} | {r['wall_s']:.2f} s | {r['cpu_ms_per_host']:.1f} ms | "
                  f"{r['node_cpu_ms_per_host']:.1f} ms |")
        return 0
    try:
        rows = []
        if not args.known_hosts_only:
            print(f"starting {args.nodes} sshd nodes...", file=sys.stderr)
            with running_cluster(args.nodes) as cluster:
                rows = bench_fanout(cluster, args.runs, work)
        print("known_hosts...", file=sys.stderr)
        kh = bench_known_hosts(work, args.known_hosts, args.paramiko_max)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"nodes": args.nodes, "runs": args.runs, "fanout": rows, "known_hosts": kh}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"\n{args.nodes} nodes, `true`, median of {args.runs} runs\n")
    print("| client | wall | client CPU / host |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['tool']} | {r['wall_s']:.2f} s | {r['cpu_ms_per_host']:.1f} ms |")
    how = "extrapolated c·n² from " + ", ".join(kh["paramiko_measured"]) if kh["paramiko_extrapolated"] else "measured"
    print(f"\nknown_hosts, {kh['entries']} entries, CPU: brctl {kh['brctl_s']:.3f} s "
          f"(wall {kh['brctl_wall_s']:.3f} s); paramiko HostKeys.load {kh['paramiko_s']:.1f} s ({how})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
