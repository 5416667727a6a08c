"""A real (tiny) distributed training job across the test cluster's machines.

Reusable by any integration test that needs a live job: ``brctl stacks`` (hung
and slow ranks), the daemon (progress in logs, checkpoints, kill and restart).

What runs: ``TRAIN_SCRIPT`` (written into the test's work directory, which every
node sees since the nodes share the filesystem apart from their private dirs) in
two modes. On every machine one *launcher* (like torchrun) is started over real
ssh with ``setsid`` in the background, so it lives in that machine's PID
namespace; it spawns ``nproc`` *ranks* with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` (the first machine's address) and
``MASTER_PORT`` in their environment, and each rank one data-loader *worker*
child (which inherits RANK). Rank order is Megatron's ``tp-cp-ep-dp-pp`` with
tp = cp = 1: ``rank = dp + DP·stage``, machine m holding ranks
``[m·nproc, (m+1)·nproc)``.

Each step of a rank (torch.distributed, gloo on CPU, ``OMP_NUM_THREADS=1``):
stage 0 computes on its batch and ``send``s activations to the next stage,
later stages ``recv_activations`` first; then every rank joins
``dp_all_reduce`` over its stage's DP group. Each rank appends ``step N loss X``
to ``<workdir>/logs/rank<R>.log``; with ``ckpt_every`` it saves
``<ckpt_dir>/step_<N>/rank<R>.pt`` (a node's private ``/local/ckpt`` when the
cluster has one).

Faults are test inputs, read only by this test script from the environment:
``TRAINJOB_HANG_RANK=R`` (rank R blocks forever in ``stuck_in_data_loader``
from step ``TRAINJOB_FAULT_STEP``, default 3) and ``TRAINJOB_SLOW_RANK=R`` with
``TRAINJOB_SLOW_SECONDS=S`` (rank R spends S more seconds per step in
``slow_compute``).

API::

    job = start_trainjob(cluster, workdir, nodes=None, nproc=2, pp=1,
                         step_seconds=0.05, ckpt_every=0, ckpt_dir="/local/ckpt",
                         env={"TRAINJOB_HANG_RANK": "0"}, node_env={}, python=sys.executable)
    job.tag                  # "brctl-trainjob": use as job.process_match
    job.world / job.ranks_on(node) / job.machine_of(rank)
    job.wait_step(n, rank=0, timeout=60)   # until rank's log shows step >= n; returns it
    job.last_step(rank)      # latest step in that rank's log (or -1)
    job.log(rank)            # the rank's log text
    job.pids(node)           # host PIDs of the job's processes on that machine
    job.stop()               # SIGKILL every process of the job on every machine (idempotent)

Use it as a context manager (``with start_trainjob(...) as job:``) so the job is
stopped even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tests.kits.cluster import SshCluster, scaled

TAG = "brctl-trainjob"

TRAIN_SCRIPT = r'''
"""brctl's integration-test training job (see tests/kits/trainjob.py)."""
import os, subprocess, sys, time


def launch(args):
    nproc, base, world = int(args[0]), int(args[1]), int(args[2])
    procs = []
    for local in range(nproc):
        env = dict(os.environ, RANK=str(base + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, __file__, "rank", *args[3:]], env=env))
    for p in procs:
        p.wait()


def stuck_in_data_loader():
    while True:
        time.sleep(3600)


def slow_compute(seconds):
    time.sleep(seconds)


def compute(torch, x, rank, step):
    if os.environ.get("TRAINJOB_SLOW_RANK") == str(rank):
        slow_compute(float(os.environ.get("TRAINJOB_SLOW_SECONDS", "1")))
    return torch.tanh(x @ torch.ones(16, 16) / 16 + step)


def recv_activations(dist, torch, src):
    x = torch.zeros(4, 16)
    dist.recv(x, src=src)
    return x


def dp_all_reduce(dist, t, group):
    dist.all_reduce(t, group=group)
    return t


def save_checkpoint(torch, state, ckpt_dir, step, rank):
    path = os.path.join(ckpt_dir, "step_%06d" % step)
    os.makedirs(path, exist_ok=True)
    torch.save(state, os.path.join(path, "rank%d.pt" % rank))


def train(args):
    import datetime
    import torch
    import torch.distributed as dist

    pp, step_seconds, ckpt_every, ckpt_dir, logdir = (int(args[0]), float(args[1]),
                                                       int(args[2]), args[3], args[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    worker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)",
                               "brctl-trainjob-worker"])  # a data-loader worker: inherits RANK
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))
    dp = world // pp
    stage = rank // dp
    groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(pp)]
    hang = os.environ.get("TRAINJOB_HANG_RANK") == str(rank)
    fault_step = int(os.environ.get("TRAINJOB_FAULT_STEP", "3"))
    torch.manual_seed(rank)
    weight = torch.zeros(16)
    log = open(os.path.join(logdir, "rank%d.log" % rank), "a", buffering=1)
    step = 0
    try:
        while True:
            step += 1
            if hang and step >= fault_step:
                stuck_in_data_loader()
            x = torch.randn(4, 16) if stage == 0 else recv_activations(dist, torch, rank - dp)
            y = compute(torch, x, rank, step)
            if stage + 1 < pp:
                dist.send(y.contiguous(), dst=rank + dp)
            grad = dp_all_reduce(dist, y.mean(0), groups[stage]) / dp
            weight -= 0.01 * grad
            log.write("step %d loss %.6f\n" % (step, float((y * y).mean())))
            if ckpt_every and step % ckpt_every == 0:
                save_checkpoint(torch, {"step": step, "weight": weight}, ckpt_dir, step, rank)
            time.sleep(step_seconds)
    finally:
        worker.kill()


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch(sys.argv[2:])
    else:
        train(sys.argv[2:])
