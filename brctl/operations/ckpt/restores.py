"""``brctl ckpt restore``: an evicted machine's newest verified backup onto a replacement.

The copy model, the relay and the rules on node answers are ``ckpt_copy``'s (read
its docstring). On the target, bytes land in a staging dir that the node-side
``ckptmove stage`` makes in ``ckpt.dir`` (0700, random name, reopened only if still
the same inode and brctl's), each file checked against its sha256 as it lands; the
step is then handed to ``job.user`` when the inventory sets it (a fresh standby's
missing ``ckpt.dir`` is made for it too), else to ``ckpt.dir``'s owner, and renamed
into place. Shards that end up root-owned without ``job.user`` are a warning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brctl.analysis.inventory import Inventory
from brctl.core.errors import RefusedError, UsageError
from brctl.core.transport import Node, Transport
from brctl.diagnostics.ckptfiles import STAGING_PREFIX
from brctl.diagnostics.safefs import UnsafeName, check_component
from brctl.operations import Finished, Track, untracked
from brctl.operations.ckpt.copy import (
    MOVER,
    PROBE,
    Copy,
    CopyReport,
    CopyState,
    Lane,
    NodeRefused,
    Relay,
    ShardFile,
    answer_of,
    checked_files,
    checked_step,
    entries,
    names,
    probe_state,
    skip_notes,
)
from brctl.operations.ckpt.room import lanes
from brctl.operations.ledger.audit import Audit
from brctl.remote.probes import ProbeResult, ProbeRunner

# -- restore ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    """The newest good copy on the peer, or why there is none."""

    area: str = "backup"
    step: str | None = None
    files: tuple[ShardFile, ...] = ()
    notes: tuple[str, ...] = ()
    failed: ProbeResult | None = None
    warnings: tuple[str, ...] = ()
    root: str | None = None  # the area's root as the peer resolved it


def _newest_good_copy(runner: ProbeRunner, peer: Node, req: dict[str, Any], evicted: str,
                      glob: str) -> _Found:
    """The newest committed step of ``evicted`` on ``peer`` whose files pass their checksums."""
    req = {**req, "source": evicted}
    listing = runner.run([peer], PROBE, {**req, "op": "scan_backup", "deep": False})[peer.name]
    if listing.document is None:
        return _Found(req["area"], failed=listing)
    notes: list[str] = []
    doc = answer_of(listing)
    root = str(doc["root"]) if doc.get("root") else None
    # what the peer did not follow or read (in the legacy area: what the job planted)
    warnings = tuple(f"{peer.name}: {n}" for n in skip_notes(peer.name, doc.get("skipped")))
    for entry in entries(peer.name, doc.get("steps"), "backed-up steps"):
        if not entry.get("committed"):
            continue
        step = checked_step(peer.name, entry.get("name"), glob)
        res = runner.run([peer], PROBE, {**req, "op": "verify", "step": step})[peer.name]
        if res.document is None:
            return _Found(req["area"], notes=tuple(notes), failed=res, warnings=warnings)
        verified = answer_of(res)
        if verified.get("ok"):
            return _Found(req["area"], step,
                          tuple(checked_files(peer.name, step, verified.get("files"))),
                          tuple(notes), warnings=warnings, root=root)
        bad = (names(peer.name, verified.get("mismatched"), "mismatched files")
               + names(peer.name, verified.get("missing"), "missing files"))
        notes.append(f"{peer.name}: backup {step} of {evicted} is corrupted or truncated "
                     f"({', '.join(bad)[:200]}); trying an older step")
    return _Found(req["area"], notes=tuple(notes), warnings=warnings)


def _check_restore_args(inv: Inventory, backups: Mapping[str, str], target: str, evicted: str,
                        source: str | None, force: bool) -> str:
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
    if not force and inv.job is not None and target in inv.job.nodes and target != evicted:
        raise RefusedError(f"ckpt restore: --to {target} is a live member of job {inv.job.name}; "
                           f"restoring there would replace its own shards",
                           hint="restore onto a standby, or add --force if this is intended")
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
    force: bool = False,
    dry_run: bool = False,
    audit: Audit | None = None,
    track: Track = untracked,
) -> CopyReport:
    """Put ``evicted``'s newest verified backup step into ``ckpt.dir`` on ``target``.

    The peer's committed steps are re-hashed newest first; a corrupted or truncated
    one is skipped (said in ``notes``) in favour of the next. Without a copy in the
    backup root, one under the old default (``<ckpt.dir>/.brctl-backup``) is used,
    with a note. The copy is received into a fresh staging dir that brctl makes in
    ``ckpt.dir`` on the target, each file checked against its sha256 as it lands,
    handed to ``ckpt.dir``'s owner and only then renamed into place.

    A dry run finds and re-hashes the copy it would restore (reading only), looks
    whether the target already has that step (it would be moved aside) and stops:
    the copy is ``planned``, with its files, from where to where. Nothing is staged,
    sent or renamed.

    Args:
        transport: the backend.
        inv: the inventory.
        backups: machine → backup peer.
        target: the replacement machine (e.g. a standby).
        evicted: the machine whose shards are restored.
        source: take the copy from this node instead of the planned peer.
        parallel: relays in flight.
        runner: the probe runner.
        force: allow a ``target`` that is a member of the inventory's job.
        dry_run: find and check the copy, write nothing.
        audit: a hand restore's audit trail: the outcome is recorded and announced
            there with the operator (not for a dry run, nor a refused request).
        track: progress: the peer's verification, the copy, the target's final check.

    Raises:
        UsageError: unknown machines, or no planned peer for ``evicted``.
        RefusedError: ``target`` is a live job member and not ``force``.
    """
    peer = _check_restore_args(inv, backups, target, evicted, source, force)
    report = _restore(transport, inv, peer, target=target, evicted=evicted, parallel=parallel,
                      runner=runner or ProbeRunner(transport), dry_run=dry_run, track=track)
    if audit is not None and not dry_run:
        copy = report.copies[0]
        audit.record("restore", [target], {"for": evicted, "from": peer, "step": copy.step,
                                           "state": copy.state, "error": copy.error,
                                           "forced": force},
                     outcome=copy.state, reason=f"shards of {evicted} from {peer}"
                     + (f" ({copy.error})" if copy.error else ""))
    return report


def _restore(transport: Transport, inv: Inventory, peer: str, *, target: str, evicted: str,
             parallel: int | None, runner: ProbeRunner, dry_run: bool,
             track: Track) -> CopyReport:
    cfg = inv.ckpt
    start = time.monotonic()
    peer_node, target_node = inv.nodes[peer], inv.nodes[target]
    # job_user: the step is its; and whose private files a 0775 root ckpt.dir may hold
    area = {"dir": cfg.dir, "backup_dir": cfg.backup_dir, "job_user": inv.job.user if inv.job else None}

    def result(state: CopyState, step: str | None = None, files: int = 0, copied: int = 0,
               size: int = 0, error: str | None = None, notes: Sequence[str] = (),
               warnings: Sequence[str] = (), **where: Any) -> CopyReport:
        return CopyReport((Copy(peer, target, evicted, state, step, files, copied, 0, size,
                                time.monotonic() - start, error, tuple(notes),
                                found.warnings + tuple(warnings), **where),))

    found = _Found()
    verified = track(f"verify the backup on {peer}", [peer])
    try:
        found = _newest_good_copy(runner, peer_node, {**area, "area": "backup"}, evicted, cfg.glob)
        if found.step is None and found.failed is None and cfg.backup_dir is None:
            legacy = _newest_good_copy(runner, peer_node, {**area, "area": "legacy"}, evicted, cfg.glob)
            if legacy.step is not None:
                found = _Found(legacy.area, legacy.step, legacy.files, found.notes + legacy.notes,
                               warnings=(f"{peer}: restored from the old default backup root "
                                         f"{cfg.dir}/.brctl-backup (inside the job's directory); "
                                         f"new backups go to {cfg.dir}.brctl-backup",
                                         *found.warnings, *legacy.warnings))
            elif legacy.warnings:  # nothing restorable there, but the job planted things
                found = _Found(found.area, notes=found.notes + legacy.notes,
                               warnings=found.warnings + legacy.warnings)
    except NodeRefused as exc:
        return result("refused", error=str(exc))
    verified(Finished(peer))
    if found.failed is not None:
        return result(probe_state(found.failed), error=found.failed.error, notes=found.notes)
    if found.step is None:
        why = "every backup step failed its checksums" if found.notes else "no complete backup"
        return result("failed", error=f"{peer}: {why} of {evicted}", notes=found.notes)
    if dry_run:
        return _preview(runner, inv, peer_node, target_node, found, evicted, result)
    return _land(transport, runner, _Landing(peer_node, target_node, area, found, evicted),
                 parallel or cfg.parallel, result, track)


def _preview(runner: ProbeRunner, inv: Inventory, peer: Node, target: Node, found: _Found,
             evicted: str, result: Callable[..., CopyReport]) -> CopyReport:
    """A dry run's answer: the copy found, where it would land, and what it would move aside."""
    cfg = inv.ckpt
    assert found.step is not None
    listing = runner.run([target], PROBE, {"op": "scan", "dir": cfg.dir, "glob": cfg.glob,
                                           "hash_steps": 0})[target.name]
    notes = list(found.notes)
    if listing.document is None:
        return result(probe_state(listing), found.step, error=listing.error, notes=notes)
    try:
        doc = answer_of(listing)
        steps = entries(target.name, doc.get("steps"), "steps")
    except NodeRefused as exc:
        return result("refused", found.step, error=str(exc), notes=notes)
    if any(s.get("name") == found.step for s in steps):
        notes.append(f"{target.name}: its own {found.step} would be moved aside")
    root = found.root or (f"{cfg.dir}/.brctl-backup" if found.area == "legacy" else
                          cfg.backup_dir or cfg.dir.rstrip("/") + ".brctl-backup")
    files = found.files
    return result("planned", found.step, len(files), 0, sum(f.size for f in files), notes=notes,
                  from_path=f"{peer.name}:{root}/{evicted}/{found.step}",
                  to_path=f"{target.name}:{doc.get('dir') or cfg.dir}/{found.step}",
                  send=tuple(f.rel for f in files))


