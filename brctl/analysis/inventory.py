"""The inventory model: raw YAML sections → resolved, frozen ``Inventory``.

The raw dataclasses mirror the YAML keys one to one (brctl-inventory(5)), so
``from_mapping`` rejects unknown keys and wrong types with the key path. ``build``
then expands node sets, applies per-entry ssh overrides and checks cross-references
(job nodes exist, address counts match, no machine listed twice).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Optional, Union

from brctl.config.ckpt import CkptSection
from brctl.config.daemon import DaemonSection
from brctl.config.diagnose import DiagnoseSection
from brctl.config.health import HealthSection
from brctl.config.slurm import SlurmJobSection, SlurmSection
from brctl.config.stacks import StacksSection
from brctl.config.update import UpdateSection
from brctl.core import nodeset
from brctl.core.errors import InputError
from brctl.core.schema import (
    SchemaError,
    at_least_one,
    from_mapping,
    non_negative,
    port_number,
    positive,
    regex,
)
from brctl.core.schema import field as sfield
from brctl.core.templates import check_template
from brctl.core.transport import Node
from brctl.diagnostics import safefs

Template = Union[str, list[str]]
ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")


def _order(value: str) -> str:
    """Field check: an order of Megatron's axes (tp, cp, ep, dp, pp), each at most once.

    Short orders (``tp-dp-pp``) are Megatron's too; whether one fits the job's
    sizes is checked with the topology (``topology.canonical_order``).
    """
    names = value.split("-")
    if any(n not in ("tp", "cp", "ep", "dp", "pp") for n in names) or \
            len(set(names)) != len(names):
        raise ValueError(f"{value!r} is not an order of tp, cp, ep, dp, pp (e.g. "
                         f"{' or '.join(ORDERS)})")
    return value


def _template(value: Template | None) -> Template | None:
    if value is None:
        return None
    try:
        check_template(value, "command template")
    except InputError as exc:
        raise ValueError(exc.message.removeprefix("command template: ")) from None
    return value


@dataclass(frozen=True)
class SshSection:
    """``ssh:`` defaults for every node (each key may be overridden per node entry)."""

    user: str = "root"
    port: int = sfield(22, check=port_number)
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = "~/.ssh/known_hosts"
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    connect_timeout: float = sfield(10.0, check=positive)
    command_timeout: float = sfield(600.0, check=positive)
    fanout: int = sfield(64, check=at_least_one)  # concurrent connections
    connect_rate: float = sfield(100.0, check=positive)  # new connections per second, at most
    proxy_jump: Optional[str] = None
    agent: bool = True  # offer the ssh-agent's keys ($SSH_AUTH_SOCK) after the key files
    python: str = "python3"
    output_keep: int = sfield(2 << 20, check=at_least_one)  # bytes kept at each end of each stream


@dataclass(frozen=True)
class NodeEntry:
    """One entry of ``nodes:`` or ``standby:``; ``name`` is a node set."""

    name: str
    address: Optional[str] = None
    gpus: int = sfield(8, check=non_negative)  # 0: a CPU-only machine (GPU checks skip)
    connection: Literal["ssh", "local", "slurm"] = "ssh"
    env: dict[str, str] = sfield(factory=dict)
    labels: dict[str, str] = sfield(factory=dict)  # e.g. {rack: r12}: failure domains
    user: Optional[str] = None
    port: Optional[int] = sfield(None, check=port_number)
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = None
    host_key_policy: Optional[Literal["strict", "accept-new"]] = None
    connect_timeout: Optional[float] = sfield(None, check=positive)
    command_timeout: Optional[float] = sfield(None, check=positive)
    proxy_jump: Optional[str] = None
    agent: Optional[bool] = None
    python: Optional[str] = None
    output_keep: Optional[int] = None


_USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]*\$?", re.IGNORECASE)


def _user_name(value: Optional[str]) -> Optional[str]:
    if value is not None and not _USER_NAME.fullmatch(value):
        raise ValueError(f"got {value!r}, expected a user name (letters, digits, _ . -)")
    return value


@dataclass(frozen=True)
class JobSection:
    """``job:`` the training job: its machines (``nodes``, or ``slurm``), parallel shape, hooks."""

    nodes: Optional[str] = None
    # the job in Slurm: the scheduler says where it runs (connection: slurm runs in it)
    slurm: Optional[SlurmJobSection] = None
    name: str = "job"
    tp: int = sfield(1, check=at_least_one)
    pp: int = sfield(1, check=at_least_one)
    cp: int = sfield(1, check=at_least_one)
    ep: int = sfield(1, check=at_least_one)
    order: str = sfield("tp-cp-ep-dp-pp", check=_order)
    process_match: str = sfield("pretrain", check=regex)
    log_paths: list[str] = sfield(factory=list)
    user: Optional[str] = sfield(None, check=_user_name)  # the job's (untrusted) user
    restart_command: Optional[Template] = sfield(None, check=_template)
    stop_command: Optional[Template] = sfield(None, check=_template)
    status_command: Optional[Template] = sfield(None, check=_template)
    evict_command: Optional[Template] = sfield(None, check=_template)
    unevict_command: Optional[Template] = sfield(None, check=_template)


@dataclass(frozen=True)
class RawInventory:
    """The whole file as written."""

    nodes: list[NodeEntry]
    ssh: SshSection = sfield(factory=SshSection)
    standby: list[NodeEntry] = sfield(factory=list)
    job: Optional[JobSection] = None
    health: HealthSection = sfield(factory=HealthSection)
    diagnose: DiagnoseSection = sfield(factory=DiagnoseSection)
    update: UpdateSection = sfield(factory=UpdateSection)
    ckpt: CkptSection = sfield(factory=CkptSection)
    daemon: DaemonSection = sfield(factory=DaemonSection)
    slurm: SlurmSection = sfield(factory=SlurmSection)
    stacks: StacksSection = sfield(factory=StacksSection)


@dataclass(frozen=True)
class Job:
    """The resolved job: machines in machine order and the parallel sizes."""

    name: str
    nodes: tuple[str, ...]
    tp: int
    pp: int
    cp: int
    ep: int
    order: str
    process_match: str
    log_paths: tuple[str, ...]
    user: Optional[str]
    restart_command: Optional[Template]
    stop_command: Optional[Template]
    status_command: Optional[Template]
    evict_command: Optional[Template]
    unevict_command: Optional[Template] = None
    # From the scheduler: ``nodes`` is empty until a command resolves the job
    # (``operations.slurm.job``), which also sets ``source`` and ``state``.
    slurm: Optional[SlurmJobSection] = None
    source: str = "inventory"  # where ``nodes`` came from, in words (brctl nodes shows it)
    state: Optional[str] = None  # the scheduler's state (RUNNING, PENDING, …); None: not asked
    scheduler_id: Optional[str] = None  # the scheduler's id of the job, once resolved


NO_JOB = "-"  # the state database's key for machines outside any job


@dataclass(frozen=True)
class Inventory:
    """The resolved inventory every command receives (never raw dicts)."""

    source: str
    nodes: Mapping[str, Node]  # every machine, job and standby, in file order
    standby: tuple[str, ...]
    job: Optional[Job]
    ssh: SshSection
    health: HealthSection = field(default_factory=HealthSection)
    diagnose: DiagnoseSection = field(default_factory=DiagnoseSection)
    update: UpdateSection = field(default_factory=UpdateSection)
    ckpt: CkptSection = field(default_factory=CkptSection)
    daemon: DaemonSection = field(default_factory=DaemonSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    stacks: StacksSection = field(default_factory=StacksSection)
    # key path -> line in the file, for the keys only checked after loading (the job's
    # sizes, checked when its topology is built): their errors say file:line key too
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)

    def node(self, name: str) -> Node:
        """The machine called ``name``."""
        return self.nodes[name]

    def select(self, include: str | None = None, exclude: str | None = None) -> list[Node]:
        """Machines picked by ``-w`` / ``-x`` (all when neither is given), in file order.

        Both take node sets with operators and this inventory's ``@groups``.
        """
        picked = nodeset.select(list(self.nodes), include, exclude, self.group)
        return [self.nodes[n] for n in picked]

    def expand(self, pattern: str) -> list[str]:
        """A node set with this inventory's ``@groups`` resolved, in written order."""
        return nodeset.expand(pattern, self.group)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Every group by name (without ``@``): all, job, standby, each label and label:value."""
        out: dict[str, tuple[str, ...]] = {
            "all": tuple(self.nodes),
            "job": self.job.nodes if self.job else (),
            "standby": self.standby,
        }
        labelled: dict[str, list[str]] = {}
        for node in self.nodes.values():
            for key, value in node.labels.items():
                labelled.setdefault(key, []).append(node.name)
                labelled.setdefault(f"{key}:{value}", []).append(node.name)
        for name, members in sorted(labelled.items()):
            out.setdefault(name, tuple(members))  # the built-in groups win over a label of that name
        return out

    def group(self, name: str) -> tuple[str, ...]:
        """The machines of group ``@name``.

        Raises:
            InputError: no such group (the message lists the groups there are).
        """
        groups = self.groups()
        if name not in groups:
            shown = [f"@{g}" for g in groups]
            known = ", ".join(shown[:12]) + (f" and {len(shown) - 12} more" if len(shown) > 12 else "")
            raise InputError(f"group @{name} is not in the inventory {self.source}",
                             hint=f"groups: {known}")
        return groups[name]

    @property
    def job_key(self) -> str:
        """The job's key in the state database: its name, or ``-`` when there is no job."""
        return self.job.name if self.job else NO_JOB

    def job_nodes(self) -> list[Node]:
        """The job's machines in machine order (empty without a job)."""
        return [self.nodes[n] for n in self.job.nodes] if self.job else []


