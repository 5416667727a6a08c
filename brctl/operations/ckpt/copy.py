"""``brctl ckpt backup|restore``: shard files between nodes, checked, resumable, refused when unsafe.

``backup`` copies each machine's newest complete step (``ckpt.dir`` + ``ckpt.glob``)
to its backup peer under ``<backup root>/<machine>/<step>/``; ``restore`` puts an
evicted machine's newest verified copy onto a replacement. Bytes travel node →
controller → node (nodes may not reach each other) as a relay of two streams: the
source node's ``ckptmove send`` writes the files back to back, the controller pipes
them to the destination's ``ckptmove receive``, which writes each through directory
fds under a new temp name, checks its sha256 and only then renames it. Nothing is
spooled on the controller; at most ``parallel`` relays are in flight. A step becomes
complete on the peer only when every file landed with its sha256 checked and the
node wrote the manifest, last and atomically; a partial copy never has one, so it is resumed
(files already there with the right checksum are kept) and never restored.

Trust (README "Safe by default"; brctl-inventory(5), SECURITY): every name in a node's answer is checked
here before it is used (a step matches ``ckpt.glob`` and is one path component, a
file path is normalised and inside its step, sizes and checksums well-formed) and
again by the receiving node. A bad name, or a node-side refusal (an unsafe backup
root, a symlink where a file was hashed), is the copy state ``refused`` with the
reason, and nothing is written: the run exits 4. The daemon calls ``backup`` and
``restore`` directly.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from brctl.analysis.inventory import Inventory
from brctl.core.errors import ExitCode, UsageError, exit_code_of
from brctl.core.transport import Node, NodeState, RunResult, Transport
from brctl.diagnostics.ckptmove import REFUSED_EXIT
from brctl.diagnostics.safefs import UnsafeName, check_component, check_relpath
from brctl.operations import Finished, Track, untracked
from brctl.operations.ckpt.room import lanes, no_room, receiver_failed, room_request
from brctl.remote.probes import ProbeResult, ProbeRunner, parse_document

PROBE = "brctl.diagnostics.ckptfiles"
MOVER = "brctl.diagnostics.ckptmove"
MIN_RATE = 8 << 20  # bytes/s a stream is allowed at least, on top of the node's command timeout
SENDER_GRACE_S = 10.0  # a sender whose receiver is done has this long to exit by itself
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ok | failed | incomplete | nothing (no step to copy) | refused (a safety rule) | planned (a dry run)
CopyState = Literal["ok", "failed", "incomplete", "nothing", "refused", "planned"]


@dataclass(frozen=True)
class Copy:
    """One machine's shards copied between two nodes (a backup or a restore)."""

    source: str  # where the bytes came from
    dest: str  # where they went
    owner: str  # whose shards they are
    state: CopyState
    step: str | None = None
    files: int = 0
    copied: int = 0
    skipped: int = 0  # already there with the right checksum (resumed)
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    notes: tuple[str, ...] = ()
    # what an operator must hear even when the copy is ok: files the job planted
    # that were not followed, a restore from the old default backup root
    warnings: tuple[str, ...] = ()
    from_path: str | None = None  # node:directory of the step read
    to_path: str | None = None  # node:directory of the step written
    send: tuple[str, ...] = ()  # a dry run: the files that would be sent (bytes: their size)

    def to_json(self) -> dict[str, object]:
        """One entry of ``copies``."""
        return {"owner": self.owner, "source": self.source, "dest": self.dest,
                "state": self.state, "step": self.step, "files": self.files,
                "copied": self.copied, "skipped": self.skipped, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "error": self.error,
                "notes": list(self.notes), "warnings": list(self.warnings),
                "from_path": self.from_path, "to_path": self.to_path, "send": list(self.send)}


