"""Probes run isolated, and job-writable code never runs as root by accident (real processes).

- Isolation (issue 14): ``brctl health`` (a real CLI process) started from a directory
  holding a planted ``json.py`` and ``sitecustomize.py`` must not import them on a
  local node; the fake NVML still comes in, through the PYTHONPATH the node's ``env``
  declares.
- StrictModes (issue 12): over the real sshd cluster, an interpreter or a PYTHONPATH
  entry in a directory owned by uid 65534 (nobody) is refused (state ``refused``,
  exit 4, the path and its owner named, the planted code never run); with ``job.user:
  nobody`` the same code runs, as uid 65534 (read from inside the probe), and so does
  an argv brctl runs for the job (replay's ``--command`` path).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from brctl.core.transport import NodeState
from tests.conftest import validated
from tests.kits.cluster import SshCluster, scaled
from tests.kits.healthkit import fake_nvml, healthy_gpus, make_root

ROOT = Path(__file__).resolve().parents[2]
BRCTL = Path(sys.executable).parent / "brctl"  # the console script: its cwd is not on sys.path
NOBODY = 65534

PLANT = """import os, sys
open(os.path.join({where!r}, "ran-" + {name!r}), "w").write(str(os.getuid()))
"""


def _cli(*args: str | Path, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BRCTL_STATE": str(state)}
    return subprocess.run([str(BRCTL), *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=scaled(120))


def test_health_on_a_local_node_ignores_modules_planted_in_the_operators_cwd(tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    for name in ("json", "sitecustomize", "pynvml"):
        (evil / f"{name}.py").write_text(PLANT.format(where=str(evil), name=name)
                                         + "raise SystemExit('planted module ran')\n")
    make_root(tmp_path / "roots" / "here")
    env = fake_nvml(tmp_path / "nvml", healthy_gpus(2))
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "here", "connection": "local", "gpus": 2, "env": env}],
        "health": {"root": str(tmp_path / "roots") + "/{node}", "checks": ["gpu_count", "ecc"]},
    }))
    res = _cli("-i", inv, "--json", "health", cwd=evil, state=tmp_path / "state")
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {c["name"]: c for c in validated(json.loads(res.stdout))["nodes"]["here"]["checks"]}
    assert checks["gpu_count"]["status"] == "ok"  # the fake pynvml, from the declared PYTHONPATH
    assert sorted(p.name for p in evil.iterdir()) == ["json.py", "pynvml.py", "sitecustomize.py"]

    old_cwd = os.getcwd()
    os.chdir(evil)
    try:
        doc = _sysinfo(inv)["here"].document
    finally:
        os.chdir(old_cwd)
    assert doc is not None and doc["cwd"] == "/"
    assert sorted(p.name for p in evil.iterdir()) == ["json.py", "pynvml.py", "sitecustomize.py"]


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A directory the job user (nobody) owns and can reach: not under pytest's 0700 tmp."""
    path = Path(tempfile.mkdtemp(prefix="brctl-job-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _own(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


def _sysinfo(inv_path: Path) -> dict[str, Any]:
    """The sysinfo probe's results on every machine of the inventory (in-process)."""
    from brctl.load.inventory import load_inventory
    from brctl.remote.factory import RoutingTransport
    from brctl.remote.probes import ProbeRunner

    inv = load_inventory(inv_path)
    transport = RoutingTransport()
    try:
        return ProbeRunner(transport).run(list(inv.nodes.values()), "brctl.diagnostics.sysinfo", {})
    finally:
        transport.close()


def _probe(cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any], **kw: Any) -> Any:
    """``brctl --json nodes --probe`` and the probe documents themselves."""
    inv = cluster.write_inventory(tmp_path, **kw)
    res = brctl("-i", inv, "--json", "nodes", "--probe")
    docs = {n: r.document for n, r in _sysinfo(inv).items()} if res.exit_code == 0 else {}
    return res, docs


def test_a_job_writable_interpreter_is_refused_or_run_as_job_user(
        make_cluster: Callable[..., SshCluster], tmp_path: Path, job_dir: Path,
        brctl: Callable[..., Any]) -> None:
    cluster = make_cluster(2)
    (job_dir / "bin").mkdir()
    python = job_dir / "bin" / "python"
    shutil.copy2(os.path.realpath("/usr/bin/python3"), python)  # a conda env the job user owns
    _own(job_dir, NOBODY)
    res, _ = _probe(cluster, tmp_path, brctl, node_env={}, python=str(python))
    assert res.exit_code == 4, res.stdout
    for name in cluster.names:
        probe = res.json["nodes"][name]["probe"]
        assert probe["state"] == "refused" and probe["ok"] is False
        assert f"{job_dir} is owned by nobody (uid 65534)" in probe["error"]

    res, docs = _probe(cluster, tmp_path, brctl, python=str(python),
                       job={"name": "train", "user": "nobody"})
    assert res.exit_code == 0, res.stdout
    for name in cluster.names:
        probe = docs[name]
        assert probe["uid"] == NOBODY and probe["executable"] == str(python) and probe["cwd"] == "/"
        assert probe["ssh_connection"].split()[2] == cluster.address(name)


def test_a_job_writable_pythonpath_entry_is_refused_or_run_as_job_user(
        make_cluster: Callable[..., SshCluster], tmp_path: Path, job_dir: Path,
        brctl: Callable[..., Any]) -> None:
    cluster = make_cluster(1)
    site = job_dir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PLANT.format(where=str(job_dir), name="site"))
    _own(job_dir, NOBODY)
    env = {"node01": {"PYTHONPATH": f"/nonexistent/ignored:{site}"}}
    res, _ = _probe(cluster, tmp_path, brctl, node_env=env)
    assert res.exit_code == 4, res.stdout
    error = res.json["nodes"]["node01"]["probe"]["error"]
    assert f"PYTHONPATH entry {site}" in error and "nobody (uid 65534)" in error
    assert not (job_dir / "ran-site").exists()  # refused before any of it ran

    res, docs = _probe(cluster, tmp_path, brctl, node_env=env,
                       job={"name": "train", "user": "nobody"})
    assert res.exit_code == 0, res.stdout
    assert docs["node01"]["uid"] == NOBODY
    assert (job_dir / "ran-site").read_text() == str(NOBODY)  # its sitecustomize, as nobody

    # A root-owned entry is trusted: it runs as root, its sitecustomize too (PYTHONPATH semantics).
    _own(job_dir, 0)
    (job_dir / "ran-site").unlink()
    res, docs = _probe(cluster, tmp_path, brctl, node_env=env)
    assert res.exit_code == 0, res.stdout
    assert docs["node01"]["uid"] == 0 and (job_dir / "ran-site").read_text() == "0"


