"""The job from Slurm: ``job.slurm`` resolved to machines, state and restart count.

Asked afresh at every command (never cached: a stale machine list is worse than none):
``squeue --json`` (every field is a JSON value, so a job name such as ``x NodeList=evil``
cannot pose as another field; 22.05 applies no filters to --json, so the job is picked
here), ``scontrol show hostnames`` for the node list in machine order, ``sinfo --json`` for
machines the inventory does not list (NodeAddr, GPU Gres) and for the standby pool. Every
client command is an argv list with a timeout; what it prints is checked before use (node
names become file names and argv words on the controller).

Errors: Slurm has no such job → exit 2 (InputError); Slurm did not answer → exit 3.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from brctl.analysis.inventory import Inventory, Job, NodeEntry, resolve_entries
from brctl.config.slurm import SlurmJobSection, SlurmSection
from brctl.core.errors import IncompleteError, InputError
from brctl.core.schema import SchemaError
from brctl.core.transport import Node

RUNNING = "RUNNING"
# States in which the job holds (or will hold) machines; the rest are over.
ACTIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                    "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                    "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
_MAX_OUTPUT = 256 << 20  # bytes of one client command's output brctl will parse
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it."""

    job_id: str
    name: str
    state: str
    reason: str
    nodes: tuple[str, ...]  # machine order; only while RUNNING (never a stale list)
    restarts: int
    user: str
    required: str = ""  # ReqNodeList as Slurm prints it (a folded set)
    excluded: str = ""  # ExcNodeList
    nodelist: str = ""  # the allocation as Slurm prints it (a finished job's last one, too)

    @property
    def running(self) -> bool:
        """RUNNING: the job's processes are on its machines."""
        return self.state == RUNNING

    @property
    def waiting(self) -> bool:
        """Queued or between runs (PENDING after a requeue, CONFIGURING, …): not running, not over."""
        return self.state in ACTIVE and self.state != RUNNING

    def describe(self) -> str:
        """``Slurm job 42 (RUNNING, 1 restart)`` for ``brctl nodes`` and messages."""
        extra = f", {self.restarts} restart{'s' if self.restarts != 1 else ''}" if self.restarts else ""
        why = f": {self.reason}" if self.reason and self.reason != "None" and not self.running else ""
        return f"Slurm job {self.job_id} ({self.state}{why}{extra})"


@dataclass(frozen=True)
class SlurmNode:
    """One machine as ``sinfo --json`` reports it."""

    name: str
    address: str
    gpus: int
    state: str  # idle, allocated, mixed, down, …
    flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, …
    partitions: tuple[str, ...]
    reason: str

    @property
    def drained(self) -> bool:
        """Drained or draining: the scheduler places nothing new there."""
        return "DRAIN" in self.flags

    @property
    def idle(self) -> bool:
        """Idle, responding, not drained and reserved for nobody: free to take into a job."""
        return self.state == "idle" and not self.flags

    @property
    def idle_reserved(self) -> bool:
        """Idle and responding, reserved (a reservation's pool) but not drained."""
        return self.state == "idle" and set(self.flags) <= {"RESERVED", "MAINTENANCE"}


