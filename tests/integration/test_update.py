"""``brctl update`` over the real sshd cluster: every machine has its own private /opt/train.

Faults are injected only here: a node's ``env`` points PYTHONPATH at a
``sitecustomize`` that wraps the probe's stdin (``BRCTL_TEST_LINK=flip`` flips one
bit of the artifact in flight, ``slow`` throttles it so a push can be cut), or the
node's sshd is stopped. Production code has no switch for any of this.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import validated
from tests.kits.cluster import SshCluster, scaled

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BARE_PYTHON = "/usr/bin/python3"  # the nodes need nothing but python3

SITECUSTOMIZE = r'''
import io, os, sys, time
_MODE = os.environ.get("BRCTL_TEST_LINK", "")
_FLIP_AT = 5000  # past any JSON request: only an artifact is that long


class _Link(io.RawIOBase):
    """stdin as a faulty link: flips one bit at _FLIP_AT, or delivers 64 KiB per 50 ms."""

    pos = 0

    def readable(self):
        return True

    def readinto(self, buf):
        data = os.read(0, min(len(buf), 65536))
        if _MODE == "slow" and data:
            time.sleep(0.05)
        if _MODE == "flip" and self.pos <= _FLIP_AT < self.pos + len(data):
            i = _FLIP_AT - self.pos
            data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
        self.pos += len(data)
        buf[:len(data)] = data
        return len(data)


if _MODE and any('"receive"' in arg for arg in sys.argv):  # only the artifact's stream
    sys.stdin = io.TextIOWrapper(io.BufferedReader(_Link()))
'''


@pytest.fixture
def cluster(make_cluster: Callable[..., SshCluster]) -> SshCluster:
    return make_cluster(4, private_dirs=("/opt/train",))


@pytest.fixture
def link_dir(tmp_path: Path) -> Path:
    path = tmp_path / "link"
    path.mkdir()
    (path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return path


def write_inv(cluster: SshCluster, tmp_path: Path, node_env: dict[str, Any] | None = None,
              **job: Any) -> Path:
    return cluster.write_inventory(
        tmp_path, job={"name": "train", "tp": 1, **job}, node_env=node_env or {},
        python=BARE_PYTHON,
        extra={"update": {"root": "/opt/train"}, "ssh": {"command_timeout": scaled(60)}})


def make_release(path: Path, version: str, blob: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.py").write_text(f"VERSION = {version!r}\n")
    if blob:
        (path / "weights.bin").write_bytes(os.urandom(blob))
    return path


def current(cluster: SshCluster, name: str) -> str | None:
    link = cluster.node_path(name, "/opt/train/current")
    return os.readlink(link) if os.path.islink(link) else None


def test_push_directory_and_git_revision_lazy_then_apply(
        brctl, state_dir, cluster: SshCluster, tmp_path: Path) -> None:
    inv = write_inv(cluster, tmp_path)
    src = make_release(tmp_path / "src", "v1")
    res = brctl("-i", inv, "--json", "update", "push", src, "--version", "v1")
    assert res.exit_code == 0, res.stderr
    assert {n["state"] for n in res.json["nodes"].values()} == {"staged"}
    for name in cluster.names:  # each machine got its own copy, nothing switched yet
        staged = cluster.node_path(name, "/opt/train/releases/v1/train.py")
        assert staged.read_text() == "VERSION = 'v1'\n"
        assert current(cluster, name) is None
    repo = tmp_path / "repo"
    make_release(repo, "g1")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "g1"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                        *args], check=True, capture_output=True)
    res = brctl("-i", inv, "--json", "update", "push", repo, "--rev", "HEAD", "-V", "g1")
    assert res.exit_code == 0, res.stderr
    assert res.json["source"].startswith("git:")
    st = brctl("-i", inv, "--json", "update", "status")
    assert st.json["pending"]["version"] == "g1"
    assert all(n["pending_staged"] for n in st.json["nodes"].values())
    res = brctl("-i", inv, "--json", "update", "apply")
    assert res.exit_code == 0 and res.json["outcome"] == "ok", res.stdout
    assert {current(cluster, n) for n in cluster.names} == {"releases/g1"}
    hist = brctl("-i", inv, "--json", "update", "history").json["events"]
    assert [(e["action"], e["version"]) for e in hist] == [("push", "v1"), ("push", "g1"),
                                                            ("apply", "g1")]


def test_urgent_runs_the_restart_hook_and_rollback(
        brctl, state_dir, cluster: SshCluster, tmp_path: Path) -> None:
    marker = tmp_path / "restarted"
    hook = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')",
            str(marker), "{version} {nnodes} {nodes_folded}"]
    inv = write_inv(cluster, tmp_path, restart_command=hook)
    assert brctl("-i", inv, "update", "push", make_release(tmp_path / "a", "v1"), "-V", "v1",
                 "--urgent").exit_code == 0
    res = brctl("-i", inv, "--json", "update", "push", make_release(tmp_path / "b", "v2"),
                "-V", "v2", "--urgent")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert res.json["switch"]["outcome"] == "ok" and res.json["switch"]["restart"]["exit_code"] == 0
    assert marker.read_text() == "v1 4 node[01-04]\nv2 4 node[01-04]\n"
    assert {current(cluster, n) for n in cluster.names} == {"releases/v2"}
    res = brctl("-i", inv, "--json", "update", "rollback", "--restart")
    assert res.exit_code == 0 and res.json["version"] == "v1" and res.json["from_version"] == "v2"
    assert {current(cluster, n) for n in cluster.names} == {"releases/v1"}
    assert marker.read_text().splitlines()[-1] == "v1 4 node[01-04]"


def test_status_with_one_drifted_node(brctl, state_dir, cluster: SshCluster,
                                      tmp_path: Path) -> None:
    inv = write_inv(cluster, tmp_path)
    for v in ("v1", "v2"):
        brctl("-i", inv, "update", "push", make_release(tmp_path / v, v), "-V", v)
        assert brctl("-i", inv, "update", "apply").exit_code == 0
    link = cluster.node_path("node03", "/opt/train/current")
    link.unlink()
    link.symlink_to("releases/v1")
    res = brctl("-i", inv, "update", "status")
    assert res.exit_code == 1 and "node03" in res.stdout and "DRIFT" in res.stdout
    assert brctl("-i", inv, "--json", "update", "status").json["drift"] == ["node03"]
    assert brctl("-i", inv, "update", "apply").exit_code == 0  # switches node03 back
    assert brctl("-i", inv, "update", "status").exit_code == 0


def test_unreachable_node_is_reported_then_caught_up(
        brctl, state_dir, cluster: SshCluster, tmp_path: Path) -> None:
    inv = write_inv(cluster, tmp_path)
    cluster.stop_node("node04")
    res = brctl("-i", inv, "--json", "update", "push", make_release(tmp_path / "s", "v1"),
                "-V", "v1")
    assert res.exit_code == 3 and res.json["nodes"]["node04"]["state"] == "unreachable"
    res = brctl("-i", inv, "--json", "update", "apply")  # never mixes versions: refuses
    assert res.exit_code == 3 and res.json["outcome"] == "incomplete"
    assert {current(cluster, n) for n in cluster.names} == {None}
    cluster.start_node("node04")
    res = brctl("-i", inv, "--json", "update", "apply")
    assert res.exit_code == 0, res.stdout
    assert res.json["nodes"]["node04"]["state"] == "switched"
    assert {current(cluster, n) for n in cluster.names} == {"releases/v1"}


def test_corrupted_transfer_is_detected_by_checksum(
        brctl, state_dir, cluster: SshCluster, tmp_path: Path, link_dir: Path) -> None:
    env = {"node02": {"PYTHONPATH": str(link_dir), "BRCTL_TEST_LINK": "flip"}}
    inv = write_inv(cluster, tmp_path, node_env=env)
    src = make_release(tmp_path / "s", "v1", blob=200_000)
    res = brctl("-i", inv, "--json", "update", "push", src, "-V", "v1")
    assert res.exit_code == 1, res.stdout
    bad = res.json["nodes"]["node02"]
    assert bad["state"] == "failed" and "sha256 mismatch" in bad["message"]
    assert not cluster.node_path("node02", "/opt/train/releases/v1").exists()
    assert not list(cluster.node_path("node02", "/opt/train/.incoming").glob("*.partial"))
    assert cluster.node_path("node01", "/opt/train/releases/v1/weights.bin").exists()
    res = brctl("-i", inv, "--json", "update", "apply")  # the link is still bad: nobody switches
    assert res.exit_code == 1 and res.json["outcome"] == "failed"
    assert {current(cluster, n) for n in cluster.names} == {None}


def test_the_switch_is_atomic_for_a_reader(brctl, state_dir, cluster: SshCluster,
                                           tmp_path: Path) -> None:
    inv = write_inv(cluster, tmp_path)
    for v in ("v1", "v2"):
        brctl("-i", inv, "update", "push", make_release(tmp_path / v, v), "-V", v)
    assert brctl("-i", inv, "update", "apply").exit_code == 0
    link = cluster.node_path("node01", "/opt/train/current")
    seen: dict[str, int] = {}
    missing = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal missing
        while not stop.is_set():
            try:
                text = (link / "train.py").read_text()  # resolve the link, read through it
            except FileNotFoundError:
                missing += 1
                continue
            seen[text] = seen.get(text, 0) + 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for v in ("v1", "v2", "v1", "v2"):
            assert brctl("-i", inv, "update", "rollback", "--to", v).exit_code == 0
    finally:
        stop.set()
        thread.join()
    assert missing == 0
    assert set(seen) == {"VERSION = 'v1'\n", "VERSION = 'v2'\n"}


@pytest.mark.slow
def test_a_push_cut_midway_resumes_on_rerun(state_dir, cluster: SshCluster, tmp_path: Path,
                                            link_dir: Path) -> None:
    slow = {"node04": {"PYTHONPATH": str(link_dir), "BRCTL_TEST_LINK": "slow"}}
    inv = write_inv(cluster, tmp_path, node_env=slow)
    src = make_release(tmp_path / "s", "v1", blob=2_000_000)  # ~1.5 s to node04 at 1.3 MB/s
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BRCTL_STATE": str(state_dir)}
    push = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), "update", "push",
                             str(src), "-V", "v1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    incoming = cluster.node_path("node04", "/opt/train/.incoming")
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        partial = list(incoming.glob("*.partial")) if incoming.exists() else []
        others = all(cluster.node_path(n, "/opt/train/releases/v1").exists()
                     for n in ("node01", "node02", "node03"))
        if others and partial and partial[0].stat().st_size > 0:
            break
        time.sleep(0.05)
    else:
        push.kill()
        pytest.fail("node04 never started receiving")
    push.send_signal(signal.SIGKILL)  # the controller dies mid-transfer
    push.wait()
    assert push.returncode == -signal.SIGKILL
    while cluster.node_pids("node04", "brctl.diagnostics.release"):
        assert time.monotonic() < deadline, "the cut receiver never exited"
        time.sleep(0.05)
    kept = partial[0].stat().st_size
    assert kept > 0 and not cluster.node_path("node04", "/opt/train/releases/v1").exists()
    inv = write_inv(cluster, tmp_path)  # the link is healthy again
    rerun = subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), "--json", "update",
                            "push", str(src), "-V", "v1"], env=env, capture_output=True,
                           text=True, timeout=scaled(120))
    assert rerun.returncode == 0, rerun.stderr
    doc = validated(json.loads(rerun.stdout))
    size = doc["size"]
    for name in ("node01", "node02", "node03"):  # finished before the cut: nothing resent
        assert doc["nodes"][name] == {"state": "present", "message": "", "bytes_sent": 0}
    assert doc["nodes"]["node04"]["state"] == "staged"
    assert doc["nodes"]["node04"]["bytes_sent"] == size - kept
    assert not list(cluster.node_path("node04", "/opt/train/releases").glob(".staging-*"))
    assert cluster.node_path("node04", "/opt/train/releases/v1/weights.bin").stat().st_size == \
        2_000_000
    assert current(cluster, "node04") is None  # lazy: staged, never switched
    assert doc["pending"]["version"] == "v1"
