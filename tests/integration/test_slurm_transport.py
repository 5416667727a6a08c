"""``connection: slurm`` against a real Slurm and a running ``sbatch`` job: ``exec``,
``health`` and ``stacks`` work unchanged over srun, a failing node and a hung one keep
the states they have over ssh, and a machine outside the job is reached by an
allocation of its own.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tests.kits.cluster import scaled
from tests.kits.slurm_cluster import SlurmCluster
from tests.kits.waiting import wait_for

pytestmark = pytest.mark.integration

TRAIN_TAG = "brctl-slurm-train"
# one rank per machine, RANK as a launcher sets it; the main thread waits in train_step
TRAIN = ("srun sh -c 'RANK=$SLURM_PROCID LOCAL_RANK=0 WORLD_SIZE=$SLURM_NTASKS exec python3 -c \""
         "import time\ndef train_step():\n    time.sleep(600)\ntrain_step()\" " + TRAIN_TAG + "'")


@pytest.fixture
def job(slurm_cluster: SlurmCluster) -> Iterator[str]:
    """A running job on node01-03 (node04 stays idle: a standby)."""
    job_id = slurm_cluster.sbatch(TRAIN, "-N", "3", "-w", "node[01-03]")
    try:
        slurm_cluster.wait_job(job_id, {"RUNNING"})
        yield job_id
    finally:
        slurm_cluster.reset()


def write_inventory(cluster: SlurmCluster, tmp_path: Path, job_id: str,
                    node_env: Optional[Mapping[str, Mapping[str, str]]] = None) -> Path:
    inv: dict[str, Any] = cluster.inventory(
        job={"nodes": "node[01-03]", "process_match": TRAIN_TAG, "slurm": {"job": job_id}},
        node_env=node_env)
    for entry in inv["nodes"]:
        entry["connection"] = "slurm"
        entry["gpus"] = 1
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_exec_runs_in_the_job_and_on_a_standby_with_per_node_states(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path, brctl: Callable[..., Any]) -> None:
    inv = write_inventory(slurm_cluster, tmp_path, job, node_env={"node02": {"RC": "5"}})
    env = slurm_cluster.slurm_env()
    res = brctl("-i", inv, "--json", "exec", "--", "sh", "-c",
                'echo "$(hostname) ${SLURM_JOB_ID}"; echo "err $(hostname)" >&2; exit "${RC:-0}"',
                env={"SLURM_CONF": env["SLURM_CONF"]})
    assert res.exit_code == 1, res.stderr  # node02's exit 5 is a finding
    nodes = res.json["nodes"]
    for name in slurm_cluster.names:
        host, where = nodes[name]["stdout"].split()
        assert host == name  # it ran on that very machine (its own UTS namespace)
        assert nodes[name]["stderr"] == f"err {name}\n"
        assert (where == job) == (name != "node04")  # a step of the job; node04: its own allocation
    assert nodes["node02"]["state"] == "failed" and nodes["node02"]["exit_code"] == 5
    assert all(nodes[n]["state"] == "ok" for n in ("node01", "node03", "node04"))
    assert slurm_cluster.job_state(job) == "RUNNING"  # the job never noticed


def test_huge_output_is_kept_head_and_tail_with_its_total_as_over_ssh(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path, brctl: Callable[..., Any]) -> None:
    inv = write_inventory(slurm_cluster, tmp_path, job)
    doc = yaml.safe_load(inv.read_text())
    doc.setdefault("ssh", {})["output_keep"] = 1000
    inv.write_text(yaml.safe_dump(doc))
    env = slurm_cluster.slurm_env()
    res = brctl("-i", inv, "--json", "exec", "-w", "node01", "--", "sh", "-c",
                "head -c 50000 /dev/zero | tr '\\0' x; printf '\\377 end'",
                env={"SLURM_CONF": env["SLURM_CONF"]})
    assert res.exit_code == 0, res.stderr
    got = res.json["nodes"]["node01"]
    assert got["stdout_total"] == 50005 and "stderr_total" not in got
    assert got["stdout"].startswith("x" * 1000) and got["stdout"].endswith("\ufffd end")
    assert "50005 bytes in all" in got["stdout"]
    assert "stdout_b64" in got  # the kept bytes exactly: they are not UTF-8


def test_a_hung_node_times_out_and_the_reaper_ends_its_command(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path, brctl: Callable[..., Any]) -> None:
    inv = write_inventory(slurm_cluster, tmp_path, job)
    conf = slurm_cluster.slurm_env()["SLURM_CONF"]
    start = time.monotonic()
    res = brctl("-i", inv, "--json", "exec", "-t", "2", "-w", "node[01-02]", "--", "sh", "-c",
                'if [ "$(hostname)" = node02 ]; then setsid sleep 127 & sleep 113; fi; echo done',
                env={"SLURM_CONF": conf})
    took = time.monotonic() - start
    assert res.exit_code == 3, res.stderr
    nodes = res.json["nodes"]
    assert nodes["node01"]["state"] == "ok" and nodes["node01"]["stdout"] == "done\n"
    assert nodes["node02"]["state"] == "timeout" and nodes["node02"]["exit_code"] is None
    assert "killed after 2s" in nodes["node02"]["stderr"]
    assert took < scaled(20)
    # the reaper ended the command's whole tree, setsid escapee included
    assert not slurm_cluster.node_pids("node02", "sleep 113")
    assert not slurm_cluster.node_pids("node02", "sleep 127")


@pytest.mark.slow
def test_health_and_stacks_run_their_probes_over_srun(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path, brctl: Callable[..., Any]) -> None:
    inv = write_inventory(slurm_cluster, tmp_path, job)
    env = {"SLURM_CONF": slurm_cluster.slurm_env()["SLURM_CONF"], "BRCTL_STATE": str(tmp_path / "state")}
    deadline = time.monotonic() + scaled(20)
    while not all(slurm_cluster.node_pids(n, TRAIN_TAG) for n in ("node01", "node02", "node03")):
        assert time.monotonic() < deadline, "the job's ranks did not start"
        time.sleep(0.1)
    res = brctl("-i", inv, "--json", "health", env=env)
    doc = res.json
    assert set(doc["nodes"]) == set(slurm_cluster.names)
    # every machine answered its probe (fake GPUs have no NVML: those checks are unknown)
    assert doc["incomplete"] == [], doc
    for name, node in doc["nodes"].items():
        assert node.get("error") is None and node["checks"], (name, node)
    assert {c["name"]: c["status"] for c in doc["nodes"]["node02"]["checks"]}["process"] == "ok"
    # the bundle was shipped once to each machine's own cache
    for name in slurm_cluster.names:
        assert list(slurm_cluster.node_path(name, "/root/.cache/brctl").glob("*/brctl.zip")), name
    save = tmp_path / "save"
    res = brctl("-i", inv, "--json", "stacks", "--rounds", "1", "--save", save, env=env)
    assert res.exit_code in (0, 1), res.stderr
    for rank, name in enumerate(("node01", "node02", "node03")):
        [dump] = (save / name).glob(f"{rank}-*.json")
        assert "train_step" in dump.read_text()


def test_a_stream_carries_bulk_bytes_through_a_single_task_srun(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path) -> None:
    import os

    from brctl.core.transport import Node
    from brctl.remote.slurm.transport import JobRef, SlurmTransport

    transport = SlurmTransport(job=JobRef(id=job), environ=slurm_cluster.slurm_env())
    node = Node("node02", "node02", connection="slurm", connect_timeout=scaled(10))
    data = os.urandom(3 << 20)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data)
    with src.open("rb") as sin, dst.open("wb") as sout:
        res = transport.stream(node, ["sh", "-c", "cat; hostname >&2"], timeout=scaled(30),
                               stdin=sin, stdout=sout)
    assert (res.state.value, res.stderr) == ("ok", "node02\n")
    assert dst.read_bytes() == data
    failed = transport.stream(node, ["sh", "-c", "exit 3"], timeout=scaled(30))
    assert (failed.state.value, failed.exit_code) == ("failed", 3)


def test_a_streams_output_is_bounded_as_over_ssh(slurm_cluster: SlurmCluster, job: str) -> None:
    """Issue 35, item 2: over Slurm the checkpoint relay kept all a node wrote on stderr
    (and on stdout, the receiving side) in controller memory, about 3x its size: one node
    could OOM the controller during a restore. Now the first and last output_keep bytes of
    each stream, the true totals (read to the end), and the probe document cap applies."""
    from brctl.core.transport import Node
    from brctl.remote.probes import parse_document
    from brctl.remote.slurm.transport import JobRef, SlurmTransport

    transport = SlurmTransport(job=JobRef(id=job), environ=slurm_cluster.slurm_env())
    node = Node("node02", "node02", connection="slurm", connect_timeout=scaled(10),
                output_keep=1000)
    big = 8 << 20  # far past output_keep: what is kept is head and tail, the rest counted
    res = transport.stream(node, ["sh", "-c", f"head -c {big} /dev/zero | tr '\\0' e >&2; "
                                  f"head -c {big} /dev/zero | tr '\\0' o; printf '{{}}'"],
                           timeout=scaled(60))
    assert res.state.value == "ok", res.stderr[-300:]
    assert (res.stdout_total, res.stderr_total) == (big + 2, big)
    assert res.stdout.startswith("o" * 1000) and res.stdout.endswith("o" * 998 + "{}")
    assert len(res.stdout) < 3000 and len(res.stderr) < 3000
    doc, why = parse_document(res)  # the receiver's answer: a probe document, capped
    assert doc is None and why is not None and "too large" in why, why


@pytest.mark.slow
def test_a_dead_machine_is_unreachable_and_the_others_still_answer(
        make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path,
        brctl: Callable[..., Any]) -> None:
    cluster = make_slurm_cluster(3, gpus=0)
    job_id = cluster.sbatch("sleep 600", "-N", "3")
    cluster.wait_job(job_id, {"RUNNING"})
    inv: dict[str, Any] = cluster.inventory(job={"slurm": {"job": job_id}})
    for entry in inv["nodes"]:
        entry["connection"] = "slurm"
        entry["gpus"] = 1
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    cluster.stop_node("node03")  # a power cut: Slurm has not noticed yet (SlurmdTimeout)
    marks = tmp_path / "marks"
    marks.mkdir()
    res = brctl("-i", path, "--json", "exec", "--", "sh", "-c", f'echo ran >> {marks}/"$(hostname)"; hostname',
                env={"SLURM_CONF": str(cluster.conf)})
    assert res.exit_code == 3, res.stderr
    nodes = res.json["nodes"]
    assert nodes["node03"]["state"] == "unreachable"
    assert "slurm could not start the task" in nodes["node03"]["stderr"]
    # Slurm aborts the whole step for one dead machine; the others ran once, in a new step
    assert [nodes[n]["stdout"] for n in ("node01", "node02")] == ["node01\n", "node02\n"]
    assert {p.name: p.read_text() for p in marks.iterdir()} == {"node01": "ran\n", "node02": "ran\n"}


def test_cancel_ends_the_step_and_every_command_it_started(
        slurm_cluster: SlurmCluster, job: str) -> None:
    import threading

    from brctl.core.transport import Node, NodeState
    from brctl.remote.slurm.transport import JobRef, SlurmTransport

    transport = SlurmTransport(job=JobRef(id=job), environ=slurm_cluster.slurm_env())
    names = ("node01", "node02")
    nodes = [Node(n, n, connection="slurm", connect_timeout=scaled(10)) for n in names]

    def ctrl_c_once_running() -> None:
        deadline = time.monotonic() + scaled(20)
        while not all(slurm_cluster.node_pids(n, "sleep 97") for n in names):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        transport.cancel()

    threading.Thread(target=ctrl_c_once_running, daemon=True).start()
    start = time.monotonic()
    res = transport.run_batch(nodes, ["sh", "-c", "setsid sleep 97 & sleep 97"], timeout=scaled(60))
    assert time.monotonic() - start < scaled(30)
    assert all(r.state is NodeState.TIMEOUT and "interrupted" in r.stderr for r in res.values()), res
    deadline = time.monotonic() + scaled(10)
    while any(slurm_cluster.node_pids(n, "sleep 97") for n in names):
        assert time.monotonic() < deadline, "a command outlived the cancel"
        time.sleep(0.1)


def test_machines_taken_from_slurm_are_reached_over_srun_with_slurm_connection(
        slurm_cluster: SlurmCluster, job: str, tmp_path: Path, brctl: Callable[..., Any]) -> None:
    # no machine listed at all: Slurm says which they are, and srun reaches them
    inv: dict[str, Any] = slurm_cluster.inventory(names=[])
    inv.update(nodes=[], slurm={"partition": "batch", "connection": "slurm"},
               job={"slurm": {"job": job}})
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    res = brctl("-i", path, "--json", "exec", "-w", "@job", "--", "sh", "-c",
                'echo "$(hostname) $SLURM_JOB_ID"', env={"SLURM_CONF": str(slurm_cluster.conf)})
    assert res.exit_code == 0, res.stderr
    assert {n: r["stdout"] for n, r in res.json["nodes"].items()} == \
        {n: f"{n} {job}\n" for n in ("node01", "node02", "node03")}  # a step of the job: srun


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children first found by /proc's PPid)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        top = todo.pop()
        kids = [p for p, pp in parents.items() if pp == top and p not in found]
        found.update(kids)
        todo.extend(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGKILL", "SIGTERM", "SIGHUP"])
def test_srun_does_not_outlive_brctl(slurm_cluster: SlurmCluster, job: str, tmp_path: Path,
                                     how: signal.Signals) -> None:
    """Issue 35, item 6: srun runs in its own session; when brctl died without its Ctrl-C
    path, every srun and every command lived on to its own timeout (600 s here) on every
    node. SIGKILL: each srun's watcher sees brctl's pipe close and ends it; SIGTERM and
    SIGHUP take the Ctrl-C path (exit 130, "interrupted")."""
    inv = write_inventory(slurm_cluster, tmp_path, job)
    names = ("node01", "node02")
    proc = subprocess.Popen(
        [sys.executable, "-m", "brctl", "-i", str(inv), "exec", "-w", ",".join(names), "--timeout",
         "600", "--", "sh", "-c", "setsid sleep 599 & sleep 599"],
        env={**slurm_cluster.slurm_env(), "SLURM_CONF": str(slurm_cluster.conf)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def started() -> bool:
            assert proc.poll() is None, proc.communicate()
            return all(slurm_cluster.node_pids(n, "sleep 599") for n in names)

        wait_for(started, "the commands to start on every node", 30, every=0.1)
        below = _descendants(proc.pid)  # the watchers and their sruns
        assert below
        proc.send_signal(how)
        _, err = proc.communicate(timeout=scaled(30))
        if how != signal.SIGKILL:
            assert proc.returncode == 130 and b"interrupted" in err, err
        # srun gone before its 600 s timeout: < 30 s x $BRCTL_TIMEOUT_SCALE
        wait_for(lambda: not any(_alive(p) for p in below) and not any(
            slurm_cluster.node_pids(n, "sleep 599") for n in names),
            "every srun and command gone after brctl", 30, every=0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
