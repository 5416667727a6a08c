"""``slurm:`` and ``job.slurm:`` — where the job lives in Slurm (``connection: slurm``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from brctl.core.schema import field as sfield

_JOB_ID = re.compile(r"\d+(_\d+|\+\d+)?")  # 1234, an array task 1234_7, a het component 1234+1
_WORD = re.compile(r"[A-Za-z0-9_.@:+-]+")


def _job_id(value: Optional[str]) -> Optional[str]:
    if value is not None and not _JOB_ID.fullmatch(str(value)):
        raise ValueError(f"got {value!r}, expected a Slurm job id (1234, 1234_7)")
    return None if value is None else str(value)


def _word(value: Optional[str]) -> Optional[str]:
    if value is not None and not _WORD.fullmatch(value):
        raise ValueError(f"got {value!r}, expected one word (letters, digits, _ . @ : + -)")
    return value


@dataclass(frozen=True)
class SlurmJobSection:
    """``job.slurm:`` the job's id, or its name (narrowed by user and cluster)."""

    job: Optional[str] = sfield(None, check=_job_id)
    name: Optional[str] = sfield(None, check=_word)
    user: Optional[str] = sfield(None, check=_word)
    cluster: Optional[str] = sfield(None, check=_word)


@dataclass(frozen=True)
class SlurmSection:
    """``slurm:`` settings for the whole inventory."""

    # Machines outside the job's allocation (standbys) that connection: slurm reaches
    # get a short allocation of their own in this partition (None: the default one).
    partition: Optional[str] = sfield(None, check=_word)