@dataclass(frozen=True)
class CopyReport:
    """Every copy of one ``backup`` or ``restore`` run."""

    copies: tuple[Copy, ...]

    @property
    def exit_code(self) -> ExitCode:
        """4 if one was refused, else 3 if a node could not be reached, else 1 if a copy
        failed or had nothing, else 0 (a dry run's ``planned`` copies are 0)."""
        states = {c.state for c in self.copies}
        return exit_code_of(refused="refused" in states, incomplete="incomplete" in states,
                            findings=bool(states - {"ok", "planned"}))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.ckpt.backup/1`` and ``brctl.ckpt.restore/1``."""
        return {"copies": [c.to_json() for c in self.copies]}


@dataclass(frozen=True)
class ShardFile:
    rel: str
    size: int
    sha256: str
    mode: int = 0o644
    # the file's identity on the node that hashed it (scan), checked again by its send
    dev: int | None = field(default=None, compare=False)
    ino: int | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The entry receivers check and manifests keep (no node-local identity)."""
        return {"path": self.rel, "size": self.size, "sha256": self.sha256, "mode": self.mode}

    def send_json(self) -> dict[str, Any]:
        """The entry for the node that sends it: with its identity there, when known."""
        out = self.to_json()
        if self.ino is not None:
            out.update(dev=self.dev, ino=self.ino)
        return out


class NodeRefused(Exception):
    """A node's answer broke a rule (a bad name) or the node refused; → state ``refused``."""


# -- what nodes say, checked --------------------------------------------------------------


def checked_step(node: str, name: Any, glob: str) -> str:
    """A step name from ``node``: one path component matching ``ckpt.glob``."""
    try:
        check_component(name)
    except UnsafeName as exc:
        raise NodeRefused(f"{node} reported step {name!r}: {exc}") from None
    if not fnmatch.fnmatchcase(name, glob):
        raise NodeRefused(f"{node} reported step {name!r}, which does not match ckpt.glob {glob!r}")
    return str(name)


def checked_files(node: str, step: str, raw: Any) -> list[ShardFile]:
    """File entries from ``node``: normalised paths inside ``step``, sane sizes and checksums."""
    if not isinstance(raw, list):
        raise NodeRefused(f"{node} reported files of {step} that are not a list")
    out = []
    for f in raw:
        path = f.get("path") if isinstance(f, dict) else None
        try:
            check_relpath(path)  # type: ignore[arg-type]
        except UnsafeName as exc:
            raise NodeRefused(f"{node} reported file {path!r} of {step}: {exc}") from None
        assert isinstance(f, dict) and isinstance(path, str)
        if path != step and not path.startswith(step + "/"):
            raise NodeRefused(f"{node} reported file {path!r} outside its step {step!r}")
        size, sha, mode = f.get("size"), f.get("sha256"), f.get("mode", 0o644)
        dev, ino = f.get("dev"), f.get("ino")
        if (not isinstance(size, int) or size < 0 or not isinstance(sha, str)
                or not _SHA256.fullmatch(sha) or not isinstance(mode, int) or not 0 <= mode <= 0o7777
                or (dev is None) != (ino is None)
                or not all(x is None or (type(x) is int and x >= 0) for x in (dev, ino))):
            raise NodeRefused(f"{node} reported a malformed entry for {path!r}")
        out.append(ShardFile(path, size, sha, mode, dev, ino))
    return out


def listed(node: str, raw: Any, what: str) -> list[Any]:
    """A list from ``node``'s answer (absent: empty); any other type refuses."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise NodeRefused(f"{node} reported {what} that is not a list: {type(raw).__name__}")
    return raw


def entries(node: str, raw: Any, what: str) -> list[Mapping[str, Any]]:
    """A list of JSON objects from ``node``'s answer; any other shape refuses."""
    out = listed(node, raw, what)
    if not all(isinstance(e, dict) for e in out):
        raise NodeRefused(f"{node} reported {what} that are not all objects")
    return out


def names(node: str, raw: Any, what: str) -> list[str]:
    """A list of strings (paths, steps) from ``node``'s answer; any other shape refuses."""
    out = listed(node, raw, what)
    if not all(isinstance(n, str) for n in out):
        raise NodeRefused(f"{node} reported {what} that are not all strings")
    return out


def skip_notes(node: str, raw: Any) -> list[str]:
    """``[[name, why], ...]`` (what a node did not follow) as notes; any other shape refuses."""
    out = listed(node, raw, "skipped entries")
    if not all(isinstance(e, list) and len(e) == 2 for e in out):
        raise NodeRefused(f"{node} reported skipped entries that are not [name, why] pairs")
    return [f"{name!r} skipped: {why}" for name, why in out]


