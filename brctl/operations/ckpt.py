"""``brctl ckpt``: plan and verify backup placement; back up and restore shard files.

``backup`` copies each machine's newest complete step (``ckpt.dir`` + ``ckpt.glob``)
to its backup peer under ``ckpt.backup_root()/<machine>/<step>/``; ``restore`` puts an
evicted machine's newest verified copy onto a replacement. Bytes travel
node → controller → node (nodes may not reach each other): the transport's ``get``
into a local spool file, a sha256 check, then ``put`` (temp name, rename) — memory
stays bounded whatever the shard size, and at most ``parallel`` files are in flight.
A step becomes complete on the peer only when the node-side probe has re-hashed
every file and written the manifest, last and atomically; a partial copy never
has one, so it is resumed (files already there with the right checksum are kept)
and never restored. The daemon calls ``backup``/``restore`` directly.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.placement import ConflictIndex, Plan, Verification, plan_backups, verify_plan
from brctl.core.errors import ExitCode, InputError, UsageError
from brctl.core.schema import SchemaError, from_mapping
from brctl.core.transport import Node, NodeState, Transport
from brctl.diagnostics.ckptfiles import STAGING, sha256_file
from brctl.remote.probes import ProbeResult, ProbeRunner

PROBE = "brctl.diagnostics.ckptfiles"


# -- plan and verify -------------------------------------------------------------------


def domains_of(inv: Inventory) -> dict[str, str]:
    """Job machine → failure domain, from the node label named by ``ckpt.domain_label``."""
    key = inv.ckpt.domain_label
    return {n: inv.nodes[n].labels[key] for n in (inv.job.nodes if inv.job else ())
            if key in inv.nodes[n].labels}


def plan(inv: Inventory) -> Plan:
    """The backup plan of the inventory's job."""
    return plan_backups(job_topology(inv), domains_of(inv))


def verify(inv: Inventory, backups: Mapping[str, str] | None = None) -> Verification:
    """Verify ``backups`` (default: the plan brctl would make) against the job's groups."""
    topo = job_topology(inv)
    index = ConflictIndex.build(topo)  # built once, shared by the plan and the proof
    if backups is None:
        backups = plan_backups(topo, domains_of(inv), index).backups()
    return verify_plan(topo, backups, index)


@dataclass(frozen=True)
class _PlanEntry:
    node: str
    backup_node: str
    meets_rule: Optional[bool] = None
    how: Optional[str] = None
    shared_kinds: list[str] = field(default_factory=list)
    same_domain: Optional[bool] = None


def read_plan_file(path: str, inv: Inventory) -> dict[str, str]:
    """A placement file (YAML or JSON, ``placements: [{node, backup_node}]``), validated.

    Raises:
        InputError: unreadable or malformed file, unknown keys, machines that are not
            in the job (``node``) or the inventory (``backup_node``), a machine twice.
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"plan {path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        raise InputError(f"plan {path}: malformed YAML/JSON: {exc}") from None
    if isinstance(data, list):
        data = {"placements": data}
    if not isinstance(data, dict) or not isinstance(data.get("placements"), list):
        raise SchemaError(path, "placements", "expected a list of {node, backup_node}",
                          hint="the output of brctl ckpt plan --format yaml has this shape")
    job = set(inv.job.nodes) if inv.job else set()
    out: dict[str, str] = {}
    for i, raw in enumerate(data["placements"]):
        entry = from_mapping(_PlanEntry, raw, path, f"placements[{i}]")
        if entry.node not in job:
            raise SchemaError(path, f"placements[{i}].node", f"{entry.node!r} is not a job machine")
        if entry.backup_node not in inv.nodes:
            raise SchemaError(path, f"placements[{i}].backup_node",
                              f"{entry.backup_node!r} is not in the inventory")
        if entry.node in out:
            raise SchemaError(path, f"placements[{i}].node", f"{entry.node!r} is placed twice")
        out[entry.node] = entry.backup_node
    return out


# -- copies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """One machine's shards copied between two nodes (a backup or a restore)."""

    source: str  # where the bytes came from
    dest: str  # where they went
    owner: str  # whose shards they are
    state: str  # ok | failed | incomplete | nothing
    step: str | None = None
    files: int = 0
    copied: int = 0
    skipped: int = 0  # already there with the right checksum (resumed)
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """One entry of ``copies``."""
        return {"owner": self.owner, "source": self.source, "dest": self.dest,
                "state": self.state, "step": self.step, "files": self.files,
                "copied": self.copied, "skipped": self.skipped, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "error": self.error,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class CopyReport:
    """Every copy of one ``backup`` or ``restore`` run."""

    copies: tuple[Copy, ...]

    @property
    def exit_code(self) -> ExitCode:
        """3 if a node could not be reached, else 1 if a copy failed or had nothing, else 0."""
        states = {c.state for c in self.copies}
        if "incomplete" in states:
            return ExitCode.INCOMPLETE
        return ExitCode.FINDINGS if states - {"ok"} else ExitCode.OK


@dataclass(frozen=True)
class _File:
    rel: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.rel, "size": self.size, "sha256": self.sha256}