'''


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _ssh(cluster: SshCluster, name: str, command: str, timeout: float = 30) -> None:
    """OpenSSH's client (independent of brctl's transport) runs ``command`` on the node."""
    res = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(cluster.client_key),
         "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "StrictHostKeyChecking=yes",
         "-o", "BatchMode=yes", "-p", str(cluster.port), f"root@{cluster.address(name)}",
         command],
        capture_output=True, text=True, timeout=scaled(timeout),
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"ssh {name}: {command!r} exited {res.returncode}: {res.stderr}")


@dataclass
class TrainJob:
    """A running job; see the module docstring for the API."""

    cluster: SshCluster
    workdir: Path
    nodes: list[str]
    nproc: int
    pp: int
    tag: str = TAG
    stopped: bool = field(default=False)

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return len(self.nodes) * self.nproc

    def ranks_on(self, node: str) -> list[int]:
        """The ranks the launcher on ``node`` started."""
        base = self.nodes.index(node) * self.nproc
        return list(range(base, base + self.nproc))

    def machine_of(self, rank: int) -> str:
        """The machine running ``rank``."""
        return self.nodes[rank // self.nproc]

    def log(self, rank: int) -> str:
        """That rank's log (empty before its first step)."""
        path = self.workdir / "logs" / f"rank{rank}.log"
        return path.read_text() if path.exists() else ""

    def last_step(self, rank: int = 0) -> int:
        """The latest step in the rank's log, -1 before the first."""
        steps = re.findall(r"^step (\d+) loss ", self.log(rank), re.M)
        return int(steps[-1]) if steps else -1

    def wait_step(self, n: int, rank: int = 0, timeout: float = 90) -> int:
        """Wait until ``rank`` logged step ``n`` or later; return the step reached."""
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            step = self.last_step(rank)
            if step >= n:
                return step
            time.sleep(0.2)
        raise TimeoutError(f"rank {rank} did not reach step {n} in {timeout}s; log:\n"
                           f"{self.log(rank)[-500:]}\nlauncher logs: {self._launcher_logs()}")

    def _launcher_logs(self) -> str:
        return " | ".join((self.workdir / "logs" / f"{n}.launcher.log").read_text()[-800:]
                          for n in self.nodes
                          if (self.workdir / "logs" / f"{n}.launcher.log").exists())

    def pids(self, node: str) -> list[int]:
        """Host PIDs of the job's processes on ``node``."""
        return self.cluster.node_pids(node, re.escape(self.tag))

    def stop(self) -> None:
        """Kill every process of the job on every machine (idempotent)."""
        for node in self.nodes:
            for pid in self.pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.stopped = True

    def __enter__(self) -> TrainJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_trainjob(
    cluster: SshCluster,
    workdir: Path,
    *,
    nodes: Optional[Sequence[str]] = None,
    nproc: int = 2,
    pp: int = 1,
    step_seconds: float = 0.05,
    ckpt_every: int = 0,
    ckpt_dir: str = "/local/ckpt",
    env: Optional[Mapping[str, str]] = None,
    node_env: Optional[Mapping[str, Mapping[str, str]]] = None,
    python: str = sys.executable,
    script: str = TRAIN_SCRIPT,
    wrap: Sequence[str] = (),
) -> TrainJob:
    """Start the job on ``nodes`` (default: all of the cluster's) and return at once.

    Args:
        cluster: the running test cluster.
        workdir: a directory for the script and logs (every node sees it).
        nodes: the machines, in machine order.
        nproc: ranks per machine.
        pp: pipeline stages (must divide the world size).
        step_seconds: pause after each step (keeps 2 CPUs from saturating).
        ckpt_every: save a checkpoint every N steps (0: never).
        ckpt_dir: where, as the node sees it.
        env: extra environment for every rank (e.g. the TRAINJOB_* faults).
        node_env: extra environment per machine.
        python: interpreter with torch on the nodes.
        script: the job's program (``launch``/``rank`` modes and arguments as
            ``TRAIN_SCRIPT``'s; ``frjob.FR_SCRIPT`` adds tensor and pipeline groups).
        wrap: argv run before the launcher (``setpriv --reuid=...``: the job as another user).
    """
    names = list(nodes) if nodes is not None else list(cluster.names)
    world = len(names) * nproc
    if world % pp:
        raise ValueError(f"pp={pp} does not divide the world size {world}")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    program = workdir / "brctl_trainjob.py"
    program.write_text(script)
    program.chmod(0o644)
    master = cluster.address(names[0])
    port = _free_port(master)
    job = TrainJob(cluster, workdir, names, nproc, pp)
    for i, node in enumerate(names):
        variables: dict[str, Any] = {
            "MASTER_ADDR": master, "MASTER_PORT": port, "OMP_NUM_THREADS": 1,
            "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": 1,
            **(env or {}), **((node_env or {}).get(node, {})),
        }
        argv = ["env", *(f"{k}={v}" for k, v in variables.items()), "setsid", *wrap, python,
                str(program), "launch", str(nproc), str(i * nproc), str(world), str(pp),
                str(step_seconds), str(ckpt_every), ckpt_dir, str(workdir / "logs"), TAG]
        log = workdir / "logs" / f"{node}.launcher.log"
        _ssh(cluster, node, f"{shlex.join(argv)} </dev/null >{shlex.quote(str(log))} 2>&1 &")
    return job