def answer_of(res: ProbeResult, doc: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The document (or batch item) of ``res``; a node-side refusal raises ``NodeRefused``."""
    doc = res.document if doc is None else doc
    if doc is not None and "refused" in doc:
        raise NodeRefused(f"{res.node}: {doc['refused']}")
    assert doc is not None
    return doc


def probe_state(res: ProbeResult) -> CopyState:
    return "failed" if res.run.state.ran else "incomplete"


def _item_error(res: ProbeResult, doc: Mapping[str, Any] | None) -> str | None:
    if res.error:
        return res.error
    if doc is None:
        return "no answer from the probe"
    if "probe_error" in doc:
        return str(doc["probe_error"])
    return None


# -- the relay ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lane:
    """Files streamed in one relay: ``send`` on ``src`` piped into ``receive`` on ``dst``."""

    src: Node
    send: dict[str, Any]
    dst: Node
    receive: dict[str, Any]
    files: tuple[ShardFile, ...]


class Relay:
    """Runs lanes, ``parallel`` at a time, over one transport and probe runner."""

    def __init__(self, transport: Transport, runner: ProbeRunner, parallel: int) -> None:
        self.transport, self.runner, self.parallel = transport, runner, parallel

    def run(self, jobs: list[Lane], on_lane: Callable[[Lane], None] | None = None
            ) -> list[str | NodeRefused | None]:
        """One outcome per lane: None (every file landed), an error text, or a refusal;
        ``on_lane`` hears of each lane as it ends (progress)."""
        if not jobs:
            return []

        def one(lane: Lane) -> str | NodeRefused | None:
            out = self._one(lane)
            if on_lane is not None:
                on_lane(lane)
            return out

        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(jobs)))) as pool:
            return list(pool.map(one, jobs))

    def _argv(self, node: Node, request: Mapping[str, Any]) -> list[str]:
        return self.runner.command(node, MOVER, json.dumps(dict(request)))

    def _one(self, lane: Lane) -> str | NodeRefused | None:
        files = [f.to_json() for f in lane.files]
        send_files = [f.send_json() for f in lane.files]
        size = sum(f.size for f in lane.files)
        timeout = max(lane.src.command_timeout, lane.dst.command_timeout) + size / MIN_RATE
        r, w = os.pipe()
        reader, writer = os.fdopen(r, "rb", buffering=0), os.fdopen(w, "wb")
        sent: list[RunResult] = []

        def send() -> None:
            try:
                sent.append(self.transport.stream(
                    lane.src, self._argv(lane.src, {**lane.send, "op": "send", "files": send_files}),
                    timeout=timeout, stdout=writer))
            finally:
                with contextlib.suppress(OSError):  # the receiver may be gone: nothing to flush to
                    writer.close()  # EOF for the receiver, whatever happened

        sender = threading.Thread(target=send, daemon=True, name=f"brctl-send-{lane.src.name}")
        sender.start()
        try:
            got = self.transport.stream(
                lane.dst, self._argv(lane.dst, {**lane.receive, "op": "receive", "files": files}),
                timeout=timeout, stdin=reader)
        finally:
            # The receiver has read what it wanted: give the sender a moment to exit on its
            # own first. Closing the pipe under it at once made its reaper take the closed
            # pipe for a lost controller (exit 129) as it was exiting after its last byte.
            # A sender still writing after that gets EPIPE instead of waiting forever.
            sender.join(SENDER_GRACE_S)
            reader.close()
        sender.join()
        return _lane_outcome(lane, sent[0] if sent else None, got)


def _lane_outcome(lane: Lane, sent: RunResult | None, got: RunResult) -> str | NodeRefused | None:
    src, dst = lane.src.name, lane.dst.name
    doc, err = parse_document(got)
    if doc is not None and "refused" in doc:
        return NodeRefused(f"{dst}: {doc['refused']}")
    if (why_dst := receiver_failed(dst, got, err)) and (sent is None or sent.exit_code != REFUSED_EXIT):
        return why_dst  # its cause (ENOSPC on the peer), not the sender's EPIPE that follows
    if sent is not None and sent.state is not NodeState.OK:
        why = sent.stderr.strip().splitlines()[-1:] or [sent.state.value]
        if sent.exit_code == REFUSED_EXIT:
            return NodeRefused(f"{src}: {why[0].removeprefix('brctl: send stopped: ')}")
        return (f"{src}: sending failed ({sent.state.value}, exit {sent.exit_code}, "
                f"{sent.seconds:.1f} s): {why[0][:300]}")
    if doc is None:
        return f"{dst}: receiving failed: {err}"
    try:
        mismatched = names(dst, doc.get("mismatched"), "mismatched files")
        missing = names(dst, doc.get("missing"), "missing files")
    except NodeRefused as exc:
        return exc
    if mismatched:
        return (f"{dst}: sha256 of {', '.join(mismatched)[:300]} did not match what "
                f"{src} hashed (changed or corrupted at the source, or in transit)")
    if missing:
        return f"{dst}: the stream from {src} ended before {', '.join(missing)[:300]}"
    return None


# -- backup -------------------------------------------------------------------------------


@dataclass
class _Pending:
    """One machine's backup in progress."""

    owner: str
    peer: str
    step: str
    files: list[ShardFile]
    skipped_at_source: list[str] = field(default_factory=list)
    todo: list[ShardFile] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    src_dir: str = ""  # ckpt.dir as the owner's node resolved it
    root: str | None = None  # the backup root as the peer resolved it (None: not made yet)


class _Backup:
    """The phases of one ``backup`` run: scan → compare → prepare → copy → commit."""

    def __init__(self, transport: Transport, inv: Inventory, backups: Mapping[str, str],
                 parallel: int, runner: ProbeRunner, track: Track = untracked) -> None:
        self.transport, self.inv, self.backups = transport, inv, backups
        self.parallel, self.runner, self.track = parallel, runner, track
        self.cfg = inv.ckpt
        # job_user: whose private files a root-owned ckpt.dir others can write may hold
        self.area = {"dir": self.cfg.dir, "backup_dir": self.cfg.backup_dir,
                     "job_user": inv.job.user if inv.job else None}
        self.start = time.monotonic()
        self.done: dict[str, Copy] = {}

    def finish(self, p: _Pending, state: CopyState, error: str | None = None,
               notes: tuple[str, ...] = (), copied: int | None = None) -> None:
        sent = len(p.todo) if copied is None else copied
        planned = state == "planned"
        root = p.root or self.cfg.backup_dir or self.cfg.dir.rstrip("/") + ".brctl-backup"
        self.done[p.owner] = Copy(
            p.owner, p.peer, p.owner, state, p.step, len(p.files), 0 if planned else sent,
            len(p.files) - len(p.todo), sum(f.size for f in (p.todo if planned else p.todo[:sent])),
            time.monotonic() - self.start, error=error, notes=notes,
            warnings=tuple(p.skipped_at_source), from_path=f"{p.owner}:{p.src_dir}/{p.step}",
            to_path=f"{p.peer}:{root}/{p.owner}/{p.step}",
            send=tuple(f.rel for f in p.todo) if planned else ())

    def scan(self, owners: list[str]) -> list[_Pending]:
        """The newest complete step of every owner, hashed on its node."""
        cfg = self.cfg
        scans = self.runner.run([self.inv.nodes[o] for o in owners], PROBE, {
            **self.area, "op": "scan", "glob": cfg.glob, "marker": cfg.complete_marker,
            "hash_steps": 1}, on_done=self.track("scan and hash", owners))
        out = []
        for o in owners:
            res, peer = scans[o], self.backups[o]
            if res.document is None:
                self.done[o] = Copy(o, peer, o, probe_state(res), error=res.error)
                continue
            try:
                p = self._pending(o, answer_of(res))
            except NodeRefused as exc:
                self.done[o] = Copy(o, peer, o, "refused", error=str(exc))
                continue
            if isinstance(p, str):
                self.done[o] = Copy(o, peer, o, "nothing", error=p)
                continue
            out.append(p)
        return out

    def _pending(self, owner: str, doc: Mapping[str, Any]) -> _Pending | str:
        cfg = self.cfg
        steps = entries(owner, doc.get("steps"), "steps")
        notes = skip_notes(owner, doc.get("skipped"))
        step = next((s for s in steps if s.get("eligible") and "files" in s), None)
        if step is None:
            why = (f"no {cfg.glob} under {doc.get('dir')}" if not steps else
                   f"no step has {cfg.complete_marker} yet")
            return "; ".join([why, *notes])
        name = checked_step(owner, step.get("name"), cfg.glob)
        notes += skip_notes(owner, step.get("skipped"))
        return _Pending(owner, self.backups[owner], name, checked_files(owner, name, step["files"]),
                        notes, src_dir=str(doc.get("dir") or self.cfg.dir))

    def batch(self, items: Mapping[str, dict[str, Any]], pending: list[_Pending]
              ) -> tuple[list[_Pending], dict[str, Mapping[str, Any]]]:
        """Run one batched probe item per pending copy on its peer; → (still going, docs)."""
        per_peer: dict[str, list[dict[str, Any]]] = {}
        for p in pending:
            per_peer.setdefault(p.peer, []).append({"key": p.owner, **self.area, **items[p.owner]})
        nodes = [self.inv.nodes[n] for n in per_peer]
        results = self.runner.run(nodes, PROBE, lambda n: {"op": "batch", "items": per_peer[n.name]})
        going, docs = [], {}
        for p in pending:
            res = results[p.peer]
            every = (res.document or {}).get("results")
            doc = every.get(p.owner) if isinstance(every, dict) else None
            if doc is not None and not isinstance(doc, dict):
                self.finish(p, "refused", f"{p.peer} answered {type(doc).__name__} for "
                            f"{p.owner}, not an object", copied=0)
                continue
            err = _item_error(res, doc)
            if err or doc is None:
                self.finish(p, probe_state(res) if res.error else "failed", err, copied=0)
                continue
            try:
                docs[p.owner] = answer_of(res, doc)
            except NodeRefused as exc:
                self.finish(p, "refused", str(exc), copied=0)
                continue
            going.append(p)
        return going, docs

    def compare(self, pending: list[_Pending]) -> list[_Pending]:
        """What the peer already has: skip complete copies, list the files to send."""
        going, docs = self.batch({p.owner: {"op": "scan_backup", "area": "backup",
                                            "source": p.owner, "step": p.step}
                                  for p in pending}, pending)
        out = []
        for p in going:
            root = docs[p.owner].get("root")
            p.root = str(root) if root else None
            try:
                p.skipped_at_source += [f"{p.peer}: {n}" for n in
                                        skip_notes(p.peer, docs[p.owner].get("skipped"))]
                steps = entries(p.peer, docs[p.owner].get("steps"), "backed-up steps")
                entry = next((s for s in steps if s.get("name") == p.step), None)
                present = entry.get("present") or {} if entry else {}
                if not isinstance(present, dict):
                    raise NodeRefused(f"{p.peer} reported present files that are not an object")
                manifest = entries(p.peer, entry.get("manifest"), "manifest entries") if entry else []
            except NodeRefused as exc:
                self.finish(p, "refused", str(exc), copied=0)
                continue
            p.todo = [f for f in p.files if present.get(f.rel) != f.sha256]
            want = sorted((f.to_json() for f in p.files), key=lambda x: x["path"])
            if entry and entry.get("committed") and not p.todo and \
                    sorted(manifest, key=lambda x: str(x.get("path"))) == want:
                self.finish(p, "ok", notes=("already backed up",))
                continue
            out.append(p)
        return out

    def preview(self, pending: list[_Pending]) -> None:
        """A dry run stops here: each copy is ``planned``, with the files it would send."""
        for p in pending:
            self.finish(p, "planned")

    def prepare(self, pending: list[_Pending]) -> list[_Pending]:
        """Create the step's directory on the peer (and its backup root), drop a stale
        manifest and partials, and check the peer can take the step (``ckpt_room``)."""
        going, docs = self.batch({p.owner: {"op": "prepare", "source": p.owner, "step": p.step,
                                            **room_request(p.todo, self.cfg.backup_margin)}
                                  for p in pending}, pending)
        for p in going:
            if (why := no_room(p.peer, p.owner, docs[p.owner])) is not None:
                self.finish(p, "refused", why, copied=0)
        return [p for p in going if docs[p.owner].get("no_room") is None]

    def copy(self, pending: list[_Pending]) -> list[_Pending]:
        """Stream every missing file; machines with a failed lane stop here."""
        jobs, whose = [], []
        for p in pending:
            for group in lanes(p.todo, self.parallel):
                jobs.append(Lane(self.inv.nodes[p.owner], {**self.area, "area": "ckpt", "step": p.step},
                                  self.inv.nodes[p.peer], {**self.area, "area": "backup",
                                                           "source": p.owner, "step": p.step},
                                  tuple(group)))
                whose.append(p)
        refused: dict[str, str] = {}
        for p, out in zip(whose, Relay(self.transport, self.runner, self.parallel).run(
                jobs, self._lanes_left([p.owner for p in pending], [p.owner for p in whose]))):
            if isinstance(out, NodeRefused):
                refused.setdefault(p.owner, str(out))
            elif out:
                p.errors.append(out)
        for p in pending:
            if p.owner in refused:
                self.finish(p, "refused", refused[p.owner], tuple(p.errors[:3]), copied=0)
            elif p.errors:
                self.finish(p, "failed", p.errors[0], tuple(p.errors[1:4]), copied=0)
        return [p for p in pending if not p.errors and p.owner not in refused]

    def _lanes_left(self, owners: list[str], lane_owners: list[str]) -> Callable[[Lane], None]:
        """Progress of the copy stage: a machine is done when the last of its lanes is."""
        advance = self.track("copy", owners)
        left = {o: lane_owners.count(o) for o in owners}
        lock = threading.Lock()
        for owner in owners:
            if not left[owner]:
                advance(Finished(owner))

        def lane_done(lane: Lane) -> None:
            with lock:
                left[lane.src.name] -= 1
                done = not left[lane.src.name]
            if done:
                advance(Finished(lane.src.name))

        return lane_done

    def commit(self, pending: list[_Pending]) -> None:
        """The peer checks the step is all there and only then writes the manifest."""
        going, docs = self.batch({p.owner: {
            "op": "commit", "source": p.owner, "step": p.step,
            "files": [f.to_json() for f in p.files], "keep": self.cfg.keep} for p in pending},
            pending)
        for p in going:
            doc = docs[p.owner]
            try:
                bad = (names(p.peer, doc.get("mismatched"), "mismatched files")
                       + names(p.peer, doc.get("missing"), "missing files"))
                pruned = names(p.peer, doc.get("pruned"), "pruned steps")
            except NodeRefused as exc:
                self.finish(p, "refused", str(exc))
                continue
            if not doc.get("ok"):
                self.finish(p, "failed", "checksum mismatch on the peer after the copy: "
                            + ", ".join(bad)[:300])
                continue
            self.finish(p, "ok", notes=(f"pruned {', '.join(pruned)}",) if pruned else ())


def backup(
    transport: Transport,
    inv: Inventory,
    backups: Mapping[str, str],
    *,
    nodes: Sequence[str] | None = None,
    parallel: int | None = None,
    runner: ProbeRunner | None = None,
    dry_run: bool = False,
    track: Track = untracked,
) -> CopyReport:
    """Copy each machine's newest complete step to its backup peer (resumable, verified).

    A dry run only reads: each machine's newest complete step and what its peer
    already holds; each copy is ``planned`` with the files it would send, from where
    to where. It creates no directory, sends no byte and writes no manifest.

    Args:
        transport: the backend.
        inv: the inventory (``ckpt`` settings, nodes).
        backups: machine → backup peer (from ``plan`` or a plan file).
        nodes: back up only these machines (default: every machine in ``backups``).
        parallel: relays in flight (default ``ckpt.parallel``).
        runner: the probe runner (one per process keeps the shipped-code cache warm).
        dry_run: read and plan only.
        track: progress: the scan, then the copy, machine by machine.

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
                  runner or ProbeRunner(transport), track)
    compared = run.compare(run.scan(owners))
    if dry_run:
        run.preview(compared)
    else:
        run.commit(run.copy(run.prepare(compared)))
    return CopyReport(tuple(run.done[o] for o in owners))