def _files(raw: Sequence[Mapping[str, Any]]) -> list[_File]:
    return [_File(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw]


def _probe_state(res: ProbeResult) -> str:
    return "failed" if res.run.state.ran else "incomplete"


class _Mover:
    """Streams files node → controller spool → node, ``parallel`` at a time."""

    def __init__(self, transport: Transport, parallel: int) -> None:
        self.transport = transport
        self.parallel = parallel

    def move(self, jobs: list[tuple[Node, str, Node, str, _File]]) -> list[str | None]:
        """Copy each (src node, src path, dst node, dst path, file); error text or None each."""
        with tempfile.TemporaryDirectory(prefix="brctl-ckpt-") as spool, \
                ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(jobs) or 1))) as pool:
            return list(pool.map(lambda ij: self._one(spool, ij[0], *ij[1]), enumerate(jobs)))

    def _one(self, spool: str, i: int, src: Node, src_path: str, dst: Node, dst_path: str,
             f: _File) -> str | None:
        local = os.path.join(spool, f"{i}")
        try:
            got = self.transport.get(src, src_path, local, timeout=src.command_timeout)
            if got.state is not NodeState.OK:
                return f"{src.name}:{src_path}: {got.state.value}: {got.stderr.strip()[-200:]}"
            digest = sha256_file(local)
            if digest != f.sha256:
                return (f"{src.name}:{src_path}: sha256 {digest[:12]}… read, {f.sha256[:12]}… "
                        "expected (changed or corrupted at the source)")
            put = self.transport.put(dst, local, dst_path, timeout=dst.command_timeout)
            if put.state is not NodeState.OK:
                return f"{dst.name}:{dst_path}: {put.state.value}: {put.stderr.strip()[-200:]}"
            return None
        finally:
            if os.path.exists(local):
                os.unlink(local)


def _batch(runner: ProbeRunner, inv: Inventory, per_node: Mapping[str, list[dict[str, Any]]]
           ) -> dict[str, tuple[ProbeResult, dict[str, Any]]]:
    """Run ``batch`` requests; → {node: (probe result, {key: item document})}."""
    nodes = [inv.nodes[n] for n in per_node]
    results = runner.run(nodes, PROBE, lambda n: {"op": "batch", "items": per_node[n.name]})
    out = {}
    for n in nodes:
        res = results[n.name]
        docs = res.document.get("results", {}) if res.document else {}
        out[n.name] = (res, docs)
    return out


def _item_error(res: ProbeResult, doc: Mapping[str, Any] | None) -> str | None:
    if res.error:
        return res.error
    if doc is None:
        return "no answer from the probe"
    if "probe_error" in doc:
        return str(doc["probe_error"])
    return None


