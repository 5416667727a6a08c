"""``ckpt:`` — checkpoint shard files on each node."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CkptSection:
    """Checkpoint backup settings."""

    dir: str = "/local/ckpt"  # directory holding this machine's shards
    glob: str = "step_*"  # one entry per saved step under dir
