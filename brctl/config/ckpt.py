"""``ckpt:`` — checkpoint shard files on each node and where their backups go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from brctl.core.schema import at_least_one
from brctl.core.schema import field as sfield


def _absolute(value: str | None) -> str | None:
    # ~ and $VARS are expanded on each node (e.g. $LOCAL_SSD/ckpt with a per-node env).
    if value is not None and not value.startswith(("/", "~", "$")):
        raise ValueError(f"got {value!r}, expected an absolute path on the nodes (/…, ~/…, $VAR/…)")
    return value


def _name(value: str | None) -> str | None:
    if value is not None and ("/" in value or value in ("", ".", "..")):
        raise ValueError(f"got {value!r}, expected a plain file name")
    return value


def _margin(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < 2 ** 62:  # NaN and infinities fail too
        raise ValueError(f"got {value!r}, expected a fraction of the filesystem (0.05) or bytes")
    return float(value)


@dataclass(frozen=True)
class CkptSection:
    """Checkpoint backup settings (``brctl ckpt``)."""

    dir: str = sfield("/local/ckpt", check=_absolute)  # directory holding this machine's shards
    glob: str = "step_*"  # one entry (file or directory) per saved step under dir
    # Peer copies live here, one subdirectory per source machine. Default (None):
    # <dir>.brctl-backup, beside dir on the same filesystem, made root-owned 0700 by
    # the node; every component from / must be owned by root and not group/other
    # writable (OpenSSH's StrictModes rule), else that node is refused.
    backup_dir: Optional[str] = sfield(None, check=_absolute)
    # Training code writes this file into a step last; when set, a step without it is
    # still being written and is not backed up. Without it every step counts.
    complete_marker: Optional[str] = sfield(None, check=_name)
    domain_label: str = "rack"  # node label naming the failure domain backups should avoid
    keep: int = sfield(2, check=at_least_one)  # complete backup steps kept per source machine
    parallel: int = sfield(8, check=at_least_one)  # file copies in flight at once
    # Kept free on a backup peer's filesystem after a copy: a fraction of it below 1,
    # else bytes. A step that would not leave it is refused before its first byte.
    backup_margin: float = sfield(0.05, check=_margin)