@dataclass
class _Pending:
    """One machine's backup in progress."""

    owner: str
    peer: str
    src_dir: str
    step: str
    files: list[_File]
    peer_root: str = ""
    todo: list[_File] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _Backup:
    """The phases of one ``backup`` run: scan → compare → prepare → copy → commit."""

    def __init__(self, transport: Transport, inv: Inventory, backups: Mapping[str, str],
                 parallel: int, runner: ProbeRunner) -> None:
        self.transport, self.inv, self.backups = transport, inv, backups
        self.parallel, self.runner = parallel, runner
        self.cfg = inv.ckpt
        self.start = time.monotonic()
        self.done: dict[str, Copy] = {}

    def finish(self, p: _Pending, state: str, error: str | None = None,
               notes: tuple[str, ...] = (), copied: int | None = None) -> None:
        sent = len(p.todo) if copied is None else copied
        self.done[p.owner] = Copy(p.owner, p.peer, p.owner, state, p.step, len(p.files), sent,
                                  len(p.files) - len(p.todo), sum(f.size for f in p.todo[:sent]),
                                  time.monotonic() - self.start, error=error, notes=notes)

    def scan(self, owners: list[str]) -> list[_Pending]:
        """The newest complete step of every owner, hashed on its node."""
        cfg = self.cfg
        scans = self.runner.run([self.inv.nodes[o] for o in owners], PROBE, {
            "op": "scan", "dir": cfg.dir, "glob": cfg.glob, "marker": cfg.complete_marker,
            "hash_steps": 1})
        out = []
        for o in owners:
            res, doc, peer = scans[o], scans[o].document, self.backups[o]
            if doc is None:
                self.done[o] = Copy(o, peer, o, _probe_state(res), error=res.error)
                continue
            step = next((s for s in doc["steps"] if s.get("eligible") and "files" in s), None)
            if step is None:
                why = (f"no {cfg.glob} under {doc['dir']}" if not doc["steps"] else
                       f"no step has {cfg.complete_marker} yet")
                self.done[o] = Copy(o, peer, o, "nothing", error=why)
                continue
            out.append(_Pending(o, peer, doc["dir"], step["name"], _files(step["files"])))
        return out

    def batch(self, items: Mapping[str, dict[str, Any]], pending: list[_Pending]
              ) -> tuple[list[_Pending], dict[str, dict[str, Any]]]:
        """Run one batched probe item per pending copy on its peer; → (still going, docs)."""
        per_peer: dict[str, list[dict[str, Any]]] = {}
        for p in pending:
            per_peer.setdefault(p.peer, []).append({"key": p.owner, **items[p.owner]})
        answers = _batch(self.runner, self.inv, per_peer)
        going, docs = [], {}
        for p in pending:
            res, by_key = answers[p.peer]
            doc = by_key.get(p.owner)
            err = _item_error(res, doc)
            if err or doc is None:
                self.finish(p, _probe_state(res) if res.error else "failed", err, copied=0)
                continue
            going.append(p)
            docs[p.owner] = doc
        return going, docs

    def compare(self, pending: list[_Pending]) -> list[_Pending]:
        """What the peer already has: skip complete copies, list the files to send."""
        root = self.cfg.backup_root()
        going, docs = self.batch({p.owner: {"op": "scan_backup", "step": p.step,
                                            "root": posixpath.join(root, p.owner)}
                                  for p in pending}, pending)
        out = []
        for p in going:
            doc = docs[p.owner]
            p.peer_root = doc["root"]
            entry = next((s for s in doc["steps"] if s["name"] == p.step), None)
            present = dict(entry.get("present", {})) if entry else {}
            p.todo = [f for f in p.files if present.get(f.rel) != f.sha256]
            want = sorted((f.to_json() for f in p.files), key=lambda x: x["path"])
            if entry and entry["committed"] and not p.todo and \
                    sorted(entry.get("manifest", []), key=lambda x: x["path"]) == want:
                self.finish(p, "ok", notes=("already backed up",))
                continue
            out.append(p)
        return out

    def prepare(self, pending: list[_Pending]) -> list[_Pending]:
        """Create the step's directories on the peer and drop a stale manifest."""
        items = {}
        for p in pending:
            step_root = posixpath.join(p.peer_root, p.step)
            dirs = sorted({posixpath.dirname(posixpath.join(step_root, f.rel)) for f in p.files})
            items[p.owner] = {"op": "prepare", "dirs": dirs, "uncommit": [step_root]}
        return self.batch(items, pending)[0]

    def copy(self, pending: list[_Pending]) -> list[_Pending]:
        """Stream every missing file; machines with a failed file stop here."""
        jobs, whose = [], []
        for p in pending:
            for f in p.todo:
                jobs.append((self.inv.nodes[p.owner], posixpath.join(p.src_dir, f.rel),
                             self.inv.nodes[p.peer], posixpath.join(p.peer_root, p.step, f.rel), f))
                whose.append(p)
        for p, err in zip(whose, _Mover(self.transport, self.parallel).move(jobs)):
            if err:
                p.errors.append(err)
        for p in pending:
            if p.errors:
                self.finish(p, "failed", p.errors[0], tuple(p.errors[1:4]),
                            copied=len(p.todo) - len(p.errors))
        return [p for p in pending if not p.errors]

    def commit(self, pending: list[_Pending]) -> None:
        """The peer re-hashes everything and writes the manifest only if all match."""
        going, docs = self.batch({p.owner: {
            "op": "commit", "root": p.peer_root, "step": p.step, "source": p.owner,
            "files": [f.to_json() for f in p.files], "keep": self.cfg.keep} for p in pending},
            pending)
        for p in going:
            doc = docs[p.owner]
            if not doc.get("ok"):
                bad = (doc.get("mismatched") or []) + (doc.get("missing") or [])
                self.finish(p, "failed", "checksum mismatch on the peer after the copy: "
                            + ", ".join(bad)[:300])
                continue
            pruned = doc.get("pruned") or []
            self.finish(p, "ok", notes=(f"pruned {', '.join(pruned)}",) if pruned else ())