@dataclass(frozen=True)
class _Landing:
    peer: Node
    target: Node
    area: dict[str, Any]
    found: _Found
    evicted: str


def _land(transport: Transport, runner: ProbeRunner, job: _Landing, parallel: int,
          result: Callable[..., CopyReport], track: Track) -> CopyReport:
    """Stage on the target, relay the files into the staging dir, finish (or drop) it."""
    step, files, notes = job.found.step, list(job.found.files), list(job.found.notes)
    target, total = job.target.name, sum(f.size for f in job.found.files)
    staged = runner.run([job.target], MOVER, {**job.area, "op": "stage"})[target]
    if staged.document is None:
        return result(probe_state(staged), step, error=staged.error, notes=notes)
    try:
        answer = answer_of(staged)
        staging, ident = str(answer.get("staging")), answer.get("staging_id")
        if not staging.startswith(STAGING_PREFIX):
            raise NodeRefused(f"{target} named staging dir {staging!r}")
        check_component(staging)
        if (not isinstance(ident, list) or len(ident) != 2
                or not all(type(x) is int and x >= 0 for x in ident)):
            raise NodeRefused(f"{target} gave staging dir {staging} a malformed identity {ident!r}")
    except (NodeRefused, UnsafeName) as exc:
        return result("refused", step, error=str(exc), notes=notes)
    dst = {**job.area, "area": "staging", "staging": staging, "staging_id": ident, "step": step}
    copied = track(f"copy {step} {job.peer.name} -> {target}", [target])
    outcomes = Relay(transport, runner, parallel).run([
        Lane(job.peer, {**job.area, "area": job.found.area, "source": job.evicted, "step": step},
              job.target, dst, tuple(group)) for group in lanes(files, parallel)])
    copied(Finished(target))
    refused = next((str(o) for o in outcomes if isinstance(o, NodeRefused)), None)
    errors = [str(o) for o in outcomes if o]
    if not errors:
        fin = runner.run([job.target], MOVER, {**dst, "op": "finish_restore", "step": step,
                                               "files": [f.to_json() for f in files]})[target]
        doc = fin.document
        if doc is None:
            errors = [fin.error or "no answer"]
        elif "refused" in doc:
            refused = f"{target}: {doc['refused']}"
        elif not doc.get("ok"):
            try:
                bad = (names(target, doc.get("mismatched"), "mismatched files")
                       + names(target, doc.get("missing"), "missing files"))
            except NodeRefused as exc:
                bad, refused = [], str(exc)
            errors = ["checksum mismatch on the target after the copy: " + ", ".join(bad)[:300]]
        else:
            if doc.get("moved_aside"):
                notes.append(f"{target}: an existing {step} was moved aside to {doc['moved_aside']}")
            warn = []
            if doc.get("owner_uid") == 0 and not job.area.get("job_user"):
                warn.append(f"{target}: the restored shards of {step} are root-owned (as is "
                            "ckpt.dir there): a job that does not run as root cannot rotate or "
                            "delete them; set job.user to the job's user to hand them to it")
            return result("ok", step, len(files), len(files), total, notes=notes, warnings=warn)
    runner.run([job.target], MOVER, {**dst, "op": "drop"})  # best effort: the next stage cleans too
    if refused:
        return result("refused", step, len(files), 0, total, refused, notes)
    return result("failed", step, len(files), 0, total, errors[0], notes + errors[1:4])