class Slurm:
    """Runs Slurm's client commands (argv lists, ``section.timeout`` each)."""

    def __init__(self, section: SlurmSection, cluster: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        """Args: the ``slurm:`` section, ``job.slurm.cluster`` (-M), the environment."""
        self.section = section
        self.cluster = cluster
        self.environ = dict(environ) if environ is not None else None

    def run(self, *argv: str) -> str:
        """stdout of one client command; exit 3 when Slurm does not answer."""
        full = [argv[0], *(["-M", self.cluster] if self.cluster else []), *argv[1:]]
        try:
            done = subprocess.run(full, capture_output=True, timeout=self.section.timeout,
                                  env=self.environ, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise InputError(f"{argv[0]}: not found: job.slurm needs Slurm's client commands "
                             "(squeue, sinfo, scontrol) on the controller's PATH") from None
        except subprocess.TimeoutExpired:
            raise IncompleteError(f"{' '.join(full[:3])}: no answer within "
                                  f"{self.section.timeout:g} s (slurm.timeout)") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()
            raise IncompleteError(f"{' '.join(full[:4])} exited {done.returncode}: "
                                  f"{(err or ['no message'])[-1][:300]}")
        if len(done.stdout) > _MAX_OUTPUT:
            raise IncompleteError(f"{argv[0]}: more than {_MAX_OUTPUT >> 20} MiB of output")
        return done.stdout.decode(errors="replace")

    def json(self, *argv: str) -> Mapping[str, Any]:
        """A ``--json`` client command's document."""
        text = self.run(*argv)
        try:
            doc = json.loads(text)
        except ValueError:
            raise IncompleteError(f"{argv[0]} --json: not JSON: {text[:120]!r}") from None
        if not isinstance(doc, dict):
            raise IncompleteError(f"{argv[0]} --json: not a JSON object")
        return doc

    def hostnames(self, folded: str) -> tuple[str, ...]:
        """``scontrol show hostnames``: a folded node list in Slurm's own order."""
        if not folded or folded == "(null)":
            return ()
        # one name a line: a line with a space in it is not two machines
        lines = self.run("scontrol", "show", "hostnames", folded).splitlines()
        names = tuple(line.strip() for line in lines if line.strip())
        for name in names:
            check_machine_name(name, f"scontrol show hostnames {folded}")
        return names

    def jobs(self) -> list[SlurmJob]:
        """Every job squeue reports (node lists still folded, in ``required``'s place)."""
        out = []
        for entry in _items(self.json("squeue", "--json"), "jobs"):
            job = _job(entry)
            if job is not None:
                out.append(job)
        return out

    def nodes(self) -> dict[str, SlurmNode]:
        """Every machine sinfo reports, by name."""
        out = {}
        for entry in _items(self.json("sinfo", "--json"), "nodes"):
            node = _node(entry)
            if node is not None:
                out[node.name] = node
        return out

    def reservation_nodes(self, name: str) -> tuple[str, ...]:
        """The machines of reservation ``name``."""
        text = self.run("scontrol", "-o", "show", "reservation", name)
        found = re.search(r"(?:^|\s)Nodes=(\S+)", text)
        return self.hostnames(found.group(1)) if found else ()

    def find(self, want: SlurmJobSection) -> SlurmJob:
        """The job ``want`` names, with its machines expanded.

        Raises:
            InputError: Slurm has no such job, or the name matches several live jobs.
        """
        jobs = self.jobs()
        if want.job is not None:
            found = [j for j in jobs if j.job_id == str(want.job)]
        else:
            found = [j for j in jobs if j.name == want.name
                     and (want.user is None or j.user == want.user)]
            live = [j for j in found if j.state in ACTIVE]
            if len(live) > 1:
                raise InputError(f"job.slurm: {len(live)} live Slurm jobs are {want.describe()}: "
                                 f"{', '.join(j.job_id for j in live)}",
                                 hint="give job.slurm.job: ID (or user:) to say which")
            found = live or sorted(found, key=lambda j: _id_key(j.job_id))[-1:]
        if not found:
            raise InputError(f"job.slurm: Slurm has no {want.describe()} (squeue forgets "
                             "finished jobs after MinJobAge)",
                             hint="check the id with squeue, or update job.slurm")
        job = found[0]
        return replace(job, nodes=self.hostnames(job.nodelist)) if job.running else job


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.split(r"[_+]", job_id) if p.isdigit())


def _items(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise IncompleteError(f"Slurm's JSON has no {key!r} list")
    return [i for i in items if isinstance(i, dict)]


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    return value if isinstance(value, str) else ""


def _job(entry: Mapping[str, Any]) -> Optional[SlurmJob]:
    """One squeue entry, or None when its id or state is malformed."""
    job_id, state = entry.get("job_id"), entry.get("job_state")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not isinstance(state, str):
        return None
    array, task = entry.get("array_job_id"), entry.get("array_task_id")
    shown = f"{array}_{task}" if isinstance(array, int) and array and isinstance(task, int) \
        and not isinstance(task, bool) else str(job_id)
    restarts = entry.get("restart_cnt")
    return SlurmJob(
        job_id=shown, name=_text(entry, "name"), state=state.upper(),
        reason=_text(entry, "state_reason"), nodes=(), nodelist=_text(entry, "nodes"),
        restarts=restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0,
        user=_text(entry, "user_name"), required=_text(entry, "required_nodes"),
        excluded=_text(entry, "excluded_nodes"))


def _node(entry: Mapping[str, Any]) -> Optional[SlurmNode]:
    name = _text(entry, "name")
    if not name:
        return None
    flags = entry.get("state_flags")
    parts = entry.get("partitions")
    gres = _GPU_GRES.findall(_text(entry, "gres"))
    return SlurmNode(
        name=name, address=_text(entry, "address") or name,
        gpus=sum(int(n) for n in gres),
        state=_text(entry, "state").lower(),
        flags=tuple(str(f) for f in flags) if isinstance(flags, list) else (),
        partitions=tuple(str(p) for p in parts) if isinstance(parts, list) else (),
        reason=_text(entry, "reason"))


def check_machine_name(name: str, where: str) -> None:
    """A machine name from Slurm becomes a file name and an argv word: refuse odd ones."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or name in (".", ".."):
        raise IncompleteError(f"{where}: Slurm named a machine brctl will not use: {name[:60]!r}")


def resolve(inv: Inventory, slurm: Optional[Slurm] = None) -> tuple[Inventory, SlurmJob]:
    """``inv`` with its job on the machines Slurm gives it now (none unless it runs).

    Machines the inventory does not list come from ``slurm.partition`` (NodeAddr, GPU Gres);
    the partition's (or ``slurm.reservation``'s) idle machines join the standby pool.

    Raises:
        InputError: no such job; a machine of the job that brctl cannot address.
        IncompleteError: Slurm did not answer.
    """
    assert inv.job is not None and inv.job.slurm is not None
    slurm = slurm or Slurm(inv.slurm, inv.job.slurm.cluster)
    job = slurm.find(inv.job.slurm)
    section = inv.slurm
    info: dict[str, SlurmNode] = {}
    pool: Sequence[str] = ()
    if section.partition or section.reservation:
        info = slurm.nodes()
        if section.reservation:
            pool = slurm.reservation_nodes(section.reservation)
        else:
            pool = [n for n, s in info.items() if section.partition in s.partitions]
    nodes = dict(inv.nodes)
    for name in job.nodes:
        if name not in nodes:
            nodes[name] = _machine(inv, info, name, job)
    spare = [n for n in pool if n in info and n not in set(job.nodes)
             and (info[n].idle_reserved if section.reservation else info[n].idle)]
    for name in spare:
        if name not in nodes:
            nodes[name] = _machine(inv, info, name, job)
    standby = tuple(dict.fromkeys([*(n for n in inv.standby if n not in set(job.nodes)), *spare]))
    resolved: Job = replace(inv.job, nodes=job.nodes, source=job.describe(), state=job.state,
                            scheduler_id=job.job_id)
    return replace(inv, nodes=nodes, standby=standby, job=resolved), job


def _machine(inv: Inventory, info: Mapping[str, SlurmNode], name: str, job: SlurmJob) -> Node:
    """A machine the inventory does not list, addressed as Slurm says (slurm.partition)."""
    assert inv.job is not None
    node = info.get(name)
    usable = node is not None and (inv.slurm.reservation is not None
                                   or inv.slurm.partition in node.partitions)
    if node is None or not usable:
        raise InputError(
            f"{job.describe()} runs on {name}, which is not under nodes: in {inv.source}",
            hint="list the job's machines under nodes: (names as Slurm calls them), or set "
                 "slurm.partition to take their addresses from Slurm (NodeAddr)")
    if not re.fullmatch(r"[A-Za-z0-9_.:\[\]][A-Za-z0-9_.:\[\]-]*", node.address):
        raise IncompleteError(f"sinfo: NodeAddr of {name} is not an address: {node.address[:60]!r}")
    if node.gpus < 1:
        raise InputError(f"{name}: Slurm gives it no gpu Gres; list it under nodes: with gpus: N",
                         file=inv.source)
    entry = NodeEntry(name=name, address=node.address, gpus=node.gpus,
                      connection=inv.slurm.connection,
                      labels={"partition": inv.slurm.partition} if inv.slurm.partition else {})
    try:
        (machine,) = resolve_entries([entry], inv.ssh, inv.source, f"slurm node {name}")
    except SchemaError as exc:
        raise IncompleteError(f"Slurm's machine {name}: {exc.detail}") from None
    return replace(machine, job_user=inv.job.user) if inv.job.user else machine
