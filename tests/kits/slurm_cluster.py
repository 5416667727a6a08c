"""A real Slurm cluster on loopback whose machines are the sshd test cluster's machines.

Each simulated machine is ONE set of namespaces (UTS + PID + mount, ``unshare --fork
--kill-child --mount-proc``) running both that machine's ``sshd`` (as in cluster.py, on
``127.0.0.N``) and its ``slurmd -D -N <name>``, under a tiny ``sh`` as the namespace's PID 1
that reaps orphaned ``slurmstepd`` processes. So a job step Slurm starts on node02 is a
process that an SSH session to node02 sees in ``/proc``, and stopping a machine
(``stop_node``, SIGKILL of PID 1) takes its sshd, its slurmd and its job steps down together.

The controller side: a private ``munged`` (own key, socket under ``/run``: munged wants every
directory above its socket world-searchable and the path under 108 bytes) and ``slurmctld`` in
its own UTS + mount namespace (hostname ``ctl``, the cluster's hosts file on ``/etc/hosts``),
listening on 127.0.0.1 only. Every slurmd listens on a port of its own (slurmd and srun bind
0.0.0.0; ``NoInAddrAny`` would break srun's I/O), reserved with an ``flock`` per block of ports
so concurrent test sessions never collide. Machines have fake GPUs (``Gres=gpu:N`` backed by
character devices, so Slurm sets ``CUDA_VISIBLE_DEVICES``); one partition ``batch`` holds every
machine. Client commands need ``SLURM_CONF``: ``cluster.slurm_env()`` / ``cluster.slurm(...)``.
Teardown stops only what the harness started, by the PIDs (and start times) it recorded.

Debian 12 packages (``scripts/test`` installs them): slurmctld slurmd slurm-client munge.

API (fixtures ``slurm_cluster``, session-wide 4 machines, and ``make_slurm_cluster(n)`` in
conftest.py)::

    cluster.names / address(name) / port / inventory(...)    # as SshCluster
    cluster.conf                        # slurm.conf path (SLURM_CONF)
    cluster.slurm_env() -> dict         # os.environ + SLURM_CONF
    cluster.slurm("squeue", "-h") -> str            # run a client command (raises on failure)
    cluster.sbatch("sleep 600", "-N", "2") -> str   # job id; the script body is sh;
                                                    # its output in cluster.root/job-<id>.out
    cluster.wait_job(job, {"RUNNING"}) -> str       # polls squeue/scontrol until that state
    cluster.node_state(name) -> str     # sinfo's long state, e.g. "idle", "drained", "allocated"
    cluster.reset()                     # cancel every job, resume every machine, wait all idle
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Optional

from tests.kits.cluster import SshCluster, missing_requirements, scaled

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch")
FIRST_PORT_BLOCK = 17000
PORT_BLOCK = 100  # slurmctld on the block's first port, machine i on first + i
PARTITION = "batch"


def missing_slurm_requirements() -> Optional[str]:
    """Why the Slurm test cluster cannot start here, or None when it can."""
    why = missing_requirements()
    if why is not None:
        return why
    for binary in SLURM_BINARIES:
        if shutil.which(binary) is None and not os.path.exists(f"/usr/sbin/{binary}"):
            return (f"{binary} not found (apt-get install --no-install-recommends"
                    " slurmctld slurmd slurm-client munge)")
    return None


def _start_time(pid: int) -> Optional[str]:
    """Field 22 of /proc/PID/stat (after the last ')'), or None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _stop_recorded(pid: int, started: str, grace: float) -> None:
    """SIGTERM that very process (same start time), then SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if _start_time(pid) != started:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _start_time(pid) == started:
            time.sleep(0.02)


def _ports_free(ports: Sequence[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


class SlurmCluster(SshCluster):
    """N machines running sshd + slurmd in shared namespaces, one slurmctld; see module doc."""

    UNSHARE = ("unshare", "--uts", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc")

    def __init__(self, root: Path, n: int, *, gpus: int = 2, **kw: Any) -> None:
        if not 1 <= n < PORT_BLOCK:
            raise ValueError(f"a Slurm test cluster has 1..{PORT_BLOCK - 1} machines")
        self.gpus = gpus
        self._slurm_lock: Optional[Any] = None
        self._ctld: Optional[subprocess.Popen[bytes]] = None
        self._munged: Optional[tuple[int, str]] = None
        super().__init__(root, n, **kw)
        self.ctld_port = self._reserve_slurm_ports()
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_dir = Path(
            "/run/brctl-test-munge-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        )
        self._write_slurm_config()

    # -- set-up -----------------------------------------------------------------

    def _reserve_slurm_ports(self) -> int:
        wanted = len(self.names) + 1
        for base in range(FIRST_PORT_BLOCK, FIRST_PORT_BLOCK + 40 * PORT_BLOCK, PORT_BLOCK):
            handle = open(f"/tmp/brctl-test-slurm-{base}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            if _ports_free(range(base, base + wanted)):
                self._slurm_lock = handle
                return base
            handle.close()
        raise RuntimeError("no free block of ports for the Slurm test cluster")

    def _write_slurm_config(self) -> None:
        etc, ctld = self.root / "etc", self.root / "ctld"
        for d in (etc, ctld / "state", self.root / "munge", self.root / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        names = ",".join(self.names)
        lines = [
            "ClusterName=brctltest",
            "SlurmctldHost=ctl(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            # slurmctld binds 127.0.0.1 only; slurmd/srun bind 0.0.0.0 (distinct ports)
            "CommunicationParameters=NoCtldInAddrAny",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also bounds how long a requeued job waits before it may run again
            f"AuthInfo=socket={self.munge_dir}/munge.socket,cred_expire=10",
            f"StateSaveLocation={ctld / 'state'}",
            f"SlurmctldPidFile={ctld / 'slurmctld.pid'}",
            f"SlurmctldLogFile={ctld / 'slurmctld.log'}",
            f"SlurmdSpoolDir={self.root / 'nodes' / '%n' / 'spool'}",
            f"SlurmdPidFile={self.root / 'nodes' / '%n' / 'slurmd.pid'}",
            f"SlurmdLogFile={self.root / 'nodes' / '%n' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=1",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "KillWait=5",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        gres = ""
        if self.gpus:
            lines.append("GresTypes=gpu")
            gres = f" Gres=gpu:{self.gpus}"
            for k in range(self.gpus):  # slurmd wants character devices; 1:3 is /dev/null's
                dev = self.root / "dev" / f"gpu{k}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
            (etc / "gres.conf").write_text(
                f"NodeName={names} Name=gpu File={self.root / 'dev'}/gpu[0-{self.gpus - 1}]\n"
            )
        for i, name in enumerate(self.names, start=1):
            (self.node_dir(name) / "spool").mkdir(parents=True, exist_ok=True)
            lines.append(
                f"NodeName={name} NodeHostname={name} NodeAddr={self.address(name)}"
                f" Port={self.ctld_port + i} CPUs=1{gres} State=UNKNOWN"
            )
        lines.append(f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        (etc / "slurm.conf").write_text("\n".join(lines) + "\n")
        hosts = Path("/etc/hosts").read_text() + "127.0.0.1 ctl\n"
        hosts += "".join(f"{self.address(n)} {n}\n" for n in self.names)
        (etc / "hosts").write_text(hosts)

    def _node_main(self, name: str) -> str:
        # PID 1 stays this sh: it reaps orphaned slurmstepds and forwards SIGTERM.
        ndir = self.node_dir(name)
        return "; ".join([
            f"mount --bind {self.root / 'etc' / 'hosts'} /etc/hosts",
            f"hostname {name}",
            "trap 'kill -TERM $s $d 2>/dev/null' TERM INT",
            f"{self._sshd_argv(name)} & s=$!",
            f"slurmd -D -N {name} -f {self.conf} >>{ndir / 'slurmd.out'} 2>&1 & d=$!",
            "while kill -0 $s 2>/dev/null || kill -0 $d 2>/dev/null; do wait || true; done",
        ])

    # -- life cycle -------------------------------------------------------------

    def start(self) -> SlurmCluster:
        """munged, slurmctld, then every machine; return when all machines are idle."""
        try:
            if self._munged is None:
                self._start_munged()
            if self._ctld is None:
                self._start_ctld()
            super().start()
            self.wait_idle(self.names)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munged(self) -> None:
        if self.munge_dir.exists():
            shutil.rmtree(self.munge_dir)
        self.munge_dir.mkdir(mode=0o755)
        mdir = self.root / "munge"
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        pid_file = mdir / "munged.pid"
        # munged forks into the background once its socket is ready
        subprocess.run(
            ["munged", f"--socket={self.munge_dir}/munge.socket", f"--key-file={key}",
             f"--pid-file={pid_file}", f"--log-file={mdir / 'munged.log'}",
             f"--seed-file={mdir / 'munged.seed'}"],
            stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=scaled(20),
        )
        pid = int(pid_file.read_text().split()[0])
        started = _start_time(pid)
        if started is None:
            raise RuntimeError(f"munged exited: {(mdir / 'munged.log').read_text()}")
        self._munged = (pid, started)

    def _start_ctld(self) -> None:
        ctld = self.root / "ctld"
        boot = (f"mount --bind {self.root / 'etc' / 'hosts'} /etc/hosts && hostname ctl"
                f" && exec slurmctld -D -i -f {self.conf}")
        with open(ctld / "stdout.log", "ab") as out:
            # no --fork: unshare and sh exec, so this PID is slurmctld's
            self._ctld = subprocess.Popen(
                ["unshare", "--uts", "--mount", "sh", "-c", boot],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )
        deadline = time.monotonic() + scaled(15)
        while time.monotonic() < deadline:
            if self._ctld.poll() is not None:
                raise RuntimeError(f"slurmctld exited: {self._tail(ctld / 'slurmctld.log')}")
            ping = subprocess.run(["scontrol", "ping"], env=self.slurm_env(),
                                  capture_output=True, text=True, check=False)
            if "is UP" in ping.stdout:
                return
            time.sleep(0.05)
        raise RuntimeError(f"slurmctld not up: {self._tail(ctld / 'slurmctld.log')}")

    def stop(self) -> None:
        """Stop the machines, slurmctld and munged (only the processes started here)."""
        super().stop()
        if self._ctld is not None:
            started = _start_time(self._ctld.pid)
            if started is not None:
                _stop_recorded(self._ctld.pid, started, scaled(10))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._ctld.wait(timeout=5)
            self._ctld = None
        if self._munged is not None:
            _stop_recorded(*self._munged, scaled(10))
            self._munged = None
        shutil.rmtree(self.munge_dir, ignore_errors=True)
        if self._slurm_lock is not None:
            self._slurm_lock.close()
            self._slurm_lock = None

    # -- Slurm clients ----------------------------------------------------------

    def slurm_env(self) -> dict[str, str]:
        """This process's environment plus SLURM_CONF (what client commands need)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def slurm(self, *argv: str, check: bool = True, input_text: Optional[str] = None) -> str:
        """Run one Slurm client command against this cluster; its stdout."""
        done = subprocess.run(list(argv), env=self.slurm_env(), capture_output=True, text=True,
                              check=False, timeout=scaled(30), input=input_text)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def sbatch(self, body: str, *args: str) -> str:
        """Submit ``body`` (sh) as a batch job with sbatch ``args``; its job id."""
        script = f"#!/bin/sh\n{body}\n"
        out = self.slurm("sbatch", "--parsable", "-o", str(self.root / "job-%j.out"), *args,
                         input_text=script)
        return out.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        """The job's state ("" when Slurm no longer knows it). From ``squeue --json``, not
        scontrol's text, where a job named ``x JobState=RUNNING`` would fool a regex."""
        doc = json.loads(self.slurm("squeue", "--json"))
        return next((j["job_state"] for j in doc["jobs"] if str(j["job_id"]) == job), "")

    def wait_job(self, job: str, states: Collection[str], timeout: float = 30) -> str:
        """Poll until the job is in one of ``states``; return that state."""
        deadline = time.monotonic() + scaled(timeout)
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job)
            if state in states:
                return state
            time.sleep(0.1)
        raise AssertionError(f"job {job} is {state or 'gone'}, not {sorted(states)}")

    def node_state(self, name: str) -> str:
        """sinfo's long state of one machine ("idle", "allocated", "drained", "draining"...)."""
        return self.slurm("sinfo", "-h", "-N", "-n", name, "-o", "%T").strip().split("\n")[0]

    def node_states(self) -> dict[str, str]:
        """Every machine's sinfo compact state ("idle", "idle*" = not responding, "drain"...)."""
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split(None, 1) for line in out.splitlines() if " " in line)

    def wait_idle(self, names: Sequence[str], timeout: float = 30) -> None:
        """Poll until every machine in ``names`` is idle and responding (fails fast if a
        daemon died)."""
        deadline = time.monotonic() + scaled(timeout)
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in names):
                return
            if self._ctld is not None and self._ctld.poll() is not None:
                raise RuntimeError(f"slurmctld died: {self._tail(self.root / 'ctld' / 'slurmctld.log')}")
            for name in names:
                proc = self._procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} died: {self._tail(self.node_dir(name) / 'slurmd.log')}")
            time.sleep(0.05)
        raise RuntimeError(f"machines not idle after {scaled(timeout):.0f} s: {states}")

    def reset(self) -> None:
        """Cancel every job, delete every reservation, resume every drained or down machine,
        wait until all are idle."""
        self.slurm("scancel", "--full", "--user=root", check=False)
        shown = self.slurm("scontrol", "-o", "show", "reservation", check=False)
        for name in re.findall(r"^ReservationName=(\S+)", shown, re.M):
            self.slurm("scontrol", "delete", f"ReservationName={name}", check=False)
        out = self.slurm("sinfo", "-h", "-N", "-t", "drain,drng,down", "-o", "%N", check=False)
        stuck = sorted(set(out.split()))
        if stuck:
            self.slurm("scontrol", "update", f"NodeName={','.join(stuck)}", "State=RESUME")
        self.wait_idle(self.names)
        deadline = time.monotonic() + scaled(30)
        while self.slurm("squeue", "-h", "-o", "%i", check=False).strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"jobs left after scancel: {self.slurm('squeue', check=False)}")
            time.sleep(0.05)

    @staticmethod
    def _tail(path: Path, lines: int = 5) -> str:
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
