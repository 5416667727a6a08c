"""Room on a backup peer, lanes of a copy, and whose failure a failed relay reports.

A job user's step may hold sparse files: a terabyte of holes costs it nothing and
would cost the peer a terabyte once brctl wrote it out (as root: past quotas and
the root reserve). So ``prepare`` asks the peer for room for every byte still to
copy, each file counted at its size (what the dense copy costs there), plus
``ckpt.backup_margin`` kept free (``brctl.diagnostics.ckptspace``), before the
first byte; a peer without it is ``refused`` naming the peer, the bytes needed and
free. When a relay fails on both ends, the receiver's cause (``ENOSPC on n2``) is
the one reported, not the sender's EPIPE that follows from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from brctl.core.transport import RunResult


class _File(Protocol):
    """A shard file as ``ckpt_copy.ShardFile`` has it (its path in the step, its size)."""

    @property
    def rel(self) -> str: ...

    @property
    def size(self) -> int: ...


F = TypeVar("F", bound=_File)


def lanes(files: Sequence[F], parallel: int) -> list[list[F]]:
    """``files`` in at most ``parallel`` groups of about equal bytes (largest first)."""
    groups: list[list[F]] = [[] for _ in range(max(1, min(parallel, len(files))))]
    sizes = [0] * len(groups)
    for f in sorted(files, key=lambda f: (-f.size, f.rel)):
        i = sizes.index(min(sizes))
        groups[i].append(f)
        sizes[i] += f.size
    return [sorted(g, key=lambda f: f.rel) for g in groups if g]


def room_request(todo: Sequence[_File], margin: float) -> dict[str, Any]:
    """What ``prepare`` checks on the peer: every byte still to copy, and the margin."""
    return {"need": sum(f.size for f in todo), "margin": margin}


def _size(n: object) -> str:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n} bytes ({n / scale:.1f} {unit})"
    return f"{n} bytes"


def no_room(peer: str, owner: str, doc: Mapping[str, Any]) -> str | None:
    """Why ``peer`` cannot take ``owner``'s step (its ``prepare`` answer), or None."""
    room = doc.get("no_room")
    if room is None:
        return None
    room = room if isinstance(room, Mapping) else {}
    return (f"{peer}: no room for {owner}'s step: needs {_size(room.get('need'))} and keeps "
            f"{_size(room.get('margin'))} free (ckpt.backup_margin), has {_size(room.get('free'))} "
            "free; nothing was copied")


def receiver_failed(dst: str, got: RunResult, err: str | None) -> str | None:
    """The receiver's own failure (its answer an error), or None when it answered."""
    if err is None or got.exit_code is None:
        return None
    return f"{dst}: receiving failed: {err}"