_SSH_KEYS = tuple(f.name for f in fields(SshSection) if f.name not in ("fanout", "connect_rate"))


def _check_node_name(name: str, source: str, path: str) -> None:
    """Node names become file names (state, backups, staging) and argv words: keep them plain."""
    hint = ("node names are used as path components on the machines; "
            "use letters and digits, not '.', '..' or a leading '-'")
    try:
        safefs.check_component(name)
    except safefs.UnsafeName:
        raise SchemaError(source, path, f"node name {name!r} is not a usable file name",
                          hint=hint) from None
    if name.startswith("-"):
        raise SchemaError(source, path,
                          f"node name {name!r} starts with '-' (it would read as an option)",
                          hint=hint)


def resolve_entries(
    entries: list[NodeEntry], ssh: SshSection, source: str, section: str
) -> list[Node]:
    out: list[Node] = []
    for i, entry in enumerate(entries):
        path = f"{section}[{i}]"
        try:
            names = nodeset.expand(entry.name)
        except Exception as exc:
            raise SchemaError(source, f"{path}.name", str(exc)) from None
        for name in names:
            _check_node_name(name, source, f"{path}.name")
        addresses = names
        if entry.address is not None:
            try:
                addresses = nodeset.expand(entry.address)
            except Exception as exc:
                raise SchemaError(source, f"{path}.address", str(exc)) from None
            if len(addresses) != len(names):
                raise SchemaError(
                    source,
                    f"{path}.address",
                    f"{len(addresses)} addresses for {len(names)} names",
                    hint="address must expand to as many entries as name",
                )
        overrides: dict[str, Any] = {k: getattr(ssh, k) for k in _SSH_KEYS}
        overrides.update({k: getattr(entry, k) for k in _SSH_KEYS if getattr(entry, k) is not None})
        for name, address in zip(names, addresses):
            out.append(
                Node(
                    name=name,
                    address=address,
                    gpus=entry.gpus,
                    connection=entry.connection,
                    env=dict(entry.env),
                    labels=dict(entry.labels),
                    **overrides,
                )
            )
    return out


