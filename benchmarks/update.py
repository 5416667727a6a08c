"""Benchmark ``brctl update push`` against ``pdcp`` and ``clush --copy`` of the same file.

``python benchmarks/update.py [--size-mb 200] [--nodes 16] [--runs 1]`` (needs root,
sshd and unshare: it starts N real sshd machines from tests/kits/cluster.py,
each with a private /opt/train).

The release is one tarball of ``--size-mb`` random bytes (incompressible: the worst
case for brctl's gzip, and the same bytes for every tool). Each tool copies it
to /opt/train on every machine, fan-out = N, fresh destination each run:

- ``brctl update push REL.tar -V vK``: inspect every machine, stream the artifact
  over paramiko, verify its sha256 on arrival, extract it into a staging
  directory and rename it into place (more work than a copy);
- ``brctl update push`` again: every machine already holds the verified release
  (what a rerun after a cut push or a catch-up costs for the machines that are done);
- ``pdcp -R ssh -f N`` (pdsh's copy, OpenSSH, runs ``pdcp -z`` on each node);
- ``clush -f N --copy`` (ClusterShell, scp underneath).

Measured: wall time and the controller's CPU (user+sys of the tool's process
tree, from ``RUSAGE_CHILDREN``), median of ``--runs``; every copy is checked on
every machine (size, and sha256 for the copies). The machines share this host's
cores, so wall times include the nodes' side (sshd decrypting, writing, and for
brctl extracting); CPU on the controller is the fairer comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kits.cluster import SshCluster, missing_requirements  # noqa: E402

BIN = Path(sys.executable).parent


def children_cpu() -> float:
    """User+sys seconds of every child process waited for so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``argv``; (wall seconds, CPU seconds of it and its children). Raises on failure."""
    cpu0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, cpu


def make_release(work: Path, size_mb: int) -> Path:
    """A tarball holding one ``size_mb`` MB file of random bytes."""
    blob = work / "weights.bin"
    with blob.open("wb") as fh:
        for _ in range(size_mb):
            fh.write(os.urandom(1 << 20))
    tarball = work / "release.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(blob, arcname="weights.bin")
    blob.unlink()
    return tarball


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def clean(cluster: SshCluster) -> None:
    """Empty every machine's /opt/train."""
    for name in cluster.names:
        base = cluster.node_path(name, "/opt/train")
        for child in base.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def check(cluster: SshCluster, rel: str, size: int, digest: str | None) -> None:
    """Every machine holds ``rel`` under /opt/train with this size (and sha256)."""
    for name in cluster.names:
        path = cluster.node_path(name, f"/opt/train/{rel}")
        if path.stat().st_size != size or (digest and sha256(path) != digest):
            raise SystemExit(f"{name}: {path} is wrong after the copy")


def ssh_options(cluster: SshCluster) -> list[str]:
    """OpenSSH options that reach the test machines (strict host keys, batch mode)."""
    return ["-F", "/dev/null", "-i", str(cluster.client_key), "-o", f"Port={cluster.port}",
            "-o", f"UserKnownHostsFile={cluster.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        raise SystemExit(f"cannot start the sshd cluster: {why}")
    pdcp, clush = shutil.which("pdcp"), shutil.which("clush", path=str(BIN)) or shutil.which(
        "clush")
    with tempfile.TemporaryDirectory(prefix="brctl-bench-update-") as tmp:
        work = Path(tmp)
        (work / "cluster").mkdir()
        tarball = make_release(work, args.size_mb)
        size, digest = tarball.stat().st_size, sha256(tarball)
        with SshCluster(work / "cluster", args.nodes, private_dirs=("/opt/train",)) as cluster:
            inv = cluster.write_inventory(work, job={"name": "bench"}, python="/usr/bin/python3",
                                          extra={"update": {"root": "/opt/train"},
                                                 "ssh": {"fanout": args.nodes}})
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            brctl = [sys.executable, "-m", "brctl", "-i", str(inv), "update", "push",
                     str(tarball)]
            addresses = f"127.0.0.[2-{args.nodes + 1}]"
            rows: dict[str, list[tuple[float, float]]] = {}

            def run(label: str, argv: list[str], extra_env: dict[str, str],
                    verify: Callable[[], None], fresh: bool = True) -> None:
                if fresh:
                    clean(cluster)
                wall, cpu = timed(argv, {**env, **extra_env})
                verify()
                rows.setdefault(label, []).append((wall, cpu))
                print(f"  {label}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)

            for k in range(args.runs):
                state = {"BRCTL_STATE": str(work / f"state{k}")}
                rel = f"releases/v{k}/weights.bin"
                run("brctl update push", [*brctl, "-V", f"v{k}"], state,
                    lambda rel=rel: check(cluster, rel, args.size_mb << 20, None))
                run("brctl update push (rerun, all present)", [*brctl, "-V", f"v{k}"], state,
                    lambda rel=rel: check(cluster, rel, args.size_mb << 20, None), fresh=False)
                if pdcp:
                    ssh_args = " ".join([*ssh_options(cluster), "-l%u", "%h"])
                    run("pdcp", [pdcp, "-R", "ssh", "-l", "root", "-f", str(args.nodes), "-w",
                                 addresses, str(tarball), "/opt/train/"],
                        {"PDSH_SSH_ARGS": ssh_args},
                        lambda: check(cluster, "release.tar", size, digest))
                if clush:
                    run("clush --copy", [clush, "-f", str(args.nodes), "-l", "root", "-w",
                                         addresses, "-o", " ".join(ssh_options(cluster)),
                                         "--copy", str(tarball), "--dest", "/opt/train/"], {},
                        lambda: check(cluster, "release.tar", size, digest))
            clean(cluster)
    base = statistics.median(w for w, _ in rows["pdcp"]) if "pdcp" in rows else None
    print(f"\n{args.size_mb} MB release to {args.nodes} sshd nodes, median of {args.runs}\n")
    print("| tool | wall | controller CPU | wall / pdcp |")
    print("|---|---|---|---|")
    for label, values in rows.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        ratio = f"{wall / base:.2f}" if base else "-"
        print(f"| {label} | {wall:.2f} s | {cpu:.2f} s | {ratio} |")


if __name__ == "__main__":
    main()