def backup(
    transport: Transport,
    inv: Inventory,
    backups: Mapping[str, str],
    *,
    nodes: Sequence[str] | None = None,
    parallel: int | None = None,
    runner: ProbeRunner | None = None,
) -> CopyReport:
    """Copy each machine's newest complete step to its backup peer (resumable, verified).

    Args:
        transport: the backend.
        inv: the inventory (``ckpt`` settings, nodes).
        backups: machine → backup peer (from ``plan`` or a plan file).
        nodes: back up only these machines (default: every machine in ``backups``).
        parallel: file copies in flight (default ``ckpt.parallel``).
        runner: the probe runner (one per process keeps the shipped-code cache warm).

    Returns:
        One ``Copy`` per machine, in the order of ``nodes``.

    Raises:
        UsageError: a machine in ``nodes`` has no planned peer.
    """
    unknown = [n for n in (nodes or []) if n not in backups]
    if unknown:
        raise UsageError(f"ckpt backup: no backup peer planned for {', '.join(unknown)}")
    owners = list(nodes or backups)
    run = _Backup(transport, inv, backups, parallel or inv.ckpt.parallel,
                  runner or ProbeRunner(transport))
    run.commit(run.copy(run.prepare(run.compare(run.scan(owners)))))
    return CopyReport(tuple(run.done[o] for o in owners))


def _newest_good_copy(runner: ProbeRunner, peer: Node, root: str, evicted: str
                      ) -> tuple[str | None, list[_File], list[str], str | None, ProbeResult | None]:
    """The newest committed step on ``peer`` whose files pass their checksums.

    Returns:
        (step or None, its files, notes about skipped steps, peer's resolved root,
        the failed probe result when the peer could not answer).
    """
    listing = runner.run([peer], PROBE, {"op": "scan_backup", "root": root, "deep": False})[peer.name]
    if listing.document is None:
        return None, [], [], None, listing
    notes: list[str] = []
    for entry in listing.document["steps"]:
        if not entry["committed"]:
            continue
        step = entry["name"]
        res = runner.run([peer], PROBE, {"op": "verify", "root": root, "step": step})[peer.name]
        doc = res.document
        if doc is None:
            return None, [], notes, None, res
        if doc["ok"]:
            return step, _files(doc["files"]), notes, listing.document["root"], None
        bad = (doc.get("mismatched") or []) + (doc.get("missing") or [])
        notes.append(f"{peer.name}: backup {step} of {evicted} is corrupted or truncated "
                     f"({', '.join(bad)[:200]}); trying an older step")
    return None, [], notes, listing.document["root"], None


def _check_restore_args(inv: Inventory, backups: Mapping[str, str], target: str, evicted: str,
                        source: str | None) -> str:
    for name, what in ((target, "--to"), (evicted, "--for")):
        if name not in inv.nodes:
            raise UsageError(f"ckpt restore {what} {name}: not in the inventory")
    peer = source or backups.get(evicted)
    if peer is None:
        raise UsageError(f"ckpt restore: no backup peer planned for {evicted}",
                         hint="give --from NODE, or --plan FILE with its placement")
    if peer not in inv.nodes:
        raise UsageError(f"ckpt restore --from {peer}: not in the inventory")
    if target == peer:
        raise UsageError(f"ckpt restore: --to {target} is the node holding the copy")
    return peer