def build(raw: RawInventory, source: str) -> Inventory:
    """Resolve node sets, per-entry overrides and cross-references.

    Raises:
        SchemaError: a name repeated, a job node missing, an address count mismatch.
    """
    main = resolve_entries(raw.nodes, raw.ssh, source, "nodes")
    spare = resolve_entries(raw.standby, raw.ssh, source, "standby")
    nodes: dict[str, Node] = {}
    for section, group in (("nodes", main), ("standby", spare)):
        for node in group:
            if node.name in nodes:
                raise SchemaError(source, section, f"machine {node.name!r} is listed twice")
            nodes[node.name] = node
    job = None
    if raw.job is not None:
        job_names = _job_names(raw.job, source)  # checked; with job.slurm, Slurm's list wins
        missing = [n for n in job_names if n not in nodes]
        if missing:
            raise SchemaError(
                source,
                "job.nodes",
                f"not defined under nodes: {nodeset.fold(missing)}",
                hint="every job machine needs an entry under nodes:",
            )
        cpu_only = [n for n in job_names if nodes[n].gpus == 0]
        if cpu_only:
            raise SchemaError(
                source,
                "job.nodes",
                f"{nodeset.fold(cpu_only)} declared with gpus: 0",
                hint="a job machine holds ranks: give it gpus: N (N >= 1)",
            )
        j = raw.job
        job = Job(
            name=j.name,
            nodes=() if j.slurm is not None else tuple(job_names),  # Slurm's, once asked
            tp=j.tp,
            pp=j.pp,
            cp=j.cp,
            ep=j.ep,
            order=j.order,
            process_match=j.process_match,
            log_paths=tuple(j.log_paths),
            user=j.user,
            restart_command=j.restart_command,
            stop_command=j.stop_command,
            status_command=j.status_command,
            evict_command=j.evict_command,
            unevict_command=j.unevict_command,
            # a name is looked up among job.slurm.user's jobs, else job.user's
            slurm=replace(j.slurm, user=j.user) if j.slurm is not None and j.slurm.name is not None
            and not j.slurm.user else j.slurm,
            source="inventory" if j.slurm is None else f"Slurm {j.slurm.describe()} (not asked yet)",
        )
        if j.user:  # job-writable code on any machine (standbys too) runs as the job's user
            nodes = {n: replace(node, job_user=j.user) for n, node in nodes.items()}
    return Inventory(
        source=source,
        nodes=nodes,
        standby=tuple(n.name for n in spare),
        job=job,
        ssh=raw.ssh,
        health=raw.health,
        diagnose=raw.diagnose,
        update=raw.update,
        ckpt=raw.ckpt,
        daemon=raw.daemon,
        slurm=raw.slurm,
        stacks=raw.stacks,
    )


