"""The job from Slurm: ``job.slurm`` resolved to machines, state and restart count.

Asked afresh at every command (never cached: a stale machine list is worse than none), and
only about the one job, never the whole queue (a queue of ~40,000 jobs is more than any
client answer brctl will parse): from 23.02 ``squeue --json -j ID`` (a name: ``squeue --json
-u USER``, the user's jobs only), where every field is a JSON value, so a job name such as
``x NodeList=evil`` cannot pose as another field; on 22.05, whose ``--json`` applies no
filter, ``squeue -h -j ID -O ...`` with fields no user can fill (``operations.slurm.read``
reads both, and every data parser's shapes). ``scontrol show hostnames`` for the node list
in machine order, ``sinfo --json`` (from 23.02 ``scontrol --json show nodes``: sinfo's
JSON became a summary by state) for machines the inventory does not list (NodeAddr, GPU
Gres) and for the standby pool. Every client command is an argv list with a timeout; what
it prints is checked before use (node names become file names and argv words on the
controller).

Errors: Slurm has no such job → exit 2 (InputError); Slurm did not answer, or answered
something brctl cannot read (the field and the data parser named) → exit 3.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

from brctl.analysis.inventory import Inventory, Job, NodeEntry, resolve_entries
from brctl.config.slurm import SlurmJobSection, SlurmSection
from brctl.core.errors import IncompleteError, InputError
from brctl.core.schema import SchemaError
from brctl.core.transport import Node
from brctl.operations.slurm.read import ACTIVE as ACTIVE
from brctl.operations.slurm.read import RUNNING as RUNNING
from brctl.operations.slurm.read import TEXT_FORMAT, parser_of, read_job, read_node, read_text_job
from brctl.operations.slurm.read import SlurmJob as SlurmJob
from brctl.operations.slurm.read import SlurmNode as SlurmNode

_MAX_OUTPUT = 256 << 20  # bytes of one client command's output brctl will parse
_KEEP_STDERR = 64 << 10  # the last bytes of its stderr kept (for the message)
_JSON_FROM = (23, 2)  # the first release whose squeue --json applies -j and -u
_GONE = re.compile(r"Invalid job id specified")  # squeue -j ID of a job purged after MinJobAge


class Slurm:
    """Runs Slurm's client commands (argv lists, ``section.timeout`` each)."""

    def __init__(self, section: SlurmSection, cluster: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None) -> None:
        """Args: the ``slurm:`` section, ``job.slurm.cluster`` (-M), the environment."""
        self.section = section
        self.cluster = cluster
        self.environ = dict(environ) if environ is not None else None
        self._version: Optional[tuple[int, int]] = None

    def _call(self, argv: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
        full = [argv[0], *(["-M", self.cluster] if self.cluster else []), *argv[1:]]
        try:
            proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self.environ, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise InputError(f"{argv[0]}: not found: job.slurm needs Slurm's client commands "
                             "(squeue, sinfo, scontrol) on the controller's PATH") from None
        try:
            out, err = _bounded(proc, time.monotonic() + self.section.timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if out is None:
            raise IncompleteError(f"{argv[0]}: more than {_MAX_OUTPUT >> 20} MiB of output")
        if err is None:
            raise IncompleteError(f"{' '.join(full[:3])}: no answer within "
                                  f"{self.section.timeout:g} s (slurm.timeout)")
        return subprocess.CompletedProcess(full, proc.returncode, out, err)

    @staticmethod
    def _failed(argv: Sequence[str], done: subprocess.CompletedProcess[bytes]) -> IncompleteError:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return IncompleteError(f"{' '.join(argv[:4])} exited {done.returncode}: "
                               f"{(err or ['no message'])[-1][:300]}")

    def run(self, *argv: str) -> str:
        """stdout of one client command; exit 3 when Slurm does not answer."""
        done = self._call(argv)
        if done.returncode != 0:
            raise self._failed(argv, done)
        return done.stdout.decode(errors="replace")

    def json(self, *argv: str) -> Mapping[str, Any]:
        """A ``--json`` client command's document."""
        return self.json_text(argv[0], self.run(*argv))

    @staticmethod
    def json_text(command: str, text: str) -> Mapping[str, Any]:
        """``command``'s JSON document (exit 3 when it is not one)."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            raise IncompleteError(f"{command} --json: not JSON: {text[:120]!r}") from None
        if not isinstance(doc, dict):
            raise IncompleteError(f"{command} --json: not a JSON object")
        return doc

    def version(self) -> tuple[int, int]:
        """Slurm's release (major, minor) as ``squeue --version`` says it (asked once)."""
        if self._version is None:
            text = self.run("squeue", "--version")
            found = re.match(r"slurm(?:-wlm)? (\d+)\.(\d+)\b", text.strip())
            if found is None:
                raise IncompleteError(f"squeue --version: not a Slurm release: {text[:80]!r}")
            self._version = (int(found.group(1)), int(found.group(2)))
        return self._version

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

    def _jobs(self, argv: Sequence[str]) -> Optional[list[SlurmJob]]:
        """The jobs ``squeue ARGV`` shows (from 23.02 ``--json``, 22.05's text form before);
        None when Slurm says the job id it was given is not one it knows (gone).

        Every entry must read (exit 3 naming the one that does not): a job skipped would
        pass for a job that is gone.
        """
        json_form = self.version() >= _JSON_FROM
        argv = ["squeue", "--json", *argv] if json_form else \
            ["squeue", "-h", "-t", "all", *argv, "-O", TEXT_FORMAT]
        done = self._call(argv)
        if done.returncode != 0:
            if "-j" in argv and _GONE.search(done.stderr.decode(errors="replace")):
                return None
            raise self._failed(argv, done)
        asked = " ".join(argv[1:-2] if not json_form else argv[1:])
        if not json_form:
            where = f"squeue {asked} (Slurm {'.'.join(map(str, self.version()))}, text)"
            lines = done.stdout.decode(errors="replace").splitlines()
            return [read_text_job(line, f"{where}: line {i + 1}")
                    for i, line in enumerate(lines) if line.strip()]
        doc = self.json_text(argv[0], done.stdout.decode(errors="replace"))
        items = doc.get("jobs")
        where = f"squeue {asked} (data parser {parser_of(doc)})"
        if not isinstance(items, list):
            raise IncompleteError(f"{where}: no 'jobs' list")
        return [read_job(item, f"{where}: jobs[{i}]") for i, item in enumerate(items)]

    def job(self, job_id: str) -> Optional[SlurmJob]:
        """The job with this id as Slurm shows it now; None when Slurm no longer knows it.

        One job is asked for, never the whole queue: ``squeue --json -j ID`` from 23.02,
        22.05's ``squeue -h -j ID -O ...`` before (its --json ignores -j).
        """
        jobs = self._jobs(["-j", job_id])
        found = [j for j in jobs or () if j.job_id == job_id]  # -j 7 shows an array's tasks
        if found and self.version() < _JSON_FROM:
            # 22.05's -O has no ExcNodeList: its -o letter, after the id
            text = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%x|")
            rows = [line.split("|") for line in text.splitlines()]
            found = [replace(found[0], excluded=row[1]) for row in rows
                     if len(row) == 3 and row[0] == job_id] or found
        return found[0] if found else None

    def named(self, name: str, user: str) -> list[SlurmJob]:
        """``user``'s jobs named ``name`` (every state Slurm still remembers)."""
        if self.version() >= _JSON_FROM:
            return [j for j in self._jobs(["-u", user]) or () if j.name == name and j.user == user]
        # 22.05: Slurm filters by name and user; the name itself is never parsed
        return [replace(j, name=name) for j in self._jobs(["-n", name, "-u", user]) or ()
                if j.user == user]

    def nodes(self) -> dict[str, SlurmNode]:
        """Every machine Slurm reports, by name (each entry must read: exit 3 naming it):
        22.05's ``sinfo --json``; from 23.02 that is a summary by node state, and the
        machines themselves are ``scontrol --json show nodes``."""
        argv = ("scontrol", "--json", "show", "nodes") if self.version() >= _JSON_FROM else \
            ("sinfo", "--json")
        doc = self.json(*argv)
        items = doc.get("nodes")
        where = f"{' '.join(argv)} (data parser {parser_of(doc)})"
        if not isinstance(items, list):
            raise IncompleteError(f"{where}: no 'nodes' list")
        nodes = (read_node(item, f"{where}: nodes[{i}]") for i, item in enumerate(items))
        return {node.name: node for node in nodes}

    def reservation_nodes(self, name: str) -> tuple[str, ...]:
        """The machines of reservation ``name``."""
        text = self.run("scontrol", "-o", "show", "reservation", name)
        found = re.search(r"(?:^|\s)Nodes=(\S+)", text)
        return self.hostnames(found.group(1)) if found else ()

    def find(self, want: SlurmJobSection) -> SlurmJob:
        """The job ``want`` names, with its machines expanded; a name is looked up among
        ``want.user``'s jobs only (the load refuses a name without a user).

        Raises:
            InputError: Slurm has no such job.
            IncompleteError: the name matches several live jobs (``_the_live_one``).
        """
        if want.job is not None:
            found = [j for j in [self.job(str(want.job))] if j is not None]
        else:
            if want.name is None or not want.user:  # the load refuses this: never every user's jobs
                raise InputError(f"job.slurm: {want.describe()}: a name needs its user",
                                 hint="give job.slurm.user (or job.user), or the id as job.slurm.job")
            found = self.named(want.name, want.user)
            live = _the_live_one([j for j in found if j.state in ACTIVE], want)
            found = live or sorted(found, key=lambda j: _id_key(j.job_id))[-1:]
        if not found:
            raise InputError(f"job.slurm: Slurm has no {want.describe()} (squeue forgets "
                             "finished jobs after MinJobAge)",
                             hint="check the id with squeue, or update job.slurm")
        job = found[0]
        return replace(job, nodes=self.hostnames(job.nodelist)) if job.running else job


def _the_live_one(live: list[SlurmJob], want: SlurmJobSection) -> list[SlurmJob]:
    """The job among several live ones of that name: the job user can ``sbatch -J NAME
    --hold`` a job of the same name at any time, which must neither be taken for the job
    nor stop brctl. Held jobs (``JobHeld*``) drop out while another is live; then the one
    running, or the only one left; else exit 3 (retried), never 2 (final under the unit)."""
    if len(live) < 2:
        return live
    left = [j for j in live if not j.reason.startswith("JobHeld")] or live
    running = [j for j in left if j.running]
    if len(running) == 1 or len(left) == 1:
        return running[:1] or left
    raise IncompleteError(f"job.slurm: {len(left)} live Slurm jobs are {want.describe()}: "
                          f"{', '.join(j.job_id for j in left)}; which one is the job is "
                          "not known",
                          hint="give job.slurm.job: ID to say which")


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.split(r"[_+]", job_id) if p.isdigit())


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


def _bounded(proc: subprocess.Popen[bytes], give_up: float) -> tuple[Optional[bytes],
                                                                       Optional[bytes]]:
    """``proc``'s (stdout, stderr) read as they come, never more than ``_MAX_OUTPUT`` of
    stdout in memory (stdout None: more than that) nor ``_KEEP_STDERR`` of stderr (its
    tail); stderr None: not done by ``give_up``. The caller kills what is left."""
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        for pipe, buf in ((proc.stdout, out), (proc.stderr, err)):
            assert pipe is not None
            sel.register(pipe, selectors.EVENT_READ, buf)
        while sel.get_map():
            left = give_up - time.monotonic()
            if left <= 0:
                return b"", None
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(data)
                if key.data is out and len(out) > _MAX_OUTPUT:
                    return None, b""
                if key.data is err and len(err) > _KEEP_STDERR:
                    del err[:len(err) - _KEEP_STDERR]
    try:
        proc.wait(max(0.0, give_up - time.monotonic()))
    except subprocess.TimeoutExpired:
        return b"", None
    return bytes(out), bytes(err)