def test_a_command_for_the_job_runs_as_job_user(make_cluster: Callable[..., SshCluster],
                                                 tmp_path: Path) -> None:
    from brctl.load.inventory import load_inventory
    from brctl.remote.factory import RoutingTransport
    from brctl.remote.probes import ProbeRunner

    cluster = make_cluster(1)
    inv = load_inventory(cluster.write_inventory(tmp_path, job={"name": "t", "user": "nobody"}))
    node = inv.node("node01")
    transport = RoutingTransport()
    try:
        runner = ProbeRunner(transport)
        assert runner.run([node], "brctl.diagnostics.sysinfo", {})["node01"].ok  # code cached
        argv = runner.as_job_user(node, ["sh", "-c", 'echo "$(id -u) $(id -g) $HOME"; pwd'])
        res = transport.run(node, argv, timeout=scaled(30))
        assert res.stdout.split("\n")[:2] == [f"{NOBODY} {NOBODY} /nonexistent", "/"], res
    finally:
        transport.close()


def _loads(program: str, library: str) -> None:
    """The planted library is one ``program`` (on sshd's default PATH, the nodes' login PATH)
    really loads (else the test proves nothing)."""
    found = shutil.which(program, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert found, program
    out = subprocess.run(["ldd", os.path.realpath(found)], capture_output=True, text=True).stdout
    assert f"{library} =>" in out, out


def test_a_job_writable_path_or_library_the_env_declares_never_runs_as_root(
        make_cluster: Callable[..., SshCluster], tmp_path: Path, job_dir: Path,
        brctl: Callable[..., Any]) -> None:
    """The node's ``env`` was put in front of the probe bootstrap (``env K=V python3 ...``): a
    declared PATH chose which ``python3`` ran it as root, LD_LIBRARY_PATH/LD_PRELOAD what it
    loaded, before any check. Now the bootstrap gets the env in its request: a job-writable
    entry is refused, or applied only once the probe runs as job.user (``setpriv``, root,
    never loads it)."""
    cluster = make_cluster(1)
    _loads("python3", "libz.so.1")
    _loads("setpriv", "libcap-ng.so.0")
    lib, bin_ = job_dir / "lib", job_dir / "bin"
    lib.mkdir()
    bin_.mkdir()
    for name in ("libz.so.1", "libcap-ng.so.0"):
        (lib / name).write_bytes(b"not a library\n")  # a program that loads it cannot start
    (bin_ / "python3").write_text(f"#!/bin/sh\nid -u > {job_dir}/ran-python3\n"
                                  'exec /usr/bin/python3 "$@"\n')
    (bin_ / "python3").chmod(0o755)
    _own(job_dir, NOBODY)
    cases = {"LD_LIBRARY_PATH": (str(lib), f"LD_LIBRARY_PATH entry {lib}"),
             "LD_PRELOAD": (f"{lib}/libz.so.1", f"LD_PRELOAD file {lib}/libz.so.1"),
             "PATH": (f"{bin_}:/usr/bin:/bin", str(bin_)),
             "LOCPATH": (str(lib), f"LOCPATH entry {lib}")}  # glibc's: python3 parses locales
    for key, (value, named) in cases.items():
        res, _ = _probe(cluster, tmp_path, brctl, node_env={"node01": {key: value}})
        assert res.exit_code == 4, (key, res.stdout)
        probe = res.json["nodes"]["node01"]["probe"]
        assert probe["state"] == "refused" and named in probe["error"], (key, probe)
        assert "nobody (uid 65534)" in probe["error"]
        assert not (job_dir / "ran-python3").exists(), key

    # As job.user it is the job's own code: the probe's python3 (as nobody) loads the
    # planted libz and cannot start; setpriv, root, did not load the planted libcap-ng.
    inv = cluster.write_inventory(tmp_path, node_env={"node01": {"LD_LIBRARY_PATH": str(lib)}},
                                  job={"name": "train", "user": "nobody"})
    run = _sysinfo(inv)["node01"].run
    assert run.state is NodeState.FAILED, run
    assert f"{lib}/libz.so.1" in run.stderr and "libcap-ng" not in run.stderr, run.stderr
    res, docs = _probe(cluster, tmp_path, brctl, node_env={"node01": {"PATH": f"{bin_}:/usr/bin:/bin"}},
                       job={"name": "train", "user": "nobody"})
    assert res.exit_code == 0 and docs["node01"]["uid"] == NOBODY, res.stdout
    assert (job_dir / "ran-python3").read_text().strip() == str(NOBODY)

    # Root-owned, the declared library path is trusted and reaches the probe, run as root.
    _own(job_dir, 0)
    inv = cluster.write_inventory(tmp_path, node_env={"node01": {"LD_LIBRARY_PATH": str(lib)}})
    run = _sysinfo(inv)["node01"].run
    assert run.state is NodeState.FAILED and f"{lib}/libz.so.1" in run.stderr, run