def _job_names(job: JobSection, source: str) -> list[str]:
    """``job.nodes`` expanded; none when the scheduler says (``job.slurm``), resolved later."""
    if job.nodes is None and job.slurm is None:
        raise SchemaError(source, "job.nodes", "required key is missing (or give job.slurm: "
                          "the scheduler says where the job runs)")
    if job.slurm is not None and (job.slurm.job is None) == (job.slurm.name is None):
        raise SchemaError(source, "job.slurm", "give the job's id (job:) or its name (name:), "
                          "one of them", hint="e.g. slurm: {job: 123456} or slurm: {name: "
                          "pretrain, user: alice}")
    if job.slurm is not None and job.slurm.name is not None and not (job.slurm.user or job.user):
        # a name alone matches every user's jobs: another user's job would pass for this one
        raise SchemaError(source, "job.slurm", f"a job given by name ({job.slurm.name!r}) needs "
                          "its user: job.slurm.user (or job.user), or give its id as job:",
                          hint=f"e.g. slurm: {{name: {job.slurm.name}, user: alice}} or slurm: "
                               "{job: 123456}")
    try:
        listed = nodeset.expand(job.nodes) if job.nodes is not None else []
    except Exception as exc:
        raise SchemaError(source, "job.nodes", str(exc)) from None
    return listed


def from_document(data: Any, source: str) -> Inventory:
    """Validate a parsed YAML document and resolve it."""
    if not isinstance(data, dict):
        raise SchemaError(source, "", "expected a mapping at the top level (ssh:, nodes:, job: …)")
    return build(from_mapping(RawInventory, data, source), source)