def restore(
    transport: Transport,
    inv: Inventory,
    backups: Mapping[str, str],
    *,
    target: str,
    evicted: str,
    source: str | None = None,
    parallel: int | None = None,
    runner: ProbeRunner | None = None,
) -> CopyReport:
    """Put ``evicted``'s newest verified backup step into ``ckpt.dir`` on ``target``.

    The peer's committed steps are re-hashed newest first; a corrupted or truncated
    one is skipped (said in ``notes``) in favour of the next. The copy is staged
    under ``ckpt.dir/.brctl-restore/`` on the target, re-hashed there, and only then
    renamed into place.

    Args:
        transport: the backend.
        inv: the inventory.
        backups: machine → backup peer.
        target: the replacement machine (e.g. a standby).
        evicted: the machine whose shards are restored.
        source: take the copy from this node instead of the planned peer.
        parallel: file copies in flight.
        runner: the probe runner.

    Raises:
        UsageError: unknown machines, or no planned peer for ``evicted``.
    """
    cfg, runner = inv.ckpt, runner or ProbeRunner(transport)
    peer = _check_restore_args(inv, backups, target, evicted, source)
    start = time.monotonic()
    peer_node, target_node = inv.nodes[peer], inv.nodes[target]

    def result(state: str, step: str | None = None, files: int = 0, copied: int = 0,
               size: int = 0, error: str | None = None, notes: Sequence[str] = ()) -> CopyReport:
        return CopyReport((Copy(peer, target, evicted, state, step, files, copied, 0, size,
                                time.monotonic() - start, error, tuple(notes)),))

    root = posixpath.join(cfg.backup_root(), evicted)
    step, files, notes, peer_root, failed = _newest_good_copy(runner, peer_node, root, evicted)
    if failed is not None:
        return result(_probe_state(failed), error=failed.error, notes=notes)
    if step is None or peer_root is None:
        why = "every backup step failed its checksums" if notes else "no complete backup"
        return result("failed", error=f"{peer}: {why} of {evicted} under {peer_root or root}",
                      notes=notes)
    staging = posixpath.join(cfg.dir, STAGING, step)
    dirs = sorted({posixpath.dirname(posixpath.join(staging, f.rel)) for f in files})
    prep = runner.run([target_node], PROBE, {"op": "prepare", "clean": [staging],
                                              "dirs": [staging, *dirs]})[target]
    if prep.document is None:
        return result(_probe_state(prep), step, error=prep.error, notes=notes)
    real_staging = prep.document["resolved"][staging]
    jobs = [(peer_node, posixpath.join(peer_root, step, f.rel), target_node,
             posixpath.join(real_staging, f.rel), f) for f in files]
    errors = [e for e in _Mover(transport, parallel or cfg.parallel).move(jobs) if e]
    total = sum(f.size for f in files)
    if errors:
        return result("failed", step, len(files), len(files) - len(errors), total, errors[0],
                      notes + errors[1:4])
    fin = runner.run([target_node], PROBE, {"op": "finish_restore", "dir": cfg.dir, "step": step,
                                            "files": [f.to_json() for f in files]})[target]
    doc = fin.document
    if doc is None:
        return result(_probe_state(fin), step, len(files), len(files), total, fin.error, notes)
    if not doc.get("ok"):
        bad = (doc.get("mismatched") or []) + (doc.get("missing") or [])
        return result("failed", step, len(files), len(files), total,
                      "checksum mismatch on the target after the copy: " + ", ".join(bad)[:300],
                      notes)
    if doc.get("moved_aside"):
        notes.append(f"{target}: an existing {step} was moved aside to {doc['moved_aside']}")
    return result("ok", step, len(files), len(files), total, notes=notes)


def plan_document(p: Plan, job: str) -> dict[str, Any]:
    """The plan as the document ``--json`` and ``--format yaml`` print."""
    return {"job": job, "ok": p.ok, "placements": [x.to_json() for x in p.placements],
            "notes": list(p.notes)}


def dumps_yaml(doc: Mapping[str, Any]) -> str:
    """YAML for training code (stable key order)."""
    import yaml

    return str(yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False))
